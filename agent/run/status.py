"""What `/status` and `gitops-agent status` show: per cluster, and per app of each cluster.

``fleet.Fleet`` keeps one ``ClusterStatus`` per cluster (its schedule, Lease holder, whether a
pass is running) holding one ``AppStatus`` per app (its last result, failures, last success and
when it last ran, which is what decides whether it is due). ``/status`` lists one row per
(cluster, app) (``ClusterStatus.rows``); a cluster entry's own app is named after the entry, so
a config without `[[apps]]` shows one row per cluster, as before apps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent.model import AppHealth, ClusterResult, HealthState, Outcome, PassState, WindowHold, drifted_objects
from agent.plan.fields import render_path
from agent.plan.health import worst

#: Which app state a cluster shows when its apps differ: the first of these any app is in.
_WORST_FIRST = (
    PassState.REFUSED,
    PassState.TIMED_OUT,
    PassState.FAILED,
    PassState.WAITING,
    PassState.SYNCING,
    PassState.WINDOW,
    PassState.SUSPENDED,
    PassState.OK,
    PassState.PENDING,
)


def worst_state(states: set[PassState]) -> PassState:
    """The state a cluster shows for its apps' states: the first of ``_WORST_FIRST`` among them."""
    return next((s for s in _WORST_FIRST if s in states), PassState.PENDING)


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _yields(r: ClusterResult) -> list[dict[str, str]]:
    return [
        {
            "object": str(x.key),
            "path": render_path(c.path),
            "manager": c.manager,
            "operation": c.operation,
            "subresource": c.subresource,
        }
        for x in r.results
        for c in x.yielded
    ]


def _skipped(r: ClusterResult) -> list[dict[str, str | None]]:
    return [
        {"object": str(x.key), "skip": x.skip.value if x.skip else None, "message": x.message}
        for x in r.results
        if x.outcome is Outcome.SKIPPED
    ]


def _window(w: WindowHold) -> dict[str, Any]:
    return {
        "reason": w.reason.value,
        "window": w.window,
        "message": w.message,
        "forced": w.forced,
        "changes": w.changes,
        "prunes": w.prunes,
    }


@dataclass
class AppStatus:
    """One app of one cluster: its last pass and what the scheduler reads to decide it is due."""

    cluster: str
    app: str
    state: PassState = PassState.PENDING
    last_result: ClusterResult | None = None
    last_success_revision: str = ""
    last_success_at: datetime | None = None
    failures: int = 0
    #: When its last pass started (``time.monotonic``) and at which revision of its source.
    last_run: float | None = None
    #: When its last pass ended (``time.monotonic``): its backoff counts from there.
    last_end: float | None = None
    last_revision: str = ""
    #: Its rollout as its wait last read it (``wait`` set); None: not followed.
    health: AppHealth | None = None

    def to_json(self) -> dict[str, Any]:
        r = self.last_result
        return {
            "cluster": self.cluster,
            "app": self.app,
            "state": self.state,
            "revision": r.revision if r else "",
            # A repository chart's ``chart@version (sha256:…)`` (else its Chart.yaml version).
            "chart": r.chart if r else "",
            "result": ("ok" if r.ok else "failed") if r else "pending",
            "error": r.error if r else None,
            "prune_refused": r.prune_refused if r else None,
            # Typed, for machines (the chaos runner, scripts): the messages above are for people.
            "reason": r.reason.value if r and r.reason else None,
            "prune_reason": r.prune_refusal.reason.value if r and r.prune_refusal else None,
            "refused": r.refused.value if r and r.refused else None,
            "waiting_on": list(r.waiting_on) if r else [],
            "conflicts": [str(c) for c in r.conflicts] if r else [],
            # apiVersions the cluster does not serve (those objects failed), deprecated ones,
            # those the cluster's target release removes, the server's warnings.
            "api": [
                {
                    "object": str(f.key),
                    "apiVersion": f.api_version,
                    "problem": f.problem.value,
                    "message": f.message,
                    "replacement": f.replacement,
                    "file": f.file,
                }
                for f in r.api_findings
            ]
            if r
            else [],
            "applied": r.applied if r else 0,
            # Every declared field left to another manager (docs/safety.md rule 5), values left out.
            "yielded": r.yielded if r else 0,
            "yields": _yields(r) if r else [],
            # What was not applied, and why (``SkipReason``): another set, reconcile disabled, a hook.
            "skipped": _skipped(r) if r else [],
            # Drift (``drift = "report"``): each field with Git's and live's value (Secrets
            # masked), who changed it and when; ``fate`` says left (reported) or corrected.
            "drift_objects": drifted_objects(r.drift_reported) if r else 0,
            "drift": [d.to_json() for d in r.drift] if r else [],
            "pruned": r.count(Outcome.PRUNED) if r else 0,
            "failed_objects": r.failed if r else 0,
            "last_run_at": _iso(r.finished) if r else None,
            "last_success_revision": self.last_success_revision,
            "last_success_at": _iso(self.last_success_at),
            "consecutive_failures": self.failures,
            "health": self.health.to_json() if self.health else None,
            # The change window of its last pass: what held it, or what it overrode once.
            "window": _window(r.window) if r and r.window else None,
            # The sync wave its last pass applied and waits on (state ``syncing``), if any.
            "wave": r.wave_wait.to_json() if r and r.wave_wait else None,
            # The rollback pin its last pass rendered (``gitops-agent rollback``), or the one it cleared.
            "pin": r.pin.to_json() if r and r.pin else None,
            "followed_revision": (r.followed or r.revision) if r else "",
            "pin_cleared": r.pin_cleared if r and r.pin_cleared else None,
        }


@dataclass
class ClusterStatus:
    """One cluster: its schedule and Lease, and its apps (``apps``, in config order)."""

    name: str
    #: ``running`` or ``standby`` while so, else the state of its worst app.
    state: PassState = PassState.PENDING
    next_run: datetime | None = None
    holder: str = ""
    #: Scheduling decisions, newest last: (when decided, delay in seconds, why).
    schedule: deque[tuple[datetime, float, str]] = field(default_factory=lambda: deque(maxlen=50))
    apps: dict[str, AppStatus] = field(default_factory=dict)

    def app(self, name: str) -> AppStatus:
        """The status of app ``name`` (created on first use)."""
        return self.apps.setdefault(name, AppStatus(self.name, name))

    def settle_state(self) -> None:
        """The cluster's state from its apps' (after a pass)."""
        self.state = worst_state({a.state for a in self.apps.values()})

    @property
    def health(self) -> HealthState | None:
        """The least healthy of its apps' health (apps without a wait do not count); None: none waits."""
        states = [a.health.state for a in self.apps.values() if a.health is not None]
        return worst(states) if states else None

    @property
    def failures(self) -> int:
        """The most consecutive failures of any of its apps."""
        return max((a.failures for a in self.apps.values()), default=0)

    @property
    def _primary(self) -> AppStatus | None:
        """The app the cluster-wide fields describe: the cluster entry's own, else the first."""
        return self.apps.get(self.name) or next(iter(self.apps.values()), None)

    @property
    def last_result(self) -> ClusterResult | None:
        p = self._primary
        return p.last_result if p else None

    @property
    def last_success_revision(self) -> str:
        p = self._primary
        return p.last_success_revision if p else ""

    @property
    def last_success_at(self) -> datetime | None:
        p = self._primary
        return p.last_success_at if p else None

    def _cluster_fields(self) -> dict[str, Any]:
        return {
            "next_run": _iso(self.next_run),
            "holder": self.holder,
            "schedule": [(_iso(t), round(d, 3), why) for t, d, why in list(self.schedule)[-10:]],
        }

    def rows(self) -> list[dict[str, Any]]:
        """One `/status` row per app: the app's fields, the cluster's schedule and Lease holder."""
        out = []
        for a in self.apps.values() or [AppStatus(self.name, self.name)]:
            row = a.to_json()
            if self.state in (PassState.RUNNING, PassState.STANDBY) or a.state is PassState.PENDING:
                row["state"] = self.state
            row.update(self._cluster_fields())
            out.append(row)
        return out

    def to_json(self) -> dict[str, Any]:
        """The cluster as one row (its own app's fields, or its first app's) with every app's rows."""
        p = self._primary or AppStatus(self.name, self.name)
        row = p.to_json()
        row.update(self._cluster_fields())
        row["state"] = self.state
        row["consecutive_failures"] = self.failures
        row["cluster_health"] = self.health.value if self.health else None
        row["apps"] = [a.to_json() for a in self.apps.values()]
        return row
