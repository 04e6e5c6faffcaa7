"""Helm hooks no sync runs: an object whose ``helm.sh/hook`` names only delete or rollback
phases (docs/safety.md, "Helm delete and rollback hooks are not applied").

``helm template`` prints every hook with the chart's other objects. Applied as ordinary objects,
a chart's ``pre-delete`` Jobs would run at install: Kyverno's scale Kyverno to zero and delete its
webhooks. The pass takes every Helm hook out of the app's objects (``plan.ordering``), so only
the planner's callers that plan every object (the offline diff) meet one here: planned as a
``SKIP`` (``SkipReason.HELM_HOOK``), never applied nor recorded in the inventory. Pure.
"""

from __future__ import annotations

from agent.model import HELM_HOOK, Manifest

#: Phases that belong to `helm uninstall` and `helm rollback`, never to an install or upgrade.
DEFERRED_PHASES = frozenset({"pre-delete", "post-delete", "pre-rollback", "post-rollback"})


def hook_phases(manifest: Manifest) -> tuple[str, ...]:
    """The phases ``helm.sh/hook`` names, as Helm reads them: comma-separated, trimmed, lower case."""
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(HELM_HOOK) if isinstance(annotations, dict) else None
    if not isinstance(raw, str):
        return ()
    return tuple(p.strip().lower() for p in raw.split(",") if p.strip())


def deferred_hook(manifest: Manifest) -> tuple[str, ...]:
    """The phases of a hook that runs only on delete or rollback; () for anything else."""
    phases = hook_phases(manifest)
    return phases if phases and DEFERRED_PHASES.issuperset(phases) else ()


def skip_reason(phases: tuple[str, ...]) -> str:
    """The words the run table, reports and ``/status`` show for such a hook."""
    return f"Helm {', '.join(phases)} hook ({HELM_HOOK}): never applied by a sync"
