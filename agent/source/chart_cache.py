"""Garbage collection of the chart cache: the unpacked charts (``<cache_dir>/charts/<digest>/``)
and the charts built with their dependencies (``charts/built/<key>/``) no app uses any more.

Called by ``reconcile.charts.ChartPolls`` (the running agent's, never a command's: a command
knows only its own pins) after each source's poll, with the directories in use: every source's
current pins and every chart's last good one (kept in force when a fetch fails). Of the others,
the ``spare`` most recently written are kept (a rollback, or a version that comes back, costs no
download); the rest are removed. An entry younger than ``min_age`` is never removed: another
source's poll may have just written it and not yet pinned it. Unfinished work (``.tmp-*``) is
removed once older than ``min_age``.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

import structlog

__all__ = ["MIN_AGE", "SPARE", "collect"]

log = structlog.get_logger("agent.source.chart_cache")

#: Unused chart copies kept besides those in use.
SPARE = 8
#: Seconds an entry is left alone after it was written.
MIN_AGE = 600.0
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
_COMPLETE = ".complete"


def _written(entry: Path) -> float:
    """When ``entry`` was completed (or last used, for a built chart), else created."""
    try:
        return (entry / _COMPLETE).stat().st_mtime
    except OSError:
        try:
            return entry.stat().st_mtime
        except OSError:
            return 0.0


def _entries(root: Path) -> list[Path]:
    found: list[Path] = []
    for parent in (root, root / "built"):
        try:
            found += [p for p in parent.iterdir() if p.is_dir() and not p.is_symlink()]
        except OSError:
            continue
    return found


def collect(
    root: Path,
    in_use: Iterable[Path],
    *,
    spare: int = SPARE,
    min_age: float = MIN_AGE,
    now: float | None = None,
) -> list[Path]:
    """Remove what of ``root`` (``<cache_dir>/charts``) ``in_use`` (pinned chart directories) does
    not need, beyond the ``spare`` newest; the entries removed."""
    now = time.time() if now is None else now
    keep = {p.parent for p in in_use if p != Path()}
    unused: list[tuple[float, Path]] = []
    removed: list[Path] = []
    for entry in _entries(root):
        age = now - _written(entry)
        if entry.name.startswith(".tmp-"):
            if age > min_age:
                removed.append(entry)
        elif _DIGEST.match(entry.name) and entry not in keep and age > min_age:
            unused.append((_written(entry), entry))
    unused.sort(reverse=True)
    removed += [e for _, e in unused[spare:]]
    for entry in removed:
        shutil.rmtree(entry, ignore_errors=True)
    if removed:
        log.info("chart cache collected", removed=len(removed), kept_unused=min(spare, len(unused)))
    return removed
