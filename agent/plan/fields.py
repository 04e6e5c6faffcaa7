"""Field paths in server-side apply's own vocabulary, and the ``fieldsV1`` set encoding.

``metadata.managedFields[].fieldsV1`` is a trie: each key is a path element —
``f:<field>``, ``k:<json object of key fields>`` (an item of an associative
list), ``v:<json value>`` (an item of a set list), ``i:<index>`` (an item of an
atomic list) — and ``".": {}`` inside a node says the node itself is a member
of the set, not only its children. ``decode_fields_v1``/``encode_fields_v1``
convert between that JSON and a ``frozenset[FieldPath]``; ``k:`` and ``v:``
elements are canonicalised (keys sorted, compact JSON) so that paths parsed
from the server and paths computed here compare equal.

``manifest_paths`` answers "which paths would this manifest own if applied",
walking it with a ``schema.Node`` the way structured-merge-diff's
``ToFieldSet`` does: scalars, atomic lists and atomic maps are leaves, list
items are members, struct fields are not members by themselves, map entries
are. Called by ``plan``; pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.model import FieldPath, Manifest
from agent.plan.schema import ListInfo, Node

SELF = "."

#: Fields server-side apply never records (the API server strips them from managed sets).
STRIPPED_METADATA = frozenset(
    {
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "generation",
        "managedFields",
        "resourceVersion",
    }
)
#: Top-level keys never owned through the main resource.
STRIPPED_TOP = frozenset({"apiVersion", "kind", "status"})


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def field_element(name: str) -> str:
    return f"f:{name}"


def key_element(keys: Mapping[str, Any]) -> str:
    return f"k:{_dumps(dict(keys))}"


def value_element(value: Any) -> str:
    return f"v:{_dumps(value)}"


def index_element(index: int) -> str:
    return f"i:{index}"


def parse_element(element: str) -> tuple[str, Any]:
    """``"f:spec"`` → ``("f", "spec")``; ``'k:{"name":"a"}'`` → ``("k", {"name": "a"})``; etc."""
    prefix, sep, rest = element.partition(":")
    if not sep or prefix not in ("f", "k", "v", "i"):
        raise ValueError(f"not a field path element: {element!r}")
    if prefix == "f":
        return "f", rest
    if prefix == "i":
        return "i", int(rest)
    value = json.loads(rest)
    if prefix == "k" and not isinstance(value, dict):
        raise ValueError(f"key element is not a JSON object: {element!r}")
    return prefix, value


def canonical_element(element: str) -> str:
    """The one spelling of an element: server JSON may order keys or escape characters differently."""
    kind, payload = parse_element(element)
    if kind == "k":
        return key_element(payload)
    if kind == "v":
        return value_element(payload)
    return element


def decode_fields_v1(fields: Mapping[str, Any]) -> frozenset[FieldPath]:
    """The set of paths a ``fieldsV1`` trie denotes."""
    out: set[FieldPath] = set()
    stack: list[tuple[FieldPath, Mapping[str, Any]]] = [((), fields)]
    while stack:
        prefix, node = stack.pop()
        for element, child in node.items():
            if element == SELF:
                if prefix:
                    out.add(prefix)
                continue
            # Only f: elements are already canonical; k:/v: JSON is re-spelled once here.
            path = (*prefix, element if element.startswith(("f:", "i:")) else canonical_element(element))
            if not isinstance(child, Mapping):
                raise ValueError(f"fieldsV1 node at {render_path(path)} is not an object")
            if child:
                stack.append((path, child))
            else:
                out.add(path)
    return frozenset(out)


def _element_order(element: str) -> tuple[int, str]:
    return ("fkvi".index(element[0]) if element[:1] in ("f", "k", "v", "i") else 4, element)


def encode_fields_v1(paths: Iterable[FieldPath]) -> dict[str, Any]:
    """The ``fieldsV1`` trie of a set of paths (deterministic order: ``.`` first, then f/k/v/i)."""
    root: dict[str, Any] = {}
    members: set[FieldPath] = set()
    for path in paths:
        if not path:
            continue
        node = root
        for element in path:
            node = node.setdefault(element, {})
        members.add(path)

    def build(prefix: FieldPath, node: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if node and prefix in members:
            out[SELF] = {}
        for element in sorted(node, key=_element_order):
            out[element] = build((*prefix, element), node[element])
        return out

    return build((), root)


def render_path(path: FieldPath) -> str:
    """Human spelling: ``spec.containers[name=app].image``, ``metadata.finalizers["a"]``."""
    out = ""
    for element in path:
        kind, payload = parse_element(element)
        if kind == "f":
            out += f".{payload}" if out else payload
        elif kind == "k":
            out += (
                "["
                + ",".join(f"{k}={_dumps(v) if not isinstance(v, str) else v}" for k, v in payload.items())
                + "]"
            )
        elif kind == "v":
            out += f"[{_dumps(payload)}]"
        else:
            out += f"[{payload}]"
    return out or "."


def name_list(names: Sequence[str], *, limit: int = 4, width: int = 200) -> str:
    """``a, b, c and 5 more``: at most ``limit`` names and about ``width`` characters, for reasons."""
    shown: list[str] = []
    used = 0
    for name in names[:limit]:
        if shown and used + len(name) > width:
            break
        shown.append(name)
        used += len(name) + 2
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def is_under(path: FieldPath, prefix: FieldPath) -> bool:
    """``path`` equals ``prefix`` or lies below it."""
    return path[: len(prefix)] == prefix


def prefixes(paths: Iterable[FieldPath]) -> frozenset[FieldPath]:
    """Every strict, non-empty prefix of the given paths (the inner nodes of their trie)."""
    return frozenset(p[:i] for p in paths for i in range(1, len(p)))


@dataclass(frozen=True)
class ManagedEntry:
    """One ``managedFields`` entry, its set decoded."""

    manager: str
    operation: str
    api_version: str
    subresource: str
    paths: frozenset[FieldPath]

    @property
    def inner(self) -> frozenset[FieldPath]:
        return prefixes(self.paths)


def managed_entries(live: Manifest) -> tuple[ManagedEntry, ...]:
    """Parse ``metadata.managedFields``; entries in other encodings (none exist today) are skipped."""
    out: list[ManagedEntry] = []
    for raw in (live.get("metadata") or {}).get("managedFields") or ():
        if raw.get("fieldsType", "FieldsV1") != "FieldsV1":
            continue
        out.append(
            ManagedEntry(
                manager=str(raw.get("manager", "")),
                operation=str(raw.get("operation", "")),
                api_version=str(raw.get("apiVersion", "")),
                subresource=str(raw.get("subresource", "")),
                paths=decode_fields_v1(raw.get("fieldsV1") or {}),
            )
        )
    return tuple(out)


# ---------------------------------------------------------------------------
# Paths of a manifest


class KeyMissing(ValueError):
    """An associative-list item lacks a key field and the schema gives no default."""


def item_element(info: ListInfo, item: Any, index: int) -> str:
    """The path element of one list item under the list's merge type."""
    if info.type == "map":
        if not isinstance(item, Mapping):
            raise KeyMissing("associative list item is not an object")
        keys: dict[str, Any] = {}
        for k in info.keys:
            if k in item and item[k] is not None:
                keys[k] = item[k]
            elif (d := info.key_default(k)) is not None:
                keys[k] = d
            else:
                raise KeyMissing(f"associative list item lacks key field {k!r}")
        return key_element(keys)
    if info.type == "set":
        return value_element(item)
    return index_element(index)


def list_elements(info: ListInfo, items: list[Any]) -> list[str] | None:
    """Elements of every item, or ``None`` when the list cannot be keyed (then it is treated as atomic)."""
    try:
        return [item_element(info, item, i) for i, item in enumerate(items)]
    except KeyMissing:
        return None


def _owned_as_entry(value: Any) -> bool:
    """SMD records a ``null`` or ``{}`` value as a field of its own, even for a struct field
    (``resources: {}``, ``annotations: {}``); an empty list only when it is atomic (see ``walk_owned``)."""
    return value is None or (isinstance(value, Mapping) and not value)


def walk_owned(value: Any, node: Node, path: FieldPath, out: set[FieldPath]) -> None:
    """Add to ``out`` the paths that applying ``value`` at ``path`` owns (SMD ToFieldSet)."""
    if isinstance(value, Mapping):
        if node.atomic_map:
            out.add(path)
            return
        for k, v in value.items():
            child = (*path, field_element(k))
            walk_owned(v, node.field(k), child, out)
            if _owned_as_entry(v) or not node.is_struct_field(k):
                out.add(child)
        return
    if isinstance(value, list):
        info = node.list_info()
        elements = list_elements(info, value) if info.type != "atomic" else None
        if elements is None:
            out.add(path)
            return
        item = node.item()
        for element, v in zip(elements, value, strict=True):
            child = (*path, element)
            walk_owned(v, item, child, out)
            out.add(child)
        return
    out.add(path)


def manifest_paths(manifest: Manifest, node: Node) -> frozenset[FieldPath]:
    """Paths our Apply entry would own after applying ``manifest`` (``status`` and identity excluded)."""
    out: set[FieldPath] = set()
    for key, value in manifest.items():
        if key in STRIPPED_TOP:
            continue
        if key == "metadata" and isinstance(value, Mapping):
            meta = node.field("metadata")
            for mk, mv in value.items():
                if mk not in STRIPPED_METADATA:
                    child = ("f:metadata", field_element(mk))
                    walk_owned(mv, meta.field(mk), child, out)
                    if _owned_as_entry(mv):
                        out.add(child)
            continue
        walk_owned(value, node.field(key), (field_element(key),), out)
        if _owned_as_entry(value):
            out.add((field_element(key),))
    out.discard(())
    return frozenset(out)


def merged_order(live: list[str], applied: list[str]) -> list[str]:
    """Item order of an associative or set list after an apply merges ``applied`` into ``live``.

    A port of structured-merge-diff's ``visitListItems``: items both sides have take the
    applied order, live-only items keep their place relative to them, new items go where
    the applied list puts them. So reordering Git's containers *is* a change the server
    makes (checked against a real server by ``tests/test_plan_crosscheck.py``), while a
    sidecar a webhook appended or prepended stays where it is.
    """
    applied_set, live_set = set(applied), set(live)
    shared = iter([e for e in applied if e in live_set])
    next_shared = next(shared, None)
    out: list[str] = []
    merged: set[str] = set()
    li = ri = 0
    while li < len(live) or ri < len(applied):
        if li < len(live) and ri < len(applied):
            element = live[li]
            if element == applied[ri]:
                merged.add(element)
                out.append(element)
                li, ri = li + 1, ri + 1
                next_shared = next(shared, None)
                continue
            if element in applied_set and next_shared is not None and next_shared != element:
                li += 1  # a shared item, but not the one the applied order wants now
                continue
        if li < len(live):
            element = live[li]
            if element not in applied_set:
                out.append(element)
                li += 1
                continue
            if element in merged:
                li += 1
                continue
        if ri < len(applied):
            element = applied[ri]
            merged.add(element)
            out.append(element)
            ri += 1
            if next_shared is not None and next_shared == element:
                next_shared = next(shared, None)
    return out


# ---------------------------------------------------------------------------
# Navigating a document by field path


def _find_item(items: list[Any], element: str, info: ListInfo) -> int | None:
    kind, payload = parse_element(element)
    if kind == "i":
        return payload if isinstance(payload, int) and 0 <= payload < len(items) else None
    for i, item in enumerate(items):
        try:
            if item_element(info, item, i) == element:
                return i
        except KeyMissing:
            continue
    return None


def _locate(doc: Any, path: FieldPath, node: Node) -> tuple[Any, str | int] | None:
    """The container holding ``path``'s value in ``doc`` and its key or index; ``None`` when absent."""
    if not path:
        return None
    parent: Any = doc
    for i, element in enumerate(path):
        last = i == len(path) - 1
        if element.startswith("f:") and isinstance(parent, dict):
            name = element[2:]
            if name not in parent:
                return None
            if last:
                return parent, name
            parent, node = parent[name], node.field(name)
        elif isinstance(parent, list):
            index = _find_item(parent, element, node.list_info())
            if index is None:
                return None
            if last:
                return parent, index
            parent, node = parent[index], node.item()
        else:
            return None
    return None


def value_at(doc: Any, path: FieldPath, node: Node) -> tuple[bool, Any]:
    """(whether ``doc`` holds a value at ``path``, that value)."""
    found = _locate(doc, path, node)
    if found is None:
        return False, None
    container, at = found
    return True, container[at]


def remove_path(doc: Any, path: FieldPath, node: Node) -> bool:
    """Delete the value at ``path`` from ``doc`` in place; ``False`` when it is not there."""
    found = _locate(doc, path, node)
    if found is None:
        return False
    container, at = found
    del container[at]
    return True


def replace_path(doc: Any, path: FieldPath, node: Node, value: Any) -> bool:
    """Put ``value`` at ``path`` of ``doc`` in place of what is there; ``False`` when nothing is."""
    found = _locate(doc, path, node)
    if found is None:
        return False
    container, at = found
    container[at] = value
    return True


def _unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


def pointer_to_path(pointer: str, doc: Any, node: Node) -> FieldPath | None:
    """``/spec/replicas`` → ``("f:spec", "f:replicas")``, resolved against ``doc``.

    A numeric segment selects a list item of ``doc`` by index and becomes that item's
    ``k:``/``v:`` element; ``name=app`` selects an associative-list item by one key field.
    A pointer into an atomic list or map stops at it (the server cannot split it).
    ``None`` for a malformed pointer or an index ``doc`` does not have.
    """
    if not pointer.startswith("/"):
        return None
    path: list[str] = []
    value: Any = doc
    for raw in pointer[1:].split("/"):
        segment = _unescape(raw)
        if isinstance(value, list):
            info = node.list_info()
            if info.type == "atomic":
                return tuple(path)
            index: int | None = None
            if segment.isdigit():
                index = int(segment)
            elif "=" in segment:
                k, _, v = segment.partition("=")
                index = next(
                    (i for i, it in enumerate(value) if isinstance(it, dict) and str(it.get(k)) == v), None
                )
            if index is None or index >= len(value):
                return None
            try:
                path.append(item_element(info, value[index], index))
            except KeyMissing:
                return tuple(path)
            value, node = value[index], node.item()
            continue
        if node.atomic_map and path:
            return tuple(path)
        path.append(field_element(segment))
        value = value.get(segment) if isinstance(value, dict) else None
        node = node.field(segment)
    return tuple(path) if path else None
