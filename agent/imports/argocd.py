"""Argo CD's objects in a checked-out repository as an agent config: each ``Application`` (and
each one an ``ApplicationSet`` generates) → an ``[[apps]]`` entry, its repositories →
``[[sources]]``/``[[helm_repositories]]``, each distinct destination → a ``[[clusters]]`` entry.

Called by ``agent.cli.importer``. An app of apps (an Application whose path in PATH yields
Applications) is not an app itself: the Applications it yields are (``app_of_apps``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.imports import appsets
from agent.imports.app_of_apps import Leaf, leaves
from agent.imports.argo_helm import values_of
from agent.imports.common import clusters_of, git_ref, other_fields, table
from agent.imports.content import content_notes
from agent.imports.model import (
    App,
    Helm,
    HelmRepository,
    Ignore,
    Imported,
    Note,
    Source,
    Tool,
    label,
    repo_path,
    unique,
)
from agent.imports.reading import Found, read_tree
from agent.render.kustomize import kustomization_file

ARGO = "argoproj.io"
IN_CLUSTER = ("https://kubernetes.default.svc", "in-cluster")
_SPEC_KNOWN = ("source", "sources", "destination", "syncPolicy", "ignoreDifferences", "project")
_SOURCE_KNOWN = ("repoURL", "path", "targetRevision", "chart", "helm", "ref", "directory")
_HELM_KNOWN = ("valueFiles", "values", "valuesObject", "releaseName", "parameters")
_NO_PEER = "the agent has no equivalent"


@dataclass
class _Argo:
    root: Path
    local: str
    sources: dict[tuple[str, str], Source] = field(default_factory=dict)
    source_names: set[str] = field(default_factory=set)
    repos: dict[str, HelmRepository] = field(default_factory=dict)
    cluster_notes: dict[str, list[Note]] = field(default_factory=dict)
    taken: dict[str, set[str]] = field(default_factory=dict)

    def source(self, url: str, revision: str, what: str, notes: list[Note]) -> str:
        ref, ref_notes = git_ref(revision, what)
        notes += ref_notes
        key = (url.rstrip("/").removesuffix(".git"), str(sorted(ref.items())))
        if key not in self.sources:
            base = label(url.rstrip("/").removesuffix(".git").rsplit("/", 1)[-1])
            self.sources[key] = Source(
                unique(base, self.source_names),
                url,
                branch=ref.get("branch", ""),
                tag=ref.get("tag", ""),
                commit=ref.get("commit", ""),
            )
        return self.sources[key].name

    def cluster(self, destination: dict[str, Any]) -> str:
        server, name = str(destination.get("server", "")), str(destination.get("name", ""))
        if server in IN_CLUSTER or name in IN_CLUSTER or not (server or name):
            return self.local
        cluster = label(name or server.split("://", 1)[-1].split("/")[0].split(":")[0])
        self.cluster_notes.setdefault(
            cluster,
            [
                Note(
                    f"destination {name or server}",
                    "the kubeconfig (and its context) that reaches it is the operator's to give",
                )
            ],
        )
        return cluster


def import_argocd(root: Path, *, cluster: str = "", kubeconfig: str = "") -> Imported:
    """Every Argo CD Application and ApplicationSet under ``root`` as agent config; ``cluster``
    names Argo CD's own cluster (``https://kubernetes.default.svc``, default ``in-cluster``)."""
    tree = read_tree(root)
    argo = _Argo(root, label(cluster or "in-cluster"))
    notes: list[Note] = []
    applications = tree.of(ARGO, "Application")
    for appset in tree.of(ARGO, "ApplicationSet"):
        generated, set_notes = appsets.expand(appset, root)
        applications += generated
        notes += set_notes
    apps: list[App] = []
    for leaf in leaves(root, applications, notes):
        made = _application(argo, leaf)
        if isinstance(made, Note):
            notes.append(made)
        else:
            apps.append(made)
    return Imported(
        tool=Tool.ARGOCD,
        sources=tuple(argo.sources.values()),
        helm_repositories=tuple(argo.repos.values()),
        clusters=clusters_of((a.cluster for a in apps), kubeconfig, argo.cluster_notes),
        apps=tuple(apps),
        notes=tuple(notes),
        warnings=tuple(tree.warnings),
    )


def _application(argo: _Argo, leaf: Leaf) -> App | Note:
    a = leaf.found
    spec, what = a.spec, a.label()
    notes = other_fields(spec, _SPEC_KNOWN, what, _NO_PEER)
    if spec.get("project") not in (None, "default"):
        notes.append(
            Note(
                f"{what} spec.project {spec['project']}",
                "a project's limits are set per app here: allowed_namespaces, allowed_kinds",
            )
        )
    all_sources = [s for s in (spec.get("sources") or [spec.get("source")]) if isinstance(s, dict)]
    refs = {str(s["ref"]): s for s in all_sources if s.get("ref")}
    main = [s for s in all_sources if not s.get("ref") or s.get("path") or s.get("chart")]
    if not main:
        return Note(what, "it has no source")
    destination = table(spec, "destination")
    cluster = argo.cluster(destination)
    first = main[0]
    helm, source_name, paths = _render(argo, first, refs, a, notes)
    for extra in main[1:]:
        if extra.get("repoURL") == first.get("repoURL") and extra.get("path") and not extra.get("chart"):
            paths += (repo_path(extra["path"]),)
        else:
            notes.append(
                Note(
                    f"{what} spec.sources {extra.get('repoURL')}",
                    "an app renders from one Git source: make it an app of its own",
                )
            )
    namespace = str(destination.get("namespace", ""))
    settings = _sync(spec.get("syncPolicy"), what, notes)
    for path in paths:
        notes += content_notes(argo.root, path, what)
    if helm is None and len(paths) == 1:
        settings = {**settings, **_directory(argo.root, first, paths[0])}
    if namespace:  # for a chart too: its objects that name no namespace go to default_namespace
        settings = {"default_namespace": namespace, **settings}
    if namespace and helm is not None:
        helm = Helm(**{**helm.__dict__, "namespace": namespace})
    return App(
        name=unique(label(a.name), argo.taken.setdefault(cluster, set())),
        cluster=cluster,
        source=source_name,
        origin=leaf.origin(),
        paths=paths,
        settings=settings,
        helm=helm,
        ignore=_ignore(spec.get("ignoreDifferences"), what, notes),
        notes=tuple(notes),
    )


def _render(
    argo: _Argo, s: dict[str, Any], refs: dict[str, dict[str, Any]], a: Found, notes: list[Note]
) -> tuple[Helm | None, str, tuple[str, ...]]:
    """(helm settings, the app's Git source, its paths) of an Application's main source; the
    release is named as Argo CD names it, ``releaseName`` or else the Application's name."""
    what = a.label()
    notes += other_fields(s, _SOURCE_KNOWN, f"{what} source", _NO_PEER)
    helm_spec = table(s, "helm")
    notes += other_fields(helm_spec, _HELM_KNOWN, f"{what} source.helm", _NO_PEER)
    if isinstance(s.get("directory"), dict):
        notes += [Note(f"{what} source.directory.{k}", _NO_PEER) for k in s["directory"] if k != "recurse"]
    repo_url, revision = str(s.get("repoURL", "")), str(s.get("targetRevision", ""))
    values = values_of(helm_spec, what, notes)
    release = str(helm_spec.get("releaseName") or a.name)
    if s.get("chart"):
        url = repo_url if "://" in repo_url else f"oci://{repo_url}"
        argo.repos.setdefault(url, HelmRepository(url))
        files, git = _ref_values(argo, helm_spec, refs, what, notes)
        helm = Helm(
            chart=str(s["chart"]),
            repository=url,
            version=revision,
            release_name=release,
            values_files=files,
            values=values,
        )
        if not git:
            notes.append(
                Note(
                    f"{what} source (a chart)",
                    "an app needs a Git source: the placeholder repository serves none of its files",
                )
            )
            git = argo.source("https://git.invalid/values.git", "main", what, [])
        return helm, git, ()
    path = repo_path(s.get("path"))
    git = argo.source(repo_url, revision, what, notes)
    if helm_spec or (argo.root / path / "Chart.yaml").is_file():
        files = tuple(
            repo_path(f"{path}/{f}") for f in helm_spec.get("valueFiles") or () if not str(f).startswith("$")
        )
        ref_files, _ = _ref_values(argo, helm_spec, refs, what, notes, same_as=repo_url)
        helm = Helm(
            chart=path,
            release_name=release,
            values_files=files + ref_files,
            values=values,
        )
        return helm, git, (path,)
    return None, git, (path,)


def _directory(root: Path, s: dict[str, Any], path: str) -> dict[str, Any]:
    """Settings that make the agent read a plain directory as Argo CD does: without
    ``directory.recurse`` Argo CD reads no sub-directory, the agent every one (``exclude``)."""
    directory = root / path
    if not directory.is_dir() or kustomization_file(directory) is not None:
        return {}
    recurse = table(s, "directory").get("recurse") is True
    if recurse or not any(p.is_dir() and not p.name.startswith(".") for p in directory.iterdir()):
        return {}
    return {"exclude": [f"{path}/*/"] if path != "." else ["/*/"]}


def _ref_values(
    argo: _Argo,
    helm_spec: dict[str, Any],
    refs: dict[str, dict[str, Any]],
    what: str,
    notes: list[Note],
    *,
    same_as: str = "",
) -> tuple[tuple[str, ...], str]:
    """``$ref/file`` value files from the ref'd source, when it can be the app's Git source."""
    files: list[str] = []
    git = ""
    for f in helm_spec.get("valueFiles") or ():
        ref, _, rest = str(f).partition("/")
        if not ref.startswith("$"):
            continue
        source = refs.get(ref[1:])
        if source is None:
            notes.append(Note(f"{what} valueFiles {f}", f"no source has ref {ref[1:]}"))
            continue
        url = str(source.get("repoURL", ""))
        if same_as and url.rstrip("/").removesuffix(".git") != same_as.rstrip("/").removesuffix(".git"):
            notes.append(
                Note(
                    f"{what} valueFiles {f}",
                    "it is in another repository than the chart: values_files come from the app's Git source",
                )
            )
            continue
        git = git or argo.source(url, str(source.get("targetRevision", "")), what, notes)
        files.append(repo_path(rest))
    return tuple(files), git


def _sync(policy: Any, what: str, notes: list[Note]) -> dict[str, Any]:
    """``syncPolicy`` as app settings."""
    policy = policy if isinstance(policy, dict) else {}
    settings: dict[str, Any] = {}
    auto = policy.get("automated")
    if not isinstance(auto, dict):
        notes.append(
            Note(
                f"{what} manual sync (no syncPolicy.automated)",
                "the agent applies every new commit: suspend = true stops it",
            )
        )
        auto = {}
    if not auto.get("prune"):
        settings["prune"] = False
    if not auto.get("selfHeal"):
        settings["drift"] = "report"
    if auto.get("allowEmpty"):
        settings["allow_empty"] = True
    for option in policy.get("syncOptions") or ():
        if option == "CreateNamespace=true":
            settings["create_namespace"] = True
        elif option != "ServerSideApply=true":
            notes.append(Note(f"{what} syncOptions {option}", _NO_PEER))
    notes += [
        Note(f"{what} syncPolicy.{k}", _NO_PEER) for k in policy if k not in ("automated", "syncOptions")
    ]
    return settings


def _ignore(raw: Any, what: str, notes: list[Note]) -> tuple[Ignore, ...]:
    rules: list[Ignore] = []
    for i, d in enumerate(raw or ()):
        if not isinstance(d, dict):
            continue
        if d.get("jqPathExpressions"):
            notes.append(
                Note(
                    f"{what} ignoreDifferences[{i}].jqPathExpressions",
                    "jq is not read: write them as json_pointers or paths",
                )
            )
        pointers = tuple(str(p) for p in d.get("jsonPointers") or ())
        managers = tuple(str(m) for m in d.get("managedFieldsManagers") or ())
        if pointers or managers:
            rules.append(
                Ignore(
                    str(d.get("group", "")),
                    str(d.get("kind", "")),
                    str(d.get("name", "")),
                    str(d.get("namespace", "")),
                    pointers,
                    managers,
                )
            )
    return tuple(rules)
