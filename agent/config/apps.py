"""Checks that the apps of a config fit together on each cluster.

Called by ``agent.config.load`` once every entry is parsed and each `[[apps]]` entry is
expanded to one ``AppConfig`` per cluster. Pure: it sees apps and the entries they came from,
never TOML. Each problem is one ``ConfigError`` naming the entry's key path
(``apps[2].depends_on``) and, when two entries clash, both of them — the reconcile pass
relies on these holding (one inventory per name, dependencies it can order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.config.types import AppConfig, ClusterConfig
from agent.errors import ConfigError


@dataclass(frozen=True)
class Placed:
    """An app and the entry it came from: ``apps[2]``, or ``clusters[0]`` for an implicit app."""

    app: AppConfig
    entry: str

    def describe(self) -> str:
        return f"the implicit app of {self.entry}" if self.app.implicit else self.entry


def check_apps(placed: Sequence[Placed], clusters: Sequence[ClusterConfig], *, file: str) -> None:
    """Raise ``ConfigError`` for the first problem, in config order; None when the apps fit."""
    for i, cluster in enumerate(clusters):
        on = [p for p in placed if p.app.cluster == cluster.name]
        if not on:
            raise ConfigError(
                f"clusters[{i}]",
                "serves no app: set path or paths, or name this cluster in an [[apps]] entry",
                file=file,
            )
        _unique_names(on, file)
        _renames(on, file)
        _dependencies(on, file, every=placed)


def _unique_names(on: Sequence[Placed], file: str) -> None:
    seen: dict[str, Placed] = {}
    for p in on:
        first = seen.setdefault(p.app.name, p)
        if first is not p:
            raise ConfigError(
                f"{p.entry}.name",
                f"duplicate app {p.app.name!r} on cluster {p.app.cluster!r} (also {first.describe()})",
                file=file,
            )


def _renames(on: Sequence[Placed], file: str) -> None:
    names = {p.app.name: p for p in on}
    claimed: dict[str, Placed] = {}
    for p in on:
        old = p.app.renamed_from
        if not old:
            continue
        where = f"{p.entry}.renamed_from"
        if old == p.app.name:
            raise ConfigError(where, f"is this app's own name {old!r}", file=file)
        if old in names:
            raise ConfigError(
                where,
                f"{old!r} is still an app on cluster {p.app.cluster!r} ({names[old].describe()}): "
                "an app takes over a renamed app's objects only once the old name is gone",
                file=file,
            )
        first = claimed.setdefault(old, p)
        if first is not p:
            raise ConfigError(
                where,
                f"{first.entry} on cluster {p.app.cluster!r} is renamed from {old!r} too: "
                "only one app can take over its objects",
                file=file,
            )


def _dependencies(on: Sequence[Placed], file: str, *, every: Sequence[Placed]) -> None:
    by_name = {p.app.name: p for p in on}
    cluster = on[0].app.cluster
    for p in on:
        for dep in p.app.depends_on:
            if dep in by_name:
                continue
            have = ", ".join(by_name)
            elsewhere = sorted({o.app.cluster for o in every if o.app.name == dep})
            if elsewhere:
                message = (
                    f"depends_on across clusters: {dep!r} is an app on {', '.join(elsewhere)}, "
                    f"not on {cluster!r} (apps on {cluster!r}: {have})"
                )
            else:
                message = f"no app named {dep!r} on cluster {cluster!r} (have: {have})"
            raise ConfigError(f"{p.entry}.depends_on", message, file=file)
    cycle = _first_cycle([p.app for p in on])
    if cycle:
        raise ConfigError(
            f"{by_name[cycle[0]].entry}.depends_on",
            f"dependency cycle on cluster {cluster!r}: {' -> '.join(cycle)}",
            file=file,
        )


def _first_cycle(apps: Sequence[AppConfig]) -> list[str]:
    """A dependency cycle as ``[a, b, a]``, starting at its app first in config order; [] if none."""
    order = {a.name: i for i, a in enumerate(apps)}
    edges = {a.name: a.depends_on for a in apps}
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            loop = stack[stack.index(name) :]
            start = min(range(len(loop)), key=lambda i: order[loop[i]])
            cycles.append(loop[start:] + loop[:start] + [loop[start]])
            return
        if name in done:
            return
        stack.append(name)
        for dep in edges[name]:
            visit(dep, stack)
        stack.pop()
        done.add(name)

    for a in apps:
        visit(a.name, [])
    return min(cycles, key=lambda c: order[c[0]], default=[])
