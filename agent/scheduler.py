"""Run reconciles for the fleet: once (CLI) or forever (daemon, apscheduler).

``Fleet`` owns one ``ClusterReconciler`` per cluster and runs a pass for each
on its own thread, so a cluster that hangs holds only its own thread and is
reported as timed out at the pass deadline (invariant 6). ``Daemon`` adds
apscheduler: one source-poll job, one reconcile job per cluster
(``max_instances=1``, coalescing, jitter), triggered by a new revision and by
the drift interval, with per-cluster exponential backoff after failures.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from agent.config import Config
from agent.errors import SourceError
from agent.health import HealthServer, Metrics
from agent.model import ClusterResult, Revision
from agent.reconcile import ClusterReconciler

log = structlog.get_logger("gitops_agent.scheduler")

BACKOFF_BASE = 10.0
BACKOFF_CAP = 600.0


@dataclass
class ClusterStatus:
    """What `/status` and `gitops-agent status` show for one cluster."""

    name: str
    last_result: ClusterResult | None = None
    last_success_revision: str = ""
    last_success_at: datetime | None = None
    failures: int = 0
    next_run: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        r = self.last_result
        return {
            "cluster": self.name,
            "revision": r.revision if r else "",
            "result": ("ok" if r.ok else "failed") if r else "pending",
            "error": r.error if r else None,
            "prune_refused": r.prune_refused if r else None,
            "applied": r.applied if r else 0,
            "failed_objects": r.failed if r else 0,
            "last_success_revision": self.last_success_revision,
            "last_success_at": self.last_success_at.isoformat() if self.last_success_at else None,
            "consecutive_failures": self.failures,
            "next_run": self.next_run.isoformat() if self.next_run else None,
        }


def backoff_delay(failures: int, *, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """Exponential backoff after ``failures`` consecutive failures (0 → no delay)."""
    return 0.0 if failures <= 0 else min(cap, base * 2 ** (failures - 1))


class Fleet:
    """One reconciler per cluster; each pass on its own thread with its own deadline."""

    def __init__(
        self, config: Config, *, reconciler_factory: Callable[..., ClusterReconciler] = ClusterReconciler
    ) -> None:
        self.config = config
        self.reconcilers = {c.name: reconciler_factory(config, c) for c in config.clusters}
        self.status = {c.name: ClusterStatus(c.name) for c in config.clusters}
        self.metrics = Metrics()
        self._lock = threading.Lock()

    def reconcile_one(self, name: str, revision: Revision, *, dry_run: bool = False) -> ClusterResult:
        try:
            result = self.reconcilers[name].reconcile(revision, dry_run=dry_run)
        except Exception as e:  # a bug in one cluster's pass must not take down the fleet
            log.exception("reconcile crashed", cluster=name)
            result = ClusterResult(name, revision.sha, error=f"internal error: {type(e).__name__}: {e}")
        self.record(result)
        return result

    def record(self, result: ClusterResult) -> None:
        with self._lock:
            st = self.status[result.cluster]
            st.last_result = result
            if result.ok:
                st.failures = 0
                st.last_success_revision = result.revision
                st.last_success_at = result.finished or datetime.now(UTC)
            else:
                st.failures += 1
        self.metrics.record(result)

    def reconcile_all(
        self, revision: Revision, *, dry_run: bool = False, only: Iterable[str] | None = None
    ) -> list[ClusterResult]:
        """Every cluster at once; a cluster still running at its pass deadline is reported as timed out."""
        names = [n for n in self.reconcilers if only is None or n in set(only)]
        results: dict[str, ClusterResult] = {}
        threads: dict[str, threading.Thread] = {}
        for name in names:

            def work(n: str = name) -> None:
                results[n] = self.reconcile_one(n, revision, dry_run=dry_run)

            # Daemon threads: a cluster that hangs past its deadline must not keep the process alive.
            t = threading.Thread(target=work, name=f"reconcile-{name}", daemon=True)
            threads[name] = t
            t.start()
        start = time.monotonic()
        for name, t in threads.items():
            deadline = self.config.cluster(name).settings.pass_deadline
            t.join(max(0.0, deadline - (time.monotonic() - start)))
        out: list[ClusterResult] = []
        for name in names:
            if name in results:
                out.append(results[name])
            else:
                deadline = self.config.cluster(name).settings.pass_deadline
                timed_out = ClusterResult(
                    name, revision.sha, error=f"timed out: pass did not finish within {deadline:g}s"
                )
                self.record(timed_out)
                out.append(timed_out)
        return out

    def close(self) -> None:
        for r in self.reconcilers.values():
            r.close()


class Daemon:
    """The long-running agent: poll Git, reconcile each cluster on its own schedule."""

    def __init__(self, config: Config, source: Any, fleet: Fleet) -> None:
        self.config = config
        self.source = source
        self.fleet = fleet
        self.revision: Revision | None = None
        self.last_tick = time.monotonic()
        self.source_attempted = False
        self.source_error: str | None = None
        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=len(config.clusters) + 2)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone="UTC",
        )
        self._stop = threading.Event()
        self.health: HealthServer | None = None
        if config.agent.listen:
            self.health = HealthServer(
                config.agent.listen,
                metrics=fleet.metrics,
                last_tick=lambda: self.last_tick,
                ready=lambda: self.source_attempted,
                status=self.status_json,
            )

    def status_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision.sha if self.revision else None,
            "source_error": self.source_error,
            "clusters": [st.to_json() for st in self.fleet.status.values()],
        }

    def start(self) -> None:
        if self.health is not None:
            self.health.start()
        now = datetime.now(UTC)
        self.scheduler.add_job(
            self.poll, "interval", seconds=self.config.source.poll_interval, id="source", next_run_time=now
        )
        self.scheduler.add_job(self._tick, "interval", seconds=1, id="tick")
        for c in self.config.clusters:
            interval = c.settings.reconcile_interval
            self.scheduler.add_job(
                self.reconcile,
                "interval",
                seconds=interval,
                jitter=max(1, int(interval * 0.1)),
                id=f"cluster:{c.name}",
                args=[c.name],
                next_run_time=None,
            )
        self.scheduler.start()

    def _tick(self) -> None:
        self.last_tick = time.monotonic()

    def poll(self) -> None:
        t0 = time.monotonic()
        try:
            rev = self.source.poll()
            self.source_error = None
        except SourceError as e:
            self.fleet.metrics.fetch_failures.inc()
            self.source_error = str(e)
            log.error("source poll failed; last good revision stays in force", error=str(e))
            return
        finally:
            self.source_attempted = True
            self.fleet.metrics.fetch_duration.observe(time.monotonic() - t0)
        if self.revision is None or rev.sha != self.revision.sha:
            log.info("new revision", revision=rev.short, subject=rev.subject)
            self.revision = rev
            for c in self.config.clusters:
                self._schedule(c.name, datetime.now(UTC))

    def reconcile(self, name: str) -> None:
        if self.revision is None:
            return
        result = self.fleet.reconcile_one(name, self.revision)
        st = self.fleet.status[name]
        if not result.ok:
            delay = backoff_delay(st.failures)
            log.warning("cluster failed; backing off", cluster=name, error=result.error, retry_in=delay)
            self._schedule(name, datetime.now(UTC) + timedelta(seconds=delay))

    def _schedule(self, name: str, when: datetime) -> None:
        job = self.scheduler.get_job(f"cluster:{name}")
        if job is not None:
            job.modify(next_run_time=when)
            self.fleet.status[name].next_run = when

    def run_forever(self, *, grace: float = 30.0) -> None:
        self.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self._stop.wait()
        log.info("shutting down: no new passes; waiting for running ones", grace=grace)
        self.scheduler.shutdown(wait=False)
        if self.health is not None:
            self.health.stop()
        deadline = time.monotonic() + grace
        for t in threading.enumerate():
            if t.name.startswith("ThreadPoolExecutor") and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        self.fleet.close()
