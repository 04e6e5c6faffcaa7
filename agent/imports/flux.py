"""Flux's objects in a checked-out repository as an agent config: ``Kustomization`` and
``HelmRelease`` → ``[[apps]]``, their sources → ``[[sources]]``/``[[helm_repositories]]``, each
``clusters/<name>/`` directory (``flux bootstrap --path``) → a ``[[clusters]]`` entry.

Called by ``agent.cli.importer``. Which cluster an object serves is where Flux would apply it:
the ``clusters/<name>/`` it sits in, or the cluster of a Kustomization whose path applies its file
(followed through local kustomization resources). A HelmRelease a kustomization patches is read
from that path built offline (``building``), so the patched values and version are its own. A
Kustomization that applies only Flux objects (``flux-system``, an app of apps) is not an app: the
objects it applies are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.imports import flux_helm
from agent.imports.building import built_path
from agent.imports.common import clusters_of, depends, other_fields, table
from agent.imports.flux_sources import (
    artifact_copies,
    artifact_path,
    git_source,
    helm_repository,
    missing_source,
    oci_note,
)
from agent.imports.model import (
    App,
    HelmRepository,
    Imported,
    Note,
    Source,
    Tool,
    duration,
    label,
    repo_path,
    unique,
)
from agent.imports.reading import Found, Reach, Tree, reach, read_tree

FLUX = "fluxcd.io"
_KS_KNOWN = (
    "path", "dependsOn", "postBuild", "prune", "targetNamespace", "interval", "suspend", "sourceRef",
    "wait", "timeout", "serviceAccountName",
)  # fmt: skip
_NO_PEER = "the agent has no equivalent"


@dataclass
class _Unit:
    """A Kustomization: its source, the directory it applies and what that reaches."""

    obj: Found
    source: str = ""
    path: str = ""
    reach: Reach = field(default_factory=Reach)
    notes: list[Note] = field(default_factory=list)


@dataclass
class _Flux:
    tree: Tree
    default_cluster: str
    only: str
    sources: dict[str, Source] = field(default_factory=dict)
    source_names: set[str] = field(default_factory=set)
    notes: list[Note] = field(default_factory=list)

    def source(self, repo_name: str) -> str:
        """The ``[[sources]]`` name of GitRepository ``repo_name`` (made on first use)."""
        if repo_name not in self.sources:
            repo = next((g for g in self.tree.of(FLUX, "GitRepository") if g.name == repo_name), None)
            made = (
                git_source(repo, self.source_names) if repo else missing_source(repo_name, self.source_names)
            )
            self.sources[repo_name] = made
        return self.sources[repo_name].name


def import_flux(root: Path, *, cluster: str = "", kubeconfig: str = "") -> Imported:
    """Every Flux object under ``root`` as agent config; ``cluster`` names (and with
    ``clusters/<cluster>/`` in the tree, selects) the cluster."""
    tree = read_tree(root)
    flux = _Flux(tree, cluster or "default", cluster)
    units = [_unit(flux, k) for k in tree.of(FLUX, "Kustomization")]
    placed = _clusters(flux, units)
    apps: list[App] = []
    taken: dict[str, set[str]] = {}
    names: dict[tuple[str, str, str], str] = {}
    ks_apps = [(u, c) for u in units for c in placed.get(id(u.obj), ()) if _is_app(flux, u)]
    for u, c in ks_apps:
        names[("Kustomization", u.obj.name, c)] = unique(label(u.obj.name), taken.setdefault(c, set()))
    releases = [(r, c) for r in _releases(tree) for c in placed.get(id(r), ())]
    for r, c in releases:
        names[("HelmRelease", r.name, c)] = unique(label(r.name), taken.setdefault(c, set()))
    for u, c in ks_apps:
        apps.append(_kustomization_app(flux, u, c, names))
    repos = {h.name: helm_repository(h) for h in tree.of(FLUX, "HelmRepository")}
    ocis = {(o.namespace, o.name): o for o in tree.of(FLUX, "OCIRepository")}
    for r, c in releases:
        parents = [u for u, uc in ks_apps if uc == c and r.file in u.reach.files]
        applying = [u for u in units if r.file in u.reach.files and c in placed.get(id(u.obj), ())]
        patched, built_by = _as_patched(flux, r, applying)
        apps.append(
            flux_helm.release_app(
                patched, c, names, repos, parents=parents, source=flux.source, built_by=built_by, ocis=ocis
            )
        )
    for u in units:
        if not _is_app(flux, u) and placed.get(id(u.obj)):
            flux.notes.append(_parent_note(flux, u))
    charts = {
        (str(ref.get("namespace") or r.namespace), str(ref.get("name", "")))
        for r, _ in releases
        if isinstance(ref := r.spec.get("chartRef"), dict) and ref.get("kind") == "OCIRepository"
    }
    # An OCIRepository no release takes its chart from (a Kustomization's sourceRef, say).
    flux.notes += [oci_note(o) for key, o in ocis.items() if key not in charts]
    used = {a.helm.repository for a in apps if a.helm and a.helm.repository}
    return Imported(
        tool=Tool.FLUX,
        sources=tuple(flux.sources.values()),
        helm_repositories=_helm_repositories(repos, used),
        clusters=clusters_of((a.cluster for a in apps), kubeconfig, {}),
        apps=tuple(apps),
        notes=tuple(flux.notes),
        warnings=tuple(tree.warnings),
    )


def _releases(tree: Tree) -> list[Found]:
    """HelmReleases with a chart; one without is a kustomize patch of another (logged)."""
    found = []
    for r in tree.of(FLUX, "HelmRelease"):
        if "chart" in r.spec or "chartRef" in r.spec:
            found.append(r)
        else:
            tree.warnings.append(
                f"{r.file}: {r.label()} has no chart: read as a kustomize patch, not a release"
            )
    return found


def _as_patched(flux: _Flux, r: Found, applying: list[_Unit]) -> tuple[Found, str]:
    """``r`` as its Kustomization applies it when a kustomization on the way patches it (built
    offline, as the agent builds it), and that Kustomization's path; else ``r`` and ""."""
    for u in applying:
        if not u.reach.patched_by:
            continue
        objects, problem = built_path(flux.tree.root, u.path)
        if problem:
            flux.tree.warnings.append(f"{u.obj.label()}: path {u.path} did not build: {problem}")
            continue
        same = [o for o in objects if o.kind == r.kind and o.group == r.group and o.name == r.name]
        match = next((o for o in same if o.namespace == r.namespace), same[0] if same else None)
        if match is not None:
            return Found(r.file, r.line, match.body), u.path
    return r, ""


def _helm_repositories(repos: dict[str, HelmRepository], used: set[str]) -> tuple[HelmRepository, ...]:
    by_url: dict[str, HelmRepository] = {}
    for r in repos.values():
        if r.url in used:
            by_url.setdefault(r.url, r)
    return tuple(by_url.values())


def _unit(flux: _Flux, k: Found) -> _Unit:
    """A Kustomization's source and repository directory (through an ``ExternalArtifact``)."""
    u = _Unit(k)
    ref = table(k.spec, "sourceRef")
    kind, name, path = str(ref.get("kind", "")), str(ref.get("name", "")), repo_path(k.spec.get("path"))
    if kind == "GitRepository":
        u.source, u.path = flux.source(name), path
    elif kind == "ExternalArtifact":
        found = artifact_path(artifact_copies(flux.tree.of(FLUX, "ArtifactGenerator")).get(name, []), path)
        if found is None:
            u.notes.append(
                Note(
                    f"{k.label()} spec.sourceRef ExternalArtifact {name}",
                    "no ArtifactGenerator in PATH copies its path from a Git directory",
                )
            )
        else:
            u.source, u.path = flux.source(found[0]), found[1]
    else:
        u.notes.append(
            Note(
                f"{k.label()} spec.sourceRef {kind} {name}",
                f"{kind} sources are not supported as Git sources",
            )
        )
    if u.path:
        if not (flux.tree.root / u.path).exists():
            flux.tree.warnings.append(
                f"{k.label()}: path {u.path} is not in PATH: what it applies is not followed"
            )
        u.reach = reach(flux.tree.root, u.path, flux.tree.warnings)
    return u


def _cluster_dir(file: str) -> str:
    parts = file.split("/")
    return label(parts[1]) if len(parts) > 2 and parts[0] == "clusters" else ""


def _clusters(flux: _Flux, units: list[_Unit]) -> dict[int, tuple[str, ...]]:
    """Object id → the clusters it serves: its ``clusters/<name>/``, then what applies it."""
    objects = flux.tree.objects
    placed: dict[int, set[str]] = {id(o): {c} for o in objects if (c := _cluster_dir(o.file))}
    changed = True
    while changed:
        changed = False
        for u in units:
            for o in objects:
                if o.file in u.reach.files and not placed.get(id(u.obj), set()) <= placed.get(id(o), set()):
                    placed.setdefault(id(o), set()).update(placed.get(id(u.obj), set()))
                    changed = True
    if not any(_cluster_dir(o.file) for o in objects):
        placed = {i: {flux.default_cluster} | c for i, c in placed.items()}
    for o in objects:
        placed.setdefault(id(o), {flux.default_cluster})
    if flux.only and any(_cluster_dir(o.file) == label(flux.only) for o in objects):
        placed = {i: c & {label(flux.only)} for i, c in placed.items()}
    return {i: tuple(sorted(c)) for i, c in placed.items() if c}


def _is_app(flux: _Flux, u: _Unit) -> bool:
    """False for a Kustomization that applies only Flux's objects (or Flux itself)."""
    if not u.source:
        return False
    applied = [o for o in flux.tree.objects if o.file in u.reach.files]
    return not applied or any(not o.group.endswith(FLUX) for o in applied)


def _parent_note(flux: _Flux, u: _Unit) -> Note:
    if not u.source:
        return u.notes[0] if u.notes else Note(u.obj.label(), "it has no Git source")
    kinds = sorted({o.label() for o in flux.tree.objects if o.file in u.reach.files})
    why = (
        "it applies only Flux's objects ("
        + ", ".join(kinds[:6])
        + (", ..." if len(kinds) > 6 else "")
        + "), imported on their own"
    )
    return Note(f"{u.obj.label()} (path {u.path})", why)


def _kustomization_app(flux: _Flux, u: _Unit, cluster: str, names: dict[tuple[str, str, str], str]) -> App:
    k, spec, what = u.obj, u.obj.spec, u.obj.label()
    notes = list(u.notes) + other_fields(spec, _KS_KNOWN, what, _NO_PEER)
    settings: dict[str, Any] = {}
    if (interval := duration(spec.get("interval"))) is not None:
        settings["reconcile_interval"] = interval
    if spec.get("prune") is False or "prune" not in spec:
        settings["prune"] = False
    if ns := spec.get("targetNamespace"):
        settings["default_namespace"] = str(ns)
        notes.append(
            Note(
                f"{what} spec.targetNamespace {ns} (set as default_namespace)",
                "Flux's targetNamespace overrides every object's namespace, while default_namespace only "
                "fills the namespace of objects that set none",
            )
        )
    if spec.get("wait"):
        settings["wait"] = True
        if (timeout := duration(spec.get("timeout"))) is not None:
            settings["health_timeout"] = timeout
    elif "timeout" in spec:
        notes.append(
            Note(
                f"{what} spec.timeout",
                "without wait the agent bounds a pass, not an apply: pass_deadline is the cluster's",
            )
        )
    if sa := spec.get("serviceAccountName"):
        settings["service_account"] = f"{k.namespace or 'flux-system'}/{sa}"
    variables, var_notes = _post_build(spec.get("postBuild"), what)
    notes += var_notes
    flux_objects = sorted(
        {o.label() for o in flux.tree.objects if o.file in u.reach.files and o.group.endswith(FLUX)}
    )
    if flux_objects:
        notes.append(
            Note(
                f"{what}: Flux objects it applies ({', '.join(flux_objects)})",
                "they are imported as apps of their own, but still render with this app: remove them from "
                f"{u.path} once Flux is gone (without Flux's CRDs their apply fails)",
            )
        )
    return App(
        name=names[("Kustomization", k.name, cluster)],
        cluster=cluster,
        source=u.source,
        origin=f"{what} ({k.file})",
        paths=(u.path,),
        settings=settings,
        depends_on=depends(spec.get("dependsOn"), "Kustomization", cluster, names, what, notes),
        suspend=bool(spec.get("suspend")),
        vars=variables,
        notes=tuple(notes),
    )


def _post_build(post: Any, what: str) -> tuple[dict[str, str], list[Note]]:
    if not isinstance(post, dict):
        return {}, []
    notes = other_fields(post, ("substitute", "substituteFrom"), f"{what} postBuild", _NO_PEER)
    variables = {str(k): str(v) for k, v in (post.get("substitute") or {}).items()}
    for ref in post.get("substituteFrom") or ():
        if isinstance(ref, dict):
            notes.append(
                Note(
                    f"{what} spec.postBuild.substituteFrom {ref.get('kind')} {ref.get('name')}",
                    "variables come from the config, not from the cluster: copy its keys into [apps.vars] "
                    "(a Secret's into a SOPS-encrypted file instead)",
                )
            )
    return variables, notes
