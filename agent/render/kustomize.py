"""``kustomize build`` for ``agent.render.renderer``: checked first, then built in a sandbox.

A kustomization from Git may name any path or URL; the agent must read nothing but the
checkout and reach no network (docs/safety.md, threat model). Two walls:

* ``check_kustomization`` walks the kustomization graph first and refuses, with the file and
  line, every field entry that takes a path or URL and would leave the checkout or the
  machine: ``resources``, ``bases``, ``components``, ``crds``, ``configurations``,
  ``transformers``, ``generators``, ``validators``, ``patchesStrategicMerge``,
  ``patchesJson6902[].path``, ``patches[].path``, ``replacements[].path``, ``openapi.path``
  and the generators' ``files``/``envs``/``env``; and ``helmCharts`` (it would run helm and
  download). Paths anywhere inside the checkout are allowed (``../dashboards/x.json``).
* ``krender`` (tools/go/krender, the pinned kustomize API) builds it over an in-memory copy of
  the checkout with an HTTP transport that refuses every request: whatever field a future
  kustomize adds, nothing outside the checkout exists for it and no request leaves.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from agent.errors import RenderProblem
from agent.render.manifests import BoundedLoader
from agent.render.process import Runner
from agent.render.tools import (
    KUSTOMIZATION_FILES,
    ToolOutput,
    _decode,
    _inside,
    _run,
    check_symlinks,
    kustomization_file,
    sandbox_env,
)

__all__ = ["KUSTOMIZATION_FILES", "Graph", "check_kustomization", "kustomization_file", "kustomize_build"]

# Looks like a URL or a go-getter/git spec rather than a local path.
_REMOTE = re.compile(
    r"^([a-z][a-z0-9+.-]*://|git@|git::|[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,}(:\d+)?/)", re.IGNORECASE
)
#: Fields whose string entries name a file or a directory with a kustomization.
_LIST_FIELDS = (
    "resources",
    "bases",
    "components",
    "crds",
    "configurations",
    "transformers",
    "generators",
    "validators",
    "patchesStrategicMerge",
)
#: Fields whose list entries are mappings with a ``path``.
_PATH_ENTRY_FIELDS = ("patches", "patchesJson6902", "replacements")
_GENERATORS = ("configMapGenerator", "secretGenerator")


@dataclass
class Graph:
    """What one kustomization reads: its kustomization directories and the other files it names."""

    directories: set[Path] = field(default_factory=set)
    files: set[Path] = field(default_factory=set)
    #: The same as kustomize names them (lexically cleaned, symlinks kept): what krender mounts.
    mounted_dirs: set[Path] = field(default_factory=set)
    mounted_files: set[Path] = field(default_factory=set)

    def roots(self) -> list[Path]:
        """Where the files it reads lie (where sops looks for the files ciphertext came from)."""
        return sorted(self.directories | {f.parent for f in self.files})

    def mounts(self) -> list[str]:
        """krender's arguments: the kustomization directories (their own files) and other files."""
        return [
            *(a for d in sorted(self.mounted_dirs) for a in ("-dir", str(d))),
            *(a for f in sorted(self.mounted_files) for a in ("-file", str(f))),
        ]


def check_kustomization(
    directory: Path, tree: Path, graph: Graph | None = None, *, named: Path | None = None
) -> list[RenderProblem]:
    """Refuse what would make the build of ``directory`` read outside ``tree``, reach out or run code.

    ``named``: the directory as kustomize names it (``directory`` lexically, symlinks kept).
    """
    graph = Graph() if graph is None else graph
    named = named or directory
    graph.mounted_dirs.add(named)
    directory = directory.resolve()
    if directory in graph.directories:
        return []
    graph.directories.add(directory)
    kfile = kustomization_file(directory)
    rel_dir = directory.relative_to(tree).as_posix()
    if kfile is None:
        return [RenderProblem(rel_dir, "referenced as a kustomize base but has no kustomization.yaml")]
    rel = kfile.relative_to(tree).as_posix()
    problems = check_symlinks(directory, tree, rel_dir)
    try:
        text = kfile.read_text("utf-8")
        data: Any = yaml.load(text, BoundedLoader)
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        return [
            *problems,
            RenderProblem(rel, f"invalid kustomization: {getattr(e, 'problem', None) or e}", line),
        ]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return [*problems, RenderProblem(rel, "kustomization must be a mapping")]
    for key in ("helmCharts", "helmChartInflationGenerator", "helmGlobals"):
        if key in data:
            problems.append(
                RenderProblem(
                    rel,
                    f"{key} is refused (it runs helm inside kustomize and may download "
                    "charts); render the chart through the cluster's helm settings",
                )
            )
    walk = _Walk(directory, named, tree, rel, text, graph)
    for key, entry, may_be_dir in _references(data, walk):
        problems.extend(walk.reference(key, entry, may_be_dir=may_be_dir))
    return problems + walk.problems


def _references(data: dict[str, Any], walk: _Walk) -> list[tuple[str, str, bool]]:
    """Every (field, path or URL, may it be a directory) the kustomization names."""
    out: list[tuple[str, str, bool]] = []
    for key in _LIST_FIELDS:
        entries = data.get(key) or []
        if not isinstance(entries, list):
            walk.problem(f"{key} must be a list")
            continue
        for entry in entries:
            if isinstance(entry, str) and "\n" not in entry:  # else inline: kustomize validates it
                out.append((key, entry, key not in ("crds", "configurations", "patchesStrategicMerge")))
    for key in _PATH_ENTRY_FIELDS:
        for entry in data.get(key) or []:
            if isinstance(entry, dict) and isinstance(entry.get("path"), str):
                out.append((f"{key}[].path", entry["path"], False))
    openapi = data.get("openapi")
    if isinstance(openapi, dict) and isinstance(openapi.get("path"), str):
        out.append(("openapi.path", openapi["path"], False))
    for key in _GENERATORS:
        for gen in data.get(key) or []:
            if not isinstance(gen, dict):
                continue
            for entry in gen.get("files") or []:
                if isinstance(entry, str):  # "key=path" or "path"
                    out.append((f"{key}[].files", entry.split("=", 1)[-1], False))
            out.extend((f"{key}[].envs", e, False) for e in gen.get("envs") or [] if isinstance(e, str))
            if isinstance(gen.get("env"), str):
                out.append((f"{key}[].env", gen["env"], False))
    return out


@dataclass
class _Walk:
    """One kustomization's references being checked."""

    directory: Path
    named: Path
    tree: Path
    rel: str
    text: str
    graph: Graph
    problems: list[RenderProblem] = field(default_factory=list)

    def problem(self, message: str, needle: str = "") -> None:
        problem = RenderProblem(self.rel, message)
        self.problems.append(_at_line(problem, self.text, needle) if needle else problem)

    def reference(self, key: str, entry: str, *, may_be_dir: bool) -> list[RenderProblem]:
        target = (self.directory / entry).resolve()
        named = Path(os.path.normpath(self.named / entry))
        local = target.exists() and not os.path.isabs(entry)
        if not local and (_REMOTE.match(entry) or "?ref=" in entry or "//" in entry.strip("/")):
            self.problem(
                f"{key}: remote reference {entry!r} is refused (render has no network; "
                "vendor it into the repository)",
                entry,
            )
        elif os.path.isabs(entry) or not _inside(target, self.tree) or not _inside(named, self.tree):
            self.problem(f"{key}: {entry!r} leaves the repository", entry)
        elif not target.exists():
            self.problem(f"{key}: {entry!r} does not exist (remote references are refused)", entry)
        elif target.is_dir() and may_be_dir:
            return check_kustomization(target, self.tree, self.graph, named=named)
        elif target.is_dir():
            self.problem(f"{key}: {entry!r} is a directory, not a file", entry)
        else:
            self.graph.files.add(target)
            self.graph.mounted_files.add(named)
        return []


def _at_line(problem: RenderProblem, text: str, needle: str) -> RenderProblem:
    """The problem pointed at the first line of ``text`` that mentions ``needle``."""
    for i, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return replace(problem, line=i)
    return problem


def kustomize_build(
    krender: Path,
    directory: Path,
    tree: Path,
    graph: Graph,
    *,
    timeout: float,
    max_output: int,
    max_file: int,
    runner: Runner,
    json_unless: str | None = None,
) -> ToolOutput:
    """The build of ``directory`` (checked into ``graph``) by ``krender``, which sees only what
    ``graph`` names of ``tree``, in memory: bounded like the plain walk's files, ``max_output``
    in all and ``max_file`` for one file. ``json_unless``: as JSON documents where krender reads the
    stream (``agent.render.tooljson``), unless a value holds this text (``""``: never)."""
    rel = directory.relative_to(tree).as_posix()
    argv = [str(krender), "-root", str(tree), "-max-input", str(max_output), "-max-file", str(max_file)]
    argv += [] if json_unless is None else ["-json", *(["-yaml-if", json_unless] if json_unless else [])]
    argv += [*graph.mounts(), str(directory)]
    with tempfile.TemporaryDirectory(prefix="gitops-agent-kustomize-") as home:
        res, problems = _run(
            f"kustomize build {rel}",
            rel,
            argv,
            cwd=directory,
            env=sandbox_env(Path(home)),
            timeout=timeout,
            max_output=max_output,
            runner=runner,
        )
    if res is None or problems:
        return ToolOutput("", tuple(problems))
    return _decode(res, rel, f"kustomize build {rel}")
