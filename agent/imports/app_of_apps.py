"""Argo CD's app of apps: an Application whose path in PATH yields Applications. The path is
rendered as the agent renders it (``building``, offline: a Helm chart with the parent's
release name, namespace and values, a kustomization built, a plain directory read), and the
Applications and ApplicationSets it yields are imported in the parent's place, recursively, at
most ``MAX_DEPTH`` parents deep and never through an Application already on the way (a cycle).

Called by ``argocd``. A path is rendered only when a file it reaches has ``kind: Application``
(or ``ApplicationSet``): an import never runs Helm or kustomize on an ordinary app's chart.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config.helm_types import HelmSettings
from agent.imports import appsets
from agent.imports.argo_helm import values_of
from agent.imports.building import CLUSTER, built
from agent.imports.common import table
from agent.imports.model import Note, label, repo_path
from agent.imports.reading import MAX_FILE_BYTES, Found, reach, yaml_files
from agent.render.kustomize import kustomization_file
from agent.render.renderer import RenderSpec

ARGO = "argoproj.io"
#: A file that may yield an Application: the kind, as a YAML file or a template spells it.
_KINDS = re.compile(rb"^\s*kind:\s*[\"']?Application(Set)?[\"']?\s*$", re.MULTILINE)
#: Apps of apps nested deeper than this are not followed (a note says so).
MAX_DEPTH = 5


@dataclass(frozen=True)
class Leaf:
    """An Application to import as an app, and the parents that yielded it (outermost first)."""

    found: Found
    parents: tuple[str, ...] = ()

    def origin(self) -> str:
        """Where the Application is, and (yielded by a parent) which parent rendered it."""
        where = f"{self.found.label()} ({self.found.file})"
        if not self.parents:
            return where
        return f"{where}, yielded by the app of apps {' > '.join(self.parents)}"


def leaves(root: Path, applications: list[Found], notes: list[Note]) -> list[Leaf]:
    """The apps among ``applications`` and among every Application their parents yield, once each
    by name (Argo CD's identity of an Application). An Application in a file a parent's path
    reaches is taken as that parent yields it (a kustomization may rename it), not as read. A
    chart or kustomization yielding Applications that no Application points at (its parent is
    made by ``argocd app create``) is a parent too."""
    found: dict[str, Leaf] = {}
    named = {p for a in applications if (p := _path(a))}

    def visit(a: Found, chain: tuple[str, ...]) -> None:
        if path := _path(a):
            named.add(path)
        if a.label() in chain:
            notes.append(Note(f"{a.label()} yielded by {chain[-1]}", "it is a cycle: not followed"))
            return
        if len(chain) >= MAX_DEPTH and _parent_path(root, a):
            notes.append(Note(a.label(), f"apps of apps deeper than {MAX_DEPTH} are not followed"))
            return
        held = _held(root, a, notes) if len(chain) < MAX_DEPTH else None
        if held is None:
            known = found.get(a.name)
            if known is None or len(known.parents) < len(chain):
                found[a.name] = Leaf(a, chain)
            return
        for child in held:
            visit(child, (*chain, a.label()))

    unnamed = _unnamed_parents(root, named)
    parents = [p for a in applications if (p := _parent_path(root, a))] + unnamed
    owned = {f for p in parents for f in _files(root, p)}
    for a in applications:
        if a.file not in owned:
            visit(a, ())
    for path in unnamed:
        if path in named:  # an Application met since points at it
            continue
        notes.append(
            Note(
                f"the parent Application of {path}",
                "no Application in PATH points at it (argocd app create made it): "
                f"rendered as Application {label(path)} with the chart's own values",
            )
        )
        for child in _held(root, _parent(path), notes) or ():
            visit(child, (_parent(path).label(),))
    return list(found.values())


def _path(a: Found) -> str:
    """The repository path ``a`` renders ("": none, a chart of a Helm repository)."""
    source = _source(a)
    return repo_path(source["path"]) if source.get("path") and not source.get("chart") else ""


def _files(root: Path, path: str) -> list[str]:
    """The PATH-relative files ``path`` applies: its kustomization's, else every file under it."""
    directory = (root / path).resolve()
    if not directory.is_dir() or not directory.is_relative_to(root.resolve()):
        return []
    if kustomization_file(directory) is not None:
        return sorted(reach(root, path, []).files)
    top = root.resolve()
    return [
        p.relative_to(top).as_posix()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    ]


def _unnamed_parents(root: Path, named: set[str]) -> list[str]:
    """Charts and kustomizations in PATH that may yield Applications and that no Application renders,
    outermost only: not one inside another, nor a kustomization another one builds."""
    found: dict[str, set[str]] = {}  # candidate -> the directories it builds
    for file in yaml_files(root):
        rel = file.parent.relative_to(root).as_posix() or "."
        if file.name != "Chart.yaml" and kustomization_file(file.parent) != file:
            continue
        if rel in named or _parent_path(root, _parent(rel)) != rel:
            continue
        built = reach(root, rel, []).files if kustomization_file(file.parent) is not None else set()
        found[rel] = {Path(f).parent.as_posix() for f in built} - {rel}
    inner = {p for p in found for q in found if q != p and (q == "." or p.startswith(f"{q}/"))}
    inner |= {p for q, built in found.items() for p in built}
    return [p for p in found if p not in inner]


def _parent(path: str) -> Found:
    """The Application ``argocd app create --path PATH`` would make, with no settings of its own."""
    body = {
        "apiVersion": f"{ARGO}/v1alpha1",
        "kind": "Application",
        "metadata": {"name": label(path), "namespace": "argocd"},
        "spec": {"source": {"path": path}, "destination": {"server": "https://kubernetes.default.svc"}},
    }
    return Found(path, None, body)


def _parent_path(root: Path, a: Found) -> str:
    """``a``'s path in PATH when a file it reaches has ``kind: Application`` (or ApplicationSet)."""
    path = _path(a)
    for rel in _files(root, path) if path else ():
        file = root / rel
        if file.stat().st_size <= MAX_FILE_BYTES and _KINDS.search(file.read_bytes()):
            return path
    return ""


def _source(a: Found) -> dict[str, Any]:
    """The source an Application renders from (of ``sources``, the first with a path)."""
    sources = [s for s in (a.spec.get("sources") or [a.spec.get("source")]) if isinstance(s, dict)]
    return next((s for s in sources if s.get("path")), sources[0] if sources else {})


def _held(root: Path, a: Found, notes: list[Note]) -> list[Found] | None:
    """What ``a`` yields when it is an app of apps (rendered), else None (an app)."""
    path = _parent_path(root, a)
    if not path:
        return None
    what = f"{a.label()} (path {path})"
    objects, problem = built(root, _render_spec(root, a, path, what, notes))
    if problem:
        why = f"it may yield Applications but its path did not render, so nothing it holds is: {problem}"
        notes.append(Note(what, why))
        return []
    held: list[Found] = []
    others: Counter[str] = Counter()
    for child in objects:
        if child.group.endswith(ARGO) and child.kind == "Application":
            held.append(child)
        elif child.group.endswith(ARGO) and child.kind == "ApplicationSet":
            generated, set_notes = appsets.expand(child, root)
            held += generated
            notes += set_notes
        else:
            others[child.kind] += 1
    if not held:
        return None
    notes.append(
        Note(what, f"it is an app of apps: the {len(held)} Application(s) it yields are imported, it is not")
    )
    if others:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(others.items()))
        notes.append(Note(f"{what}: its other objects ({kinds})", "make them an app of their own"))
    return held


def _render_spec(root: Path, a: Found, path: str, what: str, notes: list[Note]) -> RenderSpec:
    """How Argo CD renders the parent: a chart as release ``releaseName`` (default: the
    Application's name) in the destination namespace, with its value files, values, parameters."""
    source = _source(a)
    notes += [
        Note(f"{what} source.{k}", "the import renders the path without it")
        for k in ("kustomize", "plugin", "directory")
        if k in source
    ]
    if not (root / path / "Chart.yaml").is_file():
        return RenderSpec(cluster=CLUSTER, paths=(path,))
    helm = table(source, "helm")
    files: list[str] = []
    for f in helm.get("valueFiles") or ():
        if str(f).startswith("$"):
            notes.append(Note(f"{what} valueFiles {f}", "a file of another source is not read by the import"))
        else:
            files.append(repo_path(f"{path}/{f}"))
    values = values_of(helm, what, notes)
    settings = HelmSettings(
        chart=path,
        release_name=str(helm.get("releaseName") or a.name),
        namespace=str(table(a.spec, "destination").get("namespace", "")),
        values_files=tuple(files),
        values=json.dumps(values, sort_keys=True) if values else "",
    )
    return RenderSpec(cluster=CLUSTER, paths=(path,), helm=settings)
