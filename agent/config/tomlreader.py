"""Typed reads of TOML tables that name the key path of every mistake.

``config`` builds the agent's settings with it: each getter checks the type,
records the key as used (so ``finish`` can reject unknown keys, suggesting the
closest known one), and raises ``ConfigError`` naming ``table.key`` and the file.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from agent.config.constraints import Bound, Choice, Duration, Parsed, Pattern, Size, declared
from agent.errors import ConfigError

#: A key TOML writes bare; any other (``""``, ``"a.b"``) is shown quoted, as it is written.
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+(\[\d+\])*")  # an array entry too: clusters[1]
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# What can hold a bracket that is not one: strings (multi-line first; a closing """ or ''' may be
# followed by up to two quotes of the content) and comments. Any other bracket opens or closes.
_TOML_TOKEN = re.compile(
    r'"""(?:[^\\]|\\.)*?"""(?:""?)?'
    r"|'''.*?'''(?:''?)?"
    r'|"(?:[^"\\\n]|\\.)*"'
    r"|'[^'\n]*'"
    r"|#[^\n]*"
    r"|[\[\]{}]",
    re.DOTALL,
)


def parse_duration(text: str) -> float:
    """``"1h30m"`` → 5400.0 seconds. Raises ``ValueError`` on anything else."""
    text = text.strip()
    if not text:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 5m, 1h30m, 500ms)")
    return total


_SIZE = re.compile(r"(\d+)(Ki|Mi|Gi|k|M|G)?")
_SIZE_UNITS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 10**3, "M": 10**6, "G": 10**9}


def parse_size(value: str | int) -> int:
    """``"512Mi"`` → 536870912 bytes; an integer is bytes. Raises ``ValueError`` on anything else."""
    if isinstance(value, int):
        return value
    m = _SIZE.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"invalid size {value!r} (use e.g. 512Mi, 1Gi, or a number of bytes)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def too_deep(text: str, limit: int) -> tuple[int, int] | None:
    """Line and column (1-based) of the first array or inline table nested more than ``limit``
    levels deep in TOML ``text``, if any.

    Why: ``tomllib`` recurses on them up to Python's recursion limit, and its RecursionError
    names no place. Text that is not TOML is left to ``tomllib`` (an unclosed string hides the rest).
    """
    depth = 0
    for m in _TOML_TOKEN.finditer(text):
        token = m.group()
        if token in ("[", "{"):
            depth += 1
            if depth > limit:
                at = m.start()
                return text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
        elif token in ("]", "}"):
            depth -= 1
    return None


class TableReader:
    """Reads one TOML table, checking types and recording which keys were used."""

    def __init__(self, table: Any, path: str, file: str) -> None:
        if not isinstance(table, dict):
            raise ConfigError(path, f"must be a table, got {type(table).__name__}", file=file)
        self.table: dict[str, Any] = table
        self.path = path
        self.file = file
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        shown = name if _BARE_KEY.fullmatch(name) else json.dumps(name, ensure_ascii=False)
        return f"{self.path}.{shown}" if self.path else shown

    def error(self, name: str, message: str) -> ConfigError:
        return ConfigError(self.key(name), message, file=self.file)

    def get(
        self, name: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False
    ) -> Any:
        self.used.add(name)
        if name not in self.table:
            if required:
                raise self.error(name, "required key is missing")
            return default
        value = self.table[name]
        # bool is an int in Python; never accept true for a number.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.error(name, f"expected {type_name(kind)}, got boolean")
        if not isinstance(value, kind):
            raise self.error(name, f"expected {type_name(kind)}, got {type_name(type(value))}")
        return value

    def duration(self, name: str, default: float, *, minimum: float = 0.001) -> float:
        value = self.get(name, str)
        if value is None:
            return default
        try:
            seconds = parse_duration(value)
        except ValueError as e:
            raise self.error(name, str(e)) from None
        if seconds < minimum:
            raise self.error(name, f"must be at least {minimum:g}s, got {value!r}")
        return seconds

    def size(self, name: str, default: int, *, minimum: int) -> int:
        """A byte size: ``"512Mi"``, ``"1Gi"``, ``"300M"`` (Kubernetes quantity suffixes) or bytes."""
        value = self.get(name, (str, int))
        if value is None:
            return default
        try:
            size = parse_size(value)
        except ValueError as e:
            raise self.error(name, str(e)) from None
        if size < minimum:
            raise self.error(name, f"must be at least {minimum >> 20}Mi, got {value!r}")
        return size

    def setting(self, owner: type, name: str, default: Any = None, *, required: bool = False) -> Any:
        """Key ``name`` read as ``owner``'s field of that name declares it: its type and what it
        accepts (``agent.config.constraints``); ``default`` when the table does not set it."""
        d = declared(owner, name)
        a = d.accepts
        if isinstance(a, Duration):
            return self.duration(name, default, minimum=a.low)
        if isinstance(a, Size):
            return self.size(name, default, minimum=a.low)
        if d.kind is tuple:
            items = self.string_list(name)
            if items is None:
                return default
            for i, item in enumerate(items):
                if isinstance(a, Pattern) and (problem := a.refusal(item)) is not None:
                    raise self.error(f"{name}[{i}]", problem)
            return items
        value = self.get(name, (float, int) if d.kind is float else d.kind, required=required)
        if value is None:
            return default
        if d.enum is not None and isinstance(a, Choice):
            value = value.lower() if a.fold_case else value
            if (problem := a.refusal(d.enum, value)) is not None:
                raise self.error(name, problem)
            return d.enum(value)
        if isinstance(a, Bound | Pattern | Parsed) and (problem := a.refusal(value)) is not None:
            raise self.error(name, problem)
        return float(value) if d.kind is float else value

    def string_list(self, name: str) -> tuple[str, ...] | None:
        value = self.get(name, list)
        if value is None:
            return None
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise ConfigError(f"{self.key(name)}[{i}]", "expected string", file=self.file)
        return tuple(value)

    def sub(self, name: str) -> TableReader | None:
        value = self.get(name, dict)
        return None if value is None else TableReader(value, self.key(name), self.file)

    def finish(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            raise self.error(unknown[0], "unknown key" + _suggest(unknown[0], self.used))


def type_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "table"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _suggest(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
