"""The comparison walk of the plan stage: which declared paths differ from live.

Walks Git's cleaned manifest against the live object along the schema
(``schema.Node``): granular maps and list-maps/sets recurse, atomic values and
leaves compare whole after normalisation (``normalize.leaf_equal``). Also notes
lists whose item order an apply would change. Pure; ``plan.plan_object`` turns
the result into a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.model import FieldPath, Manifest
from agent.plan import masking
from agent.plan.fields import field_element, list_elements, merged_order
from agent.plan.normalize import MISSING, b64_equal, changed_inside, is_empty, leaf_equal, strip_defaults
from agent.plan.schema import Node


@dataclass
class Differences:
    """What ``_compare`` found: differing declared paths (with both values), and lists whose
    item order the apply would change (not a field conflict: no value differs)."""

    changed: set[FieldPath] = field(default_factory=set)
    values: dict[FieldPath, tuple[Any, Any]] = field(default_factory=dict)
    reordered: set[FieldPath] = field(default_factory=set)
    #: For a differing atomic map or list, where inside it (``matchLabels.tier``), for reasons.
    inside: dict[FieldPath, tuple[str, ...]] = field(default_factory=dict)
    #: Leaves and atomic values equal to live only once normalised (``fieldRef`` without the
    #: ``apiVersion: v1`` the server added, ``cpu: 1000m`` stored as ``"1"``): live's spelling.
    respelled: dict[FieldPath, Any] = field(default_factory=dict)

    def add(self, path: FieldPath, desired: Any, live: Any) -> None:
        self.changed.add(path)
        self.values[path] = (desired, None if live is MISSING else live)


def differences(
    desired: Manifest, live: Manifest, node: Node, *, owned: frozenset[FieldPath], secret: bool
) -> Differences:
    """Declared paths whose normalised value differs from live, with both values.

    ``owned``: the paths our Apply entry holds (``leaf_equal`` is stricter on those);
    ``secret``: compare ``data`` as bytes, with values masked in what is recorded.
    """
    diff = Differences()
    for key, value in desired.items():
        if key in ("apiVersion", "kind", "status") or (secret and key in ("data", "stringData")):
            continue
        path = (field_element(key),)
        if key == "metadata" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in ("name", "namespace")}
        _compare(value, live.get(key, MISSING), node.field(key), path, owned, diff)
    if secret:
        _compare_secret(desired, live, diff)
    return diff


def _compare(
    desired: Any, live: Any, node: Node, path: FieldPath, owned: frozenset[FieldPath], diff: Differences
) -> None:
    if isinstance(desired, dict) and not node.atomic_map:
        live_map = live if isinstance(live, dict) else {}
        for k, v in desired.items():
            _compare(v, live_map.get(k, MISSING), node.field(k), (*path, field_element(k)), owned, diff)
        return
    if isinstance(desired, list) and (info := node.list_info()).type != "atomic":
        elements = list_elements(info, desired)
        live_items = live if isinstance(live, list) else []
        live_elements = list_elements(info, live_items)
        if elements is not None and live_elements is not None:
            by_element = dict(zip(live_elements, live_items, strict=True))
            item = node.item()
            for element, v in zip(elements, desired, strict=True):
                child = (*path, element)
                if element not in by_element:
                    diff.add(child, v, None)
                    if info.type == "set":
                        continue
                if info.type == "map":
                    _compare(v, by_element.get(element, MISSING), item, child, owned, diff)
            # The apply puts shared items in Git's order (fields.merged_order): a reordering
            # in Git is a write, one the server makes once; others' items keep their place.
            if len(elements) > 1 and live_elements:
                present = set(live_elements)
                merged = [e for e in merged_order(live_elements, elements) if e in present]
                if merged != live_elements:
                    diff.reordered.add(path)
            return
    if not leaf_equal(desired, live, node, owned_by_us=path in owned):
        diff.add(path, desired, live)
        if isinstance(desired, dict | list) and isinstance(live, dict | list):
            diff.inside[path] = changed_inside(desired, strip_defaults(desired, live, node))
    elif live is not MISSING and desired != live and not (is_empty(desired) and is_empty(live)):
        diff.respelled[path] = live


def _compare_secret(desired: Manifest, live: Manifest, diff: Differences) -> None:
    """``data`` compared as bytes (``stringData`` was folded into it by ``_clean``)."""
    live_data = live.get("data") or {}
    for k, v in (desired.get("data") or {}).items():
        lv = live_data.get(k)
        if lv is None or not b64_equal(v, lv):
            diff.add(
                ("f:data", field_element(k)),
                masking.MASK_AFTER,
                masking.MASK_BEFORE if lv is not None else None,
            )


__all__ = ["Differences", "differences"]
