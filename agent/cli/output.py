"""How commands that print a table print it: ``-o table`` (the default) or ``-o json``.

Shared by ``status``, ``run --once``, ``events``, ``tree`` and ``wait``, so each spells the
option the same way (kubectl's and flux's ``-o``/``--output``) and prints JSON the same way:
one indented document on standard output, nothing else there (logs go to standard error).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import click

from agent.model import AppHealth, ClusterResult

F = TypeVar("F", bound=Callable[..., Any])

TABLE, JSON = "table", "json"
FORMATS = (TABLE, JSON)


def output_option(help_json: str = "json: one JSON document (for scripts).") -> Callable[[F], F]:
    """``-o/--output table|json``, default table."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(FORMATS),
        default=TABLE,
        show_default=True,
        help=help_json,
    )


def to_json(doc: Any) -> str:
    """The JSON every command prints: indented, keys in the order the command built them."""
    return json.dumps(doc, indent=2, ensure_ascii=False)


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, trailing spaces dropped (the last
    column is not padded, so a long message does not widen the others)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip() for r in rows
    ]


def results_json(
    results: Sequence[ClusterResult], health: Mapping[tuple[str, str], AppHealth] | None = None
) -> dict[str, Any]:
    """``run --once -o json``: each (cluster, app) as a ``/status`` row of that one pass (the
    same keys, less the daemon's schedule and the counts across passes)."""
    from agent.run.status import AppStatus

    rows = []
    for r in results:
        app = r.app or r.cluster
        row = AppStatus(
            r.cluster, app, state=r.state, last_result=r, health=(health or {}).get((r.cluster, app))
        )
        doc = row.to_json()
        for across in ("last_success_revision", "last_success_at", "consecutive_failures"):
            doc.pop(across)
        rows.append(doc)
    return {"results": rows}
