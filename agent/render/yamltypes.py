"""What a YAML scalar is, the way Kubernetes reads it: the types of ``sigs.k8s.io/yaml``.

Called by both YAML loaders of ``agent.render`` (``fastyaml`` and ``manifests``): their resolver
decides a plain scalar's tag here, and their constructors make its value here. Kubernetes reads
YAML with ``sigs.k8s.io/yaml`` (a fork of go-yaml v2: YAML 1.1 words, Go's number syntax) and
then as JSON; PyYAML's YAML 1.1 rules differ from it on real manifests (``=`` was
refused as a "value" tag, ``1:20`` was 80, ``0o17`` and ``1e3`` were strings), so the agent
applied something other than what ``kubectl`` does. The rules here are go-yaml v2's ``resolve``
followed by the JSON conversion, checked by tests/test_yaml_oracle.py against the real library:

* ``y Y yes Yes YES true True TRUE on On ON`` are true, their ``n``/``no``/``false``/``off``
  counterparts false; ``~ null Null NULL`` and the empty scalar are null; ``.inf``/``.nan``
  spellings are floats that JSON (so Kubernetes) refuses;
* a scalar starting with a digit or sign, ``_`` removed, is an integer in Go's syntax
  (``0x1F``, ``0o17``, ``0b101``, ``0777`` octal, int64 or uint64 range), else a float of
  ``[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?`` that does not overflow; one starting
  with ``.`` is a float as Go parses it; anything else -- ``1:20``, dates -- is a string;
* a whole float (``1.0``, ``1e3``) is the integer JSON writes for it, below ``1e21``;
* mapping keys that are numbers or booleans become their JSON spelling (``80`` -> ``"80"``,
  ``y`` -> ``"true"``, floats as Go's 32-bit shortest form); a null, list or mapping key is refused.
"""

from __future__ import annotations

import math
import re
import struct
from decimal import Decimal
from functools import lru_cache
from typing import Any

import yaml
from yaml.nodes import ScalarNode

STR = "tag:yaml.org,2002:str"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
BOOL = "tag:yaml.org,2002:bool"
NULL = "tag:yaml.org,2002:null"
MERGE = "tag:yaml.org,2002:merge"

_TRUE = ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
_FALSE = ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
_WORDS: dict[str, tuple[str, Any]] = {
    **{w: (BOOL, True) for w in _TRUE},
    **{w: (BOOL, False) for w in _FALSE},
    **{w: (NULL, None) for w in ("", "~", "null", "Null", "NULL")},
    **{w: (FLOAT, math.nan) for w in (".nan", ".NaN", ".NAN")},
    **{w: (FLOAT, math.inf) for w in (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")},
    **{w: (FLOAT, -math.inf) for w in ("-.inf", "-.Inf", "-.INF")},
    "<<": (MERGE, "<<"),
}
_NUMERIC_START = frozenset("0123456789+-")
_GO_INT = re.compile(
    r"([-+]?)(?:0[xX]([0-9a-fA-F]+)|0[oO]([0-7]+)|0[bB]([01]+)|(0[0-7]*)|([1-9][0-9]*))", re.ASCII
)
_YAML_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?", re.ASCII)
# Go's ParseFloat of a scalar starting with ".": underscores only between digits.
_DOT_FLOAT = re.compile(r"\.[0-9](?:_?[0-9])*(?:[eE][-+]?[0-9](?:_?[0-9])*)?", re.ASCII)
_INT64 = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1


@lru_cache(maxsize=4096)
def resolve(text: str) -> tuple[str, Any]:
    """(tag, value) of a plain scalar without a tag, as go-yaml v2 resolves it, then as JSON."""
    word = _WORDS.get(text)
    if word is not None:
        return word
    first = text[0]
    if first in _NUMERIC_START:
        number = _number(text.replace("_", ""))
        if number is not None:
            return number
    elif first == "." and _DOT_FLOAT.fullmatch(text):
        value = float(text.replace("_", ""))
        if not math.isinf(value):
            return FLOAT, json_number(value)
    return STR, text


def _number(plain: str) -> tuple[str, int | float] | None:
    m = _GO_INT.fullmatch(plain)
    if m is not None:
        sign, hex_, octal, binary, zero_octal, decimal = m.groups()
        if hex_ is not None:
            value = int(hex_, 16)
        elif octal is not None:
            value = int(octal, 8)
        elif binary is not None:
            value = int(binary, 2)
        elif zero_octal is not None:
            value = int(zero_octal, 8)
        else:
            value = int(decimal)
        value = -value if sign == "-" else value
        if _INT64[0] <= value <= _INT64[1] or (not sign and value <= _UINT64_MAX):
            return INT, value
    if _YAML_FLOAT.fullmatch(plain):
        f = float(plain)
        if not math.isinf(f):  # Go refuses an overflow: the scalar stays a string
            return FLOAT, json_number(f)
    return None


def json_number(value: float) -> int | float:
    """``value`` as JSON writes it back: a whole number below 1e21 has no fraction (Go's encoder)."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e21:
        # Go writes the shortest digits that read back as the float, then zeros: so does repr.
        return int(value) if abs(value) < 2**53 else int(Decimal(repr(value)))
    return value


class TypeMismatch(ValueError):
    """A scalar written with an explicit tag it cannot have (``!!int 1.5``): Kubernetes refuses it."""


def tagged(tag: str, text: str) -> Any:
    """The value of a scalar with an explicit standard tag (``!!int "1"``), as go-yaml v2 reads it."""
    if tag == STR:
        return text
    found, value = resolve(text)
    if found == tag or (tag == FLOAT and found == INT):
        return value
    want, got = tag.rsplit(":", 1)[-1], found.rsplit(":", 1)[-1]
    raise TypeMismatch(f"{text!r} is not a {want} (it reads as a {got})")


def json_key(key: Any, tag: str, text: str) -> str | None:
    """A mapping key as ``sigs.k8s.io/yaml`` spells it in JSON, or ``None`` when it refuses the key.

    ``tag``, ``text``: the key's resolved tag and its scalar text; a float key (``1e6``, ``-0.0``)
    is spelled as the float it was written as, even when its value is whole (``1e+06``, ``-0``).
    """
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int | float) and tag == FLOAT:
        word = _WORDS.get(text)
        return _float32_text(word[1] if word is not None else float(text.replace("_", "")))
    if isinstance(key, int):
        return str(key) if _INT64[0] <= key <= _INT64[1] else None  # a uint64 key is refused
    if isinstance(key, float):
        return _float32_text(key)
    return None


def _float32_text(value: float) -> str:
    """Go's ``FormatFloat(value, 'g', -1, 32)``: the shortest digits of the 32-bit float."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    try:
        single = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # beyond float32: Go's conversion gives an infinity
        single = math.copysign(math.inf, value)
    if math.isinf(single):
        return ".inf" if single > 0 else "-.inf"
    for digits in range(1, 10):
        text = f"{single:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == single:
            break
    mantissa, exponent = text.split("e")
    exp = int(exponent)
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    if exp < -4 or exp >= 6:  # %e when the exponent is below -4 or at least 6 (shortest form)
        return f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    return format(Decimal(f"{mantissa}e{exp}"), "f")


class Resolver(yaml.resolver.BaseResolver):
    """PyYAML's resolver hook with go-yaml v2's rules for plain scalars (``resolve`` above).

    A plain scalar gets the tag of what it reads as, so the constructors see ``merge`` for
    ``<<`` and never PyYAML's ``value`` (``=``) or ``timestamp`` tags.
    """

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is ScalarNode and implicit[0]:
            return resolve(value)[0]
        base: Any = super()  # PyYAML's resolver is untyped
        return base.resolve(kind, value, implicit)
