"""An import as agent config text (TOML), each entry followed by its ``# not carried over``
comments, so they are read where they apply.

Called by ``agent.cli.importer``. Written by hand rather than by a TOML library: the comments are
the point, and the keys are few. Values have no ``null`` in TOML: a ``null`` in Helm values is
left out, with a comment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from agent.imports.model import KUBECONFIG_PLACEHOLDER, App, Imported, Note

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def toml_text(imported: Imported, *, path: str) -> str:
    """The whole config: a header, sources, Helm repositories, clusters, apps, skipped objects."""
    lines = [
        f"# Imported by `gitops-agent import --from {imported.tool.value}` from {path}:",
        f"# {len(imported.sources)} source(s), {len(imported.apps)} app(s) on "
        f"{len(imported.clusters)} cluster(s). Read every 'not carried over' comment before using it.",
    ]
    for s in imported.sources:
        lines += ["", "[[sources]]", *_pairs(_source_keys(s.__dict__)), *_comments(s.notes)]
    for r in imported.helm_repositories:
        lines += ["", "[[helm_repositories]]", _pair("url", r.url), *_comments(r.notes)]
    for c in imported.clusters:
        lines += ["", "[[clusters]]", _pair("name", c.name), _pair("kubeconfig", c.kubeconfig)]
        if c.kubeconfig == KUBECONFIG_PLACEHOLDER.format(name=c.name):
            lines.append(
                "# kubeconfig: a placeholder (no --kubeconfig given): the file that reaches this cluster"
            )
        lines += _comments(c.notes)
    for a in imported.apps:
        if why := _unsupported(a):
            lines += ["", f"# not carried over: app {a.name!r} is written commented out because {why}"]
            lines += [f"# {line}" if line and not line.startswith("#") else line for line in _app(a)]
        else:
            lines += ["", *_app(a)]
    if imported.notes:
        lines += ["", "# Objects not carried over:", *_comments(imported.notes)]
    return "\n".join(lines) + "\n"


def _unsupported(a: App) -> str:
    """Why an app cannot load with this agent yet (its chart's source), or ""."""
    return a.unsupported


def _source_keys(s: Mapping[str, Any]) -> dict[str, Any]:
    return {k: s[k] for k in ("name", "url", "branch", "tag", "commit", "poll_interval") if s[k]}


def _app(a: App) -> Iterator[str]:
    yield f"# from {a.origin}"
    yield "[[apps]]"
    keys: dict[str, Any] = {"name": a.name, "cluster": a.cluster, "source": a.source}
    if len(a.paths) == 1:
        keys["path"] = a.paths[0]
    elif a.paths:
        keys["paths"] = list(a.paths)
    if a.depends_on:
        keys["depends_on"] = list(a.depends_on)
    if a.suspend:
        keys["suspend"] = True
    keys.update(a.settings)
    yield from _pairs(keys)
    yield from _comments(a.notes)
    if a.vars:
        yield "[apps.vars]"
        yield from _pairs(dict(a.vars))
    if a.helm is not None:
        h = a.helm
        yield "[apps.helm]"
        helm_keys = {
            "repository": h.repository,
            "chart": h.chart,
            "version": h.version,
            "release_name": h.release_name,
            "namespace": h.namespace,
            "values_files": list(h.values_files),
        }
        yield from _pairs({k: v for k, v in helm_keys.items() if v})
        if h.values:
            yield "[apps.helm.values]"
            dropped: list[str] = []
            yield from _pairs(_without_nulls(h.values, "", dropped))
            yield from _comments(
                tuple(
                    Note(f"values {p}", "it is null, which TOML cannot spell (Helm drops the key)")
                    for p in dropped
                )
            )
    for rule in a.ignore:
        yield "[[apps.ignore]]"
        rule_keys = {
            "group": rule.group,
            "kind": rule.kind,
            "name": rule.name,
            "namespace": rule.namespace,
            "json_pointers": list(rule.json_pointers),
            "managers": list(rule.managers),
        }
        yield from _pairs({k: v for k, v in rule_keys.items() if v})


def _without_nulls(value: Mapping[str, Any], at: str, dropped: list[str]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for k, v in value.items():
        where = f"{at}.{k}" if at else str(k)
        if v is None:
            dropped.append(where)
        elif isinstance(v, Mapping):
            kept[str(k)] = _without_nulls(v, where, dropped)
        elif isinstance(v, list):
            if any(item is None for item in v):
                dropped.append(where)
            else:
                kept[str(k)] = [_without_nulls(i, where, dropped) if isinstance(i, Mapping) else i for i in v]
        else:
            kept[str(k)] = v
    return kept


def _comments(notes: tuple[Note, ...]) -> list[str]:
    return [n.comment().replace("\n", " ") for n in notes]


def _pairs(keys: Mapping[str, Any]) -> list[str]:
    return [_pair(k, v) for k, v in keys.items()]


def _pair(key: str, value: Any) -> str:
    return f"{_key(key)} = {_value(value)}"


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    """One TOML value: strings in JSON's escapes (valid TOML basic strings), tables inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        inner = ", ".join(_pair(str(k), v) for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML spelling for {type(value).__name__}")
