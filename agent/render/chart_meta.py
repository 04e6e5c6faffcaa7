"""A chart's version as its ``Chart.yaml`` says it: what the history shows beside a revision.

Called by ``reconcile.pipeline`` after an app that renders a chart (``helm.chart``) rendered.
Best effort and cheap: one small file read from the checkout; anything unreadable (missing,
too large, not a mapping, no string version) is ``""``, never an error of the pass.
"""

from __future__ import annotations

from pathlib import Path

import yaml

__all__ = ["chart_version"]

#: A Chart.yaml larger than this is not read for the history (real ones are a few hundred bytes).
_LIMIT = 64 * 1024


def chart_version(tree: Path, chart: str) -> str:
    """``version`` of ``<tree>/<chart>/Chart.yaml`` ("" when it cannot be read)."""
    path = tree / chart.strip("/") / "Chart.yaml"
    try:
        if path.is_symlink() or path.stat().st_size > _LIMIT:
            return ""
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return ""
    version = doc.get("version") if isinstance(doc, dict) else None
    return str(version)[:80] if isinstance(version, str | int | float) else ""
