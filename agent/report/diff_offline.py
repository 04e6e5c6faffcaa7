"""Offline diff reports: what a change does to each cluster's desired state, without any cluster.

Called by ``gitops-agent diff --offline``. Both revisions are checked out
through ``GitSource.resolve`` (any URL the agent can fetch, or a local
repository such as the PR's own checkout), each cluster's paths are rendered
at both, and objects are matched by identity (group, kind, namespace as
written, name): added, changed (with field-level diffs) or removed. Secrets
are masked by ``diff_fields.diff_objects`` like in live mode.

Which clusters: the ``--config`` file's clusters (paths, variables, Helm
settings, excludes; their kubeconfigs need not exist: nothing here connects),
or without one, by convention every directory ``clusters/<name>/`` found at
either revision, rendered without variables.
A cluster path that does not exist at the base revision counts as empty
there (the change adds it); at the head revision it is an error, as the
agent would report it. Each cluster fails alone (its own error section).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from agent.config.types import ClusterConfig, ClusterSettings, Config, SourceConfig
from agent.errors import AgentError
from agent.model import DesiredObject, DesiredSet, Revision
from agent.reconcile.reconciler import render_spec
from agent.render.renderer import RenderSpec, render
from agent.report.diff import new_object, sort_objects
from agent.report.diff_fields import diff_objects
from agent.report.model import ClusterReport, Mode, ObjectAction, ObjectReport, Report, RevisionInfo
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
        helm = spec.helm if spec.helm is None or (tree / spec.helm.chart).exists() else None
        if not paths and helm is None:
            return DesiredSet(spec.cluster, revision, ())
        spec = dataclasses.replace(spec, paths=paths or spec.paths, helm=helm)
    return render(tree, spec, revision=revision)


def compare_cluster(cluster: ClusterConfig, base: Revision, head: Revision) -> ClusterReport:
    """One cluster's added/changed/removed objects between two checked-out revisions."""
    spec = render_spec(cluster)
    try:
        before = _render_at(base.tree, spec, base=True, revision=base.sha)
    except AgentError as e:
        return ClusterReport(cluster.name, error=f"base revision {base.short}: {e}")
    try:
        after = _render_at(head.tree, spec, base=False, revision=head.sha)
    except AgentError as e:
        return ClusterReport(cluster.name, error=f"head revision {head.short}: {e}")
    old = {o.key: o for o in before.objects}
    new = {o.key: o for o in after.objects}
    objects: list[ObjectReport] = []
    unchanged = 0
    base_label, head_label = f"base {base.short}", f"head {head.short}"
    for key in sorted(set(old) | set(new)):
        b, a = old.get(key), new.get(key)
        text, fields = diff_objects(
            b.manifest if b else None, a.manifest if a else None, from_label=base_label, to_label=head_label
        )
        if not fields:
            unchanged += 1
            continue
        action = (
            ObjectAction.CREATE if b is None else ObjectAction.PRUNE if a is None else ObjectAction.UPDATE
        )
        where = a or b
        assert where is not None
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
            )
        )
    return ClusterReport(cluster.name, objects=sort_objects(objects), unchanged=unchanged)


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
    notes: tuple[str, ...] = ()
    if config is None:
        notes = (f"clusters by convention: `{CONVENTION_DIR}/<name>/` (no --config given)",)
    reports = tuple(compare_cluster(c, base, head) for c in chosen)
    return Report(
        Mode.OFFLINE,
        RevisionInfo(head_ref, head.sha),
        reports,
        base=RevisionInfo(base_ref, base.sha),
        notes=notes,
    )


__all__ = ["compare_cluster", "convention_clusters", "run_offline"]
