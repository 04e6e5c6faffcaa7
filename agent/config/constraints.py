"""What a setting accepts, declared on its field in ``agent.config.types``.

A field's ``metadata["accepts"]`` holds one declaration: ``Duration`` or ``Size`` (how it is
spelled, and its least value), ``Bound`` (a number's range), ``Pattern`` (a string's shape),
``Choice`` (an enum's spellings) or ``Parsed`` (a parser's word). ``TableReader.setting`` reads a
key as its field declares it, so the loader holds no bounds of its own and a new option states
its limits where its default is. Checks across keys (``retry_period < renew_deadline``) stay in
the loader, beside the table they concern.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

#: The metadata key of a field's declaration.
ACCEPTS = "accepts"

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A chart repository's name, as `helm repo add` takes it.
REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: An http:// or https:// URL with a host.
HTTP_URL = re.compile(r"https?://[^\s/?#]+[^\s]*\Z")
#: A chart repository: an http(s):// URL, or an OCI registry path ``oci://host[:port]/path``.
CHART_REPO_URL = re.compile(r"(https?://[^\s/?#]+[^\s]*|oci://[^\s/?#]+(/[^\s?#]*)?)\Z")
#: host:port, or ":port" (every address).
LISTEN = re.compile(r"[^\s:]*:\d{1,5}\Z")


def choices(kind: type[StrEnum]) -> list[str]:
    """The spellings a setting accepts: for the loader's checks and the CLI's ``click.Choice``."""
    return [m.value for m in kind]


@dataclass(frozen=True)
class Duration:
    """Seconds, written ``"30s"``, ``"5m"``, ``"1h30m"``, ``"500ms"``; at least ``low``."""

    low: float = 0.001


@dataclass(frozen=True)
class Size:
    """Bytes, written ``"512Mi"``, ``"1Gi"``, ``"300M"`` or as a number; at least ``low``."""

    low: int


@dataclass(frozen=True)
class Bound:
    """A number from ``low`` (excluded when ``open_low``) to ``high`` (``None``: no limit)."""

    low: float
    high: float | None = None
    open_low: bool = False
    #: The refusal, formatted with ``low``, ``high`` and the ``value`` as written.
    message: str = "must be at least {low}, got {value}"

    def refusal(self, value: float) -> str | None:
        too_low = value <= self.low if self.open_low else value < self.low
        if too_low or (self.high is not None and value > self.high):
            return self.message.format(low=self.low, high=self.high, value=value)
        return None


@dataclass(frozen=True)
class Pattern:
    """A string ``regex`` matches (from its start); each entry of a list of strings."""

    regex: re.Pattern[str]
    #: The refusal, formatted with the ``value``.
    message: str
    #: Whether ``""`` means "not set" and is accepted as it is.
    optional: bool = True

    def refusal(self, value: str) -> str | None:
        if (value or not self.optional) and not self.regex.match(value):
            return self.message.format(value=value)
        return None


#: ``Choice`` messages: "must be one of a, b, c; got 'x'" and "must be a, b or c, got 'x'".
ONE_OF = "must be one of {listed}; got {value!r}"
EITHER = "must be {either}, got {value!r}"


@dataclass(frozen=True)
class Choice:
    """An enum's spelling (the field's type says which enum)."""

    message: str = ONE_OF
    #: Read case-insensitively (``log_level = "INFO"``).
    fold_case: bool = False

    def refusal(self, kind: type[StrEnum], value: str) -> str | None:
        allowed = choices(kind)
        if value in allowed:
            return None
        either = f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0]
        return self.message.format(listed=", ".join(allowed), either=either, value=value)


@dataclass(frozen=True)
class Parsed:
    """A string ``parse`` accepts (``""``: not set); its ``ValueError`` is the refusal."""

    parse: Callable[[str], object]

    def refusal(self, value: str) -> str | None:
        if value:
            try:
                self.parse(value)
            except ValueError as e:
                return str(e)
        return None


Accepts = Duration | Size | Bound | Pattern | Choice | Parsed

#: Declarations many fields share, with the messages the loader has always given.
LABEL = Pattern(
    DNS_LABEL, "must be a DNS label (lowercase letters, digits, '-'), got {value!r}", optional=False
)
NAMESPACE = Pattern(DNS_LABEL, "not a valid namespace name: {value!r}")
AT_LEAST_0 = Bound(0)
AT_LEAST_1 = Bound(1)


def accepts(declaration: Accepts) -> dict[str, Any]:
    """A field's metadata holding ``declaration``: ``field(default=..., metadata=accepts(...))``."""
    return {ACCEPTS: declaration}


_T = TypeVar("_T")


def declare(default: _T, declaration: Accepts) -> _T:
    """A field's ``default`` and what it accepts, side by side: ``port: int = declare(80, Bound(1))``."""
    return dataclasses.field(default=default, metadata=accepts(declaration))


@dataclass(frozen=True)
class Declared:
    """A field as the loader reads it: the TOML type, the enum if any, its declaration."""

    kind: type
    enum: type[StrEnum] | None
    accepts: Accepts | None


@functools.cache
def declared(owner: type, name: str) -> Declared:
    """How ``owner``'s field ``name`` is read: ``int | None`` reads as ``int``, an enum as ``str``,
    ``tuple[str, ...]`` as a list of strings."""
    hint = typing.get_type_hints(owner)[name]
    if isinstance(hint, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    field = next(f for f in dataclasses.fields(owner) if f.name == name)
    decl = field.metadata.get(ACCEPTS)
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, StrEnum):
        return Declared(str, origin, decl if decl is not None else Choice())
    return Declared(origin, None, decl)
