"""Health settings read from TOML: custom CEL checks per kind, and which objects an app waits for.

Called by ``agent.config.load``. A check is Flux's ``healthCheckExprs`` shape (``api_version``,
``kind``, ``current``, optional ``in_progress`` and ``failed``), compiled here when the config
is read, so a mistyped expression is a ``ConfigError`` (exit 2) naming the entry, the app and
the expression instead of a surprise in the middle of a wait. ``agent.plan.health.assess``
evaluates them. ``wait`` entries (``Kind[.group]/[namespace/]name``) become ``WaitRef``s.
``celpy`` (cel-python) is imported only when a config has checks: it takes a third of a second.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.config.tomlreader import TableReader
from agent.errors import ConfigError
from agent.model import ObjectKey, split_api_version

_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_GROUP = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.:]*[a-z0-9])?$")
#: The top-level fields an expression may name bare (Flux's style: ``status.conditions...``),
#: bound to ``{}`` when the object lacks them, so ``has(status.x)`` works before a controller wrote.
_TOP_LEVEL = ("apiVersion", "kind", "metadata", "spec", "status")


class CheckError(Exception):
    """An expression did not evaluate to a boolean for one object (the object's health is Unknown)."""


@dataclass(frozen=True)
class Expression:
    """One compiled CEL expression; equal to another with the same text."""

    source: str
    program: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def compile(cls, source: str) -> Expression:
        """Parse ``source``; raises ``ValueError`` saying what is wrong with it."""
        from celpy.celparser import CELParseError  # here: a third of a second, only configs with checks

        if not source.strip():
            raise ValueError("empty expression")
        try:
            with _LOCK:  # one shared parser; a config reload may compile beside a pass
                env = _environment()
                return cls(source, env.program(env.compile(source)))
        except CELParseError as e:
            line, column = getattr(e, "line", None), getattr(e, "column", None)
            where = f" at line {line}, column {column}" if line and column else ""
            raise ValueError(f"syntax error{where}") from None

    def __call__(self, obj: Mapping[str, Any]) -> bool:
        """The expression's value for ``obj`` (seen as ``self`` and by its top-level fields)."""
        from celpy import celtypes
        from celpy.adapter import json_to_cel
        from celpy.evaluation import CELEvalError

        activation: dict[str, Any] = {k: {} for k in _TOP_LEVEL}
        activation.update(obj)
        activation["self"] = obj
        try:
            value = self.program.evaluate({k: json_to_cel(v) for k, v in activation.items()})
        except CELEvalError as e:
            said = str(e.args[0]) if e.args else type(e).__name__
            raise CheckError(said.split(" (in activation", 1)[0]) from None
        if not isinstance(value, celtypes.BoolType):
            raise CheckError(f"gave {type(value).__name__.removesuffix('Type').lower()}, not a boolean")
        return bool(value)


_ENV: list[Any] = []
_LOCK = threading.Lock()


def _environment() -> Any:
    """One CEL environment for every expression: building its parser takes half a second."""
    if not _ENV:
        import celpy

        _ENV.append(celpy.Environment())
    return _ENV[0]


@dataclass(frozen=True)
class HealthCheck:
    """Custom health of one kind: ``in_progress``, then ``failed``, then ``current``; else InProgress.

    Matched by group and kind (any version), as Flux does.
    """

    api_version: str
    kind: str
    current: Expression
    in_progress: Expression | None = None
    failed: Expression | None = None

    @property
    def group(self) -> str:
        return split_api_version(self.api_version)[0]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        group, _ = split_api_version(str(obj.get("apiVersion", "")))
        return obj.get("kind") == self.kind and group == self.group


def health_check(r: TableReader, app: str = "") -> HealthCheck:
    """One `[[health_checks]]` table, its expressions compiled; errors name the entry and the app."""
    api_version = r.get("api_version", str, required=True)
    group, version = split_api_version(api_version)
    if not version or (group and not _GROUP.match(group)):
        raise r.error("api_version", f"must be group/version or version, got {api_version!r}")
    kind = r.get("kind", str, required=True)
    if not _KIND.match(kind):
        raise r.error("kind", f"must be a kind such as Certificate, got {kind!r}")
    exprs: dict[str, Expression | None] = {}
    for name in ("current", "in_progress", "failed"):
        source = r.get(name, str, required=name == "current")
        if source is None:
            exprs[name] = None
            continue
        try:
            exprs[name] = Expression.compile(source)
        except ValueError as e:
            of_app = f" of app {app!r}" if app else ""
            raise r.error(name, f"invalid CEL expression{of_app}: {source!r}: {e}") from None
    r.finish()
    current = exprs["current"]
    assert current is not None  # required above
    return HealthCheck(api_version, kind, current, exprs["in_progress"], exprs["failed"])


def health_checks(tables: list[Any], path: str, file: str, app: str = "") -> tuple[HealthCheck, ...]:
    """A list of `[[health_checks]]` tables; one kind checked twice is an error naming both entries."""
    checks: list[HealthCheck] = []
    for i, table in enumerate(tables):
        check = health_check(TableReader(table, f"{path}[{i}]", file), app)
        for j, other in enumerate(checks):
            if (other.group, other.kind) == (check.group, check.kind):
                raise ConfigError(
                    f"{path}[{i}].kind",
                    f"{check.kind} of {check.api_version} is checked twice (also {path}[{j}])",
                    file=file,
                )
        checks.append(check)
    return tuple(checks)


@dataclass(frozen=True)
class WaitRef:
    """One entry of ``wait``: ``Kind[.group]/[namespace/]name``.

    Without a group it means that kind in any group; without a namespace, that name in any
    namespace (and a cluster-scoped object), as the app applied it.
    """

    kind: str
    name: str
    group: str | None = None
    namespace: str | None = None

    def matches(self, key: ObjectKey) -> bool:
        return (
            (key.kind, key.name) == (self.kind, self.name)
            and self.group in (None, key.group)
            and self.namespace in (None, key.namespace)
        )

    def __str__(self) -> str:
        kind = f"{self.kind}.{self.group}" if self.group else self.kind
        ns = f"{self.namespace}/" if self.namespace is not None else ""
        return f"{kind}/{ns}{self.name}"


def wait_ref(text: str) -> WaitRef:
    """``Deployment/web``, ``Deployment.apps/shop/web`` → ``WaitRef``; ``ValueError`` saying what is wrong."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"must be Kind/name or Kind/namespace/name, got {text!r}")
    kind, _, group = parts[0].partition(".")
    if not _KIND.match(kind):
        raise ValueError(f"{parts[0]!r} is not a kind (Deployment, or with its group: Deployment.apps)")
    if group and not _GROUP.match(group):
        raise ValueError(f"{group!r} is not an API group")
    namespace = parts[1] if len(parts) == 3 else None
    if namespace is not None and not _DNS_LABEL.match(namespace):
        raise ValueError(f"{namespace!r} is not a namespace name")
    if not _NAME.match(parts[-1]):
        raise ValueError(f"{parts[-1]!r} is not an object name")
    return WaitRef(kind, parts[-1], group or None, namespace)


@dataclass(frozen=True)
class Wait:
    """``wait``: follow the health of every object the app applies (``true``), or of those listed."""

    every: bool = False
    refs: tuple[WaitRef, ...] = ()

    def __bool__(self) -> bool:
        return self.every or bool(self.refs)

    def includes(self, key: ObjectKey) -> bool:
        """Whether the app waits for the object ``key`` (when it applied it)."""
        return self.every or any(r.matches(key) for r in self.refs)

    def unmatched(self, keys: Iterable[ObjectKey]) -> tuple[WaitRef, ...]:
        """The entries that name none of ``keys`` (what the app applies): a typo to report, not wait on."""
        applied = tuple(keys)
        return tuple(r for r in self.refs if not any(r.matches(k) for k in applied))


def wait_setting(r: TableReader, name: str = "wait") -> Wait | None:
    """``wait = false | true | ["Kind/name", ...]``; None when unset. Errors name ``wait[i]``."""
    value = r.get(name, (bool, list))
    if value is None:
        return None
    if isinstance(value, bool):
        return Wait(every=value)
    refs: list[WaitRef] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ConfigError(f"{r.key(name)}[{i}]", "expected string (Kind/name)", file=r.file)
        try:
            ref = wait_ref(item)
        except ValueError as e:
            raise ConfigError(f"{r.key(name)}[{i}]", str(e), file=r.file) from None
        if ref in refs:
            raise ConfigError(f"{r.key(name)}[{i}]", f"{item!r} is listed twice", file=r.file)
        refs.append(ref)
    if not refs:
        raise r.error(name, "an empty list waits for nothing: say false, true or name objects")
    return Wait(refs=tuple(refs))
