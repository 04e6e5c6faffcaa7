"""An app's sync in order: each object's wave and hook read from its annotations, and the steps
they make (``model.ordering``; docs/ordering.md). Pure; the pipeline reads it for every app.

Argo CD's annotations are read as Argo CD documents them, Helm's as Helm's own ``helm install``
and ``helm upgrade`` do (not Argo's mapping of them): an install hook runs only on an app's first
install, an upgrade hook only on a later revision, and a ``test`` hook only on ``gitops-agent
test``. Where both tools annotate one object, Argo CD's hook annotation wins, as it does in Argo.

One difference on purpose: Argo CD reads a sync wave that is not an integer as 0, which moves
the object silently; here it is a render error naming the object and the annotation. Helm's
annotations are read as Helm reads them (an unknown event or delete policy ignored, a weight
that is not an integer 0): what Helm accepts, the agent accepts the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from agent.errors import RenderError, RenderProblem
from agent.model import (
    ARGOCD_HOOK,
    ARGOCD_HOOK_DELETE_POLICY,
    HELM_HOOK,
    HELM_HOOK_DELETE_POLICY,
    HELM_HOOK_WEIGHT,
    SYNC_WAVE,
    DeletePolicy,
    DesiredObject,
    Hook,
    HookTool,
    Left,
    NotRun,
    Ordered,
    Stage,
    Step,
    SyncKind,
    SyncOrder,
    phase_of,
)

#: Go's ``strconv.Atoi`` syntax, which both tools parse these annotations with.
_INTEGER = re.compile(r"^[+-]?[0-9]+$")

#: Argo CD's hook types → the stage each runs in (None: a delete hook, not run by a sync).
ARGOCD_STAGES: Mapping[str, Stage | None] = {
    "PreSync": Stage.PRE,
    "Sync": Stage.SYNC,
    "PostSync": Stage.POST,
    "SyncFail": Stage.FAIL,
    "Skip": None,
    "PreDelete": None,
    "PostDelete": None,
}
ARGOCD_POLICIES: Mapping[str, DeletePolicy] = {
    "BeforeHookCreation": DeletePolicy.BEFORE_HOOK_CREATION,
    "HookSucceeded": DeletePolicy.HOOK_SUCCEEDED,
    "HookFailed": DeletePolicy.HOOK_FAILED,
}
#: Helm's events per sync kind → the stage each runs in.
HELM_STAGES: Mapping[SyncKind, Mapping[str, Stage]] = {
    SyncKind.INSTALL: {"pre-install": Stage.PRE, "post-install": Stage.POST},
    SyncKind.UPGRADE: {"pre-upgrade": Stage.PRE, "post-upgrade": Stage.POST},
}
HELM_SYNC_EVENTS = frozenset({"pre-install", "post-install", "pre-upgrade", "post-upgrade"})
HELM_TEST_EVENTS = frozenset({"test", "test-success"})  # ``test-success``: Helm 2's name, still read
HELM_DEFERRED_EVENTS = frozenset({"pre-delete", "post-delete", "pre-rollback", "post-rollback"})
HELM_EVENTS = HELM_SYNC_EVENTS | HELM_TEST_EVENTS | HELM_DEFERRED_EVENTS
_HELM_POLICIES = frozenset(p.value for p in DeletePolicy)  # Helm's spelling is ours


def _annotations(obj: DesiredObject) -> dict[str, Any]:
    annotations = (obj.manifest.get("metadata") or {}).get("annotations") or {}
    return annotations if isinstance(annotations, dict) else {}


def _items(raw: str) -> list[str]:
    return [p.strip() for p in raw.split(",") if p.strip()]


def _integer(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and _INTEGER.match(value) else None


class _Reader:
    """Reads the annotations of one app's objects, gathering every problem before failing."""

    def __init__(self, kind: SyncKind, *, helm_hooks: bool = True) -> None:
        self.kind = kind
        self.helm_hooks = helm_hooks
        self.problems: list[RenderProblem] = []

    def problem(self, obj: DesiredObject, annotation: str, message: str) -> None:
        where = obj.provenance
        self.problems.append(
            RenderProblem(where.file, f"{obj.key}: annotation {annotation}: {message}", line=where.line)
        )

    def wave(self, obj: DesiredObject, annotations: Mapping[str, Any]) -> int:
        if SYNC_WAVE not in annotations:
            return 0
        value = _integer(annotations[SYNC_WAVE])
        if value is None:
            self.problem(obj, SYNC_WAVE, f"{annotations[SYNC_WAVE]!r} is not an integer (a sync wave)")
            return 0
        return value

    def argo_hook(self, obj: DesiredObject, raw: Any, annotations: Mapping[str, Any]) -> Hook | None:
        types = _items(raw) if isinstance(raw, str) else []
        unknown = [t for t in types if t not in ARGOCD_STAGES]
        if unknown or not types:
            known = ", ".join(ARGOCD_STAGES)
            self.problem(obj, ARGOCD_HOOK, f"{raw!r} names no hook type Argo CD knows (one of {known})")
            return None
        policies: set[DeletePolicy] = set()
        raw_policy = annotations.get(ARGOCD_HOOK_DELETE_POLICY)
        for p in _items(raw_policy) if isinstance(raw_policy, str) else []:
            if p not in ARGOCD_POLICIES:
                known = ", ".join(ARGOCD_POLICIES)
                self.problem(obj, ARGOCD_HOOK_DELETE_POLICY, f"{p!r} is not a delete policy (one of {known})")
                continue
            policies.add(ARGOCD_POLICIES[p])
        return Hook(
            HookTool.ARGOCD,
            tuple(types),
            frozenset(policies or {DeletePolicy.BEFORE_HOOK_CREATION}),
            self.wave(obj, annotations),
        )

    @staticmethod
    def helm_hook(raw: Any, annotations: Mapping[str, Any]) -> Hook:
        events = [e.lower() for e in _items(raw)] if isinstance(raw, str) else []
        raw_policy = annotations.get(HELM_HOOK_DELETE_POLICY)
        named = _items(raw_policy) if isinstance(raw_policy, str) else []
        policies = {DeletePolicy(p) for p in named if p in _HELM_POLICIES}
        return Hook(
            HookTool.HELM,
            tuple(e for e in events if e in HELM_EVENTS),
            frozenset(policies or {DeletePolicy.BEFORE_HOOK_CREATION}),
            _integer(annotations.get(HELM_HOOK_WEIGHT)) or 0,
        )

    def place(self, obj: DesiredObject) -> tuple[Ordered, tuple[Stage, ...], NotRun | None]:
        """``obj`` ordered, the stages it runs in this sync, and why it runs in none."""
        annotations = _annotations(obj)
        wave = self.wave(obj, annotations)
        if ARGOCD_HOOK in annotations:
            hook = self.argo_hook(obj, annotations[ARGOCD_HOOK], annotations)
            if hook is None:
                return Ordered(obj.key, wave), (), None
            ordered = Ordered(obj.key, wave, hook)
            if "Skip" in hook.events:
                return ordered, (), NotRun.SKIP
            stages = tuple(dict.fromkeys(s for t in hook.events if (s := ARGOCD_STAGES[t]) is not None))
            return ordered, stages, None if stages else NotRun.DELETE_OR_ROLLBACK
        if HELM_HOOK in annotations and self.helm_hooks:
            hook = self.helm_hook(annotations[HELM_HOOK], annotations)
            ordered = Ordered(obj.key, hook.weight, hook)
            mine = HELM_STAGES[self.kind]
            stages = tuple(dict.fromkeys(mine[e] for e in hook.events if e in mine))
            return ordered, stages, None if stages else _helm_not_run(hook.events)
        return Ordered(obj.key, wave), (Stage.SYNC,), None


def _helm_not_run(events: Iterable[str]) -> NotRun:
    named = set(events)
    if named & HELM_SYNC_EVENTS:
        return NotRun.OTHER_SYNC
    if named & HELM_TEST_EVENTS:
        return NotRun.TEST
    return NotRun.DELETE_OR_ROLLBACK if named & HELM_DEFERRED_EVENTS else NotRun.NO_EVENT


def _steps(stage: Stage, placed: Iterable[Ordered]) -> tuple[Step, ...]:
    """``placed`` grouped by wave (ascending), each group in apply order."""
    waves: dict[int, list[Ordered]] = {}
    for o in placed:
        waves.setdefault(o.wave, []).append(o)
    return tuple(
        Step(stage, w, tuple(sorted(waves[w], key=lambda o: (phase_of(o.key), o.key)))) for w in sorted(waves)
    )


def sync_order(objects: Iterable[DesiredObject], kind: SyncKind, *, helm_hooks: bool = True) -> SyncOrder:
    """The steps of one sync of an app's ``objects``: ``RenderError`` naming every object whose
    ordering annotations cannot be read (nothing of the app is applied then: fail closed).

    ``helm_hooks=False``: Helm's hook annotations are not read (each such object an ordinary one
    in its wave); the pass and ``diff`` read them (docs/ordering.md)."""
    reader = _Reader(kind, helm_hooks=helm_hooks)
    by_stage: dict[Stage, list[Ordered]] = {s: [] for s in Stage}
    left: list[Left] = []
    for obj in objects:
        ordered, stages, why = reader.place(obj)
        for stage in stages:
            by_stage[stage].append(ordered)
        if why is not None:
            left.append(Left(ordered, why))
    if reader.problems:
        raise RenderError(reader.problems)
    steps = (*_steps(Stage.PRE, by_stage[Stage.PRE]), *_steps(Stage.SYNC, by_stage[Stage.SYNC]))
    return SyncOrder(
        (*steps, *_steps(Stage.POST, by_stage[Stage.POST])),
        _steps(Stage.FAIL, by_stage[Stage.FAIL]),
        tuple(sorted(left, key=lambda x: x.ordered.key)),
    )


def live_wave(manifest: Mapping[str, Any]) -> int:
    """The sync wave a live object was applied in (what a prune orders by); 0 if unreadable."""
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    value = _integer(annotations.get(SYNC_WAVE)) if isinstance(annotations, dict) else None
    return value or 0


__all__ = ["live_wave", "sync_order"]
