"""Run one pass per cluster, each alone: own reconciler, client, thread and deadline.

``Fleet`` owns one ``ClusterReconciler`` (so one client, connection pool and
timeouts) per cluster and runs each pass on a thread of its own under the
cluster's wall-clock ``pass_deadline``. A pass covers the cluster's apps that
are due (``due_apps``: a new revision of their source, their interval elapsed,
their backoff over, a dependency waited for) and yields one result per app;
status, metrics and events are kept per (cluster, app) (``status``). A pass still running then is reported
as timed out and *abandoned*: its client is fenced (no further writes), the
next pass gets a fresh client, and while the abandoned one still hangs the
cluster reports "still stuck" instead of starting more threads (docs/safety.md rule 6).
Safe to abandon at any point: the inventory is widened before applying and
narrowed only after pruning (docs/safety.md rule 10). It also knows every entry's
cluster identity (``identity.IdentityBook``), so entries that reach one
cluster are all refused (state ``refused``) before any of them writes there.

Used by ``gitops-agent run --once``, ``sync`` (one-off), ``demo``, the tests,
and ``scheduler.Daemon``, which adds the schedule, leases and health.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog

from agent.config.types import AGENT_DEFAULTS, SCHEDULE_JITTER, ClusterConfig, Config
from agent.errors import AgentError
from agent.kube.client import KubeClient
from agent.model import AppHealth, ClusterResult, Failure, FailureReason, Outcome, PassState, Revision
from agent.notify.notifier import PassObserver
from agent.reconcile.apps import Revisions, cluster_apps, combined, revisions_of
from agent.reconcile.charts import of_app
from agent.reconcile.identity import IdentityBook
from agent.reconcile.reconciler import ClusterReconciler
from agent.render.renderer import RenderCache
from agent.report import events
from agent.run import lease
from agent.run.due import AppClock, Decision, Timing, backoff_delay, decide
from agent.run.health_watch import HealthWatch
from agent.run.server import Metrics
from agent.run.status import AppStatus, ClusterStatus

__all__ = ["BACKOFF_BASE", "BACKOFF_CAP", "AppStatus", "ClusterStatus", "Fence", "Fleet", "backoff_delay"]

log = structlog.get_logger("gitops_agent.fleet")

#: A cluster's write gate: None, or why writes there are refused now (no Lease, shutting down).
Fence = Callable[[str], str | None]

BACKOFF_BASE = AGENT_DEFAULTS.backoff_base
BACKOFF_CAP = AGENT_DEFAULTS.backoff_cap


@dataclass
class _Slot:
    """One cluster's runtime: its reconciler, status, and the pass threads it has out."""

    cluster: ClusterConfig
    reconciler: ClusterReconciler
    status: ClusterStatus
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: threading.Thread | None = None
    stuck: threading.Thread | None = None


class Fleet:
    """One reconciler per cluster; each pass on its own thread with its own deadline."""

    def __init__(
        self,
        config: Config,
        *,
        reconciler_factory: Callable[..., ClusterReconciler] = ClusterReconciler,
        metrics: Metrics | None = None,
        emit_events: bool = True,
        fence: Fence | None = None,
        observer: PassObserver | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.emit_events = emit_events
        #: Per-cluster write gate (leases, shutdown): None or the reason writes are refused.
        self.fence = fence
        #: Told of each app's pass and wait (the daemon's notifier); it only queues, never blocks.
        self.observer = observer
        self._factory = reconciler_factory
        #: One cache for every cluster: clusters serving the same paths and vars share one render
        #: (and one copy of its objects); it outlives reconcilers replaced after a deadline or a reload.
        self.render_cache = RenderCache(_cache_entries(config))
        self.identities = IdentityBook()
        self._slots = {c.name: self._slot(c) for c in config.clusters}
        self._closing = threading.Event()
        #: The waits on apps' rollouts (``wait``), stepped by the daemon's health jobs or ``run --once``.
        self.health = HealthWatch(self)
        #: Cluster → apps whose next pass overrides a closed change window (``sync --force-window``).
        self._force_window: dict[str, set[str]] = {}

    def _slot(self, c: ClusterConfig) -> _Slot:
        slot = _Slot(c, self._reconciler(c), ClusterStatus(c.name))
        self._sync_apps(slot)
        return slot

    def _sync_apps(self, slot: _Slot) -> None:
        """The slot's app statuses follow the config: new apps added, removed apps forgotten."""
        apps = [a.name for a in cluster_apps(self.config, slot.cluster)]
        st = slot.status
        for gone in [n for n in st.apps if n not in apps]:
            del st.apps[gone]
            self.metrics.remove_app(slot.cluster.name, gone)
        st.apps = {n: st.apps.get(n) or AppStatus(slot.cluster.name, n) for n in apps}

    def _reconciler(self, c: ClusterConfig) -> ClusterReconciler:
        return self._factory(
            self.config,
            c,
            client_factory=self._client_for,
            render_cache=self.render_cache,
            same_cluster=self._same_cluster,
        )

    def _same_cluster(self, name: str, uid: str | None) -> list[str]:
        """The other entries reaching the cluster of ``name`` (whose kube-system UID is ``uid``).

        Runs in ``name``'s pass, on its thread and under its deadline. Entries never read are read
        first (once for all passes, side by side, with their own connect timeout), so whichever
        entry passes first already sees the other: both are refused, deterministically.
        """
        self.identities.record(name, uid)
        if uid is None:  # hidden by RBAC: nothing to compare (the claim on the parent guards instead)
            return []
        self.identities.resolve([n for n in list(self._slots) if n != name], self._peer_uid)
        return self.identities.sharing(name, uid)

    def _peer_uid(self, name: str) -> str | None:
        """Another entry's kube-system UID through a client of its own (a read: no lease needed)."""
        slot = self._slots.get(name)
        if slot is None:
            return None
        try:
            client = KubeClient.from_config(slot.cluster)
        except AgentError as e:
            log.info("cluster identity not read", cluster=name, error=str(e))
            return None
        try:
            return client.cluster_uid(timeout=slot.cluster.settings.connect_timeout)
        except AgentError as e:  # unreachable now: its own passes record it once they get through
            log.info("cluster identity not read", cluster=name, error=str(e))
            return None
        finally:
            client.close()

    def _client_for(self, c: ClusterConfig) -> KubeClient:
        gate = lease.Fence(c.name, lambda: self.fence(c.name) if self.fence is not None else None)
        return KubeClient.from_config(c, gate=gate)

    @property
    def status(self) -> dict[str, ClusterStatus]:
        return {n: s.status for n, s in self._slots.items()}

    @property
    def reconcilers(self) -> dict[str, ClusterReconciler]:
        return {n: s.reconciler for n, s in self._slots.items()}

    def names(self) -> list[str]:
        return list(self._slots)

    def busy(self, name: str) -> bool:
        slot = self._slots.get(name)
        return slot is not None and slot.running is not None

    def running(self) -> list[str]:
        return [n for n, s in self._slots.items() if s.running is not None]

    # -- status transitions the daemon asks for ---------------------------------

    def standby(self, name: str, holder: str) -> None:
        """``name`` is held by another replica (``holder``): no pass here, state ``standby``."""
        if (slot := self._slots.get(name)) is not None:
            slot.status.state, slot.status.holder = PassState.STANDBY, holder

    def lease_changed(self, name: str, held: bool, holder: str) -> None:
        """This replica took (``held``) or lost ``name``'s Lease, now held by ``holder``."""
        if (slot := self._slots.get(name)) is not None:
            slot.status.holder = holder
            slot.status.state = slot.status.state if held else PassState.STANDBY

    def scheduled(self, name: str, when: datetime, why: str) -> None:
        """``name``'s job was woken for ``when``: its next run and a schedule entry saying ``why``."""
        if (slot := self._slots.get(name)) is None:
            return
        now = datetime.now(UTC)
        slot.status.next_run = when
        slot.status.schedule.append((now, (when - now).total_seconds(), why))
        self.metrics.next_run_at(name, when.timestamp())

    def next_run_is(self, name: str, when: datetime | None) -> None:
        """``name``'s job runs next at ``when`` by its own interval (no pass set a wake)."""
        if (slot := self._slots.get(name)) is not None:
            slot.status.next_run = when

    def set_health(self, name: str, health: AppHealth) -> None:
        """An app's rollout as its wait last read it (``health_watch``)."""
        slot = self._slots.get(name)
        if slot is not None and health.app in slot.status.apps:
            slot.status.app(health.app).health = health

    def force_window(self, name: str, apps: Iterable[str]) -> None:
        """The next pass of each of ``apps`` on ``name`` overrides a closed change window, once."""
        with self._slots[name].lock:
            self._force_window.setdefault(name, set()).update(apps)

    def _take_forced(self, slot: _Slot, apps: list[str]) -> set[str]:
        """The overrides this pass of ``apps`` uses up (each one pass only)."""
        with slot.lock:
            pending = self._force_window.get(slot.cluster.name, set())
            taken = pending & set(apps)
            pending -= taken
        return taken

    # -- one pass -------------------------------------------------------------

    def run_pass(self, name: str, revision: Revision | Revisions, *, dry_run: bool = False) -> ClusterResult:
        """Every app of one cluster in one pass, their results combined (one app: its own result)."""
        return combined(name, self.run_apps(name, revision, dry_run=dry_run))

    def run_apps(
        self,
        name: str,
        revision: Revision | Revisions,
        *,
        dry_run: bool = False,
        apps: Iterable[str] | None = None,
    ) -> list[ClusterResult]:
        """One pass of one cluster (``apps``, or all) under its deadline; one result per app that
        ran. Never raises, never outlives the deadline."""
        slot = self._slots[name]
        revisions = revisions_of(self.config, revision)
        deadline = slot.cluster.settings.pass_deadline
        wanted = list(slot.status.apps) if apps is None else [a for a in apps if a in slot.status.apps]
        if slot.stuck is not None and slot.stuck.is_alive():
            return self._still_stuck(slot, wanted, revisions)
        reconciler = slot.reconciler
        box: dict[str, list[ClusterResult]] = {}
        short = ", ".join(sorted({r.short for r in revisions.values()}))
        forced = set() if dry_run else self._take_forced(slot, wanted)

        def work() -> None:
            with structlog.contextvars.bound_contextvars(cluster=name, revision=short):
                r = self._reconcile(reconciler, name, revisions, dry_run, wanted, forced)
            with slot.lock:
                box["results"] = r
                retired = slot.reconciler is not reconciler
            if retired:  # replaced (abandoned, reloaded) while it ran: nobody else will close it
                reconciler.close()

        t = threading.Thread(target=work, name=f"pass-{name}", daemon=True)
        log.info("pass started", cluster=name, apps=wanted, revision=short, deadline=deadline)
        slot.running = t
        slot.status.state = PassState.RUNNING
        started = time.monotonic()
        self._clock(slot, wanted, started)
        if self.observer is not None and not dry_run:
            sources = {a.name: a.source for a in cluster_apps(self.config, slot.cluster)}
            for app in wanted:
                if (rev := revisions.get(sources.get(app, ""))) is not None:
                    self.observer.started(name, app, rev.sha)
        t.start()
        end = started + deadline
        while t.is_alive() and time.monotonic() < end and not self._closing.is_set():
            t.join(min(0.2, max(0.0, end - time.monotonic())))
        with slot.lock:
            done = box.get("results")
            if done is None:
                why = "agent shutting down" if self._closing.is_set() else f"deadline {deadline:g}s"
                self._abandon(slot, reconciler, f"pass abandoned ({why})")
                slot.stuck = t
            slot.running = None
        if done is None:
            done = self._failed(slot, wanted, revisions, self._abandoned(deadline))
        # Dependencies the pass ran first count as run now too.
        self._clock(slot, [r.app for r in done], started, time.monotonic())
        return self._record_all(slot, done)

    def _still_stuck(self, slot: _Slot, apps: list[str], revisions: Revisions) -> list[ClusterResult]:
        """No pass while the one abandoned at its deadline still waits for the cluster: each of
        ``apps`` fails at once, an attempt all the same (its backoff counts from now)."""
        now = time.monotonic()
        self._clock(slot, apps, now, now)
        stuck = Failure(
            FailureReason.TIMEOUT,
            f"timed out: the pass abandoned at its {slot.cluster.settings.pass_deadline:g}s deadline is "
            "still waiting for the cluster; no new pass until it returns",
            PassState.TIMED_OUT,
        )
        return self._record_all(slot, self._failed(slot, apps, revisions, stuck))

    @staticmethod
    def _clock(slot: _Slot, apps: Iterable[str], started: float, ended: float | None = None) -> None:
        """When the pass of each of ``apps`` started and (``ended``) ended: their clocks (``due``)."""
        for app in apps:
            if app in slot.status.apps:
                st = slot.status.app(app)
                st.last_run = started
                st.last_end = ended if ended is not None else st.last_end

    def _failed(
        self, slot: _Slot, apps: list[str], revisions: Revisions, failure: Failure
    ) -> list[ClusterResult]:
        by_app = {a.name: a for a in cluster_apps(self.config, slot.cluster)}
        out = []
        for app in apps:
            rev = revisions.get(by_app[app].source) if app in by_app else None
            out.append(ClusterResult(slot.cluster.name, rev.sha if rev else "", failure=failure, app=app))
        return out

    def _record_all(self, slot: _Slot, results: list[ClusterResult]) -> list[ClusterResult]:
        for r in results:
            self.record(r)
        slot.status.settle_state()  # also when no app ran: the cluster is no longer running
        return results

    def _abandoned(self, deadline: float) -> Failure:
        """Why a pass was left behind: its deadline (state ``timed-out``), or the agent stopping."""
        if self._closing.is_set():
            return Failure(FailureReason.FENCED, "abandoned: agent shutting down")
        message = f"timed out: pass did not finish within {deadline:g}s"
        return Failure(FailureReason.TIMEOUT, message, PassState.TIMED_OUT)

    def _abandon(self, slot: _Slot, reconciler: ClusterReconciler, why: str) -> None:
        """Fence the pass's client for good and give the cluster a fresh reconciler (caller locks)."""
        lease.abandon(reconciler.client_if_open, why)
        if slot.reconciler is reconciler:
            slot.reconciler = self._reconciler(slot.cluster)

    def _reconcile(
        self,
        reconciler: ClusterReconciler,
        name: str,
        revisions: Revisions,
        dry_run: bool,
        apps: list[str],
        forced: Collection[str] = (),
    ) -> list[ClusterResult]:
        try:
            results = reconciler.reconcile_apps(revisions, dry_run=dry_run, apps=apps, force_window=forced)
        except Exception as e:  # a bug in one cluster's pass must not take down the fleet
            log.exception("reconcile crashed", cluster=name)
            internal = Failure(FailureReason.INTERNAL, f"internal error: {type(e).__name__}: {e}")
            slot = self._slots.get(name)
            results = self._failed(slot, apps, revisions, internal) if slot else []
        for result in results:
            if self.emit_events and not dry_run and (events.reportable(result) or events.api_notes(result)):
                try:
                    events.emit(
                        reconciler.client,
                        result,
                        parent_name=reconciler.parent_of(result.app or name),
                        namespace=self.config.agent.namespace,
                        component=self.config.agent.name,
                    )
                except Exception as e:  # events are best effort
                    log.warning("events not written", cluster=name, app=result.app, error=str(e))
            if self.emit_events and not dry_run and result.drift:
                self._drift_events(reconciler, name, result)
        return results

    def _drift_events(self, reconciler: ClusterReconciler, name: str, result: ClusterResult) -> None:
        """``DriftDetected`` for the drift the app's last pass did not report (best effort)."""
        slot = self._slots.get(name)
        app = result.app or name
        previous = slot.status.app(app).last_result if slot and app in slot.status.apps else None
        fresh = events.new_drift(result, previous)
        if fresh:
            try:
                events.emit_drift(
                    reconciler.client,
                    result,
                    fresh,
                    parent_name=reconciler.parent_of(app),
                    namespace=self.config.agent.namespace,
                    component=self.config.agent.name,
                )
            except Exception as e:  # events are best effort
                log.warning("drift events not written", cluster=name, app=result.app, error=str(e))

    def record(self, result: ClusterResult) -> None:
        """One app's result into its status, metrics and log."""
        slot = self._slots.get(result.cluster)
        if slot is None:  # removed by a config reload while it ran
            return
        app = result.app or result.cluster
        if app not in slot.status.apps:  # removed by a config reload while it ran
            return
        st = slot.status.app(app)
        st.last_result = result
        st.state = result.state
        suspended = st.state is PassState.SUSPENDED
        if st.state is not PassState.WAITING:  # a dependency's wait is no pass of this app
            # A pinned app ran at its source's revision too: not due again for it (``due``).
            st.last_revision = result.followed or result.revision
        if result.ok:
            st.failures = 0
            if st.state is PassState.OK:
                st.last_success_revision = result.revision
                st.last_success_at = result.finished or datetime.now(UTC)
        else:
            st.failures += 1
        self.metrics.record(result)
        self.metrics.app_state(result.cluster, app, failures=st.failures, suspended=suspended)
        if self.observer is not None:
            self.observer.finished(result)
        nxt = slot.status.next_run
        self.metrics.next_run_at(result.cluster, nxt.timestamp() if nxt else None)
        _log_result(result, app, st.state)
        slot.status.settle_state()

    def due_apps(
        self,
        name: str,
        revision: Revision | Revisions,
        *,
        base: float = BACKOFF_BASE,
        cap: float = BACKOFF_CAP,
        jitter: float = SCHEDULE_JITTER,
        now: float | None = None,
    ) -> list[str]:
        """The apps of ``name`` a scheduled pass runs now (``due.decide``): never run, a new
        revision of their source, their backoff over after failures, with the dependency they
        wait on, or (healthy) their ``reconcile_interval`` elapsed, within its jitter."""
        return list(self.schedule(name, revision, Timing(base, cap, jitter), now=now).due)

    def schedule(
        self,
        name: str,
        revision: Revision | Revisions,
        timing: Timing,
        *,
        now: float | None = None,
        woken: Collection[str] = (),
        sources: Collection[str] | None = None,
    ) -> Decision:
        """``due.decide`` on the clocks of ``name``'s apps: which are due at ``now`` and when the
        cluster's job wakes next. ``woken``: apps whose dependency rolled out since their pass;
        ``sources``: only the apps of these sources count (None: every app)."""
        slot = self._slots[name]
        revisions = revisions_of(self.config, revision)
        clocks = []
        for app in cluster_apps(self.config, slot.cluster):
            if sources is not None and app.source not in sources:
                continue
            st = slot.status.app(app.name)
            rev = revisions.get(app.source)
            # A pass that waited leaves ``last_revision`` alone (it was no pass of the app).
            waited = st.last_result if st.state is PassState.WAITING else None
            seen = waited.revision if waited else st.last_revision
            if app.helm is not None and app.helm.repository and (last := waited or st.last_result):
                seen = f"{seen} {last.chart}" if last.chart else seen  # as ``of_app`` spells it
            clocks.append(
                AppClock(
                    app.name,
                    app.settings.reconcile_interval,
                    last_run=st.last_run,
                    last_end=st.last_end,
                    failures=st.failures,
                    seen=seen,
                    current=of_app(rev, app) if rev is not None else None,
                    waiting_on=tuple(waited.waiting_on) if waited else (),
                    woken=app.name in woken,
                    recheck=st.last_result.recheck
                    if st.last_result and st.state is PassState.SYNCING
                    else None,
                )
            )
        now = time.monotonic() if now is None else now
        return decide(clocks, now, timing)

    def reconcile_one(
        self, name: str, revision: Revision | Revisions, *, dry_run: bool = False
    ) -> ClusterResult:
        return self.run_pass(name, revision, dry_run=dry_run)

    def reconcile_all(
        self, revision: Revision | Revisions, *, dry_run: bool = False, only: Iterable[str] | None = None
    ) -> list[ClusterResult]:
        """Every cluster at once, each under its own deadline: one result per (cluster, app)."""
        wanted = set(only) if only is not None else None
        names = [n for n in self._slots if wanted is None or n in wanted]
        results: dict[str, list[ClusterResult]] = {}
        threads = [
            threading.Thread(
                target=lambda n=n: results.__setitem__(n, self.run_apps(n, revision, dry_run=dry_run)),
                name=f"fleet-{n}",
                daemon=True,
            )
            for n in names
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r for n in names for r in results[n]]

    # -- config reload and shutdown ---------------------------------------------

    def update(self, config: Config) -> tuple[list[str], list[str], list[str]]:
        """Take a new config: (added, removed, changed). Removing a cluster only stops serving it."""
        old = self._slots
        new_names = {c.name for c in config.clusters}
        previous_config, self.config = self.config, config
        self.render_cache.max_entries = _cache_entries(config)
        added: list[str] = []
        removed: list[str] = []
        changed: list[str] = []
        for name in [n for n in old if n not in new_names]:
            slot = self._slots.pop(name)
            self.identities.forget(name)
            with slot.lock:
                self._abandon(slot, slot.reconciler, "cluster removed from the config")
                if slot.running is None:
                    slot.reconciler.close()
            self.metrics.remove(name)
            removed.append(name)
        for c in config.clusters:
            current = self._slots.get(c.name)
            if current is None:
                self._slots[c.name] = self._slot(c)
                added.append(c.name)
            elif current.cluster != c or previous_config.apps_of(c.name) != config.apps_of(c.name):
                if current.cluster != c:
                    self.identities.forget(c.name)  # it may reach another cluster now
                with current.lock:
                    previous = current.reconciler
                    current.cluster = c
                    current.reconciler = self._reconciler(c)
                    if current.running is None:
                        previous.close()
                self._sync_apps(current)
                changed.append(c.name)
        return added, removed, changed

    def abandon_all(self, why: str) -> None:
        """Shutdown after the grace period: fence every client; waiting passes return at once."""
        self._closing.set()
        for slot in self._slots.values():
            with slot.lock:
                lease.abandon(slot.reconciler.client_if_open, why)

    def close(self) -> None:
        for slot in self._slots.values():
            slot.reconciler.close()


def _cache_entries(config: Config) -> int:
    """Room for two revisions of every app's render: with fewer entries than apps, each pass
    evicted renders the next app needed, and every steady pass re-rendered every app."""
    return max(RenderCache.DEFAULT_ENTRIES, 2 * len(config.apps))


def _log_result(result: ClusterResult, app: str, state: PassState) -> None:
    """One app's pass in the log: a line per failed, pruned or unread object (Secret-safe), per
    API version note, and the pass's summary."""
    for r in events.reportable(result):  # one line per failed/pruned/unread object, Secret-safe
        log.log(
            30 if (events.reason_of(r) or ("",))[0] == "Warning" else 20,
            "object " + r.outcome.value,
            cluster=result.cluster,
            app=app,
            revision=result.revision[:12],
            object=str(r.key),
            detail=events.message_for(r),
        )
    for f in events.api_notes(result):
        log.warning(
            "api version " + f.problem.value,
            cluster=result.cluster,
            app=app,
            revision=result.revision[:12],
            object=str(f.key),
            detail=f.message if f.key.kind != "Secret" else f.api_version,
        )
    log.info(
        "pass finished",
        cluster=result.cluster,
        app=app,
        revision=result.revision[:12],
        state=state,
        applied=result.applied,
        unchanged=result.count(Outcome.UNCHANGED),
        pruned=result.count(Outcome.PRUNED),
        failed=result.failed,
        error=(result.error or "").splitlines()[0] if result.error else None,
        waiting_on=list(result.waiting_on) or None,
        conflicts=len(result.conflicts) or None,
    )
