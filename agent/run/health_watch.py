"""The fleet's waits on rollouts: step each cluster's, and record what they read.

``Fleet.health`` steps one cluster's due waits (``ClusterReconciler.step_health``) and
records each app's health in its status, its metrics, the log (a line when the state changes),
the fleet's ``observer`` (notifications) and an Event when a wait ends (``HealthFailed`` naming
the blocker, or ``HealthCurrent``). The daemon calls ``step`` from each cluster's health job;
``run --once`` calls ``wait`` and returns when every wait has ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Protocol

import structlog

from agent.config.types import Config
from agent.model import AppHealth, ClusterResult, HealthState, PassState, Revision
from agent.notify.notifier import PassObserver
from agent.reconcile.apps import Revisions
from agent.reconcile.reconciler import ClusterReconciler
from agent.report import events
from agent.run.server import Metrics
from agent.run.status import ClusterStatus

log = structlog.get_logger("gitops_agent.health")


class Fleet(Protocol):
    """What a ``HealthWatch`` reads of ``fleet.Fleet`` (which holds it)."""

    config: Config
    metrics: Metrics
    emit_events: bool
    observer: PassObserver | None

    @property
    def reconcilers(self) -> dict[str, ClusterReconciler]: ...

    @property
    def status(self) -> dict[str, ClusterStatus]: ...

    def run_apps(
        self,
        name: str,
        revision: Revision | Revisions,
        *,
        dry_run: bool = False,
        apps: Iterable[str] | None = None,
    ) -> list[ClusterResult]: ...

    def set_health(self, name: str, health: AppHealth) -> None: ...


class HealthWatch:
    """Steps the waits of a fleet's clusters and records their readings."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def step(self, name: str, now: float | None = None) -> list[AppHealth]:
        """One read of cluster ``name``'s due waits; each app's health recorded."""
        reconciler = self.fleet.reconcilers.get(name)
        if reconciler is None:
            return []
        out = reconciler.step_health(now)
        for health in out:
            self._record(name, health)
        return out

    def next_step(self, name: str) -> float | None:
        """When cluster ``name`` has a wait to read next (``time.monotonic``); None: none."""
        reconciler = self.fleet.reconcilers.get(name)
        return reconciler.next_health_step() if reconciler is not None else None

    def unblocks(self, name: str, healths: Iterable[AppHealth]) -> list[str]:
        """Apps of ``name`` waiting on a dependency that these readings found rolled out."""
        status = self.fleet.status.get(name)
        if status is None:
            return []
        ready = {h.app for h in healths if h.done and h.state is HealthState.CURRENT}
        apps = {a.name: a for a in self.fleet.config.apps_of(name)}
        return [
            n
            for n, st in status.apps.items()
            if st.state is PassState.WAITING and n in apps and ready & set(apps[n].depends_on)
        ]

    def wait(self, names: Iterable[str], stop: threading.Event) -> None:
        """Step ``names``' waits until every one has ended (or ``stop`` is set): ``run --once``."""
        names = list(names)
        while not stop.is_set():
            times = [t for n in names if (t := self.next_step(n)) is not None]
            if not times:
                return
            delay = min(times) - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            for n in names:
                self.step(n)

    def settle(
        self, revisions: Revision | Revisions, results: list[ClusterResult], stop: threading.Event
    ) -> list[ClusterResult]:
        """``run --once`` after its pass: wait for every rollout, run the apps whose dependencies
        rolled out meanwhile (and wait for theirs), until nothing more can run; the results of
        every app, each its latest pass."""
        latest = {(r.cluster, r.app): r for r in results}
        names = sorted({r.cluster for r in results})
        for _ in range(len(self.fleet.config.apps) + 1):  # each round runs at least one app more
            self.resync(revisions, latest, stop)
            self.wait(names, stop)
            ran = False
            for name in names:
                ready = self._ready(name)
                if ready and not stop.is_set():
                    for r in self.fleet.run_apps(name, revisions, apps=ready):
                        latest[(r.cluster, r.app)] = r
                    ran = True
            if not ran:
                break
        return list(latest.values())

    def resync(
        self,
        revisions: Revision | Revisions,
        latest: dict[tuple[str, str], ClusterResult],
        stop: threading.Event,
    ) -> None:
        """``run --once``: run the apps whose sync waits on a wave (state ``syncing``) again when
        their pass said to look, until none waits (each wave is bounded by ``wave_timeout``)."""
        while not stop.is_set():
            syncing = [r for r in latest.values() if r.state is PassState.SYNCING]
            if not syncing:
                return
            if stop.wait(min(r.recheck if r.recheck is not None else 1.0 for r in syncing)):
                return
            for cluster in sorted({r.cluster for r in syncing}):
                apps = [r.app for r in syncing if r.cluster == cluster]
                for r in self.fleet.run_apps(cluster, revisions, apps=apps):
                    latest[(r.cluster, r.app)] = r

    def _ready(self, name: str) -> list[str]:
        """Apps of ``name`` waiting on dependencies that have all succeeded and rolled out since."""
        st = self.fleet.status[name]
        apps = {a.name: a for a in self.fleet.config.apps_of(name)}

        def ok(dep: str) -> bool:
            d = st.apps.get(dep)
            if d is None or d.state is not PassState.OK:
                return False
            if not apps[dep].settings.wait:
                return True
            return d.health is not None and d.health.done and d.health.state is HealthState.CURRENT

        waiting = [n for n, a in st.apps.items() if a.state is PassState.WAITING and n in apps]
        return [n for n in waiting if all(ok(d) for d in apps[n].depends_on if d in apps)]

    def latest(self) -> dict[tuple[str, str], AppHealth]:
        """Every followed app's health, by (cluster, app)."""
        return {
            (name, app): st.health
            for name, status in self.fleet.status.items()
            for app, st in status.apps.items()
            if st.health is not None
        }

    def _record(self, cluster: str, health: AppHealth) -> None:
        fleet = self.fleet
        status, reconciler = fleet.status.get(cluster), fleet.reconcilers.get(cluster)
        if status is None or reconciler is None or health.app not in status.apps:
            return  # removed by a config reload meanwhile
        before = status.apps[health.app].health
        fleet.set_health(cluster, health)
        cluster_state = status.health or health.state
        fleet.metrics.app_health(cluster, health.app, health.state, cluster_state)
        # A wait's count grows; a new wait (a new pass) starts again from zero.
        grew = before is not None and before.revision == health.revision and health.reads >= before.reads
        fleet.metrics.health_reads.labels(cluster, health.app).inc(
            health.reads - before.reads if grew and before is not None else health.reads
        )
        changed = before is None or before.revision != health.revision or before.state is not health.state
        ended = health.done and (changed or not (before and before.done))
        if changed or ended:
            level = 30 if health.state is HealthState.FAILED else 20
            log.log(
                level,
                "health " + health.state.value,
                cluster=cluster,
                app=health.app,
                revision=health.revision[:12],
                done=health.done,
                current=f"{health.current}/{health.objects}",
                detail=health.health.describe(),
            )
        if ended and fleet.observer is not None:
            fleet.observer.health(cluster, health)
        if ended and fleet.emit_events:
            try:
                events.emit_health(
                    reconciler.client,
                    cluster,
                    health,
                    parent_name=reconciler.parent_of(health.app),
                    namespace=fleet.config.agent.namespace,
                    component=fleet.config.agent.name,
                )
            except Exception as e:  # events are best effort
                log.warning("health event not written", cluster=cluster, app=health.app, error=str(e))
