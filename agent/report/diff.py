"""Live diff reports: what applying a revision (or a PR checkout) would do to each cluster.

Called by ``gitops-agent diff`` (``agent.cli.diff``). Per cluster, on its own thread with its
own client and deadline (docs/safety.md rule 6), ``cluster_reports`` runs the pass's own
pipeline (``reconcile.pipeline``) without writing: every app of the cluster rendered, the
inventories and live state read, each object decided for the app that manages it, each app's
prune decided. So the report says what the pass would do, an object moving between apps
included. Only what happens to the result differs: each create/update is confirmed with a
server-side dry-run apply under our field manager, so defaults, webhooks and validation errors
show exactly as the real apply would see them; prunes are previewed with
``prune.execute(dry_run=True)`` (uid precondition, the namespace/CRD holder checks), after the
guards (brake, unknown state) decided.

A rejected object is an error on that object and the rest of the report is complete; a
cluster that cannot be reached or listed, or an app that cannot be rendered, is an error of
its own part. An object two apps declare carries the conflict in both parts, as the pass
decides it. The diff of each object is made by ``diff_fields.diff_objects`` (which masks
Secrets) from the live object to the dry-run result; ``scrub`` keeps Secret values out of
error messages. ``flag_app_conflicts`` does the same flagging for the offline diff, which plans
each app alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from agent.apply.ssa import ApplyOptions, immutable_fields_text, immutable_message
from agent.config.types import DEFAULT_SOURCE, AppConfig, ClusterConfig, Config
from agent.errors import AccessDenied, AgentError, ApiError
from agent.kube.client import KubeClient
from agent.model import (
    CRD_KEY,
    RECREATE,
    RECREATE_ON_IMMUTABLE,
    Action,
    ApiProblem,
    ApplyResult,
    Change,
    DesiredObject,
    Drift,
    IgnoredFields,
    Manifest,
    ObjectKey,
    Outcome,
    Revision,
)
from agent.plan.fields import render_path
from agent.reconcile import confirm
from agent.reconcile.appruns import AppRun
from agent.reconcile.live import LiveState
from agent.reconcile.pipeline import AppPlan, PassPlan, owner_of
from agent.reconcile.reconciler import ClusterReconciler
from agent.reconcile.verdicts import Verdict, digest
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
        ignored=change.ignored,
    )


# -- one cluster ------------------------------------------------------------------------


#: What a live diff renders: one revision, a local checkout, or each source's revision.
Target = Revision | Path | Mapping[str, Revision]


@dataclass(frozen=True)
class Preview:
    """One app's report with the objects it declares and which of them its own ApplySet holds
    (the offline diff flags conflicts between apps from these)."""

    report: AppReport
    declared: Mapping[ObjectKey, DesiredObject] = field(default_factory=dict)
    held: frozenset[ObjectKey] = frozenset()


def revisions_for(config: Config, target: Target) -> Revision | Mapping[str, Revision]:
    """``target`` as the pass takes it: a local checkout stands for every source's revision."""
    if isinstance(target, Path):
        local = Revision(sha="", ref=str(target), tree=target)
        return {s.name: local for s in config.sources} or {DEFAULT_SOURCE: local}
    return target


def cluster_reports(
    rec: ClusterReconciler, target: Target, wanted: Sequence[AppConfig] | None = None
) -> tuple[AppReport, ...]:
    """``wanted`` apps' parts (default: every app of the cluster), planned by the pass's own
    pipeline: every app of the cluster rendered, so what another app declares, holds or failed
    to render weighs exactly as in a pass; nothing is written."""
    names = [a.name for a in (wanted if wanted is not None else rec.apps)]
    runs = rec.new_runs(revisions_for(rec.config, target), names, dry_run=True)
    for run in runs.values():
        run.due = run.name in names  # only what is reported, not the dependencies a pass runs first
    try:
        planned = rec.plan_pass(runs, dry_run=True, keep_live=True, preview=True)
    except AgentError as e:
        return tuple(AppReport(n, error=str(e)) for n in names)
    return tuple(_app_report(rec, runs[n], planned) for n in names)


def _app_report(rec: ClusterReconciler, run: AppRun, planned: PassPlan | None) -> AppReport:
    """One app's part; every failure becomes the app's report."""
    if run.result.failure is not None:
        return AppReport(run.name, error=run.result.failure.message)
    if planned is None or not run.active:
        return AppReport(run.name, notes=tuple(run.notes))
    try:
        return _report(rec, rec.plan_app(run, planned, dry_run=True))
    except AgentError as e:
        return AppReport(run.name, error=str(e))
    except Exception as e:  # a bug planning one app must not lose the others' sections
        return AppReport(run.name, error=f"internal error: {type(e).__name__}: {e}")


def _report(rec: ClusterReconciler, ap: AppPlan) -> AppReport:
    """The plan previewed: changes confirmed by server dry-runs, prunes by dry-run deletes."""
    run, live = ap.run, ap.live
    notes = [*run.notes, *live.errors]
    api: dict[ObjectKey, list[ApiLine]] = {}
    for f in run.result.api_findings:
        api.setdefault(f.key, []).append(ApiLine(f.problem.value, f.message, f.replacement))
    client = rec.client_for(run.app)
    if run.identity:
        try:  # what the pass would refuse before writing, said once rather than as a 403 per object
            unread = [k for k in {*ap.by_key, *run.members} if not live.listed(k)]
            rec.preflight(run.app, ap.plan.changes, ap.decision, unread)
        except AccessDenied as e:
            notes.append(str(e))
    secrets = secret_strings([o.manifest for o in ap.by_key.values()] + list(live.objects.values()))
    quiet: set[ObjectKey] = set()
    changes = tuple(_left_to_owner(c, v) for c, v in zip(ap.plan.changes, _by_change(ap), strict=True))
    # A conflict of spelling only (the server stores Git's values as live holds them) is no
    # change, as the pass finds it: checked with the same forced dry-run.
    options = ApplyOptions(
        field_manager=rec.field_manager, dry_run=True, concurrency=rec.cluster.settings.concurrency
    )
    changes = confirm.confirm_plan(
        client,
        replace(ap.plan, changes=changes),
        ap.verdicts,
        rec.memo(run.name),
        options,
        whole=ap.whole,
        actions=(Action.CONFLICT,),
    ).changes
    objects = _confirm(rec, client, changes, ap, secrets, api, quiet)
    for result in ap.prune(client):
        objects.append(_prune_report(result, live, secrets))
    report = AppReport(
        run.name,
        objects=sort_objects(objects),
        unchanged=sum(1 for c in changes if (c.action is Action.NOOP or c.key in quiet) and c.key not in api),
        prune_refused=ap.decision.refused,
        notes=tuple(notes),
        ignored=ignored_totals(changes),
        sync=() if ap.order.plain and not ap.order.left_out else ap.order.describe(),
    )
    for v in ap.verdicts:
        if v.conflicts:
            lines = tuple(
                AppConflictLine(c.holder, c.holder_file, c.other, c.other_file)
                for c in v.conflicts
                if run.name in (c.holder, c.other)
            )
            report = _flagged(report, v.obj, lines, "", skip=False)
    drifted = {v.obj.key: v.drift for v in ap.verdicts if v.drift}
    if drifted:  # drift = "report": what of the change overwrites a hand edit, and whose
        kept = (run.inventory or ap.ready.inventory).applied_revision == ap.ready.revision.sha
        noted = tuple(_drift_noted(o, drifted.get(_key_of(o), ()), kept=kept) for o in report.objects)
        report = replace(report, objects=noted)
    return report


def _drift_noted(o: ObjectReport, drift: tuple[Drift, ...], *, kept: bool) -> ObjectReport:
    """``o`` marked as drift: left as it is (the revision the app last applied), or corrected."""
    if not drift or o.action is not ObjectAction.UPDATE:
        return o
    fate = "left and reported at this revision" if kept else "corrected by this revision"
    said = "; ".join(f"{d.path} changed by {d.who}" for d in drift)
    note = f"drift (drift = report), {fate}: {said}"
    return replace(o, note=f"{o.note}; {note}" if o.note else note)


def ignored_totals(changes: Iterable[Change]) -> tuple[IgnoredFields, ...]:
    """Fields left alone per ignore rule over ``changes``, rules in the order first met."""
    totals: dict[str, int] = {}
    for c in changes:
        for i in c.ignored:
            totals[i.rule] = totals.get(i.rule, 0) + i.fields
    return tuple(IgnoredFields(rule, n) for rule, n in totals.items())


def _by_change(ap: AppPlan) -> list[Verdict | None]:
    """Each planned change's verdict (the plan is in declared order, one change per verdict)."""
    verdicts = {v.obj.key: v for v in ap.verdicts}
    return [verdicts.get(c.key) for c in ap.plan.changes]


def _left_to_owner(change: Change, verdict: Verdict | None) -> Change:
    """An object the pass leaves to the app managing it, in the words a reader needs."""
    if verdict is None or not verdict.passed:
        return change
    owner = next((c.holder for c in verdict.conflicts), "")
    return replace(change, reason=f"not written by this app: app {owner!r} manages it") if owner else change


def flag_app_conflicts(previews: Sequence[Preview], *, skip_others: bool) -> tuple[AppReport, ...]:
    """Each object two or more of one cluster's apps declare, flagged in every declaring app's
    report naming the other app and both files; the app that manages it is decided as the
    cluster pass decides (``pipeline.owner_of``: its ApplySet's holder, else the first in
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
        decl = [(names[i], previews[i].declared[key].provenance.file) for i in idx]
        verdict = owner_of(key, decl, holder, names)
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
    ap: AppPlan,
    secrets: set[str],
    api: Mapping[ObjectKey, list[ApiLine]],
    quiet: set[ObjectKey],
) -> list[ObjectReport]:
    """Every non-noop change as a report entry; creates/updates confirmed by a server dry-run
    (an update the server would store nothing for is added to ``quiet``, with no entry).

    An object whose apiVersion the cluster does not serve is not sent (the pass fails it with
    the same words); an unchanged one with a note on its apiVersion still gets an entry.
    """
    by_key, live, unserved = ap.by_key, ap.live, ap.run.unserved
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
        expected = ap.expected(change, current)
        body = ap.body(change)
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
        return cluster_reports(
            rec, target, list(apps.get(rec.cluster.name, ())) if apps is not None else None
        )

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
    "cluster_reports",
    "flag_app_conflicts",
    "new_object",
    "pruned_report",
    "revisions_for",
    "run_live",
    "sort_objects",
]
