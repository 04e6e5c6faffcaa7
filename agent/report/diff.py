"""Live diff reports: what applying a revision (or a PR checkout) would do to each cluster.

Called by ``gitops-agent diff`` (``agent.cli.diff``). Per cluster, on its own
thread with its own client and deadline (docs/safety.md rule 6), ``preview_cluster``
runs the reconcile stages without writing anything: render, read the
inventory, prepare, read live state (one LIST per kind), ``plan`` and the
pure prune ``decide``. Each create/update is then confirmed with a
server-side dry-run apply under our field manager, so defaults, webhooks and
validation errors show exactly as the real apply would see them; prunes are
previewed with ``prune.execute(dry_run=True)`` (uid precondition, the
namespace/CRD holder checks), after the guards (brake, unknown state) decided.

A rejected object is an error on that object and the rest of the report is
complete; a cluster that cannot be reached, rendered or listed is an error
section of its own. Each app of a cluster is previewed alone (``preview_app``)
and gets its own part of the cluster's section; ``flag_app_conflicts`` then
flags an object two apps declare in both parts, as the cluster pass decides it.
The diff of each object is made by
``diff_fields.diff_objects`` (which masks Secrets) from the live object to
the dry-run result; ``scrub`` keeps Secret values out of error messages.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from agent.apply import prune as prune_stage
from agent.apply.ssa import immutable_fields_text, immutable_message
from agent.config.types import DEFAULT_SOURCE, AppConfig, ClusterConfig, Config
from agent.errors import AccessDenied, AgentError, ApiError, ScopeError, SourceError
from agent.kube.client import KubeClient
from agent.model import (
    CRD_KEY,
    PART_OF,
    RECREATE,
    RECREATE_ON_IMMUTABLE,
    Action,
    ApiProblem,
    ApplyResult,
    Change,
    DesiredObject,
    DesiredSet,
    Manifest,
    ObjectKey,
    Outcome,
    Revision,
)
from agent.plan.fields import render_path
from agent.plan.planner import PlanOptions, expected_object, plan, request_body
from agent.reconcile import confirm
from agent.reconcile.apps import Declared, assign
from agent.reconcile.live import LiveState
from agent.reconcile.reconciler import ClusterReconciler
from agent.reconcile.verdicts import digest
from agent.render.renderer import render
from agent.report.diff_fields import diff_objects, scrub, secret_strings
from agent.report.model import (
    ACTION_ORDER,
    ApiLine,
    AppConflictLine,
    AppReport,
    ClusterReport,
    ConflictLine,
    FieldChange,
    Mode,
    ObjectAction,
    ObjectReport,
    ReleasedField,
    Report,
    RevisionInfo,
)

ReconcilerFactory = Callable[[Config, ClusterConfig], ClusterReconciler]
_CRD = CRD_KEY


class Progress(Protocol):
    """Told when each cluster starts and ends planning (the CLI shows it on a terminal)."""

    def started(self, cluster: str) -> None: ...
    def finished(self, report: ClusterReport) -> None: ...


def new_object(key: ObjectKey, api_version: str, action: ObjectAction, **kw: object) -> ObjectReport:
    return ObjectReport(
        group=key.group,
        kind=key.kind,
        namespace=key.namespace,
        name=key.name,
        api_version=api_version,
        action=action,
        **kw,  # type: ignore[arg-type]
    )


def sort_objects(objects: list[ObjectReport]) -> tuple[ObjectReport, ...]:
    """Errors first, then by action, then by identity: stable for golden files and reviewers."""
    return tuple(sorted(objects, key=lambda o: (o.error is None, ACTION_ORDER.index(o.action), o.key)))


def change_report(
    change: Change,
    live: Manifest | None,
    after: Manifest | None,
    *,
    basis: str,
    to_label: str,
    note: str = "",
    error: str | None = None,
) -> ObjectReport:
    """One planned change as a report entry; ``after`` is unmasked, masked here with ``live``."""
    action = {
        Action.CREATE: ObjectAction.CREATE,
        Action.UPDATE: ObjectAction.UPDATE,
        Action.CONFLICT: ObjectAction.CONFLICT,
    }.get(change.action, ObjectAction.SKIP)
    text, fields = "", tuple[FieldChange, ...]()
    if action in (ObjectAction.CREATE, ObjectAction.UPDATE) and after is not None:
        text, fields = diff_objects(live, after, from_label="live", to_label=to_label)
    return new_object(
        change.key,
        change.api_version,
        action,
        diff=text,
        fields=fields,
        conflicts=tuple(
            ConflictLine(
                render_path(c.path),
                c.manager,
                c.operation,
                c.subresource,
                c.resolution.value,
                c.desired,
                c.live,
            )
            for c in change.conflicts
        ),
        released=tuple(ReleasedField(render_path(p), removed) for p, removed in change.released),
        basis=basis if text else "",
        source=str(change.provenance) if change.provenance else "",
        reason=change.reason,
        note=note,
        skip=change.skip.value if change.skip else "",
        error=error,
    )


# -- one cluster ------------------------------------------------------------------------


#: What a live diff renders: one revision, a local checkout, or each source's revision.
Target = Revision | Path | Mapping[str, Revision]


@dataclass(frozen=True)
class Preview:
    """One app's report, with what cross-app checks need: the objects it declares and which
    of them its own ApplySet holds live."""

    report: AppReport
    declared: Mapping[ObjectKey, DesiredObject] = field(default_factory=dict)
    held: frozenset[ObjectKey] = frozenset()
    #: The ApplySet each declared object is a member of, as read live (absent: none or unread).
    sets: Mapping[ObjectKey, str] = field(default_factory=dict)


def preview_app(rec: ClusterReconciler, target: Target, app: AppConfig | None = None) -> Preview:
    """Plan ``target`` for ``app`` (default: the cluster entry's own) on ``rec``'s cluster
    without writing; every failure becomes the app's report."""
    name = rec.cluster.name if app is None else app.name
    try:
        return _preview(rec, target, app, name)
    except AgentError as e:
        return Preview(AppReport(name, error=str(e)))
    except Exception as e:  # a bug planning one app must not lose the others' sections
        return Preview(AppReport(name, error=f"internal error: {type(e).__name__}: {e}"))


def preview_cluster(rec: ClusterReconciler, target: Target, app: AppConfig | None = None) -> ClusterReport:
    """One app's plan as its cluster's section (see ``run_live`` for a cluster's every app)."""
    return ClusterReport(rec.cluster.name, (preview_app(rec, target, app).report,))


def _render(rec: ClusterReconciler, target: Target, app: AppConfig | None) -> DesiredSet:
    """``app``'s render of ``target``: its own source's revision, or a local directory."""
    spec = rec.spec_for(app)
    if isinstance(target, Mapping):
        source = app.source if app is not None else DEFAULT_SOURCE
        if source not in target:
            raise SourceError(f"source {source!r} delivered no revision")
        target = target[source]
    if isinstance(target, Revision):
        return rec.render_at(target, spec)
    return render(target, spec, revision="")


def _preview(rec: ClusterReconciler, target: Target, app: AppConfig | None, name: str) -> Preview:
    desired_set = _render(rec, target, app)
    store = rec.store if app is None else rec.store_for(rec.parent_of(app.name))
    inventory = store.load()
    notes: list[str] = []
    if inventory.suspended:
        notes.append("the app is suspended (ApplySet parent annotation): nothing is applied until resumed")
    default_namespace = app.settings.default_namespace if app is not None else None
    desired = rec.prepare(desired_set, store.id, default_namespace=default_namespace)
    if violations := rec.scope_violations(app, desired):  # before any request made as the app
        raise ScopeError(violations, cluster=rec.cluster.name, app=name)
    rec.load_schema(desired)
    unserved, api_notes = rec.check_apis(desired)
    api: dict[ObjectKey, list[ApiLine]] = {}
    for f in [*unserved.values(), *api_notes]:
        api.setdefault(f.key, []).append(ApiLine(f.problem.value, f.message, f.replacement))
    by_key = {o.key: o for o in desired}
    client = rec.client_for(app)
    live = rec.read_live(set(by_key) | inventory.keys(), desired, app=app)
    notes.extend(live.errors)
    options = rec.plan_options(store.id, app=app)
    # An object whose listing failed has unknown live state: planned as SKIP, never as a create.
    known = {k: live.objects.get(k) for k in by_key if live.listed(k)}
    the_plan = plan(rec.cluster.name, desired_set.revision, desired, known, options)
    the_plan = replace(the_plan, changes=tuple(live.explain(c) for c in the_plan.changes))
    secrets = secret_strings([o.manifest for o in desired] + list(live.objects.values()))
    prune_options = rec.prune_options(store.id, dry_run=True, app=app)
    decision = prune_stage.decide(
        inventory,
        set(by_key),
        live.objects,
        live.complete,
        prune_options,
        render_empty=desired_set.empty,
    )
    if app is not None and app.settings.service_account:
        try:  # what the pass would refuse before writing, said once rather than as a 403 per object
            unread = [k for k in {*by_key, *inventory.keys()} if not live.listed(k)]
            rec.preflight(app, the_plan.changes, decision, unread)
        except AccessDenied as e:
            notes.append(str(e))
    quiet: set[ObjectKey] = set()
    objects = _confirm(
        rec, client, the_plan.changes, by_key, live, options, secrets, api, set(unserved), quiet
    )
    prune_refused = decision.refused
    for result in prune_stage.execute(client, decision, prune_options):
        objects.append(_prune_report(result, live, secrets))
    sets = {
        k: part_of
        for k in by_key
        if (part_of := (((live.objects.get(k) or {}).get("metadata") or {}).get("labels") or {}).get(PART_OF))
    }
    held = frozenset(k for k, part_of in sets.items() if part_of == store.id)
    report = AppReport(
        name,
        objects=sort_objects(objects),
        unchanged=sum(
            1 for c in the_plan.changes if (c.action is Action.NOOP or c.key in quiet) and c.key not in api
        ),
        prune_refused=prune_refused,
        notes=tuple(notes),
    )
    return Preview(report, by_key, held, sets)


def declared_by(
    rec: ClusterReconciler, target: Target, app: AppConfig, selected: Sequence[Preview]
) -> Preview:
    """What an app left out of ``--app`` declares, rendered only (no request), so a conflict
    with it is still flagged; it holds what the selected apps read live in its ApplySet."""
    desired_set = _render(rec, target, app)
    store_id = rec.store_for(rec.parent_of(app.name)).id
    desired = rec.prepare(desired_set, store_id, default_namespace=app.settings.default_namespace)
    by_key = {o.key: o for o in desired}
    held = frozenset(
        k for p in selected for k, part_of in p.sets.items() if k in by_key and part_of == store_id
    )
    return Preview(AppReport(app.name), by_key, held)


def flag_app_conflicts(previews: Sequence[Preview], *, skip_others: bool) -> tuple[AppReport, ...]:
    """Each object two or more of one cluster's apps declare, flagged in every declaring app's
    report naming the other app and both files; the app that manages it is decided as the
    cluster pass decides (``reconcile.apps.assign``: its ApplySet's holder, else the first in
    config order). ``skip_others`` (live): the others' entries become the SKIP the pass makes."""
    declarers: dict[ObjectKey, list[int]] = {}
    for i, p in enumerate(previews):
        for key in p.declared:
            declarers.setdefault(key, []).append(i)
    reports = [p.report for p in previews]
    names = [p.report.name for p in previews]
    for key, idx in sorted(declarers.items()):
        if len(idx) < 2:
            continue
        holder = next((names[i] for i in idx if key in previews[i].held), None)
        decl = [Declared(names[i], previews[i].declared[key].provenance.file) for i in idx]
        verdict = assign(key, decl, holder, names)
        for i in idx:
            lines = tuple(
                AppConflictLine(c.holder, c.holder_file, c.other, c.other_file)
                for c in verdict.conflicts
                if names[i] in (c.holder, c.other)
            )
            skip = skip_others and names[i] != verdict.owner
            why = (
                f"not written by this app: app {verdict.owner!r} manages it"
                if verdict.owner
                else verdict.reason
            )
            reports[i] = _flagged(reports[i], previews[i].declared[key], lines, why, skip=skip)
    return tuple(reports)


def _flagged(
    report: AppReport, obj: DesiredObject, lines: tuple[AppConflictLine, ...], reason: str, *, skip: bool
) -> AppReport:
    """``report`` with ``obj``'s entry carrying ``lines`` (added when the object had no change)."""
    objects = list(report.objects)
    unchanged = report.unchanged
    at = next((n for n, o in enumerate(objects) if _key_of(o) == obj.key), None)
    if at is not None and not skip:
        objects[at] = replace(objects[at], app_conflicts=lines)
    else:
        entry = new_object(
            obj.key,
            obj.api_version,
            ObjectAction.SKIP,
            source=str(obj.provenance),
            reason=reason if skip else "no change",
            app_conflicts=lines,
        )
        if at is None:
            unchanged = max(0, unchanged - 1)
            objects.append(entry)
        else:
            objects[at] = entry
    return replace(report, objects=sort_objects(objects), unchanged=unchanged)


def _key_of(o: ObjectReport) -> ObjectKey:
    return ObjectKey(o.group, o.kind, o.namespace, o.name)


def _confirm(
    rec: ClusterReconciler,
    client: KubeClient,
    changes: tuple[Change, ...],
    by_key: dict[ObjectKey, DesiredObject],
    live: LiveState,
    options: PlanOptions,
    secrets: set[str],
    api: Mapping[ObjectKey, list[ApiLine]],
    unserved: set[ObjectKey],
    quiet: set[ObjectKey],
) -> list[ObjectReport]:
    """Every non-noop change as a report entry; creates/updates confirmed by a server dry-run
    (an update the server would store nothing for is added to ``quiet``, with no entry).

    An object whose apiVersion the cluster does not serve is not sent (the pass fails it with
    the same words); an unchanged one with a note on its apiVersion still gets an entry.
    """
    new_namespaces = {
        c.key.name
        for c in changes
        if c.action is Action.CREATE and (c.key.group, c.key.kind) == ("", "Namespace")
    }
    new_kinds = {
        (str((o.manifest.get("spec") or {}).get("group", "")), str(names.get("kind", "")))
        for o in by_key.values()
        if (o.key.group, o.key.kind) == _CRD
        for names in [(o.manifest.get("spec") or {}).get("names") or {}]
    }

    def one(change: Change) -> ObjectReport | None:
        entry = _one(change)
        lines = tuple(api.get(change.key, ()))
        if entry is None and lines:
            desired = by_key[change.key]
            why = "not applied: its apiVersion is not served" if change.key in unserved else "no change"
            return new_object(
                change.key,
                change.api_version,
                ObjectAction.SKIP,
                source=str(desired.provenance),
                reason=why,
                api=lines,
            )
        if entry is not None and lines:
            entry = replace(entry, api=lines + entry.api)
        return entry

    def _one(change: Change) -> ObjectReport | None:
        if change.action is Action.NOOP or change.key in unserved:
            return None
        current = live.objects.get(change.key)
        if change.action not in (Action.CREATE, Action.UPDATE):
            return change_report(change, current, None, basis="", to_label="")
        desired = by_key[change.key]
        expected = expected_object(desired, current, options)
        body = request_body(change, desired)
        assert body is not None
        warnings: list[str] = []
        try:
            after = confirm.dry_run_apply(
                client, change, body, field_manager=rec.field_manager, warnings=warnings
            )
        except ApiError as e:
            if e.is_cluster_level:
                raise
            message = scrub(e.api_message or str(e), secrets)
            if change.key.namespace in new_namespaces and e.status == 404:
                note = (
                    f"not checked by the server: namespace {change.key.namespace} is created by this change;"
                    " the diff is the agent's plan"
                )
                return change_report(change, current, expected, basis="plan", to_label="plan", note=note)
            if (change.key.group, change.key.kind) in new_kinds and e.status == 404:
                note = "not checked by the server: its CRD is created by this change; the diff is the plan"
                return change_report(change, current, expected, basis="plan", to_label="plan", note=note)
            if e.is_immutable:  # the fields, not the server's message (the whole rejected value)
                annotations = (body.get("metadata") or {}).get("annotations") or {}
                if annotations.get(RECREATE) == RECREATE_ON_IMMUTABLE:
                    fields = immutable_fields_text(e)
                    note = f"an immutable field changes: would delete and re-create ({fields})"
                    return change_report(change, current, expected, basis="plan", to_label="plan", note=note)
                message = immutable_message(e)
            return change_report(
                change, current, expected, basis="plan", to_label="plan", error=f"HTTP {e.status}: {message}"
            )
        if current is not None and confirm.stores_nothing(digest(current), after):
            if change.yielded:  # nothing is sent, but what is yielded stays visible
                return change_report(confirm.unchanged(change), current, None, basis="", to_label="")
            quiet.add(change.key)  # what the plan saw the server fills in or drops: no change
            return None
        done = change_report(change, current, after, basis="server", to_label="server dry-run")
        said = tuple(ApiLine(ApiProblem.WARNING.value, scrub(w, secrets)) for w in warnings)
        return replace(done, api=said) if said else done

    workers = max(1, rec.cluster.settings.concurrency)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"diff-{rec.cluster.name}") as pool:
        return [r for r in pool.map(one, changes) if r is not None]


def pruned_report(key: ObjectKey, live: Manifest | None, *, note: str = "") -> ObjectReport:
    """An object that leaves the cluster: its whole (masked) live state shown as removed."""
    text, fields = diff_objects(live, None, from_label="live", to_label="deleted")
    return new_object(
        key,
        str((live or {}).get("apiVersion", "")),
        ObjectAction.PRUNE,
        diff=text,
        fields=fields,
        basis="live" if text else "",
        reason="removed from Git: deleted with a uid precondition",
        note=note,
    )


def _prune_report(result: ApplyResult, live: LiveState, secrets: set[str]) -> ObjectReport:
    current = live.objects.get(result.key)
    api_version = str((current or {}).get("apiVersion", ""))
    message = scrub(result.message, secrets)
    if result.outcome is Outcome.PRUNED:
        return pruned_report(result.key, current, note=message)
    if result.outcome is Outcome.ORPHANED:
        return new_object(result.key, api_version, ObjectAction.ORPHAN, reason=message)
    if result.outcome is Outcome.FAILED:
        return new_object(
            result.key,
            api_version,
            ObjectAction.PRUNE,
            reason="removed from Git",
            error=f"HTTP {result.status}: {message}",
        )
    return new_object(result.key, api_version, ObjectAction.KEEP, reason=message)


# -- the fleet ------------------------------------------------------------------------------


def run_live(
    config: Config,
    target: Target,
    *,
    clusters: tuple[str, ...] = (),
    progress: Progress | None = None,
    reconciler_factory: ReconcilerFactory = ClusterReconciler,
    apps: Mapping[str, Sequence[AppConfig]] | None = None,
) -> Report:
    """Every selected cluster at once, each on its own thread with its pass deadline.

    ``apps``: per cluster, the apps to report (default: every app of the cluster, in config
    order); each cluster's section holds one part per app, conflicts between them flagged.
    """
    chosen = [c for c in config.clusters if not clusters or c.name in clusters]
    results: dict[str, ClusterReport] = {}
    lock = threading.Lock()

    def sections(rec: ClusterReconciler) -> tuple[AppReport, ...]:
        wanted = list(apps.get(rec.cluster.name, ())) if apps is not None else list(rec.apps)
        if not wanted or (len(wanted) == 1 and wanted[0].implicit and not isinstance(target, Mapping)):
            return (preview_app(rec, target).report,)
        selected = [preview_app(rec, target, a) for a in wanted]
        others: list[Preview] = []
        unknown: list[str] = []
        for a in rec.apps:
            if a in wanted:
                continue
            try:
                others.append(declared_by(rec, target, a, selected))
            except Exception as e:  # a note: the selected apps' report stands
                unknown.append(
                    f"app {a.name!r} (not selected) did not render, so conflicts with it are unknown: {e}"
                )
        reports = flag_app_conflicts([*selected, *others], skip_others=True)[: len(selected)]
        return tuple(replace(r, notes=(*r.notes, *unknown)) if unknown else r for r in reports)

    def work(cluster: ClusterConfig) -> None:
        if progress:
            progress.started(cluster.name)
        rec = reconciler_factory(config, cluster)
        try:
            report = ClusterReport(cluster.name, sections(rec))
        finally:
            rec.close()
        with lock:
            results[cluster.name] = report
        if progress:
            progress.finished(report)

    threads = {
        c.name: threading.Thread(target=work, args=(c,), name=f"diff-{c.name}", daemon=True) for c in chosen
    }
    for t in threads.values():
        t.start()
    start = time.monotonic()
    for c in chosen:
        threads[c.name].join(max(0.0, c.settings.pass_deadline - (time.monotonic() - start)))
    out: list[ClusterReport] = []
    for c in chosen:
        with lock:
            report = results.get(c.name)
        if report is None:
            report = ClusterReport(
                c.name, error=f"timed out: planning did not finish within {c.settings.pass_deadline:g}s"
            )
            if progress:
                progress.finished(report)
        out.append(report)
    if isinstance(target, Mapping):
        first = target.get(DEFAULT_SOURCE) or next(iter(target.values()), None)
        revision = RevisionInfo(first.ref, first.sha) if first else RevisionInfo("")
    elif isinstance(target, Revision):
        revision = RevisionInfo(target.ref, target.sha)
    else:
        revision = RevisionInfo(str(target))
    managers = sorted({config.field_manager(c) for c in chosen})
    return Report(Mode.LIVE, revision, tuple(out), field_manager=", ".join(managers))


__all__ = [
    "Preview",
    "Progress",
    "change_report",
    "flag_app_conflicts",
    "new_object",
    "preview_app",
    "preview_cluster",
    "pruned_report",
    "run_live",
    "sort_objects",
]
