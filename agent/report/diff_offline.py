"""Offline diff reports: what a change does to each cluster's desired state, without any cluster.

Called by ``gitops-agent diff --offline``. Both revisions are checked out
through ``GitSource.resolve`` (any URL the agent can fetch, or a local
repository such as the PR's own checkout), each cluster's paths are rendered
at both, and objects are matched by identity (group, kind, namespace as
written, name): added, changed (with field-level diffs) or removed. Secrets
are masked by ``diff_fields.diff_objects`` like in live mode. A Helm hook of
delete/rollback phases only that changed is a ``skip`` (``helm-hook``): the
agent never applies nor deletes it (``plan.hooks``).

Which clusters: the ``--config`` file's clusters (paths, variables, Helm
settings, excludes; their kubeconfigs need not exist: nothing here connects),
or without one, by convention every directory ``clusters/<name>/`` found at
either revision, rendered without variables. Each cluster's apps (``[[apps]]``, or the
entry's own) are rendered and compared separately, one part of the section each; an
object two apps of one cluster declare at the head revision is flagged in both parts,
naming the other app and both files (``diff.flag_app_conflicts``).
A cluster path that does not exist at the base revision counts as empty
there (the change adds it); at the head revision it is an error, as the
agent would report it. Each cluster fails alone (its own error section).

Charts from repositories: with ``--config``, each revision is rendered with the charts it
resolves to, fetched as the source's poll fetches them (``reconcile.charts.ChartPolls``; it needs
the chart repositories, not a cluster): an app's chart from a repository, and the dependencies
of a chart in Git at the versions that revision's ``Chart.yaml`` (or ``Chart.lock``) asks for. A
``version`` change is thus reported as the objects it changes, with a note naming both pins; a
chart that cannot be fetched at a revision is that app's error.

Encrypted (SOPS) files are not decrypted: there is no private key here. Both
revisions render sealed (encrypted values stay ciphertext, masked in the diff),
and the head is checked instead (``check_secrets``): every encrypted file an app
applies must be encrypted to each age recipient its config names (else that
cluster could not decrypt it: an error, so the check fails before merge), and a
Secret in plaintext in Git is a warning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from agent.config.types import AppConfig, ClusterConfig, ClusterSettings, Config, SourceConfig, implicit_app
from agent.errors import AgentError, RenderError, RenderProblem
from agent.model import (
    DECRYPTED_FIELDS,
    DesiredObject,
    DesiredSet,
    ObjectKey,
    Revision,
    SkipReason,
    SyncKind,
    parse_release,
)
from agent.plan import apis, hooks
from agent.plan.ordering import sync_order
from agent.plan.release import RenderRelease, render_release
from agent.reconcile.charts import ChartPolls, chart_key, chart_refusal, with_charts
from agent.reconcile.reconciler import app_render_spec
from agent.render.renderer import RenderSpec, render, rendered_for
from agent.render.sops import SopsMode
from agent.report.diff import Preview, flag_app_conflicts, new_object, sort_objects
from agent.report.diff_fields import diff_objects
from agent.report.model import (
    ApiLine,
    AppReport,
    ClusterReport,
    Finding,
    FindingKind,
    Mode,
    ObjectAction,
    ObjectReport,
    Report,
    RevisionInfo,
    Severity,
)
from agent.source.git import GitSource

CONVENTION_DIR = "clusters"


def convention_clusters(*trees: Path) -> tuple[ClusterConfig, ...]:
    """``clusters/<name>/`` directories at any of ``trees``: one cluster each, sorted by name."""
    names = sorted(
        {
            p.name
            for t in trees
            if (t / CONVENTION_DIR).is_dir()
            for p in (t / CONVENTION_DIR).iterdir()
            if p.is_dir()
        }
    )
    return tuple(ClusterConfig(n, (f"{CONVENTION_DIR}/{n}",), ClusterSettings()) for n in names)


def _render_at(tree: Path, spec: RenderSpec, *, base: bool, revision: str) -> DesiredSet:
    if base:
        # The change may add this cluster or one of its paths: absent at base means empty there.
        paths = tuple(p for p in spec.paths if (tree / p).exists())
        fetched = spec.chart_dir is not None
        helm = spec.helm if spec.helm is None or fetched or (tree / spec.helm.chart).exists() else None
        if not paths and helm is None:
            return DesiredSet(spec.cluster, revision, ())
        spec = dataclasses.replace(spec, paths=paths or spec.paths, helm=helm)
    return render(tree, spec, revision=revision)


def compare_cluster(
    cluster: ClusterConfig,
    base: Revision,
    head: Revision,
    apps: Sequence[AppConfig] = (),
    *,
    kubernetes_version: str = "",
) -> ClusterReport:
    """One cluster's section: per app (default: the entry's own), its added/changed/removed
    objects between two checked-out revisions; an object two apps declare at the head is
    flagged in both apps' parts. ``kubernetes_version`` (else the cluster's own target): the
    head's objects using API versions that release removes are flagged, changed or not. Charts
    are rendered for that release, else the pinned one (``agent.plan.release``)."""
    chosen = list(apps) or [implicit_app(cluster, ())]
    target = kubernetes_version or cluster.settings.kubernetes_version
    release = render_release(cluster, kubernetes_version)
    previews = [compare_app(a, base, head, kubernetes_version=target, release=release) for a in chosen]
    return ClusterReport(cluster.name, flag_app_conflicts(previews, skip_others=False))


def _api_lines(objects: Sequence[DesiredObject], target: str) -> dict[ObjectKey, tuple[ApiLine, ...]]:
    """The head's objects whose apiVersion ``target`` removes, or deprecates (the table, a CRD
    of the render)."""
    release = parse_release(target) if target else None
    found: dict[ObjectKey, list[ApiLine]] = {}
    removed = apis.removed_by(objects, release) if release else {}
    notes = apis.deprecations([o for o in objects if o.key not in removed], release)
    for f in [*removed.values(), *notes.values()]:
        found.setdefault(f.key, []).append(ApiLine(f.problem.value, f.message, f.replacement))
    return {k: tuple(v) for k, v in found.items()}


def compare_app(
    app: AppConfig,
    base: Revision,
    head: Revision,
    *,
    kubernetes_version: str = "",
    release: RenderRelease | None = None,
) -> Preview:
    """One app's added/changed/removed objects; it fails alone (its own error). Charts choose
    their apiVersions for ``release`` (default: ``kubernetes_version``, else the pinned one)."""
    release = release or render_release(None, kubernetes_version)
    spec = dataclasses.replace(app_render_spec(app), sops=SopsMode.SEAL, kube_version=release.kube_version)
    try:
        before = _render_at(base.tree, _charted(spec, app, base), base=True, revision=base.sha)
    except AgentError as e:
        return Preview(AppReport(app.name, error=f"base revision {base.short}: {e}"))
    try:
        after = _render_at(head.tree, _charted(spec, app, head), base=False, revision=head.sha)
    except AgentError as e:
        return Preview(AppReport(app.name, error=f"head revision {head.short}: {e}"))
    try:  # the sync's steps, read as the pass reads them (a wave that is not an integer fails it)
        order = sync_order(after.objects, SyncKind.UPGRADE)
    except AgentError as e:
        return Preview(AppReport(app.name, error=f"head revision {head.short}: {e}"))
    old = {o.key: o for o in before.objects}
    new = {o.key: o for o in after.objects}
    api = _api_lines(after.objects, kubernetes_version)
    objects: list[ObjectReport] = []
    unchanged = 0
    base_label, head_label = f"base {base.short}", f"head {head.short}"
    for key in sorted(set(old) | set(new)):
        b, a = old.get(key), new.get(key)
        text, fields = diff_objects(
            b.manifest if b else None, a.manifest if a else None, from_label=base_label, to_label=head_label
        )
        if not fields:
            if a is not None and key in api:
                objects.append(
                    new_object(
                        key, a.api_version, ObjectAction.SKIP, source=str(a.provenance), reason="no change",
                        api=api[key],
                    )
                )  # fmt: skip
            else:
                unchanged += 1
            continue
        where = a or b
        assert where is not None
        if phases := hooks.deferred_hook(where.manifest):  # added, changed or removed: never applied
            reason = hooks.skip_reason(phases)
            skip = SkipReason.HELM_HOOK.value
            objects.append(
                new_object(
                    key,
                    where.api_version,
                    ObjectAction.SKIP,
                    source=str(where.provenance),
                    reason=reason,
                    skip=skip,
                )
            )
            continue
        action = (
            ObjectAction.CREATE if b is None else ObjectAction.PRUNE if a is None else ObjectAction.UPDATE
        )
        objects.append(
            new_object(
                key,
                where.api_version,
                action,
                diff=text,
                fields=fields,
                basis="git",
                source=str(where.provenance),
                reason=_moved(b, a),
                api=api.get(key, ()),
            )
        )
    report = AppReport(
        app.name,
        objects=sort_objects(objects),
        unchanged=unchanged,
        findings=check_secrets(app, after),
        notes=((release.describe(),) if rendered_for(after) is not None else ())
        + _chart_notes(app, base, head),
        sync=() if order.plain and not order.left_out else order.describe(),
    )
    return Preview(report, new)


def _charted(spec: RenderSpec, app: AppConfig, revision: Revision) -> RenderSpec:
    """``spec`` with the charts ``revision`` pinned for ``app``; ``RenderError`` when one of
    them could not be fetched (as a pass would fail)."""
    if (refused := chart_refusal(app, revision)) is not None:
        raise RenderError(
            [RenderProblem(app.helm.chart if app.helm else "", refused[0])], cluster=app.cluster
        )
    return with_charts(spec, app, revision)


def _chart_notes(app: AppConfig, base: Revision, head: Revision) -> tuple[str, ...]:
    """The chart each revision renders when they differ, and what the fetch said of the head's."""
    if app.helm is None or not app.helm.chart:
        return ()
    old, new = base.chart(*chart_key(app.helm)), head.chart(*chart_key(app.helm))
    notes = [f"chart {old or 'as vendored'} → {new or 'as vendored'}"] if str(old) != str(new) else []
    return tuple(notes) + (new.notes if new is not None else ())


def check_secrets(app: AppConfig, head: DesiredSet) -> tuple[Finding, ...]:
    """What a cluster would find wrong with ``app``'s encrypted files and Secrets at ``head``."""
    found: list[Finding] = []
    wanted = app.settings.decryption.age_recipients
    where = f"cluster {app.cluster!r}" + ("" if app.implicit else f", app {app.name!r}")
    for source in head.encrypted:
        for recipient in wanted:
            if recipient not in source.recipients:
                found.append(
                    Finding(
                        FindingKind.NOT_ENCRYPTED_TO,
                        Severity.ERROR,
                        source.file,
                        f"not encrypted to {recipient}, the age recipient of {where}: it could not "
                        "decrypt it (add the recipient: sops updatekeys, docs/secrets.md)",
                    )
                )
    if head.encrypted and not wanted:
        found.append(
            Finding(
                FindingKind.NO_RECIPIENTS,
                Severity.WARNING,
                "",
                f"{len(head.encrypted)} encrypted file(s), and no age_recipients configured for {where}: "
                "which keys they need is not checked",
            )
        )
    for obj in head.objects:
        annotations = (obj.manifest.get("metadata") or {}).get("annotations") or {}
        secret = obj.key.kind == "Secret" and obj.key.group == ""
        if (
            secret
            and DECRYPTED_FIELDS not in annotations
            and (obj.manifest.get("data") or obj.manifest.get("stringData"))
        ):
            found.append(
                Finding(
                    FindingKind.PLAINTEXT_SECRET,
                    Severity.WARNING,
                    obj.provenance.file,
                    f"{obj.key} holds its values in plaintext in Git: encrypt it with sops (docs/secrets.md)",
                )
            )
    return tuple(found)


def _moved(b: DesiredObject | None, a: DesiredObject | None) -> str:
    if b is not None and a is not None and b.provenance.file != a.provenance.file:
        return f"moved from {b.provenance.file}"
    return ""


def run_offline(
    repo: str,
    base_ref: str,
    head_ref: str,
    *,
    config: Config | None,
    cache_dir: Path,
    clusters: Sequence[str] = (),
    kubernetes_version: str = "",
) -> Report:
    """Resolve both refs, then compare every selected cluster; a ``SourceError`` propagates."""
    source_config = (
        dataclasses.replace(config.source, url=repo, branch="", tag="", commit="")
        if config is not None
        else SourceConfig(url=repo)
    )
    source = GitSource(source_config, cache_dir)
    base = source.resolve(base_ref)
    head = source.resolve(head_ref)
    chosen = config.clusters if config is not None else convention_clusters(base.tree, head.tree)
    chosen = tuple(c for c in chosen if not clusters or c.name in clusters)
    if config is not None:  # each revision with the charts it resolves to (their repositories, no cluster)
        charts = ChartPolls(config)
        wanted = [
            a.helm for c in chosen for a in config.apps_of(c.name) if a.helm is not None and a.helm.chart
        ]
        base, head = charts.attach_helm(wanted, base), charts.attach_helm(wanted, head)
    notes: tuple[str, ...] = ()
    if config is None:
        notes = (f"clusters by convention: `{CONVENTION_DIR}/<name>/` (no --config given)",)
    reports = tuple(
        compare_cluster(
            c,
            base,
            head,
            config.apps_of(c.name) if config is not None else (),
            kubernetes_version=kubernetes_version,
        )
        for c in chosen
    )
    return Report(
        Mode.OFFLINE,
        RevisionInfo(head_ref, head.sha),
        reports,
        base=RevisionInfo(base_ref, base.sha),
        notes=notes,
        kubernetes_version=kubernetes_version,
    )


__all__ = ["check_secrets", "compare_app", "compare_cluster", "convention_clusters", "run_offline"]
