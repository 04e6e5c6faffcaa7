"""An Argo CD source's ``helm`` table as the values Argo CD gives ``helm template``: ``values`` (or
``valuesObject``) over the value files, then ``parameters`` over both, as ``--set`` would.

Called by ``argocd`` (an app's ``[apps.helm.values]``) and ``app_of_apps`` (the values a parent
chart is rendered with). Only what ``--set`` means without doubt is carried over: a dotted name
of plain keys and a value without Helm's escapes or list syntax; the rest is noted.
"""

from __future__ import annotations

import re
from typing import Any

from agent.imports.model import Note

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\Z")
_INT = re.compile(r"[+-]?[0-9]+\Z")


def values_of(helm_spec: dict[str, Any], what: str, notes: list[Note]) -> dict[str, Any]:
    """The values of ``helm_spec`` merged as Argo CD orders them (files are the caller's)."""
    values: dict[str, Any] = {}
    if isinstance(text := helm_spec.get("values"), str) and text.strip():
        from agent.render.manifests import Origin, parse_yaml

        docs, problems = parse_yaml(text, Origin(f"{what} helm.values"), None)
        if problems or not docs or not isinstance(docs[0].value, dict):
            notes.append(Note(f"{what} source.helm.values", "it is not a YAML mapping the agent reads"))
        else:
            values.update(docs[0].value)
    if isinstance(obj := helm_spec.get("valuesObject"), dict):
        values.update(obj)
    for i, p in enumerate(helm_spec.get("parameters") or ()):
        _set(values, p, f"{what} source.helm.parameters[{i}]", notes)
    return values


def _set(values: dict[str, Any], param: Any, what: str, notes: list[Note]) -> None:
    """One ``--set name=value`` (``--set-string`` with ``forceString``) into ``values``."""
    if not isinstance(param, dict) or not isinstance(param.get("name"), str):
        notes.append(Note(what, "it has no name"))
        return
    name, raw = param["name"], str(param.get("value", ""))
    if not _PLAIN_NAME.match(name):
        notes.append(Note(f"{what} {name}", "a name with list indexes or escapes: write it into values"))
        return
    if "\\" in raw or (raw.startswith("{") and raw.endswith("}")):
        notes.append(Note(f"{what} {name}", "a value with Helm escapes or list syntax: write it into values"))
        return
    value = raw if param.get("forceString") else _typed(raw)
    if value is None:
        notes.append(Note(f"{what} {name}", "null deletes the key in Helm, which TOML cannot spell"))
        return
    *parents, leaf = name.split(".")
    at = values
    for key in parents:
        if not isinstance(at.get(key), dict):
            at[key] = {}
        at = at[key]
    at[leaf] = value


def _typed(raw: str) -> Any:
    """What ``--set`` makes of ``raw``: booleans, null, 64-bit integers not written with a leading
    zero, else text."""
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    if raw == "0":
        return 0
    if not raw.startswith("0") and _INT.match(raw) and -(1 << 63) <= int(raw) < (1 << 63):
        return int(raw)
    return raw
