"""``[[conflict_rules]]`` and an app's ``[[apps.conflict_rules]]``: who yields which fields to whom.

Called by ``load`` and ``app_entries``; what ``action`` and ``operation`` accept is declared on
``ConflictRule``.
"""

from __future__ import annotations

from typing import Any

from agent.config.tomlreader import TableReader
from agent.config.types import ConflictRule


def conflict_rules(raw: list[Any], path: str, file: str) -> tuple[ConflictRule, ...]:
    """The entries of the array at ``path``, in order (the first match wins)."""
    return tuple(_rule(TableReader(t, f"{path}[{i}]", file)) for i, t in enumerate(raw))


def _rule(r: TableReader) -> ConflictRule:
    rule = ConflictRule(
        manager=r.get("manager", str, required=True),
        action=r.setting(ConflictRule, "action", required=True),
        operation=r.setting(ConflictRule, "operation", "*"),
        subresource=r.get("subresource", str, "*"),
    )
    r.finish()
    return rule
