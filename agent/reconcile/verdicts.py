"""One app's verdicts in a pass, with the no-op memo that spares re-planning unchanged objects.

``ClusterReconciler`` keeps one ``NoopMemo`` per app (the apps' plan options differ: each has
its own membership label) and asks it for the verdicts of each chunk of listed objects, on the
listing threads. ``plan_object`` is a pure function of the desired object, the live object and
the options, and a resourceVersion names exactly one stored state of an object, so an equal
desired object against the same live version gets the same verdict without re-planning.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.model import Action, AppConflict, Change, DesiredObject, Drift, Manifest, ObjectKey, Plan
from agent.plan import drift as drift_plan
from agent.plan.planner import PlanOptions, plan


@dataclass(frozen=True, slots=True)
class Verdict:
    """One object's change for one app, the live version it was planned against, whether it was
    planned now, and what the pass decided about apps sharing it."""

    app: str
    obj: DesiredObject
    change: Change
    version: tuple[str, str] | None
    fresh: bool = True
    #: The app whose set held the object and gives it to ``app`` (handover, rename), or "".
    taken_from: str = ""
    conflicts: tuple[AppConflict, ...] = ()
    #: Left to another app by the pass (not planned): not a member of this app.
    passed: bool = False
    #: Of an update: the live object's digest (``digest``); of a conflict: its digest without
    #: ``managedFields`` (``content_digest``). A dry-run's answer is compared with it
    #: (``reconcile.confirm``); the pass does not keep the live object itself.
    live_digest: str = ""
    #: Of an update of an app with ``drift = "report"``: the drift it would overwrite (``plan.drift``).
    drift: tuple[Drift, ...] = ()


class NoopMemo:
    """Last NOOP verdict per object of one app: (desired object, live (resourceVersion, uid), change);
    also a CONFLICT the server confirmed sends nothing (``confirmed``)."""

    def __init__(self) -> None:
        self.entries: dict[ObjectKey, tuple[DesiredObject, tuple[str, str], Change]] = {}
        self._token: tuple[Any, ...] = ()

    def reset(self, options: PlanOptions, schema_generation: int) -> None:
        """Forget every verdict when the options (or the schema) they were made with changed."""
        token = (
            options.field_manager,
            options.rules,
            options.adopt,
            options.membership_label,
            options.handover_from,
            options.protected,
            tuple(options.ignore),
            id(options.schema),
            schema_generation,
        )
        if token != self._token:
            self.entries.clear()
            self._token = token

    def verdicts(
        self,
        app: str,
        cluster: str,
        revision: str,
        desired: list[DesiredObject],
        known: Mapping[ObjectKey, Manifest | None],
        options: PlanOptions,
        *,
        observe: bool = False,
    ) -> list[Verdict]:
        """One verdict per desired object; reads the memo only (it may run on a listing thread).

        ``observe``: read the drift each update would overwrite (``drift = "report"``)."""
        out: list[Verdict] = []
        todo: list[DesiredObject] = []
        for obj in desired:
            live = known.get(obj.key)
            hit = self.entries.get(obj.key)
            if (
                hit is not None
                and live is not None
                and hit[1][0]
                and hit[1] == version(live)
                and _same(hit[0], obj)
            ):
                out.append(Verdict(app, obj, hit[2], hit[1], fresh=False))
            else:
                todo.append(obj)
        planned = plan(cluster, revision, todo, known, options).changes
        for obj, change in zip(todo, planned, strict=True):
            live = known.get(obj.key)
            if live is None:
                out.append(Verdict(app, obj, slim(change), None))
                continue
            live_digest = (
                digest(live)
                if change.action is Action.UPDATE
                else content_digest(live)
                if change.action is Action.CONFLICT
                else ""
            )
            seen = (
                drift_plan.observe(
                    obj, live, change, field_manager=options.field_manager, schema=options.schema
                )
                if observe
                else ()
            )
            out.append(Verdict(app, obj, slim(change), version(live), live_digest=live_digest, drift=seen))
        return out

    def confirmed(self, obj: DesiredObject, live: tuple[str, str], change: Change) -> None:
        """Remember a change the server confirmed sends nothing (a NOOP, or a CONFLICT whose
        fields are all yielded) for ``obj`` against the live version ``live``
        (``reconcile.confirm``): the next pass against that version sends nothing for it."""
        if change.action in (Action.NOOP, Action.CONFLICT) and live[0]:
            self.entries[obj.key] = (obj, live, change)

    def remember(
        self, cluster: str, revision: str, desired: list[DesiredObject], verdicts: list[Verdict]
    ) -> Plan:
        """Record fresh NOOP verdicts, forget objects that left Git; the plan in ``desired`` order."""
        memo = self.entries
        by_key = {v.obj.key: v for v in verdicts}
        for v in verdicts:
            if not v.fresh:
                continue
            if v.change.action is Action.NOOP and v.version is not None:
                memo[v.obj.key] = (v.obj, v.version, v.change)
            else:
                memo.pop(v.obj.key, None)
        if len(memo) > len(desired):  # objects that left Git
            wanted = {o.key for o in desired}
            for key in [k for k in memo if k not in wanted]:
                del memo[key]
        changes = tuple(by_key[o.key].change for o in desired if o.key in by_key)
        return Plan(cluster=cluster, revision=revision, changes=changes)


def slim(change: Change) -> Change:
    """The change as the pass keeps it until apply, which reads neither the report's operations
    (a JSON patch carrying a copy of every value sent) nor the path sets (declared, changed): they
    were most of what a plan held. Reports plan again with ``plan.plan`` and keep everything."""
    if change.operations or change.declared or change.changed:
        return replace(change, operations=(), declared=frozenset(), changed=frozenset())
    return change


def _same(a: DesiredObject, b: DesiredObject) -> bool:
    return a is b or (a.provenance == b.provenance and a.manifest == b.manifest)


def version(live: Manifest) -> tuple[str, str]:
    meta = live.get("metadata") or {}
    return str(meta.get("resourceVersion") or ""), str(meta.get("uid") or "")


def content_digest(obj: Manifest) -> str:
    """``digest`` of the object without ``metadata.managedFields``: what it holds, whoever owns it."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return digest(obj)


def digest(obj: Manifest) -> str:
    """A digest of an object's stored form, what a LIST item and an apply's answer share
    (``apiVersion`` and ``kind`` left out: LIST items may omit them); ``reconcile.confirm``
    compares a dry-run's answer with it."""
    stored = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    text = json.dumps(stored, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
