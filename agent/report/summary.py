"""The per-(cluster, app) table that ``run --once`` and ``demo`` print."""

from __future__ import annotations

from collections.abc import Mapping

from agent.model import (
    ApiProblem,
    AppHealth,
    ClusterResult,
    DriftFate,
    FieldConflict,
    HealthState,
    Outcome,
    drifted_objects,
)
from agent.plan.fields import render_path


def yielded_text(c: FieldConflict) -> str:
    """``spec.replicas kept by kube-controller-manager (scale)``: no values, so no secret can show."""
    return f"{render_path(c.path)} kept by {c.manager} ({c.subresource or c.operation})"


def _status(r: ClusterResult) -> str:
    """One cell: ``ok``, ``ok (prune refused: …)``, ``held by change window …``, ``refused
    (<refusal>): …`` or ``failed: …``."""
    if r.failure is not None:
        first = (r.failure.message.splitlines() or [""])[0]
        if r.failure.refusal is not None:
            return f"refused ({r.failure.refusal.value}): {first}"
        return f"failed: {first}"
    if not r.ok:
        return "failed: objects failed"
    if r.window is not None and not r.window.forced:
        return f"held by change window {r.window.window}: {r.window.message}"
    if r.waiting_on:
        return f"waiting on {', '.join(r.waiting_on)}"
    if r.prune_refusal is not None:
        return f"ok (prune refused: {r.prune_refusal.message})"
    if reported := drifted_objects([d for d in r.drift if d.fate is DriftFate.REPORTED]):
        return f"ok (drift reported in {reported} object(s), not corrected)"
    return "ok"


def format_summary(
    results: list[ClusterResult], health: Mapping[tuple[str, str], AppHealth] | None = None
) -> str:
    """One row per (cluster, app), then each failed or skipped object, each object two apps declare
    and each field yielded to another manager (YIELDED counts those objects: a yield is never silent),
    and each drifted field (``drift = "report"``: left and reported, or corrected by a new revision).

    The APP column is there when an app is not a cluster entry's own (named after the entry):
    a config without `[[apps]]` prints the table it printed before apps. The HEALTH column is
    there when an app waited for its rollout (``health``: by (cluster, app)), with a line for
    each app not Current naming what blocks it.
    """
    health = health or {}
    apps = any(r.app and r.app != r.cluster for r in results)
    head = ("CLUSTER", "APP") if apps else ("CLUSTER",)
    shown = ("HEALTH",) if health else ()
    cols = ("REVISION", "APPLIED", "UNCHANGED", "YIELDED", "PRUNED", "FAILED")
    rows = [(*head, *cols, *shown, "STATUS")]
    for r in results:
        status = _status(r)
        h = health.get((r.cluster, r.app or r.cluster))
        rows.append(
            (
                *((r.cluster, r.app or r.cluster) if apps else (r.cluster,)),
                r.revision[:12],
                str(r.applied),
                str(r.count(Outcome.UNCHANGED)),
                str(r.yielded),
                str(r.count(Outcome.PRUNED)),
                str(r.failed),
                *((h.state.value if h else "-",) if health else ()),
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1] for row in rows
    ]
    for r in results:
        where = f"{r.cluster}/{r.app}" if r.app and r.app != r.cluster else r.cluster
        for res in r.results:
            if res.outcome is Outcome.FAILED:
                lines.append(f"  {where}: {res.key}: HTTP {res.status}: {res.message}")
            elif res.outcome is Outcome.SKIPPED and res.message:
                # Not written, and not failed: "ok" alone would hide an object left to another set.
                lines.append(f"  {where}: {res.key}: skipped: {res.message}")
        for c in r.conflicts:
            lines.append(f"  {where}: conflict: {c}")
        for res in r.results:
            lines.extend(f"  {where}: {res.key}: yielded: {yielded_text(y)}" for y in res.yielded)
        lines.extend(f"  {where}: drift {d.fate.value}: {d.describe()}" for d in r.drift)
        for f in r.api_findings:
            if f.problem is not ApiProblem.NOT_SERVED:  # those are failed objects, listed above
                lines.append(f"  {where}: {f.key}: {f.problem.value}: {f.message}")
        h = health.get((r.cluster, r.app or r.cluster))
        if h is not None and h.state is not HealthState.CURRENT:
            lines.append(f"  {where}: health {h.health.describe()}")
    return "\n".join(lines)
