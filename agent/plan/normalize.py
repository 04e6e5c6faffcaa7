"""Value normalisation for deciding "Git's value equals live" without asking the server.

The API server rewrites some values on the way in; comparing raw JSON would
report those as drift on every pass and cost a write each time. What is
normalised, and why it is safe:

- **Quantities** of built-in kinds are compared in the spelling the server
  stores (``canonical_quantity``, a port of apimachinery's ``CanonicalizeBytes``):
  ``1000m`` = ``1``, ``0.5`` = ``500m``, YAML ``1`` = ``"1"``, ``1024Mi`` =
  ``1Gi``. The canonical form keeps the *format* of what was sent, so
  ``1073741824`` ≠ ``1Gi``: applying it rewrites the stored spelling (once),
  which a real server confirms (``tests/test_plan_crosscheck.py``). Custom
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
- **Server defaults inside atomic values**: an atomic map or list is replaced
  whole, then the server defaults what it lacks (``fieldRef.apiVersion: v1``).
  A field Git leaves out there equals live when live holds the field's
  *default* (``schema.Node.field_default``: the OpenAPI ``default``, or one the
  server sets without publishing it); any other live value is a change, since
  the apply would reset it. Ownership alone would not do: Git dropping an
  explicit ``protocol: UDP`` looks the same in managedFields.
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
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any, Final

from deepdiff import DeepDiff

from agent.plan.schema import Node


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


_DECIMAL_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIX = {0: "", 1: "Ki", 2: "Mi", 3: "Gi", 4: "Ti", 5: "Pi", 6: "Ei"}
_NANO = Decimal("1e-9")


def canonical_quantity(value: Any) -> str | None:
    """The string the API server stores for a Quantity (``None`` if ``value`` is not one).

    Format from the input (binary suffix → BinarySI, ``e``-exponent → DecimalExponent,
    otherwise DecimalSI); values rounded up to nano units; BinarySI falls back to
    DecimalSI below 1024 or for fractions; DecimalSI/Exponent strip trailing zeros and
    put the exponent on a multiple of three (``1500m``, ``1k``, ``1073741824``).
    """
    amount = parse_quantity(value)
    if amount is None:
        return None
    text = value.strip() if isinstance(value, str) else str(value)
    fmt = "binary" if text.endswith("i") else "exponent" if re.search(r"[eE][+-]?\d+$", text) else "decimal"
    places = amount.as_tuple().exponent
    if isinstance(places, int) and places < -9:
        amount = amount.quantize(_NANO, rounding=ROUND_CEILING)
    if amount == 0:
        return "0"
    if fmt == "binary":
        if -1024 < amount < 1024 or amount != amount.to_integral_value():
            fmt = "decimal"
        else:
            number, power = int(amount), 0
            while power < 6 and number % 1024 == 0:
                number, power = number // 1024, power + 1
            return f"{number}{_BINARY_SUFFIX[power]}"
    sign, digits, exponent = amount.normalize().as_tuple()
    mantissa = int("".join(map(str, digits))) * (-1 if sign else 1)
    assert isinstance(exponent, int)
    shift = exponent % 3
    mantissa, exponent = mantissa * 10**shift, exponent - shift
    if fmt == "decimal" and exponent in _DECIMAL_SUFFIX:
        return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"
    return f"{mantissa}e{exponent}" if exponent else str(mantissa)


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
        dq, lq = canonical_quantity(desired), canonical_quantity(live)
        if dq is not None and lq is not None:
            return dq == lq
    if isinstance(desired, dict | list):
        wanted = strip_empty(desired)
        # Defaults are looked for only when the values differ: equal values cost nothing more.
        return values_equal(wanted, strip_empty(live)) or values_equal(
            wanted, strip_empty(strip_defaults(desired, live, node))
        )
    return values_equal(desired, live)


def strip_defaults(desired: Any, live: Any, node: Node) -> Any:
    """``live`` without the fields ``desired`` leaves out that hold their server default (module docstring).

    Lists are matched by position: inside an atomic value the server keeps Git's items in order.
    """
    if isinstance(desired, Mapping) and isinstance(live, Mapping):
        out: dict[str, Any] = {}
        for k, v in live.items():
            child = node.field(k)
            if k in desired:
                out[k] = strip_defaults(desired[k], v, child)
                continue
            default = node.field_default(k)
            if default is None or not leaf_equal(default, v, child, owned_by_us=False):
                out[k] = v
        return out
    if isinstance(desired, list) and isinstance(live, list) and len(desired) == len(live):
        item = node.item()
        return [strip_defaults(d, v, item) for d, v in zip(desired, live, strict=True)]
    return live


def changed_inside(desired: Any, live: Any, *, limit: int = 3) -> tuple[str, ...]:
    """Where two differing atomic values (a selector, a rule list) differ, as ``matchLabels.tier``.

    deepdiff does the comparison, with JSON's one number type; it runs only on values
    already found different, so unchanged objects never pay for it. Names, never values.
    """
    if not isinstance(desired, dict | list) or not isinstance(live, dict | list):
        return ()
    diff = DeepDiff(strip_empty(live), strip_empty(desired), ignore_numeric_type_changes=True, view="tree")
    found = sorted({_dotted(leaf.path(output_format="list")) for leaves in diff.values() for leaf in leaves})
    return tuple(found[:limit]) + (("…",) if len(found) > limit else ())


def _dotted(parts: list[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "."


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
