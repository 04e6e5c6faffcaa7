"""The apps of one cluster pass, as pure decisions: which run, in what order, who holds an object.

``ClusterReconciler`` asks these before it writes anything: the apps of its cluster
(``cluster_apps``), the revision of each app's source (``revisions_of``), which apps a pass
must run for the requested ones to have their dependencies (``with_dependencies``), their
order (``dependency_order``), and, for an object several apps declare or another app's set
holds, which app manages it (``assign``). Pure: no client, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.config.types import DEFAULT_SOURCE, AppConfig, ClusterConfig, Config, implicit_app
from agent.model import AppConflict, ClusterResult, ObjectKey, Revision

#: Source name → the revision it delivered; an app renders its own source's.
Revisions = Mapping[str, Revision]


def revisions_of(config: Config, revision: Revision | Revisions) -> dict[str, Revision]:
    """Every source's revision. A single ``Revision`` is the one source callers poll today
    (``GitSource.from_config``: ``Config.source``), under every name that source has."""
    if isinstance(revision, Revision):
        names = [s.name for s in config.sources if s.config == config.source] or [DEFAULT_SOURCE]
        return dict.fromkeys(names, revision)
    return dict(revision)


def cluster_apps(config: Config, cluster: ClusterConfig) -> tuple[AppConfig, ...]:
    """The apps on ``cluster`` in config order; a config built without apps has the entry's own."""
    apps = config.apps_of(cluster.name)
    if apps or config.apps:
        return apps
    return (
        (implicit_app(cluster, config.conflict_rules, config.health_checks, config.ignore),)
        if cluster.has_app
        else ()
    )


def with_dependencies(
    apps: Sequence[AppConfig], wanted: Iterable[str], succeeded: Mapping[str, str], revisions: Revisions
) -> set[str]:
    """``wanted`` and, transitively, each dependency not known to have succeeded at its source's
    current revision (``succeeded``: app → revision of its last successful pass): those run first."""
    by_name = {a.name: a for a in apps}
    due = {n for n in wanted if n in by_name}
    todo = list(due)
    while todo:
        for dep in by_name[todo.pop()].depends_on:
            if dep in due or dep not in by_name:
                continue
            rev = revisions.get(by_name[dep].source)
            if rev is not None and succeeded.get(dep) == rev.sha:
                continue
            due.add(dep)
            todo.append(dep)
    return due


def dependency_order(apps: Sequence[AppConfig]) -> list[AppConfig]:
    """``apps`` with each after its dependencies, otherwise in config order (cycles are refused at load)."""
    names = {a.name for a in apps}
    placed: set[str] = set()
    out: list[AppConfig] = []
    pending = list(apps)
    while pending:
        ready = next((a for a in pending if all(d in placed or d not in names for d in a.depends_on)), None)
        if ready is None:  # a cycle: the loader refuses it, so this only keeps the function total
            out.extend(pending)
            break
        out.append(ready)
        placed.add(ready.name)
        pending.remove(ready)
    return out


@dataclass(frozen=True)
class Declared:
    """One app's declaration of an object: the app and the file that declares it."""

    app: str
    file: str


@dataclass(frozen=True)
class Assignment:
    """Which app manages one object in this pass, and what the others are told."""

    #: The app that plans and applies it; ``None``: nobody this pass (its holder is unknown).
    owner: str | None
    #: Why the declaring apps other than ``owner`` leave it alone.
    reason: str = ""
    conflicts: tuple[AppConflict, ...] = ()


def assign(
    key: ObjectKey, declared: Sequence[Declared], holder: str | None, known: Iterable[str]
) -> Assignment:
    """Who manages ``key``, declared by ``declared`` (config order) and held live by ``holder``.

    ``holder``: the app whose set the live object is a member of (a renamed app's set counts as
    its successor's), ``None`` when no app of this agent on the cluster holds it. ``known``: the
    apps whose declarations this pass knows (rendered, not suspended, not refused).

    - The holder keeps what it still declares; the others never write it (no flip-flop).
    - A holder that no longer declares it hands it to the first app that does (handover).
    - A holder whose declarations are unknown keeps it for now: nobody takes it over.
    - Held by no app: the first declaring app in config order.
    """
    apps = [d.app for d in declared]
    if holder is not None and holder not in apps and holder not in set(known):
        why = f"a member of app {holder!r}, whose declarations are unknown in this pass; left alone"
        return Assignment(None, reason=why)
    owner = holder if holder is not None and holder in apps else apps[0]
    if len(declared) == 1:
        return Assignment(owner)
    first = next(d for d in declared if d.app == owner)
    conflicts = tuple(AppConflict(key, owner, first.file, d.app, d.file) for d in declared if d.app != owner)
    reason = "; ".join(str(c) for c in conflicts)
    return Assignment(owner, reason=reason, conflicts=conflicts)


def combined(cluster: str, results: Sequence[ClusterResult]) -> ClusterResult:
    """One result for a whole cluster pass, for callers that know one app per cluster: the app's
    own result; with several, every object's result and the first failure and prune refusal."""
    if len(results) == 1:
        return results[0]
    if not results:
        return ClusterResult(cluster)
    first = results[0]
    return ClusterResult(
        cluster,
        first.revision,
        results=[r for res in results for r in res.results],
        failure=next((r.failure for r in results if r.failure), None),
        prune_refusal=next((r.prune_refusal for r in results if r.prune_refusal), None),
        started=first.started,
        finished=results[-1].finished,
        dry_run=first.dry_run,
        conflicts=[c for r in results for c in r.conflicts],
    )
