"""The config's ignore rules (``[[ignore]]``, ``[[apps.ignore]]``) resolved against one object.

Called by ``planner`` beside the per-object ``gitops-agent.io/ignore-fields`` annotation and on
the same mechanism: the paths found here are left out of the body, so they are neither sent nor
compared nor a conflict. One difference keeps a rule from deleting what it means to leave alone:
a path only our Apply entry holds would be released by the next write, and the server deletes a
field no manager holds any more (a Deployment's ``replicas`` back to 1, a container's image
gone). Such a path is sent as live holds it (``kept``): the write changes nothing there and the
field stays ours until someone else takes it. Pure.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.config.ignore_rules import IgnoreRule, Step
from agent.model import PART_OF, FieldPath, IgnoredFields, Manifest, split_api_version
from agent.plan.fields import (
    KeyMissing,
    ManagedEntry,
    field_element,
    is_under,
    item_element,
    managed_entries,
    manifest_paths,
    pointer_to_path,
    remove_path,
    replace_path,
    value_at,
)
from agent.plan.schema import Node

#: Never ignored, whatever a rule resolves to: the proof of membership prunes rely on.
_MEMBERSHIP: FieldPath = ("f:metadata", "f:labels", field_element(PART_OF))


@dataclass(frozen=True)
class Ignored:
    """What the rules leave alone on one object."""

    #: Paths taken out of the body.
    dropped: tuple[FieldPath, ...] = ()
    #: Paths only our Apply entry holds: sent with live's value (see the module docstring).
    kept: Mapping[FieldPath, Any] = field(default_factory=dict)
    #: Fields per rule, for reports (rules that matched no field are left out).
    counts: tuple[IgnoredFields, ...] = ()


NOTHING = Ignored()


def resolve(
    rules: Sequence[IgnoreRule], manifest: Manifest, live: Manifest | None, node: Node, field_manager: str
) -> Ignored:
    """The declared paths of ``manifest`` that ``rules`` leave alone, against ``live``.

    Nothing without ``live`` (absent, or not at hand): an object is created whole, as Git
    declares it; the rules leave its fields to others from then on.
    """
    matched = [r for r in rules if _applies(r, manifest)] if live is not None else []
    if not matched:
        return NOTHING
    entries = managed_entries(live) if live is not None else ()
    counts: list[IgnoredFields] = []
    found: set[FieldPath] = set()
    for rule in matched:
        paths = _topmost(
            p for p in _paths(rule, manifest, node, entries, field_manager) if not is_under(_MEMBERSHIP, p)
        )
        if paths:
            counts.append(IgnoredFields(rule.origin, len(paths)))
            found |= paths
    ours = next(
        (e for e in entries if e.manager == field_manager and e.operation == "Apply" and not e.subresource),
        None,
    )
    others = [e for e in entries if e is not ours]
    kept: dict[FieldPath, Any] = {}
    for path in _topmost(found):
        if live is not None and ours is not None and _only_ours(path, ours, others):
            present, value = value_at(live, path, node)
            if present:
                kept[path] = value
    dropped = tuple(sorted(p for p in _topmost(found) if p not in kept))
    return Ignored(dropped, kept, tuple(counts))


def with_kept(body: Manifest, kept: Mapping[FieldPath, Any], node: Node) -> Manifest:
    """``body`` with the ``kept`` paths as live holds them (a copy: ``body`` may be Git's manifest)."""
    if not kept:
        return body
    out = copy.deepcopy(body)
    for path, value in kept.items():
        replace_path(out, path, node, copy.deepcopy(value))
    return out


def without_emptied(body: Manifest, dropped: Iterable[FieldPath], node: Node) -> Manifest:
    """``body`` (already a copy: ``dropped`` were removed from it) without the maps and lists the
    removals left empty: an empty ``annotations: {}`` sent would be a field of its own to own."""
    for path in dropped:
        for i in range(len(path) - 1, 0, -1):
            present, value = value_at(body, path[:i], node)
            if not present or value not in ({}, []):
                break
            remove_path(body, path[:i], node)
    return body


def _applies(rule: IgnoreRule, manifest: Manifest) -> bool:
    meta = manifest.get("metadata") or {}
    group, _ = split_api_version(str(manifest.get("apiVersion", "")))
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    kind = str(manifest.get("kind", ""))
    return rule.applies_to(group, kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""), labels)


def _paths(
    rule: IgnoreRule,
    manifest: Manifest,
    node: Node,
    entries: Sequence[ManagedEntry],
    field_manager: str,
) -> Iterable[FieldPath]:
    for pointer in rule.json_pointers:
        path = pointer_to_path(pointer, manifest, node)
        if path and value_at(manifest, path, node)[0]:
            yield path
    for steps in rule.steps:
        yield from _walk(manifest, steps, node)
    owners = [
        e
        for e in entries
        if e.manager != field_manager and any(fnmatch.fnmatchcase(e.manager, g) for g in rule.managers)
    ]
    if owners:
        for path in manifest_paths(manifest, node):
            if any(_held(path, e) for e in owners):
                yield path


def _held(path: FieldPath, entry: ManagedEntry) -> bool:
    """``entry`` holds ``path`` itself or an ancestor of it (an atomic value it owns whole)."""
    return any(path[:i] in entry.paths for i in range(1, len(path) + 1))


def _only_ours(path: FieldPath, ours: ManagedEntry, others: Sequence[ManagedEntry]) -> bool:
    """Our Apply entry holds something at or under ``path``, and no other entry holds anything
    there (nor an ancestor of it): releasing it would delete it."""
    if not any(is_under(p, path) for p in ours.paths):
        return False
    return not any(_held(path, e) or any(is_under(p, path) for p in e.paths) for e in others)


def _topmost(paths: Iterable[FieldPath]) -> set[FieldPath]:
    """The paths none of the others lies above."""
    ordered = sorted(set(paths), key=len)
    out: set[FieldPath] = set()
    for p in ordered:
        if not any(is_under(p, q) for q in out):
            out.add(p)
    return out


def _spelled(value: Any) -> str:
    """A list item's field as a selector's ``value`` spells it (``80``, ``true``, ``web``)."""
    return value if isinstance(value, str) else json.dumps(value)


def _walk(doc: Manifest, steps: tuple[Step, ...], node: Node) -> set[FieldPath]:
    """The paths of ``doc`` a parsed ``paths`` entry selects. Inside an atomic list or map the
    path stops at it: the server cannot split what it owns whole."""
    out: set[FieldPath] = set()

    def go(value: Any, node: Node, i: int, path: FieldPath) -> None:
        if i == len(steps):
            out.add(path)
            return
        kind, arg = steps[i]
        if kind == "field":
            if path and node.atomic_map:
                out.add(path)
            elif isinstance(value, dict) and arg in value:
                go(value[arg], node.field(arg), i + 1, (*path, field_element(arg)))
            return
        if not isinstance(value, list):
            return
        info = node.list_info()
        if info.type == "atomic":
            out.add(path)
            return
        for index, item in enumerate(value):
            if kind == "index" and index != arg:
                continue
            if kind == "match" and not (
                isinstance(item, dict) and all(k in item and _spelled(item[k]) == v for k, v in arg)
            ):
                continue
            try:
                element = item_element(info, item, index)
            except KeyMissing:
                out.add(path)
                return
            go(item, node.item(), i + 1, (*path, element))

    go(doc, node, 0, ())
    out.discard(())
    return out
