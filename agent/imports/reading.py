"""The YAML of a checked-out repository, read as the render stage reads it, and which files a
directory applies (Flux's view of a path: its kustomization's resources, else every file).

Called by ``flux`` and ``argocd``. Nothing is executed: a kustomization is followed through its
local ``resources``/``bases``/``components`` only, never built.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.render.manifests import Document, Origin, parse_yaml

#: Files larger than this are not read (a vendored CRD bundle is a few MiB; a Flux object is small).
MAX_FILE_BYTES = 8 << 20
_KUSTOMIZATIONS = ("kustomization.yaml", "kustomization.yml", "Kustomization")


@dataclass(frozen=True)
class Found:
    """One object of the tree: where it is (PATH-relative) and its body."""

    file: str
    line: int | None
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def group(self) -> str:
        return str(self.body.get("apiVersion", "")).rpartition("/")[0]

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name", ""))

    @property
    def namespace(self) -> str:
        return str((self.body.get("metadata") or {}).get("namespace", ""))

    @property
    def spec(self) -> dict[str, Any]:
        spec = self.body.get("spec")
        return spec if isinstance(spec, dict) else {}

    def label(self) -> str:
        """``Kustomization flux-system/apps``, as notes and logs name it."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


@dataclass
class Tree:
    """Every object found under a root, and the files that could not be read."""

    root: Path
    objects: list[Found] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def of(self, group_suffix: str, *kinds: str) -> list[Found]:
        return [o for o in self.objects if o.kind in kinds and o.group.endswith(group_suffix)]


def yaml_files(root: Path, directory: Path | None = None) -> Iterator[Path]:
    """``*.yaml``/``*.yml`` under ``directory`` (default ``root``), sorted, dot-names skipped."""
    start = directory or root
    for path in sorted(start.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or path.is_symlink():
            continue
        if path.is_file() and path.suffix in (".yaml", ".yml"):
            yield path


def documents(root: Path, path: Path, warnings: list[str]) -> list[Document]:
    """The documents of one file, or none (with a warning) when it is not YAML the agent reads."""
    rel = path.relative_to(root).as_posix()
    if path.stat().st_size > MAX_FILE_BYTES:
        warnings.append(f"{rel}: skipped, larger than {MAX_FILE_BYTES} bytes")
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        warnings.append(f"{rel}: not read: {e}")
        return []
    docs, problems = parse_yaml(text, Origin(rel), None)
    if problems:
        warnings.append(f"{rel}: not read: {problems[0]}")
        return []
    return docs


def read_tree(root: Path) -> Tree:
    """Every object (a mapping with ``apiVersion`` and ``kind``) in the YAML files under ``root``;
    a file a kustomization names as a patch is a patch, never an object of its own."""
    tree = Tree(root)
    files = list(yaml_files(root))
    patches = _patch_files(root, [p for p in files if p.name in _KUSTOMIZATIONS], tree.warnings)
    for path in files:
        rel = path.relative_to(root).as_posix()
        if _chart_template(root, path):
            continue  # Helm template text, not YAML: read when its chart renders (``app_of_apps``)
        if rel in patches:
            tree.warnings.append(f"{rel}: a kustomize patch ({patches[rel]}), not read as objects")
            continue
        for doc in documents(root, path, tree.warnings):
            value = doc.value
            if isinstance(value, dict) and isinstance(value.get("kind"), str) and "apiVersion" in value:
                tree.objects.append(Found(path.relative_to(root).as_posix(), doc.line, value))
    return tree


def _chart_template(root: Path, path: Path) -> bool:
    """Whether ``path`` is under a chart's ``templates/`` (or its ``charts/``) directory."""
    for parent in path.parents:
        if parent == root or not parent.is_relative_to(root):
            return False
        if parent.name in ("templates", "charts") and (parent.parent / "Chart.yaml").is_file():
            return True
    return False


def _patch_files(root: Path, kustomizations: list[Path], warnings: list[str]) -> dict[str, str]:
    """PATH-relative patch file → the kustomization naming it (``patches[].path``,
    ``patchesStrategicMerge``, ``patchesJson6902[].path``)."""
    out: dict[str, str] = {}
    for kfile in kustomizations:
        docs = documents(root, kfile, warnings)
        k = docs[0].value if docs and isinstance(docs[0].value, dict) else {}
        named = [
            e.get("path")
            for key in ("patches", "patchesJson6902")
            for e in k.get(key) or ()
            if isinstance(e, dict)
        ]
        named += [e for e in k.get("patchesStrategicMerge") or () if isinstance(e, str) and "\n" not in e]
        for entry in named:
            if isinstance(entry, str) and entry:
                target = (kfile.parent / entry).resolve()
                if target.is_relative_to(root.resolve()):
                    out[target.relative_to(root.resolve()).as_posix()] = kfile.relative_to(root).as_posix()
    return out


@dataclass
class Reach:
    """The files a directory applies, and the kustomization files on the way that patch them."""

    files: set[str] = field(default_factory=set)
    patched_by: set[str] = field(default_factory=set)


def reach(root: Path, rel_dir: str, warnings: list[str]) -> Reach:
    """What Flux applies from ``rel_dir`` (PATH-relative): its kustomization's local resources,
    followed, or else every YAML file under it. Nothing outside ``root`` is followed."""
    found = Reach()
    _follow(root, (root / rel_dir).resolve(), found, warnings, set())
    return found


def _follow(root: Path, target: Path, found: Reach, warnings: list[str], seen: set[Path]) -> None:
    if target in seen or not target.is_relative_to(root.resolve()):
        return
    seen.add(target)
    if target.is_file():
        found.files.add(target.relative_to(root.resolve()).as_posix())
        return
    if not target.is_dir():
        return
    kfile = next((target / k for k in _KUSTOMIZATIONS if (target / k).is_file()), None)
    if kfile is None:
        for path in yaml_files(root.resolve(), target):
            found.files.add(path.relative_to(root.resolve()).as_posix())
        return
    docs = documents(root.resolve(), kfile, warnings)
    k = docs[0].value if docs and isinstance(docs[0].value, dict) else {}
    if any(k.get(key) for key in ("patches", "patchesStrategicMerge", "patchesJson6902", "replacements")):
        found.patched_by.add(kfile.relative_to(root.resolve()).as_posix())
    for key in ("resources", "bases", "components"):
        for entry in k.get(key) or ():
            if isinstance(entry, str) and "://" not in entry and not entry.startswith("github.com/"):
                _follow(root, (target / entry).resolve(), found, warnings, seen)
