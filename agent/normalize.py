"""Value normalisation for deciding "Git's value equals live" without asking the server.

The API server rewrites some values on the way in; comparing raw JSON would
report those as drift on every pass and cost a write each time. What is
normalised, and why it is safe:

- **Quantities** of built-in kinds (``1000m`` = ``1``, ``1Gi`` = ``1073741824``,
  YAML ``1`` = ``"1"``): the server stores the canonical form. Custom
  resources keep what was sent, so there a quantity is compared as written.
- **Numbers**: ``1`` = ``1.0`` (JSON has one number type), but ``true`` ≠ ``1``.
- **int-or-string** values are compared *with* their type: the server keeps
  ``"80"`` as a string, so ``"80"`` vs ``80`` is a real change (and built-in
  validation usually rejects the string form: hiding it would hide an error).
- **null vs absent, defaulted empties**: ``null``, ``{}`` and ``[]`` equal an
  absent field (the server drops them from ``omitempty`` fields). ``""``,
  ``0`` and ``false`` equal an absent field only when our own Apply entry
  already owns it — the server recorded our ownership and dropped the zero
  value; otherwise they are a change.
- **Secret ``stringData``** is write-only: the server merges it into ``data``
  (base64), so ``stringData.k`` is compared with ``data.k`` decoded.
- ``status`` is never compared (see ``fields.STRIPPED_TOP``).

List ordering of associative lists and sets is handled by the walker in
``plan`` (items are matched by key, not by index). Pure; called by ``plan``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from agent.schema import Node


class _Missing:
    """Marks a field absent from live (distinct from an explicit ``null``)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<missing>"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")
_SUFFIX: dict[str, Decimal] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(value: Any) -> Decimal | None:
    """``"1000m"`` → 1; ``"1Gi"`` → 1073741824; numbers as themselves; ``None`` if not a quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return Decimal(str(value))
        except InvalidOperation:  # nan/inf
            return None
    if not isinstance(value, str):
        return None
    m = _QUANTITY.match(value.strip())
    if not m:
        return None
    number, exponent, suffix = m.groups()
    try:
        base = Decimal(number)
        if exponent:
            return base * (Decimal(10) ** int(exponent[1:]))
        return base * _SUFFIX[suffix or ""]
    except (InvalidOperation, OverflowError):
        return None


def is_empty(value: Any) -> bool:
    """``null``, ``{}``, ``[]`` or absent: the server drops these from omitempty fields."""
    return value is None or value is MISSING or (isinstance(value, dict | list) and not value)


def is_zero(value: Any) -> bool:
    """Go's zero values of scalars, dropped by ``omitempty`` when the field is not a pointer."""
    return (
        value is False
        or (isinstance(value, str) and value == "")
        or (isinstance(value, int | float) and not isinstance(value, bool) and value == 0)
    )


def strip_empty(value: Any) -> Any:
    """Drop ``null``/empty entries recursively (for comparing atomic values as the server stores them)."""
    if isinstance(value, Mapping):
        out = {k: strip_empty(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if not is_empty(v)}
    if isinstance(value, list):
        return [strip_empty(v) for v in value]
    return value


def values_equal(a: Any, b: Any) -> bool:
    """JSON equality with one number type but no bool/number mixing; dict order ignored."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def leaf_equal(desired: Any, live: Any, node: Node, *, owned_by_us: bool) -> bool:
    """Whether applying ``desired`` at a leaf (scalar, atomic list or map) leaves ``live`` as it is."""
    if is_empty(desired) and is_empty(live):
        return True
    if live is MISSING and is_zero(desired):
        return owned_by_us
    if node.quantity and not node.int_or_string:
        dq, lq = parse_quantity(desired), parse_quantity(live)
        if dq is not None and lq is not None:
            return dq == lq
    if isinstance(desired, dict | list):
        return values_equal(strip_empty(desired), strip_empty(live))
    return values_equal(desired, live)


def secret_string_data_as_data(desired: Mapping[str, Any]) -> dict[str, Any]:
    """``stringData`` entries encoded into ``data``, the form the server stores (for comparison only)."""
    data = dict(desired.get("data") or {})
    for k, v in (desired.get("stringData") or {}).items():
        if isinstance(v, str):
            data[k] = base64.b64encode(v.encode()).decode()
    return data


def b64_equal(a: Any, b: Any) -> bool:
    """Two base64 strings that decode to the same bytes (padding/line breaks aside)."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    try:
        return base64.b64decode(a, validate=False) == base64.b64decode(b, validate=False)
    except (binascii.Error, ValueError):
        return a == b
