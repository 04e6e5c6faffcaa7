"""Health: has an object (and an app) actually rolled out, and if not, what holds it up.

Pure: called by whatever follows health after apply (the objects it read, their children
grouped by owner UID), by reports and by tests; no client, no clock. ``assess`` follows kstatus
(sigs.k8s.io/cli-utils v0.37.2): deletion, then ``metadata.generation`` against
``status.observedGeneration``, then ``Reconciling``/``Stalled``, then a rule per kind
(``agent.plan.health_kinds``), else the ``Ready`` condition, else Current. It closes the gaps
docs/health.md lists (the oracle test, tests/test_health_oracle.py, holds us to that list).
Custom CEL checks (``HealthCheck``, compiled with the config) replace all of it for their kind.
``worst`` and ``summarize`` make one app's health of its objects'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from agent.config.health_checks import CheckError, HealthCheck
from agent.model import HEALTH, HEALTH_IGNORE, Health, HealthState, ObjectKey, split_api_version
from agent.plan.health_kinds import RULES
from agent.plan.health_status import (
    Children,
    Malformed,
    Obj,
    conditions,
    current,
    field,
    from_condition,
    held_by,
    in_progress,
)

__all__ = ["CHILD_KINDS", "ORDER", "assess", "child_index", "excluded", "summarize", "worst"]

#: For each kind whose blocker is a child: the kinds the follower lists (by owner UID) to name it.
CHILD_KINDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "Deployment": ("ReplicaSet", "Pod"),
        "StatefulSet": ("Pod",),
        "DaemonSet": ("Pod",),
        "ReplicaSet": ("Pod",),
        "Job": ("Pod",),
    }
)

#: App-level order, best first: an app is as healthy as its least healthy object. Unknown ranks
#: just below Failed (we cannot tell, so we never say better); Suspended above Current, so an
#: app with a paused Deployment says so.
ORDER: tuple[HealthState, ...] = (
    HealthState.CURRENT,
    HealthState.SUSPENDED,
    HealthState.IN_PROGRESS,
    HealthState.TERMINATING,
    HealthState.NOT_FOUND,
    HealthState.UNKNOWN,
    HealthState.FAILED,
)
_RANK = {s: i for i, s in enumerate(ORDER)}
_NO_CHILDREN: Children = MappingProxyType({})


def excluded(obj: Obj) -> bool:
    """Annotation ``gitops-agent.io/health: ignore``: the object counts for no health at all."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(HEALTH) == HEALTH_IGNORE


def assess(obj: Obj, *, children: Children = _NO_CHILDREN, checks: Sequence[HealthCheck] = ()) -> Health:
    """One object's health from its own status; ``children`` (owner UID → owned objects) name blockers."""
    try:
        return _assess(obj, children, checks)
    except Malformed as e:
        return Health(HealthState.UNKNOWN, str(e), reason="MalformedStatus")


def _assess(obj: Obj, children: Children, checks: Sequence[HealthCheck]) -> Health:
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return Health(HealthState.TERMINATING, "being deleted", reason="Terminating")
    check = next((c for c in checks if c.matches(obj)), None)
    if check is not None:
        return _custom(obj, check)
    if (decided := _generic(obj)) is not None:
        return decided
    group, _ = split_api_version(str(obj.get("apiVersion", "")))
    rule = RULES.get((group, str(obj.get("kind", ""))))
    if rule is not None:
        return rule(obj, children)
    ready = next((c for c in conditions(obj) if c.get("type") == "Ready"), None)
    if ready is None:
        return current("no status to wait for")
    if ready.get("status") == "True":
        return current("Ready")
    # Ready=False is a controller still working (or saying why it waits): never Failed by itself.
    return held_by(from_condition(obj, ready, "NotReady", "not Ready"), HealthState.IN_PROGRESS)


def _observed(obj: Obj) -> Health | None:
    generation = field(obj, "metadata.generation")
    observed = field(obj, "status.observedGeneration")
    if isinstance(generation, int) and isinstance(observed, int) and generation != observed:
        return in_progress(
            "LatestGenerationNotObserved", f"generation {generation} not observed yet (at {observed})"
        )
    return None


def _generic(obj: Obj) -> Health | None:
    """kstatus's rules for every kind: the controller saw the latest spec, and its own conditions."""
    if (pending := _observed(obj)) is not None:
        return pending
    for c in conditions(obj):
        if c.get("type") == "Reconciling" and c.get("status") == "True":
            return in_progress(str(c.get("reason") or "Reconciling"), str(c.get("message") or "reconciling"))
        if c.get("type") == "Stalled" and c.get("status") == "True":
            return held_by(from_condition(obj, c, "Stalled", "stalled"), HealthState.FAILED)
    return None


def _custom(obj: Obj, check: HealthCheck) -> Health:
    """Flux's order: generation, then ``in_progress``, ``failed``, ``current``; none true: InProgress."""
    if (pending := _observed(obj)) is not None:
        return pending
    for name, expression, state in (
        ("in_progress", check.in_progress, HealthState.IN_PROGRESS),
        ("failed", check.failed, HealthState.FAILED),
        ("current", check.current, HealthState.CURRENT),
    ):
        if expression is None:
            continue
        try:
            true = expression(obj)
        except CheckError as e:
            return Health(
                HealthState.UNKNOWN, f"health check {name} {expression.source!r}: {e}", reason="CheckError"
            )
        if true:
            return Health(state, f"health check {name}: {expression.source}", reason=f"Check{_camel(name)}")
    return in_progress("CheckPending", "no health check expression holds yet")


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def worst(healths: Iterable[Health | HealthState]) -> HealthState:
    """The least healthy state of ``healths`` in ``ORDER``; Current when there are none."""
    states = (h.state if isinstance(h, Health) else h for h in healths)
    return max(states, key=_RANK.__getitem__, default=HealthState.CURRENT)


def summarize(healths: Mapping[ObjectKey, Health]) -> Health:
    """One app's health: the worst state, counted, naming the first object in it and its blocker."""
    if not healths:
        return current("no objects to wait for")
    state = worst(h.state for h in healths.values())
    key, first = min(((k, h) for k, h in healths.items() if h.state is state), key=lambda kh: kh[0])
    done = sum(1 for h in healths.values() if h.state is HealthState.CURRENT)
    counted = f"{done} of {len(healths)} objects Current"
    if state is HealthState.CURRENT:
        return current(counted)
    return Health(state, f"{counted}; {key}: {first.message}", first.blocker, first.reason, first.cause)


def child_index(objects: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Owner UID → the objects it owns (by ``ownerReferences``): the ``children`` ``assess`` takes."""
    index: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objects:
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
            if isinstance(ref, Mapping) and ref.get("uid"):
                index.setdefault(str(ref["uid"]), []).append(obj)
    return index
