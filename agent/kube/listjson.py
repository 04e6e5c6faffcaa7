"""Decode a LIST response one item at a time.

``json.loads`` of a page builds every item of it before the first can be looked at; with
several clusters listing several kinds at once, those decoded pages were most of a steady
pass's peak memory. ``each_item`` walks the top-level object itself and decodes each element
of ``items`` with the C scanner (``JSONDecoder.raw_decode``), handing it over at once, so a
caller that plans and drops items holds one page's text and one item at a time.

Pure: tests in ``tests/test_listjson.py`` (property-tested against ``json.loads``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_DECODER = json.JSONDecoder()
_BLANK = re.compile(r"[ \t\n\r]*")


def each_item(text: str, on_item: Callable[[Any], None]) -> dict[str, Any]:
    """Call ``on_item`` with each element of the top-level ``items`` array, in order.

    Returns the other top-level members (``metadata`` with the continue token, ``kind``...).
    Raises ``ValueError`` (``json.JSONDecodeError`` included) when ``text`` is not one JSON object.
    """
    decode = _DECODER.raw_decode
    i = _skip(text, _expect(text, _skip(text, 0), "{"))
    rest: dict[str, Any] = {}
    if text.startswith("}", i):
        return _end(text, i + 1, rest)
    while True:
        if not text.startswith('"', i):
            raise ValueError(f"expected a member name at character {i}")
        key, i = decode(text, i)
        i = _skip(text, _expect(text, _skip(text, i), ":"))
        if key == "items" and text.startswith("[", i):
            i = _items(text, i + 1, on_item)
        else:
            rest[key], i = decode(text, i)
        i = _skip(text, i)
        if text.startswith("}", i):
            return _end(text, i + 1, rest)
        i = _skip(text, _expect(text, i, ","))


def _items(text: str, i: int, on_item: Callable[[Any], None]) -> int:
    decode = _DECODER.raw_decode
    i = _skip(text, i)
    if text.startswith("]", i):
        return i + 1
    while True:
        item, i = decode(text, i)
        on_item(item)
        i = _skip(text, i)
        if text.startswith("]", i):
            return i + 1
        i = _skip(text, _expect(text, i, ","))


def _skip(text: str, i: int) -> int:
    """The index of the first non-blank character at or after ``i``."""
    found = _BLANK.match(text, i)
    return found.end() if found else i


def _expect(text: str, i: int, char: str) -> int:
    if not text.startswith(char, i):
        found = repr(text[i]) if i < len(text) else "the end"
        raise ValueError(f"expected {char!r} at character {i}, found {found}")
    return i + 1


def _end(text: str, i: int, rest: dict[str, Any]) -> dict[str, Any]:
    if _skip(text, i) != len(text):
        raise ValueError(f"extra data after the object at character {i}")
    return rest
