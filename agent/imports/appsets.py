"""Argo CD ``ApplicationSet``s as the Applications they generate: the ``list`` generator (one per
element) and the ``git`` directory generator (one per matching directory under PATH, ``exclude``
honoured), with ``{{name}}``-style (and ``goTemplate``'s ``{{.name}}``) parameters filled in.

Called by ``argocd``. Other generators are noted, not guessed.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

from agent.imports.common import table
from agent.imports.model import Note
from agent.imports.reading import Found

_PARAM = re.compile(r"\{\{\s*\.?([A-Za-z0-9_.\[\]]+)\s*\}\}")


def expand(appset: Found, root: Path) -> tuple[list[Found], list[Note]]:
    """The Applications ``appset`` generates from what PATH holds, and notes on what it cannot."""
    spec, what = appset.spec, appset.label()
    template = table(spec, "template")
    notes = [
        Note(f"{what} spec.{k}", "the agent has no equivalent")
        for k in spec
        if k not in ("generators", "template", "goTemplate", "goTemplateOptions")
    ]
    params: list[dict[str, str]] = []
    for i, gen in enumerate(spec.get("generators") or ()):
        kind = next(iter(gen), "") if isinstance(gen, dict) else ""
        if kind == "list":
            params += [
                {str(k): _text(v) for k, v in e.items()}
                for e in gen["list"].get("elements") or ()
                if isinstance(e, dict)
            ]
        elif kind == "git" and gen["git"].get("directories"):
            params += [_path_params(d) for d in _directories(root, gen["git"]["directories"])]
            if gen["git"].get("files"):
                notes.append(
                    Note(f"{what} generators[{i}].git.files", "only the directory generator is read")
                )
        else:
            notes.append(
                Note(f"{what} generators[{i}].{kind}", "only the list and git directory generators are read")
            )
    apps: list[Found] = []
    for p in params:
        body, missing = _fill(template, p)
        if missing:
            notes.append(
                Note(
                    f"{what} element {p}",
                    f"the template uses {', '.join(sorted(missing))}, which it does not set",
                )
            )
            continue
        app = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", **body}
        apps.append(Found(appset.file, appset.line, app))
    return apps, notes


def _text(v: Any) -> str:
    return v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def _directories(root: Path, entries: list[Any]) -> list[str]:
    """Directories under ``root`` matching an entry's ``path`` (``*`` within one segment), minus
    those an ``exclude: true`` entry matches."""
    every = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_dir() and not any(x.startswith(".") for x in p.relative_to(root).parts)
    )
    take = [e for e in entries if isinstance(e, dict) and not e.get("exclude")]
    drop = [e for e in entries if isinstance(e, dict) and e.get("exclude")]
    return [
        d
        for d in every
        if any(_match(d, str(e.get("path", ""))) for e in take)
        and not any(_match(d, str(e.get("path", ""))) for e in drop)
    ]


def _match(directory: str, pattern: str) -> bool:
    parts, want = directory.split("/"), pattern.strip("/").split("/")
    return len(parts) == len(want) and all(
        fnmatch.fnmatchcase(p, w) for p, w in zip(parts, want, strict=True)
    )


def _path_params(directory: str) -> dict[str, str]:
    base = directory.rsplit("/", 1)[-1]
    params = {
        "path": directory,
        "path.path": directory,
        "path.basename": base,
        "path.basenameNormalized": re.sub(r"[^a-z0-9-]", "-", base.lower()),
    }
    params |= {f"path[{i}]": seg for i, seg in enumerate(directory.split("/"))}
    return params


def _fill(value: Any, params: dict[str, str]) -> tuple[Any, set[str]]:
    """``value`` with every ``{{param}}`` replaced; the names it uses that ``params`` lacks."""
    missing: set[str] = set()

    def walk(v: Any) -> Any:
        if isinstance(v, str):

            def one(m: re.Match[str]) -> str:
                if m.group(1) in params:
                    return params[m.group(1)]
                missing.add(m.group(1))
                return m.group(0)

            return _PARAM.sub(one, v)
        if isinstance(v, dict):
            return {walk(k): walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(value), missing
