"""The per-cluster table that ``run --once`` and ``demo`` print."""

from __future__ import annotations

from agent.model import ClusterResult, Outcome


def format_summary(results: list[ClusterResult]) -> str:
    """The per-cluster table `run --once` and `demo` print."""
    rows = [("CLUSTER", "REVISION", "APPLIED", "UNCHANGED", "PRUNED", "FAILED", "STATUS")]
    for r in results:
        status = "ok" if r.ok else f"failed: {(r.error or 'objects failed').splitlines()[0]}"
        if r.refused is not None:
            status = f"refused ({r.refused.value}): {(r.error or '').splitlines()[0]}"
        if r.ok and r.prune_refused:
            status = f"ok (prune refused: {r.prune_refused})"
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
