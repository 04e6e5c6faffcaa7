"""The per-cluster table that ``run --once`` and ``demo`` print."""

from __future__ import annotations

from agent.model import ClusterResult, Outcome


def _status(r: ClusterResult) -> str:
    """One cell: ``ok``, ``ok (prune refused: …)``, ``refused (<refusal>): …`` or ``failed: …``."""
    if r.failure is not None:
        first = (r.failure.message.splitlines() or [""])[0]
        if r.failure.refusal is not None:
            return f"refused ({r.failure.refusal.value}): {first}"
        return f"failed: {first}"
    if not r.ok:
        return "failed: objects failed"
    if r.prune_refusal is not None:
        return f"ok (prune refused: {r.prune_refusal.message})"
    return "ok"


def format_summary(results: list[ClusterResult]) -> str:
    """The per-cluster table `run --once` and `demo` print."""
    rows = [("CLUSTER", "REVISION", "APPLIED", "UNCHANGED", "PRUNED", "FAILED", "STATUS")]
    for r in results:
        status = _status(r)
        rows.append(
            (
                r.cluster,
                r.revision[:12],
                str(r.applied),
                str(r.count(Outcome.UNCHANGED)),
                str(r.count(Outcome.PRUNED)),
                str(r.failed),
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1] for row in rows
    ]
    for r in results:
        for res in r.results:
            if res.outcome is Outcome.FAILED:
                lines.append(f"  {r.cluster}: {res.key}: HTTP {res.status}: {res.message}")
    return "\n".join(lines)
