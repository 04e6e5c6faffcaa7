"""One class per fault kind: ``inject``, ``observe`` (did its effect really happen?), ``heal``.

Called by ``benchmarks.chaos.runner`` for each step of its seeded schedule. A fault counts
only when ``observe`` returned True: the process really stopped (``/proc`` state ``T``) or
died (its port refuses), the endpoint really hung, the agent's ``/status`` shows the pass that
saw the broken commit, the brake's refusal, the 401, the source error. What the agent's status
says is read from its typed fields (``reason``, ``prune_reason``), never from messages.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from agent.dev import localcluster
from benchmarks.chaos import content
from benchmarks.chaos.content import NS, NS_K, Key, Mode
from benchmarks.chaos.world import (
    PROXIED_CLUSTER,
    SERVICE_ACCOUNT,
    TOKEN_CLUSTER,
    World,
    port_refuses,
    proc_state,
)

OBSERVE_SECONDS = 30.0


@dataclass
class Ledger:
    """What the runner knows besides the clusters: Git's last full content and what users wrote."""

    #: Per cluster, the last content with every object (what the brake and fail-closed protect).
    basis: dict[str, content.ClusterContent] = field(default_factory=dict)
    #: Per cluster, fields other managers set: key → {"label:NAME"|"annotation:NAME"|"replicas": value}.
    foreign_fields: dict[str, dict[Key, dict[str, Any]]] = field(default_factory=dict)
    #: Per cluster, objects outside every inventory: key → (uid, resourceVersion).
    foreign_objects: dict[str, dict[Key, tuple[str, str]]] = field(default_factory=dict)


@dataclass
class Step:
    """One step of the schedule, and what its fault's inject left for observe and heal."""

    index: int
    kind: str
    cluster: str
    rng: random.Random
    world: World
    ledger: Ledger
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    facts: dict[str, Any] = field(default_factory=dict)
    #: Where the fault stopped a cluster's control plane (the invariants skip it until healed).
    down: str | None = None


def wait_until(done: Callable[[], bool], timeout: float = OBSERVE_SECONDS, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if done():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(every)


def rows(world: World, cluster: str | None = None) -> list[dict[str, Any]]:
    doc = world.agent.status()
    if doc is None:
        return []
    return [r for r in doc["clusters"] if cluster is None or r["cluster"] == cluster]


def _finished_after(row: dict[str, Any], t: datetime) -> bool:
    at = row.get("last_run_at")
    return isinstance(at, str) and datetime.fromisoformat(at) >= t


def _row_saw(world: World, cluster: str, app: str, check: Callable[[dict[str, Any]], bool]) -> bool:
    return any(r["app"] == app and check(r) for r in rows(world, cluster))


def _all_reached(world: World, cluster: str | None, sha: str) -> bool:
    found = rows(world, cluster)
    return bool(found) and all(r["last_success_revision"] == sha for r in found)


class Fault:
    kind: ClassVar[str]
    #: The fault stops part of a control plane: skip that cluster in checks until healed.
    stops_cluster: ClassVar[bool] = False
    #: Which clusters it may target (None: any).
    only: ClassVar[str | None] = None

    def inject(self, s: Step) -> None:
        raise NotImplementedError

    def observe(self, s: Step) -> bool:
        raise NotImplementedError

    def heal(self, s: Step) -> None:
        pass


# ---------------------------------------------------------------- control planes


class ApiserverStop(Fault):
    kind = "apiserver-sigstop"
    stops_cluster = True

    def inject(self, s: Step) -> None:
        pid = s.world.pid(s.cluster, localcluster.APISERVER)
        assert pid is not None, f"{s.cluster}: no kube-apiserver to stop"
        s.facts["pid"] = pid
        os.kill(pid, signal.SIGSTOP)

    def observe(self, s: Step) -> bool:
        ok = wait_until(lambda: proc_state(s.facts["pid"]) in ("T", "t"), 5, 0.05)
        time.sleep(s.rng.uniform(2.0, 5.0))  # the fault is the pause itself: hold it through a pass or two
        return ok

    def heal(self, s: Step) -> None:
        os.kill(s.facts["pid"], signal.SIGCONT)


class _Kill(Fault):
    stops_cluster = True
    component: ClassVar[str]

    def _port(self, s: Step) -> int:
        ports = s.world.clusters[s.cluster].ports
        return ports.etcd if self.component == localcluster.ETCD else ports.apiserver

    def inject(self, s: Step) -> None:
        pid = s.world.pid(s.cluster, self.component)
        assert pid is not None, f"{s.cluster}: no {self.component} to kill"
        s.facts["pid"] = pid
        os.kill(pid, signal.SIGKILL)

    def observe(self, s: Step) -> bool:
        gone = wait_until(
            lambda: proc_state(s.facts["pid"]) in ("X", "Z") and port_refuses(self._port(s)), 10, 0.05
        )
        time.sleep(s.rng.uniform(1.0, 3.0))
        return gone

    def heal(self, s: Step) -> None:
        localcluster.status(s.cluster, s.world.state_dir)  # reaps our dead child, so its pid reads as gone
        localcluster.restart_component(s.cluster, s.world.state_dir, self.component, timeout=120)


class ApiserverKill(_Kill):
    kind = "apiserver-kill"
    component = localcluster.APISERVER


class EtcdKill(_Kill):
    kind = "etcd-kill"
    component = localcluster.ETCD


class CredentialsRevoke(Fault):
    kind = "credentials-revoke"
    only = TOKEN_CLUSTER

    def inject(self, s: Step) -> None:
        localcluster.revoke(s.cluster, s.world.state_dir, SERVICE_ACCOUNT)
        s.facts["at"] = datetime.now(UTC)

    def observe(self, s: Step) -> bool:
        return _pass_failed_after(s, ("unauthorized", "forbidden"))

    def heal(self, s: Step) -> None:
        localcluster.token(s.cluster, s.world.state_dir, SERVICE_ACCOUNT)


def _pass_failed_after(s: Step, reasons: tuple[str, ...]) -> bool:
    """A pass of the target's plain app finished after the fault, failed for one of ``reasons``."""
    at = s.facts["at"]
    return wait_until(
        lambda: _row_saw(
            s.world,
            s.cluster,
            content.plain_app(s.cluster),
            lambda r: r["reason"] in reasons and _finished_after(r, at),
        )
    )


class EndpointHang(Fault):
    kind = "endpoint-hang"
    only = PROXIED_CLUSTER

    def inject(self, s: Step) -> None:
        assert s.world.proxy is not None
        s.world.proxy.hang()
        s.facts["at"] = datetime.now(UTC)

    def observe(self, s: Step) -> bool:
        assert s.world.proxy is not None
        if s.world.proxy.answers():
            return False
        return _pass_failed_after(s, ("timeout", "unreachable"))

    def heal(self, s: Step) -> None:
        assert s.world.proxy is not None
        s.world.proxy.release()


# ---------------------------------------------------------------- the agent and Git


class AgentKill(Fault):
    kind = "agent-kill"

    def inject(self, s: Step) -> None:
        # A new generation everywhere, so the agent is applying when it dies.
        _next(s, rotate=False, every_cluster=True)
        s.facts["sha"] = s.world.git.commit(f"step {s.index}: agent-kill: new generation")
        s.facts["mid_pass"] = wait_until(
            lambda: any(r["state"] == "running" for r in rows(s.world)), 15, 0.02
        )
        s.world.watch.agent_down = True
        s.facts["code"] = s.world.agent.kill()

    def observe(self, s: Step) -> bool:
        return bool(s.facts["mid_pass"]) and s.facts["code"] == -signal.SIGKILL

    def heal(self, s: Step) -> None:
        s.world.agent.start()
        s.world.watch.agent_down = False


class GitDown(Fault):
    kind = "git-down"

    def inject(self, s: Step) -> None:
        s.world.git.stop()

    def observe(self, s: Step) -> bool:
        if not port_refuses(s.world.git.port):
            return False

        def source_error() -> bool:
            doc = s.world.agent.status()
            return bool(doc and doc.get("source_error"))

        return wait_until(source_error, 20)

    def heal(self, s: Step) -> None:
        s.world.git.start()


def _next(s: Step, *, rotate: bool, every_cluster: bool = False) -> None:
    for c in list(s.world.git.contents) if every_cluster else [s.cluster]:
        s.world.git.contents[c] = s.ledger.basis[c] = s.ledger.basis[c].next(rotate=rotate)


def _reached(s: Step, cluster: str | None = None) -> bool:
    return wait_until(lambda: _all_reached(s.world, cluster, s.facts["sha"]))


class ForcePush(Fault):
    kind = "force-push"

    def inject(self, s: Step) -> None:
        same = s.rng.random() < 0.5
        s.facts["same"] = same
        if not same:
            _next(s, rotate=True)
        old = s.world.git.head()
        s.facts["sha"] = s.world.git.force_push(
            f"step {s.index}: force-push ({'same' if same else 'other'} content)"
        )
        s.facts["rewritten"] = not s.world.git.is_ancestor(old, s.facts["sha"])

    def observe(self, s: Step) -> bool:
        return bool(s.facts["rewritten"]) and _reached(s, s.cluster)


class EmptyCommit(Fault):
    kind = "empty-commit"

    def inject(self, s: Step) -> None:
        s.facts["sha"] = s.world.git.commit(f"step {s.index}: empty commit")

    def observe(self, s: Step) -> bool:
        return _reached(s)


class _BrokenCommit(Fault):
    mode: ClassVar[Mode]
    #: Which of the cluster's apps the broken file belongs to.
    plain: ClassVar[bool]
    #: What the app's row must show at the broken revision.
    expect: ClassVar[tuple[str, str]]

    def inject(self, s: Step) -> None:
        s.world.git.contents[s.cluster] = replace(s.ledger.basis[s.cluster], mode=self.mode)
        s.facts["sha"] = s.world.git.commit(f"step {s.index}: {self.kind} in {s.cluster}")

    def observe(self, s: Step) -> bool:
        field_name, value = self.expect
        app = content.plain_app(s.cluster) if self.plain else content.kust_app(s.cluster)
        return wait_until(
            lambda: _row_saw(
                s.world, s.cluster, app, lambda r: r["revision"] == s.facts["sha"] and r[field_name] == value
            )
        )

    def heal(self, s: Step) -> None:
        s.world.git.contents[s.cluster] = s.ledger.basis[s.cluster]
        s.world.git.commit(f"step {s.index}: {self.kind} in {s.cluster} fixed")


class RenderError(_BrokenCommit):
    kind = "render-error"
    mode = Mode.BROKEN_PLAIN
    plain = True
    expect = ("reason", "render")


class KustomizeError(_BrokenCommit):
    kind = "kustomize-error"
    mode = Mode.BROKEN_KUST
    plain = False
    expect = ("reason", "render")


class MassRemoval(_BrokenCommit):
    kind = "mass-removal"
    mode = Mode.MASS
    plain = True
    expect = ("prune_reason", "brake")


# ---------------------------------------------------------------- users and controllers


class ForeignEdit(Fault):
    """``kubectl label`` and ``annotate`` on an object the agent manages, then a Git change to it."""

    kind = "foreign-edit"

    def inject(self, s: Step) -> None:
        choices: list[Key] = [
            ("ConfigMap", NS, "cm-00"),
            ("ConfigMap", NS, f"extra-{s.rng.randrange(content.EXTRA_CONFIGMAPS)}"),
            ("Deployment", NS, "web"),
            ("ConfigMap", NS_K, f"k-{s.rng.randrange(content.KUST_CONFIGMAPS)}"),
        ]
        key = choices[s.rng.randrange(len(choices))]
        kind, ns, name = key
        value = f"s{s.index}"
        target = f"{kind.lower()}/{name}"
        s.world.kubectl(s.cluster, "-n", ns, "label", "--overwrite", target, f"chaos.user/owner={value}")
        s.world.kubectl(s.cluster, "-n", ns, "annotate", "--overwrite", target, f"chaos.user/note={value}")
        s.ledger.foreign_fields.setdefault(s.cluster, {})[key] = {
            "label:chaos.user/owner": value,
            "annotation:chaos.user/note": value,
        }
        s.facts["key"] = key
        _next(s, rotate=False)
        s.facts["sha"] = s.world.git.commit(f"step {s.index}: new generation after a user's edit")

    def observe(self, s: Step) -> bool:
        kind, ns, name = s.facts["key"]
        path = f"/api/v1/namespaces/{ns}/configmaps/{name}"
        if kind == "Deployment":
            path = f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"
        code, body = s.world.api(s.cluster, "GET", path)
        edited = (
            code == 200 and (body["metadata"].get("labels") or {}).get("chaos.user/owner") == f"s{s.index}"
        )
        return edited and _reached(s, s.cluster)


class DriftEdit(Fault):
    """``kubectl patch`` of a field Git declares: the agent must put Git's value back."""

    kind = "drift-edit"

    def inject(self, s: Step) -> None:
        out = s.world.kubectl(
            s.cluster,
            "-n",
            NS,
            "patch",
            "configmap",
            content.DRIFT_TARGET,
            "--type=merge",
            "-p",
            json.dumps({"data": {"mode": f"drifted-{s.index}"}}),
            "-o",
            "json",
        )
        s.facts["patched"] = json.loads(out)["data"]["mode"]

    def observe(self, s: Step) -> bool:
        return bool(s.facts["patched"] == f"drifted-{s.index}")


class HpaScale(Fault):
    """A controller scales a Deployment through ``/scale`` with its own field manager: kept."""

    kind = "hpa-scale"

    def inject(self, s: Step) -> None:
        name = list(content.DEPLOYMENTS)[s.rng.randrange(len(content.DEPLOYMENTS))]
        replicas = s.rng.randint(3, 9)
        out = s.world.kubectl(
            s.cluster,
            "-n",
            NS,
            "patch",
            "deployment",
            name,
            "--subresource=scale",
            "--field-manager=chaos-hpa",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"replicas": replicas}}),
            "-o",
            "json",
        )
        s.facts["scaled"] = json.loads(out)["spec"]["replicas"] == replicas
        s.ledger.foreign_fields.setdefault(s.cluster, {})[("Deployment", NS, name)] = {"replicas": replicas}
        _next(s, rotate=False)
        s.facts["sha"] = s.world.git.commit(f"step {s.index}: new generation after a scale")

    def observe(self, s: Step) -> bool:
        return bool(s.facts["scaled"]) and _reached(s, s.cluster)


FAULTS: dict[str, Fault] = {
    f.kind: f
    for f in (
        ApiserverStop(),
        ApiserverKill(),
        EtcdKill(),
        AgentKill(),
        CredentialsRevoke(),
        EndpointHang(),
        GitDown(),
        ForcePush(),
        RenderError(),
        KustomizeError(),
        EmptyCommit(),
        MassRemoval(),
        ForeignEdit(),
        DriftEdit(),
        HpaScale(),
    )
}
