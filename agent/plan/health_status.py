"""Reading an object's status for health, and naming what blocks it: pure helpers.

``agent.plan.health_kinds`` (the rule per kind) and ``agent.plan.health`` (the generic rules)
use them: typed reads that raise ``Malformed`` when a status field has a type the API never
gives it (the object is then Unknown), conditions, the ``Health`` builders, and the
``Blocker`` found among children (the newest ReplicaSet of a Deployment, a Pod that cannot
run) in the kubelet's, the scheduler's or the controller's own words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.model import Blocker, Health, HealthState

Obj = Mapping[str, Any]
Children = Mapping[str, Sequence[Obj]]


#: Container waiting reasons that do not pass by themselves: the Pod has Failed (kstatus reads
#: only CrashLoopBackOff, and only in a running Pod).
FAILING_WAITING = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
#: The Deployment controller's annotation numbering its ReplicaSets: the highest is the new one.
REVISION = "deployment.kubernetes.io/revision"


class Malformed(Exception):
    """A status field has a type the API never gives it: the object's health is Unknown."""


# -- reading fields ------------------------------------------------------------------------


def field(obj: Obj, path: str) -> Any:
    """``obj`` at a dotted path (``status.replicas``); None when any step is missing."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def number(obj: Obj, path: str, default: int) -> int:
    value = field(obj, path)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{path} is {value!r}, not an integer")
    return value


def text(obj: Obj, path: str, default: str = "") -> str:
    value = field(obj, path)
    if value is None:
        return default
    if not isinstance(value, str):
        raise Malformed(f"{path} is {value!r}, not a string")
    return value


def conditions(obj: Obj) -> list[Obj]:
    found = field(obj, "status.conditions")
    if found is None:
        return []
    if not isinstance(found, list) or not all(isinstance(c, Mapping) for c in found):
        raise Malformed("status.conditions is not a list of conditions")
    return found


def condition(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in conditions(obj) if c.get("type") == kind), None)


def holds(obj: Obj, kind: str, status: str = "True") -> Obj | None:
    """The condition ``kind`` when its status is ``status``."""
    c = condition(obj, kind)
    return c if c is not None and c.get("status") == status else None


def name_of(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def uid_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def blocker(obj: Obj, reason: str, message: str = "") -> Blocker:
    namespace, name = name_of(obj)
    return Blocker(str(obj.get("kind", "")), namespace, name, reason or "Unknown", message)


def from_condition(obj: Obj, c: Obj, fallback: str, said: str = "") -> Blocker:
    """The object blocks itself, in the words of one of its conditions (``said`` when it has none)."""
    return blocker(obj, str(c.get("reason") or fallback), str(c.get("message") or said))


def current(message: str, reason: str = "") -> Health:
    return Health(HealthState.CURRENT, message, reason=reason)


def in_progress(reason: str, message: str, why: Blocker | None = None) -> Health:
    return Health(HealthState.IN_PROGRESS, message, why, reason)


def failed(reason: str, message: str, why: Blocker | None = None) -> Health:
    return Health(HealthState.FAILED, message, why, reason)


def suspended(reason: str, message: str) -> Health:
    return Health(HealthState.SUSPENDED, message, reason=reason)


def held_by(why: Blocker, state: HealthState) -> Health:
    """An object its own ``Blocker`` explains: the message is the blocker's, said once."""
    return Health(state, why.message, why, why.reason)


# -- blockers among children ----------------------------------------------------------------


def pod_problem(pod: Obj) -> Blocker | None:
    """What keeps one Pod from running, in the kubelet's or the scheduler's words."""
    for key in ("status.initContainerStatuses", "status.containerStatuses"):
        statuses = field(pod, key) or []
        for cs in statuses if isinstance(statuses, list) else ():
            waiting = field(cs, "state.waiting") if isinstance(cs, Mapping) else None
            if isinstance(waiting, Mapping) and waiting.get("reason") in FAILING_WAITING:
                return blocker(pod, str(waiting["reason"]), str(waiting.get("message") or ""))
    if text(pod, "status.phase") == "Failed":
        if reason := text(pod, "status.reason"):  # the kubelet's own: Evicted, DeadlineExceeded
            return blocker(pod, reason, text(pod, "status.message"))
        return exited(pod) or blocker(pod, "PodFailed", text(pod, "status.message"))
    scheduled = holds(pod, "PodScheduled", "False")
    if scheduled is not None:
        return from_condition(pod, scheduled, "Unschedulable")
    return None


def exited(pod: Obj) -> Blocker | None:
    """The first container that ended with a non-zero exit code, in the runtime's words."""
    statuses = field(pod, "status.containerStatuses") or []
    for cs in statuses if isinstance(statuses, list) else ():
        ended = field(cs, "state.terminated") if isinstance(cs, Mapping) else None
        if isinstance(ended, Mapping) and ended.get("exitCode") not in (None, 0):
            said = f"container {cs.get('name')} exited with code {ended['exitCode']}"
            return blocker(pod, str(ended.get("reason") or "Error"), said)
    return None


def pods_blocker(pods: Sequence[Obj]) -> Blocker | None:
    """The first Pod (by name) that cannot run; one whose containers fail before one not scheduled."""
    found = [b for b in (pod_problem(p) for p in sorted(pods, key=name_of)) if b is not None]
    return next((b for b in found if b.reason != "Unschedulable"), found[0] if found else None)


def deployment_blocker(obj: Obj, children: Children) -> Blocker | None:
    """The new ReplicaSet's failure to create Pods, else one of its Pods that cannot run."""
    sets = children.get(uid_of(obj), ())
    if not sets:
        return None

    def revision(rs: Obj) -> int:
        value = str(((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION, ""))
        return int(value) if value.isdigit() else -1

    newest = max(sets, key=revision)
    if (c := holds(newest, "ReplicaFailure")) is not None:
        return from_condition(newest, c, "ReplicaFailure")
    return pods_blocker(children.get(uid_of(newest), ()))


def own_pods_blocker(obj: Obj, children: Children) -> Blocker | None:
    return pods_blocker(children.get(uid_of(obj), ()))
