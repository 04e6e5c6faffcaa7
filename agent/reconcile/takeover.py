"""managedFields hygiene: hand Git-declared fields over from leftover managers to ours.

Restores and migrations leave field managers behind that nobody runs any more:
``before-first-apply`` (the API server's placeholder for fields that predate
managedFields), ``kubectl-client-side-apply`` (``kubectl apply`` without
``--server-side``), restore tools (``velero*``), a previous agent name (an
applier that owns the ApplySet ``part-of`` label), or a single manager owning
every field, as a restore leaves it. While such a manager co-owns a field Git
declares, removing that field from Git does not remove it from the cluster
(the server keeps co-owned fields), and its drift is reported as a conflict.

``plan_takeover`` (pure) lists, per object, which Git-declared paths would move
from which leftover manager to our field manager, and why each manager counts
as a leftover; ``--manager`` names the managers explicitly instead. Only paths
Git declares are ever taken over; paths held by anyone else (an HPA through
``/scale``, a user's label) are left out of the body, so nothing is forced over
them. ``execute_takeover`` does it: a forced server-side apply of the body
(moves the paths whose values differ and makes us an owner of the rest, with
the plan's ``resourceVersion`` as a precondition), then a JSON patch of
``metadata.managedFields`` guarded by a ``test`` of the new ``resourceVersion``
that removes the declared paths from the leftover entries — an apply alone
cannot move a field whose value is unchanged: the server makes it shared.
This is what ``kubectl``'s client-side → server-side upgrade does.

The same command removes managedFields entries that name a custom resource version on its way
out (``stale_versions``): after the CRD stops serving it, they would make every server-side
apply of the object fail and could not be removed any more (kubernetes#111937).

Called by ``agent/cli/takeover.py``: ``run_takeover`` plans the app with the pass's own
pipeline (``reconcile.pipeline``), so it considers exactly the objects the app manages (never
one another app holds); tests in ``tests/test_takeover.py``.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.apply.inventory import widen
from agent.config.types import Adopt, AppConfig, ConflictRule
from agent.errors import ApiError, AppFailed, ClusterError
from agent.kube.client import KubeClient
from agent.model import (
    PART_OF,
    ApplyResult,
    DesiredObject,
    Failure,
    FailureReason,
    FieldConflict,
    FieldPath,
    Manifest,
    ObjectKey,
    Outcome,
    Revision,
    split_api_version,
)
from agent.plan import masking
from agent.plan.fields import (
    ManagedEntry,
    decode_fields_v1,
    encode_fields_v1,
    is_under,
    managed_entries,
    manifest_paths,
    name_list,
    render_path,
)
from agent.plan.planner import PlanOptions, plan_object, send_body
from agent.plan.schema import root_node
from agent.reconcile.apps import Revisions
from agent.reconcile.reconciler import ClusterReconciler
from agent.reconcile.stale_versions import CrdVersions, StaleEntry, crd_versions, stale_entries

#: Managers that are leftovers by name: (glob, why).
KNOWN_LEFTOVERS: tuple[tuple[str, str], ...] = (
    ("before-first-apply", "the API server's placeholder for fields set before managedFields existed"),
    ("kubectl-client-side-apply", "client-side apply (kubectl apply without --server-side)"),
    ("velero*", "a restore tool's manager"),
)
_PART_OF_PATH: FieldPath = ("f:metadata", "f:labels", f"f:{PART_OF}")


@dataclass(frozen=True)
class Handover:
    """Git-declared paths one leftover managedFields entry holds, to move to our manager."""

    manager: str
    operation: str
    api_version: str
    paths: tuple[FieldPath, ...]
    why: str


@dataclass(frozen=True)
class TakeoverItem:
    """One object to take over; ``yielded`` paths stay with their (non-leftover) owners."""

    key: ObjectKey
    handovers: tuple[Handover, ...]
    resource_version: str | None
    yielded: tuple[FieldConflict, ...] = ()
    #: Entries naming a custom resource version on its way out: removed.
    stale: tuple[StaleEntry, ...] = ()

    @property
    def paths(self) -> int:
        return sum(len(h.paths) for h in self.handovers)


@dataclass(frozen=True)
class TakeoverPlan:
    cluster: str
    field_manager: str
    items: tuple[TakeoverItem, ...]

    @property
    def managers(self) -> tuple[str, ...]:
        return tuple(sorted({h.manager for i in self.items for h in i.handovers}))


def leftover_reason(
    entry: ManagedEntry, entries: Sequence[ManagedEntry], field_manager: str, named: Sequence[str]
) -> str | None:
    """Why ``entry`` counts as a leftover manager, or ``None``. ``named``: the --manager globs."""
    if entry.subresource or (entry.manager == field_manager and entry.operation == "Apply"):
        return None  # a status/scale writer is cooperation, never a leftover; our entry is ours
    if named:
        hit = any(fnmatch.fnmatchcase(entry.manager, g) for g in named)
        return "named with --manager" if hit else None
    if entry.manager == field_manager:
        return "our own manager's non-apply writes"
    for glob, why in KNOWN_LEFTOVERS:
        if fnmatch.fnmatchcase(entry.manager, glob):
            return why
    if entry.operation == "Apply" and _PART_OF_PATH in entry.paths:
        return "an applier that owns the ApplySet part-of label (a previous agent name?)"
    main = [e for e in entries if not e.subresource]
    if main == [entry]:
        return "the single owner of every field (as a restore leaves it)"
    return None


def _options_for(base: PlanOptions, leftovers: Sequence[str]) -> PlanOptions:
    """Force only over the leftovers, yield to everyone else; take the object whatever adopt says."""
    rules = [ConflictRule(manager=m, action="force") for m in sorted(set(leftovers))]
    rules.append(ConflictRule(manager="*", action="yield"))
    return replace(base, rules=tuple(rules), adopt=Adopt.ALWAYS)


def plan_takeover(
    cluster: str,
    desired: Sequence[DesiredObject],
    live: Mapping[ObjectKey, Manifest | None],
    options: PlanOptions,
    named: Sequence[str] = (),
    crds: Mapping[tuple[str, str], CrdVersions] | None = None,
    everything: Sequence[DesiredObject] | None = None,
) -> TakeoverPlan:
    """Per object, the Git-declared paths leftover managers hold and the entries naming a custom
    resource version on its way out (pure; see the module docstring). ``crds``: the live CRDs'
    versions; ``everything``: the whole desired set (its CRDs say which versions Git keeps)."""
    items: list[TakeoverItem] = []
    for obj in desired:
        current = live.get(obj.key)
        if current is None:
            continue
        entries = managed_entries(current)
        reasons = {e: r for e in entries if (r := leftover_reason(e, entries, options.field_manager, named))}
        opts = _options_for(options, [e.manager for e in reasons])
        body = send_body(obj, current, opts)
        if body is None:
            continue  # reconcile disabled: never touched
        stale = stale_entries(obj, current, crds or {}, desired if everything is None else everything)
        group, version = split_api_version(obj.api_version)
        declared = manifest_paths(body, root_node(options.schema, group, version, str(obj.manifest["kind"])))
        handovers = tuple(
            Handover(e.manager, e.operation, e.api_version, tuple(sorted(declared & e.paths)), why)
            for e, why in reasons.items()
            if declared & e.paths
        )
        if handovers or stale:
            change = plan_object(obj, current, opts)
            rv = str(current["metadata"].get("resourceVersion") or "") or None
            items.append(TakeoverItem(obj.key, handovers, rv, change.yielded, stale))
    return TakeoverPlan(cluster, options.field_manager, tuple(items))


def _without(entry: Mapping[str, Any], moved: frozenset[FieldPath]) -> dict[str, Any] | None:
    """``entry`` with ``moved`` paths removed, and markers left only as their parents; ``None``: empty."""
    paths = decode_fields_v1(entry.get("fieldsV1") or {})
    rest = {p for p in paths if p not in moved}
    # A "." marker of a map or list item that only held moved fields goes too: its content is ours now.
    rest = {p for p in rest if not (any(is_under(m, p) for m in moved) and not any(
        is_under(q, p) and q != p for q in rest))}  # fmt: skip
    if not rest:
        return None
    return {**entry, "fieldsV1": encode_fields_v1(rest)}


def execute_takeover(
    client: KubeClient,
    plan_: TakeoverPlan,
    desired: Mapping[ObjectKey, DesiredObject],
    options: PlanOptions,
    named: Sequence[str] = (),
    crds: Mapping[tuple[str, str], CrdVersions] | None = None,
) -> list[ApplyResult]:
    """Take each item over: re-planned from a fresh read (controllers write status in between),
    a forced apply of Git's paths only, then the moved paths removed from the leftovers and the
    stale-version entries removed."""
    results: list[ApplyResult] = []
    everything = list(desired.values())
    # A server's message may quote a value: the secret ones are masked (docs/secrets.md).
    secrets = masking.secret_strings(o.manifest for o in everything)
    for item in plan_.items:
        obj = desired[item.key]
        try:
            results.append(_take(client, obj, options, named, crds or {}, everything))
        except ApiError as e:
            if e.status in (0, 401):
                raise
            hint = " (it changed under us: run takeover again)" if e.status in (409, 422) else ""
            message = masking.scrub(f"{e.api_message}{hint}", secrets)
            results.append(ApplyResult(item.key, Outcome.FAILED, status=e.status, message=message))
    return results


def _take(
    client: KubeClient,
    obj: DesiredObject,
    options: PlanOptions,
    named: Sequence[str],
    crds: Mapping[tuple[str, str], CrdVersions],
    everything: Sequence[DesiredObject],
) -> ApplyResult:
    info = client.resource(obj.api_version, obj.key.kind)
    ns = obj.key.namespace or None
    live = client.get(info, ns, obj.key.name)
    fresh = plan_takeover("", [obj], {obj.key: live}, options, named, crds, everything).items
    if not fresh:
        return ApplyResult(obj.key, Outcome.UNCHANGED, message="nothing left to take over")
    item = fresh[0]
    applied = live
    assert applied is not None
    ours_stale = any(e.manager == options.field_manager and e.operation == "Apply" for e in item.stale)
    if item.handovers or ours_stale:  # our own entry moves to Git's version with our apply
        body = send_body(obj, live, _options_for(options, [h.manager for h in item.handovers]))
        assert body is not None
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = item.resource_version
        applied = client.apply(body, field_manager=options.field_manager, force=True, info=info)
    moved = {(h.manager, h.operation, h.api_version): frozenset(h.paths) for h in item.handovers}
    entries: list[dict[str, Any]] = []
    for raw in applied["metadata"].get("managedFields") or ():
        if any(s.matches(raw) for s in item.stale):
            continue
        paths = moved.get((raw.get("manager"), raw.get("operation"), raw.get("apiVersion")))
        if paths is None or raw.get("subresource"):
            entries.append(raw)
        elif (kept := _without(raw, paths)) is not None:
            entries.append(kept)
    if entries != applied["metadata"].get("managedFields"):
        rv = applied["metadata"]["resourceVersion"]
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "replace", "path": "/metadata/managedFields", "value": entries},
        ]
        client.patch(info, ns, obj.key.name, patch, patch_type="json", field_manager=options.field_manager)
    done = []
    if item.handovers:
        done.append(f"took over {item.paths} path(s) from {', '.join(h.manager for h in item.handovers)}")
    if item.stale:
        named_versions = ", ".join(sorted({f"{s.manager} ({s.api_version})" for s in item.stale}))
        done.append(f"removed {len(item.stale)} entry(ies) naming a version to leave: {named_versions}")
    return ApplyResult(
        obj.key, Outcome.CONFIGURED, message="; ".join(done), uid=applied["metadata"].get("uid")
    )


def describe(plan_: TakeoverPlan, *, applied: bool) -> list[str]:
    """The report the CLI prints: per object, which paths move from which manager, and why."""
    mode = "applying" if applied else "dry run: nothing is written; --apply to do it"
    lines = [f"takeover on cluster {plan_.cluster} by field manager {plan_.field_manager} ({mode})"]
    for item in plan_.items:
        lines.append(f"{item.key}  (resourceVersion {item.resource_version})")
        for h in item.handovers:
            shown = name_list([render_path(p) for p in h.paths], limit=6)
            lines.append(
                f"  {h.manager} ({h.operation}) → {plan_.field_manager}: {len(h.paths)} path(s): {shown}"
            )
            lines.append(f"      why: {h.why}")
        for c in item.yielded:
            lines.append(f"  left to {c.manager} ({c.subresource or c.operation}): {render_path(c.path)}")
        for st in item.stale:
            where = f"{st.operation}, subresource {st.subresource}" if st.subresource else st.operation
            lines.append(f"  {st.manager} ({where}) names {st.api_version}: entry removed")
            lines.append(f"      why: {st.why}")
    total = sum(i.paths for i in plan_.items)
    lines.append(
        f"{len(plan_.items)} object(s), {total} Git-declared path(s) from "
        f"{len(plan_.managers)} manager(s): {', '.join(plan_.managers) or 'none'}"
    )
    stale = sum(len(i.stale) for i in plan_.items)
    if stale:
        lines.append(f"{stale} managedFields entry(ies) naming a custom resource version to leave")
    return lines


def run_takeover(
    reconciler: ClusterReconciler,
    revision: Revision | Revisions,
    named: Sequence[str],
    *,
    apply: bool,
    app: AppConfig | None = None,
) -> tuple[TakeoverPlan, list[ApplyResult]]:
    """Plan ``app`` (default: the cluster entry's own) with the pass's own pipeline (so only the
    objects it manages, never one another app holds) and the paths leftover managers hold; with
    ``apply``, widen that app's inventory first (docs/safety.md rule 10) and take them over."""
    name = app.name if app is not None else reconciler.cluster.name
    runs = reconciler.new_runs(revision, [name], dry_run=True)
    if name not in runs:
        raise AppFailed(
            Failure(FailureReason.RENDER, f"cluster {reconciler.cluster.name!r} has no app {name!r}")
        )
    for run in runs.values():
        run.due = run.name == name  # the others only rendered: what they declare and hold counts
    planned = reconciler.plan_pass(runs, dry_run=True, keep_live=True, preview=True)
    run = runs[name]
    if run.result.failure is not None:
        raise run.cause or AppFailed(run.result.failure)
    if planned is None or not run.active:
        return TakeoverPlan(reconciler.cluster.name, reconciler.field_manager, ()), []
    ap = reconciler.plan_app(run, planned, dry_run=True)
    if ap.live.errors:
        raise ClusterError(reconciler.cluster.name, "; ".join(ap.live.errors), retryable=True)
    desired = list(ap.mine.values())
    # One LIST of CRDs: which of these kinds they define, in which versions.
    crds = crd_versions(reconciler.client, {(o.key.group, o.key.kind) for o in desired if o.key.group})
    live_of = {k: ap.live.objects.get(k) for k in ap.mine}
    options = ap.ready.options
    the_plan = plan_takeover(
        reconciler.cluster.name, desired, live_of, options, named, crds, everything=ap.ready.desired
    )
    if not apply or not the_plan.items:
        return the_plan, []
    store = ap.ready.store
    inventory = store.claim(store.load())  # refused if another entry's; created (claimed) if absent
    members = widen(inventory, [i.key for i in the_plan.items])
    if {m.key for m in members} != set(inventory.members):
        store.write(members)
    return the_plan, execute_takeover(reconciler.client, the_plan, ap.mine, options, named, crds)


__all__ = [
    "KNOWN_LEFTOVERS",
    "Handover",
    "TakeoverItem",
    "TakeoverPlan",
    "describe",
    "execute_takeover",
    "leftover_reason",
    "plan_takeover",
    "run_takeover",
]
