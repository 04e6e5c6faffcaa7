"""The server's word on a planned update or conflict: would applying it store anything?

The local plan compares what Git declares with live after normalisation (``plan.normalize``,
``plan.schema``), but no table can know every default a server (or a CRD's schema) fills in,
nor that it drops an explicit ``null``: webhook ``rules[].scope``, a ValidatingAdmissionPolicy's
atomic ``matchConstraints``, an RBAC subject's ``apiGroup: ""``, a Helm template's
``replicas: null``. Such objects would be written every pass and shown as changed with an
empty diff. So every update the local plan sees is confirmed with a server-side dry-run of the
very request the apply would send, and is a no-op when the server's answer is the live object
itself: a dry-run answers with the live ``resourceVersion`` either way, so the whole stored
form is compared (``stores_nothing``), through a digest taken when the object was planned (a
pass does not keep the live objects it planned).

A conflict (a field Git declares that another manager owns with another value, yielded to it)
is confirmed the same way, with a forced dry-run of Git's whole object: where the server would
store exactly what live holds but for ownership, the two only spell one value differently (an
explicit ``null`` beside Helm's value, ``apiGroup: ""`` the server drops), and a conflict
reported every pass after taking over a Helm release would be noise (``agreed``).

Called by the pass (``confirm_plan``, before applying; its no-ops are remembered in the app's
``NoopMemo``, so the next pass sends nothing for them) and by the live diff report
(``confirm_plan`` for conflicts; ``dry_run_apply`` and ``stores_nothing`` for updates, whose
answer is also its preview). Creates, no-ops and skips cost no request here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from agent.apply.ssa import ApplyOptions
from agent.errors import ApiError
from agent.kube.client import KubeClient, WarningSink
from agent.model import Action, Change, DesiredObject, Manifest, Plan
from agent.plan.planner import request_body
from agent.reconcile.verdicts import NoopMemo, Verdict, content_digest, digest

#: Why a planned update became a no-op (the result's message and the diff report say it).
CONFIRMED_NOOP = "no change: the server's dry-run of the update stores nothing"
#: Why a planned conflict became a no-op.
AGREED_NOOP = (
    "no change: Git and live hold the same values as the server stores them (a forced dry-run"
    " of Git's whole object stores nothing but ownership); the other manager keeps its fields"
)


def stores_nothing(live_digest: str, after: Manifest | None) -> bool:
    """Whether a dry-run's answer ``after`` is the live object (of ``live_digest``) unchanged."""
    return bool(live_digest) and after is not None and digest(after) == live_digest


def dry_run_apply(
    client: KubeClient,
    change: Change,
    body: Manifest,
    *,
    field_manager: str,
    precondition: bool = False,
    warnings: WarningSink | None = None,
    force: bool | None = None,
) -> Manifest:
    """The server-side apply the pass would send for ``change``, with ``dryRun=All``.

    ``precondition``: sent with the resourceVersion it was planned from, as the pass sends it,
    so a write in between fails the dry-run (409) instead of confirming another version.
    ``force``: instead of the change's own (a conflict's check forces Git's whole body).
    """
    if precondition and change.resource_version:
        body = copy.copy(body)
        body["metadata"] = {**body.get("metadata", {}), "resourceVersion": change.resource_version}
    return client.apply(
        body,
        field_manager=field_manager,
        force=change.force if force is None else force,
        dry_run=True,
        warnings=warnings,
    )


def unchanged(change: Change) -> Change:
    """``change`` as what it turned out to be: nothing to send (yielded fields still shown)."""
    action = Action.CONFLICT if change.yielded else Action.NOOP
    reason = change.reason if change.yielded else CONFIRMED_NOOP
    return replace(change, action=action, body=None, force=False, operations=(), reason=reason)


def agreed(change: Change) -> Change:
    """A conflict that is one of spelling only: nothing to send and nothing to report."""
    return replace(
        change, action=Action.NOOP, body=None, force=False, operations=(), conflicts=(), reason=AGREED_NOOP
    )


def confirm_plan(
    client: KubeClient,
    the_plan: Plan,
    verdicts: Sequence[Verdict],
    memo: NoopMemo,
    options: ApplyOptions,
    *,
    whole: Callable[[DesiredObject], Manifest],
    actions: Collection[Action] = (Action.UPDATE, Action.CONFLICT),
) -> Plan:
    """``the_plan`` with each update the server would store nothing for, and each conflict whose
    values the server stores as live holds them, turned into a no-op, which ``memo`` remembers
    for that desired object and live version (no request next pass).

    A conflict is checked with a forced dry-run of Git's whole body (``whole``): when its answer
    is live but for ``managedFields``, Git and the other manager only spell the same values
    differently (an explicit ``null``, ``apiGroup: ""``, ``1000m``), and reporting a conflict
    every pass would be noise. A dry-run that fails leaves the change as planned: the apply
    then reports its own answer.
    """
    planned = {v.obj.key: v for v in verdicts if v.fresh and v.live_digest}
    field_manager = options.field_manager
    todo = [c for c in the_plan.changes if c.action in actions and c.key in planned]
    if not todo:
        return the_plan

    def stored_nothing(change: Change) -> bool:
        v = planned[change.key]
        conflict = change.action is Action.CONFLICT
        body = whole(v.obj) if conflict else request_body(change, v.obj)
        if body is None:
            return False
        try:
            after = dry_run_apply(
                client, change, body, field_manager=field_manager, precondition=True, force=conflict or None
            )
        except ApiError as e:
            if e.is_cluster_level:
                raise
            return False
        if conflict:
            return bool(v.live_digest) and content_digest(after) == v.live_digest
        return stores_nothing(v.live_digest, after)

    with ThreadPoolExecutor(max_workers=max(1, min(options.concurrency, len(todo)))) as pool:
        quiet = {c.key for c, same in zip(todo, pool.map(stored_nothing, todo), strict=True) if same}
    if not quiet:
        return the_plan
    changes = []
    for c in the_plan.changes:
        if c.key in quiet:
            c = agreed(c) if c.action is Action.CONFLICT else unchanged(c)
            v = planned[c.key]
            if v.version is not None:
                memo.confirmed(v.obj, v.version, c)
        changes.append(c)
    return replace(the_plan, changes=tuple(changes))
