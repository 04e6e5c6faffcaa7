"""``agent.kube.listjson.each_item`` against ``json.loads``: the same items and members, or an error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.kube.listjson import each_item

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
_objects = st.dictionaries(st.text(max_size=6), _values, max_size=4)
_layouts = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 2}, {"indent": "\t"}])


def _collect(text: str) -> tuple[list[Any], dict[str, Any]]:
    items: list[Any] = []
    rest = each_item(text, items.append)
    return items, rest


@settings(max_examples=300, deadline=None)
@given(obj=_objects, items=st.one_of(st.none(), st.lists(_values, max_size=5)), layout=_layouts)
def test_each_item_gives_what_json_loads_gives(
    obj: dict[str, Any], items: Any, layout: dict[str, Any]
) -> None:
    if items is not None:
        obj = {**obj, "items": items}
    text = json.dumps(obj, **layout)
    got_items, rest = _collect(text)
    expected = json.loads(text)
    if isinstance(expected.get("items"), list):
        assert got_items == expected.pop("items")
    else:
        assert got_items == []
    assert rest == expected


def test_items_are_handed_over_in_order_before_later_members() -> None:
    seen: list[str] = []
    rest = each_item(
        '{"kind":"ConfigMapList","items":[{"n":"a"},{"n":"b"}],"metadata":{"continue":"t"}}',
        lambda it: seen.append(it["n"]),
    )
    assert seen == ["a", "b"] and rest == {"kind": "ConfigMapList", "metadata": {"continue": "t"}}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"items":[{"a":1},]}',
        '{"items":[{"a":1}',
        '{"items":[1 2]}',
        '{"kind":"X" "items":[]}',
        '{"kind":"X",}',
        '{"items":[]} trailing',
        "{kind: 1}",
        '{"items":[{"a":1}]',
    ],
)
def test_malformed_lists_raise_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        _collect(text)
