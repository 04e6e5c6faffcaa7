"""What an object looks like after a server-side apply: the server's merge, approximated.

``plan`` renders the operations of an update (``jsonpatch.make_patch`` from live
to ``expected_after``) and the cross-check test compares the plan with a
server-side dry-run apply. The merge follows structured-merge-diff: maps merge
key by key (atomic maps are replaced), associative and set lists are matched by
their keys and ordered by ``fields.merged_order``, atomic lists and scalars are
replaced, released paths nobody else owns are removed. Pure; called by ``plan``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from agent.model import FieldPath, Manifest
from agent.plan.fields import list_elements, merged_order, remove_path
from agent.plan.normalize import leaf_equal
from agent.plan.schema import Node


def whole_item_if_key(path: FieldPath) -> FieldPath:
    """A key field cannot be left out of its item: the unit becomes the item itself."""
    if len(path) >= 2 and path[-2].startswith("k:") and path[-1].startswith("f:"):
        keys = json.loads(path[-2][2:])
        if path[-1][2:] in keys:
            return path[:-1]
    return path


def expected_after(
    live: Manifest, body: Manifest, released: Sequence[tuple[FieldPath, bool]], node: Node
) -> Manifest:
    """``live`` after applying ``body`` and dropping the released paths the server removes."""
    # A deep copy: merge shares untouched subtrees with live, and removals below must not reach it.
    out: Manifest = merge(copy.deepcopy(live), body, node)
    for path, removed in sorted(released, key=lambda r: len(r[0])):
        if removed and whole_item_if_key(path) == path:
            remove_path(out, path, node)
    return out


def merge(live: Any, applied: Any, node: Node) -> Any:
    """``applied`` merged into ``live`` the way server-side apply merges an applied configuration."""
    if isinstance(applied, dict) and isinstance(live, dict) and not node.atomic_map:
        out = dict(live)
        for k, v in applied.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(live.get(k), v, node.field(k))
        return out
    if isinstance(applied, list) and isinstance(live, list) and (info := node.list_info()).type != "atomic":
        ours, theirs = list_elements(info, applied), list_elements(info, live)
        if ours is not None and theirs is not None:
            live_items = dict(zip(theirs, live, strict=True))
            applied_items = dict(zip(ours, applied, strict=True))
            item = node.item()
            out_list: list[Any] = []
            for element in merged_order(theirs, ours):
                if element in applied_items:
                    old = live_items.get(element)
                    new = applied_items[element]
                    out_list.append(merge(old, new, item) if old is not None else copy.deepcopy(new))
                else:
                    out_list.append(live_items[element])
            return out_list
    if live is not None and leaf_equal(applied, live, node, owned_by_us=False):
        return live  # the server keeps its canonical spelling (cpu "1" for "1000m")
    return copy.deepcopy(applied)


def for_report(manifest: Manifest) -> Manifest:
    """The object without managedFields and status, the parts a diff report never shows."""
    out = dict(manifest)
    out.pop("status", None)
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k != "managedFields"}
    return out
