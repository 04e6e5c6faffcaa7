"""Shard clusters across agent replicas with Kubernetes Leases (coordination.k8s.io/v1).

Started by ``scheduler.Daemon`` when the agent runs in a cluster (or has a
management kubeconfig); ``cli_ops sync`` uses ``acquire_once`` for a one-off
pass. Kubernetes is the coordination engine, nothing else is (docs/operations.md, "Scale-out with Leases"):

- one Lease per managed cluster, ``<agent>-c-<cluster>``, in the lease
  namespace of the management cluster; ``holderIdentity`` is the replica id;
- one Lease per replica, ``<agent>-r-<hash(id)>``, renewed in the same round:
  the live replica Leases say how many replicas share the clusters, so each
  takes at most ``ceil(clusters / replicas)`` and hands surplus back;
- a holder may write to a cluster only until ``renew_deadline`` after the
  start of its last successful renewal, and not at all from the moment a
  renewal fails. Another replica takes a Lease over only after
  ``renewTime + lease_duration`` (``lease_duration > renew_deadline``), so two
  replicas never write to one cluster at once, and a dead replica's clusters
  are taken within ``lease_duration + retry_period``.

The write gate is ``Fence``, given to a cluster's ``KubeClient``: its non-read
requests fail with ``ClusterError`` while the fence says no. Reads go on.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from agent.errors import ApiError, ClusterError
from agent.kube.client import KubeClient
from agent.model import AGENT_LABEL, CLUSTER_LABEL, ROLE_LABEL, FailureReason
from agent.run.lease_settings import LeaseSettings

log = structlog.get_logger("gitops_agent.lease")

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
_READS = frozenset({"GET", "HEAD"})


class Fence:
    """The write gate of one cluster's client: lease held, pass not abandoned, not stopping.

    ``Fleet`` gives each cluster's client one; ``may_write`` says why this replica may not
    write there now (None: it may). Reads always go on.
    """

    def __init__(self, cluster: str, may_write: Callable[[], str | None] = lambda: None) -> None:
        self.cluster = cluster
        self.may_write = may_write
        #: Set once and for good when the pass using the client was abandoned.
        self.abandoned: str | None = None

    def abandon(self, why: str) -> None:
        """Refuse every later write, whatever the Lease says (a pass left behind at its deadline)."""
        self.abandoned = why

    def check(self, method: str) -> None:
        if method.upper() not in _READS:
            why = self.abandoned or self.may_write()
            if why:
                raise ClusterError(
                    self.cluster, f"write refused: {why}", retryable=True, failure_reason=FailureReason.FENCED
                )


def abandon(client: KubeClient | None, why: str) -> None:
    """Fence ``client``'s writes for good (a client without a ``Fence``, or none made yet: nothing)."""
    if client is not None and isinstance(client.gate, Fence):
        client.gate.abandon(why)


def _now() -> datetime:
    return datetime.now(UTC)


def micro_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(t: str | None) -> datetime | None:
    if not t:
        return None
    try:
        return datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease as read: who holds it and until when."""

    name: str
    holder: str
    renew_time: datetime | None
    acquire_time: str | None
    duration: int
    transitions: int
    resource_version: str
    labels: dict[str, str]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> LeaseRecord:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        return cls(
            name=str(meta.get("name", "")),
            holder=str(spec.get("holderIdentity") or ""),
            renew_time=_parse(spec.get("renewTime") or spec.get("acquireTime")),
            acquire_time=spec.get("acquireTime"),
            duration=int(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str(meta.get("resourceVersion", "")),
            labels=dict(meta.get("labels") or {}),
        )

    def expired(self, now: datetime) -> bool:
        if not self.holder or self.renew_time is None:
            return True
        return (now - self.renew_time).total_seconds() >= self.duration


@dataclass
class Held:
    """This replica's view of one cluster's Lease."""

    cluster: str
    held: bool = False
    #: monotonic time until which writes are allowed (start of last good renewal + renew deadline)
    valid_until: float = 0.0
    renew_failed: str = ""
    holder: str = ""
    acquired_at: datetime | None = None
    record: LeaseRecord | None = None
    transitions: list[tuple[datetime, bool]] = field(default_factory=list)


def _score(identity: str, cluster: str) -> str:
    """Rendezvous order: replicas prefer different clusters, so they rarely race for the same one."""
    return hashlib.sha256(f"{identity}/{cluster}".encode()).hexdigest()


class LeaseManager:
    """Acquires, renews, observes and releases this replica's Leases on its own thread."""

    def __init__(
        self,
        client: KubeClient,
        settings: LeaseSettings,
        *,
        agent: str,
        clusters: Iterable[str],
        on_change: Callable[[str, bool], None] = lambda _c, _h: None,
        busy: Callable[[str], bool] = lambda _c: False,
        register: bool = True,
    ) -> None:
        self.client = client
        self.s = settings
        self.agent = agent
        self.on_change = on_change
        self.busy = busy
        #: Whether this process counts as a replica (a one-off CLI pass does not).
        self.register = register
        self._lock = threading.Lock()
        self.state: dict[str, Held] = {c: Held(c) for c in clusters}
        self.replicas: list[str] = [settings.identity]
        self.heartbeat = time.monotonic()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- names ----------------------------------------------------------------

    def lease_name(self, cluster: str) -> str:
        return f"{self.agent}-c-{cluster}"

    @property
    def replica_lease(self) -> str:
        return f"{self.agent}-r-{hashlib.sha256(self.s.identity.encode()).hexdigest()[:10]}"

    @property
    def _base(self) -> str:
        return LEASES.format(ns=self.s.namespace)

    # -- what the scheduler asks ----------------------------------------------

    def may_write(self, cluster: str) -> str | None:
        """None when this replica may write to ``cluster`` now; otherwise why not."""
        with self._lock:
            h = self.state.get(cluster)
            if h is None or not h.held:
                holder = h.holder if h else ""
                return f"lease not held by this replica (holder: {holder or 'none'})"
            if h.renew_failed:
                return f"lease renewal failed: {h.renew_failed}"
            if time.monotonic() >= h.valid_until:
                return "lease not renewed within the renew deadline"
            return None

    def holds(self, cluster: str) -> bool:
        return self.may_write(cluster) is None

    def holder(self, cluster: str) -> str:
        with self._lock:
            h = self.state.get(cluster)
            return h.holder if h else ""

    def set_clusters(self, clusters: Iterable[str]) -> None:
        """Config reload: new clusters are contended for next round; removed ones are released."""
        wanted = set(clusters)
        with self._lock:
            gone = [h for c, h in self.state.items() if c not in wanted]
            for c in wanted - set(self.state):
                self.state[c] = Held(c)
            for h in gone:
                del self.state[h.cluster]
        for h in gone:
            if h.held and h.record is not None:
                self._release(h.cluster, h.record)

    # -- the loop ---------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="leases", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_round = time.monotonic()
        while not self._stop.is_set():
            try:
                self.run_round()
            except Exception as e:  # the loop must outlive any one bad round
                log.exception("lease round crashed", error=str(e))
            next_round += self.s.retry_period
            self._stop.wait(max(0.0, next_round - time.monotonic()))
            next_round = max(next_round, time.monotonic() - self.s.retry_period)

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing; with ``release`` hand every held Lease back at once (rolling update)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.s.renew_deadline)
        with self._lock:
            held = [(h.cluster, h.record) for h in self.state.values() if h.held and h.record]
            for h in self.state.values():
                h.held = False  # the gate closes before the Lease goes
        if release:
            for cluster, rec in held:
                assert rec is not None
                self._release(cluster, rec)
            if self.register:
                self._delete(self.replica_lease)

    def run_round(self) -> None:
        """One round: renew the replica Lease, read all Leases, then renew, take or hand back."""
        started = time.monotonic()
        now = _now()
        try:
            if self.register:
                self._renew_replica(now)
            items = self.client.request(
                "GET", self._base, query={"labelSelector": f"{AGENT_LABEL}={self.agent}"}
            ).get("items", [])
            self.error = None
        except ApiError as e:
            self.error = str(e)
            log.warning("lease round failed; writes paused on renewals that fail", error=str(e))
            self._fail_all(str(e), started)
            self.heartbeat = time.monotonic()
            return
        records = {r.name: r for r in (LeaseRecord.of(o) for o in items)}
        replicas = sorted(
            {
                r.holder
                for r in records.values()
                if r.labels.get(ROLE_LABEL) == "replica" and not r.expired(now)
            }
            | {self.s.identity}
        )
        self.replicas = replicas
        with self._lock:
            clusters = sorted(self.state, key=lambda c: _score(self.s.identity, c), reverse=True)
        share = math.ceil(len(clusters) / len(replicas)) if clusters else 0
        mine = [c for c in clusters if self._get(c).held]
        surplus = set(mine[share:]) if len(mine) > share else set()
        count = len(mine)
        for c in clusters:
            rec = records.get(self.lease_name(c))
            h = self._get(c)
            if h.held:
                if c in surplus and not self.busy(c):
                    self._set(c, held=False, holder="")
                    if rec is not None:
                        self._release(c, rec)
                    count -= 1
                    continue
                self._renew(c, rec, started, now)
            elif rec is not None and rec.holder == self.s.identity and not rec.expired(now):
                # Ours from before a restart of the loop: treat as free, take it back.
                if count < share and self._take(c, rec, started, now):
                    count += 1
            elif rec is None or rec.expired(now):
                if count < share and self._take(c, rec, started, now):
                    count += 1
                elif rec is not None:
                    self._observe(c, rec)
            else:
                self._observe(c, rec)
        self.heartbeat = time.monotonic()

    # -- steps ------------------------------------------------------------------

    def _get(self, cluster: str) -> Held:
        with self._lock:
            return self.state.get(cluster) or Held(cluster)

    def _set(self, cluster: str, **kw: Any) -> None:
        changed: bool | None = None
        with self._lock:
            h = self.state.get(cluster)
            if h is None:
                return
            was = h.held
            for k, v in kw.items():
                setattr(h, k, v)
            if h.held != was:
                changed = h.held
                h.transitions.append((_now(), h.held))
        if changed is not None:
            log.info("lease " + ("acquired" if changed else "lost"), cluster=cluster, replica=self.s.identity)
            self.on_change(cluster, changed)

    def _observe(self, cluster: str, rec: LeaseRecord) -> None:
        self._set(cluster, held=False, holder=rec.holder, record=rec)

    def _body(
        self,
        name: str,
        role: str,
        cluster: str,
        now: datetime,
        rec: LeaseRecord | None,
        *,
        holder: str,
        acquire: bool,
        duration: int | None = None,
    ) -> dict[str, Any]:
        labels = {AGENT_LABEL: self.agent, ROLE_LABEL: role}
        if cluster:
            labels[CLUSTER_LABEL] = cluster
        spec: dict[str, Any] = {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration or self.s.duration,
            "renewTime": micro_time(now),
            "leaseTransitions": (rec.transitions if rec else 0) + (1 if acquire and rec else 0),
        }
        spec["acquireTime"] = micro_time(now) if acquire or rec is None else rec.acquire_time
        meta: dict[str, Any] = {"name": name, "namespace": self.s.namespace, "labels": labels}
        if rec is not None:
            meta["resourceVersion"] = rec.resource_version  # optimistic concurrency: a race is a 409
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _write(self, body: dict[str, Any], rec: LeaseRecord | None) -> LeaseRecord:
        name = body["metadata"]["name"]
        if rec is None:
            out = self.client.request("POST", self._base, body=body)
        else:
            out = self.client.request("PUT", f"{self._base}/{name}", body=body)
        return LeaseRecord.of(out)

    def _take(self, cluster: str, rec: LeaseRecord | None, started: float, now: datetime) -> bool:
        body = self._body(
            self.lease_name(cluster), "cluster", cluster, now, rec, holder=self.s.identity, acquire=True
        )
        try:
            new = self._write(body, rec)
        except ApiError as e:
            if e.status not in (409, 422):
                log.warning("taking lease failed", cluster=cluster, error=str(e))
            return False  # somebody else was faster: observe them next round
        self._set(
            cluster,
            holder=self.s.identity,
            record=new,
            valid_until=started + self.s.renew_deadline,
            renew_failed="",
            acquired_at=now,
            held=True,
        )
        return True

    def _renew(self, cluster: str, rec: LeaseRecord | None, started: float, now: datetime) -> None:
        if rec is None or rec.holder != self.s.identity:
            # Deleted or taken over (we must have been late): stop at once.
            self._set(
                cluster,
                held=False,
                holder=rec.holder if rec else "",
                record=rec,
                renew_failed="lease taken over",
            )
            return
        body = self._body(
            self.lease_name(cluster), "cluster", cluster, now, rec, holder=self.s.identity, acquire=False
        )
        try:
            new = self._write(body, rec)
        except ApiError as e:
            self._renew_failed(cluster, str(e), started)
            return
        self._set(cluster, record=new, valid_until=started + self.s.renew_deadline, renew_failed="")

    def _renew_failed(self, cluster: str, why: str, started: float) -> None:
        h = self._get(cluster)
        lost = time.monotonic() >= h.valid_until
        log.warning("lease renewal failed; writes to the cluster stop", cluster=cluster, error=why, lost=lost)
        if lost:
            self._set(cluster, held=False, renew_failed=why)
        else:
            self._set(cluster, renew_failed=why)

    def _fail_all(self, why: str, started: float) -> None:
        for c in list(self.state):
            if self._get(c).held:
                self._renew_failed(c, why, started)

    def _renew_replica(self, now: datetime) -> None:
        name = self.replica_lease
        try:
            rec = LeaseRecord.of(self.client.request("GET", f"{self._base}/{name}"))
        except ApiError as e:
            if e.status != 404:
                raise
            rec = None
        body = self._body(name, "replica", "", now, rec, holder=self.s.identity, acquire=rec is None)
        self._write(body, rec)

    def _release(self, cluster: str, rec: LeaseRecord) -> None:
        """Hand a Lease back (holder empty, 1 s): the next replica takes it within a retry period."""
        try:
            fresh = LeaseRecord.of(self.client.request("GET", f"{self._base}/{rec.name}"))
            if fresh.holder != self.s.identity:
                return
            body = self._body(
                rec.name, "cluster", cluster, _now(), fresh, holder="", acquire=False, duration=1
            )
            self._write(body, fresh)
            log.info("lease released", cluster=cluster, replica=self.s.identity)
        except ApiError as e:
            log.warning("releasing lease failed; it expires on its own", cluster=cluster, error=str(e))

    def _delete(self, name: str) -> None:
        with contextlib.suppress(ApiError):  # it expires on its own
            self.client.request("DELETE", f"{self._base}/{name}")

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                "identity": self.s.identity,
                "namespace": self.s.namespace,
                "replicas": list(self.replicas),
                "error": self.error,
                "held": sorted(c for c, h in self.state.items() if h.held),
            }


def acquire_once(client: KubeClient, settings: LeaseSettings, *, agent: str, cluster: str) -> LeaseManager:
    """Take one cluster's Lease for a one-off pass (``gitops-agent sync`` without a running agent).

    Raises ``ClusterError`` when another replica holds it; the caller ``stop()``s the manager.
    """
    lm = LeaseManager(client, settings, agent=agent, clusters=[cluster], register=False)
    now = _now()
    try:
        rec = LeaseRecord.of(client.request("GET", f"{lm._base}/{lm.lease_name(cluster)}"))
    except ApiError as e:
        if e.status != 404:
            raise
        rec = None
    if rec is not None and not rec.expired(now):
        raise ClusterError(cluster, f"held by replica {rec.holder!r}; ask it (its /sync endpoint) instead")
    if not lm._take(cluster, rec, time.monotonic(), now):
        raise ClusterError(cluster, "another replica took the lease first")
    lm.start()  # keep renewing while the pass runs
    return lm
