"""The long-running agent: apscheduler jobs, leases, health, config reload, SIGTERM.

``Daemon`` drives a ``fleet.Fleet``: one poll job per source an app uses (a
``SourceSet``), each at its own ``poll_interval`` on an executor of its own, whose
new revision triggers the clusters with an app on that source, where each app renders
its own source's latest revision (a failing source's last good one); one reconcile job per
cluster on an executor of its own (one worker: with ``max_instances=1`` a hung
cluster never holds a worker another cluster needs), triggered by a new revision and by
``sync``, and after each pass woken at its earliest app due (``due.decide``: each app's own
interval or backoff, jitter; coalescing). A pass runs the apps that are due; a ``sync``, a
config reload or a Lease acquired runs all of them. A tick job
whose silence is the only thing ``/healthz`` reports (docs/safety.md rule 7); config
reload; Leases (``agent.run.lease``) when running in a cluster; graceful SIGTERM. With
``[[notifications]]``, a ``Notifier`` the fleet tells of every pass and wait (alerts, commit
statuses: ``agent.notify``); with ``[receiver] listen``, a ``Receiver`` whose pushes poll their
sources at once (``request_poll``: one poll at a time per source, later pushes coalesced into one
more). Called by ``gitops-agent run`` (``cli``) and the tests.
"""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from agent.config.load import check_access, load_config
from agent.config.types import (
    AGENT_DEFAULTS,
    DEFAULT_SOURCE,
    HEALTH_POLL_MAX,
    SCHEDULE_JITTER,
    SCHEDULER_TICK,
    ClusterConfig,
    Config,
)
from agent.errors import ConfigError
from agent.model import PassState, Revision
from agent.notify import store as notify_store
from agent.notify.delivery import NotifyMetrics
from agent.notify.notifier import Notifier
from agent.reconcile.apps import cluster_apps
from agent.run import record_store
from agent.run.due import DueReason, Timing
from agent.run.fleet import Fleet
from agent.run.lease import LeaseManager
from agent.run.lease_settings import LeaseSettings, lease_settings, management_client
from agent.run.listener import allowed_hosts
from agent.run.receiver import Receiver
from agent.run.server import HealthServer, main_limits
from agent.run.statuspage import ClusterSnapshot, Snapshot, StatusPage, ui_token
from agent.run.synclimit import ForcedSyncs
from agent.source.sources import SourceSet
from agent.ui.auth import access

__all__ = ["Daemon", "DaemonOptions"]

log = structlog.get_logger("gitops_agent.scheduler")


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


@dataclass(frozen=True)
class DaemonOptions:
    """Timing of the daemon; ``from_config`` reads the ``[agent]`` keys when they exist."""

    #: Seconds between scheduler ticks; ``/healthz`` fails after ``stuck_after`` without one.
    tick: float = SCHEDULER_TICK
    stuck_after: float = AGENT_DEFAULTS.stuck_after
    #: Seconds SIGTERM waits for running passes before abandoning them.
    grace: float = AGENT_DEFAULTS.shutdown_grace
    backoff_base: float = AGENT_DEFAULTS.backoff_base
    backoff_cap: float = AGENT_DEFAULTS.backoff_cap
    #: Fraction of the interval (and of a backoff delay) added at random.
    jitter: float = SCHEDULE_JITTER
    #: Seconds between checks of the config file for changes (0: never reload).
    reload_interval: float = AGENT_DEFAULTS.reload_interval
    #: None: decided from the config (``lease_settings.lease_settings``).
    leases: LeaseSettings | None = None

    @classmethod
    def from_config(cls, config: Config) -> DaemonOptions:
        a = config.agent
        return cls(
            stuck_after=a.stuck_after,
            grace=a.shutdown_grace,
            backoff_base=a.backoff_base,
            backoff_cap=a.backoff_cap,
            reload_interval=a.reload_interval,
        )


class Daemon:
    """The long-running agent: poll Git, reconcile each cluster on its own schedule."""

    def __init__(
        self,
        config: Config,
        sources: SourceSet,
        fleet: Fleet,
        options: DaemonOptions | None = None,
        *,
        source_factory: Callable[[Config], SourceSet] = SourceSet.from_config,
    ) -> None:
        self.config = config
        self.sources = sources
        self.fleet = fleet
        self.opts = options or DaemonOptions.from_config(config)
        self._timing = Timing(self.opts.backoff_base, self.opts.backoff_cap, self.opts.jitter)
        #: Builds the sources of a reloaded config whose sources changed.
        self.source_factory = source_factory
        self.metrics = fleet.metrics
        #: Source name → the last revision it delivered (kept while its polls fail).
        self.revisions: dict[str, Revision] = {}
        #: Source name → why its last poll failed.
        self.source_errors: dict[str, str] = {}
        self.last_tick = time.monotonic()
        self.source_attempted = False
        self._polled: set[str] = set()
        self._source_lock = threading.Lock()
        self.config_error: str | None = None
        self.stopping = False
        self._shut = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._in_job: set[str] = set()
        self._queued: dict[str, tuple[datetime, str]] = {}
        #: Cluster → its apps whose dependency rolled out: due at its next pass.
        self._woken: dict[str, set[str]] = {}
        #: Clusters whose next pass runs every app, not only the due ones (sync, reload, Lease).
        self._forced: set[str] = set()
        self._syncs = ForcedSyncs()
        self._config_stamp = self._stamp()
        settings = self.opts.leases or lease_settings(config)
        self.leases: LeaseManager | None = None
        if settings.enabled:
            self.leases = LeaseManager(
                management_client(settings),
                settings,
                agent=config.agent.name,
                clusters=fleet.names(),
                on_change=self._lease_changed,
                busy=fleet.busy,
            )
        fleet.fence = self._fence
        #: Sources a push asked to poll, the push pollers running, one poll lock per source.
        self._dirty: set[str] = set()
        self._pushers: set[str] = set()
        self._poll_locks: dict[str, threading.Lock] = {}
        self.notifier: Notifier | None = None
        if config.notifications:
            self.notifier = Notifier(
                config,
                store=self._notify_store(settings),
                metrics=NotifyMetrics(self.metrics.registry),
                fence=self._fence,
                clusters=fleet.names,
                instance=settings.identity or socket.gethostname(),
                config_of=lambda: self.config,
            )
            fleet.observer = self.notifier
        self.receiver: Receiver | None = None
        if config.receiver.listen:
            self.receiver = Receiver(
                config,
                on_push=self.request_poll,
                registry=self.metrics.registry,
                sources=lambda: {n: self.sources.source(n).config for n in self.sources.names},
            )
        self.scheduler = BackgroundScheduler(
            executors={n: ThreadPoolExecutor(max_workers=1) for n in ("default", "loop", "reload")},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone="UTC",
        )
        self.scheduler.add_listener(self._job_done, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
        self.health: HealthServer | None = None
        self.page: StatusPage | None = None
        if config.agent.listen:
            token = ui_token(config.agent)
            self.page = self._status_page(config, settings, token)
            self.health = HealthServer(
                config.agent.listen,
                metrics=self.metrics,
                last_tick=self._last_tick,
                ready=self._not_ready,
                status=self.status_json,
                sync=self.sync,
                stuck_after=self.opts.stuck_after,
                page=self.page,
                token=token,
                limits=main_limits(config.agent),
                allowed=allowed_hosts(config.agent.public_url, config.agent.allowed_hosts),
            )

    def _status_page(self, config: Config, settings: LeaseSettings, token: str) -> StatusPage:
        """The status page and where its records live: the management cluster with Leases (every
        replica reads them), else ``<cache_dir>/status/`` (docs/status-page.md)."""
        a = config.agent
        store: record_store.RecordStore
        if settings.enabled:
            store = record_store.ConfigMapStore(
                management_client(settings), namespace=settings.namespace, agent=a.name
            )
        else:
            store = record_store.FileStore(Path(a.cache_dir).expanduser() / "status")
        page = StatusPage(
            self._page_snapshot, store, access=access(a.listen, token), token=token, shared=settings.enabled
        )
        page.load()
        return page

    def _page_snapshot(self) -> Snapshot:
        """What the status page shows now: every cluster with its apps, who holds it, each app's
        source head."""
        with self._source_lock:
            heads = {n: r.sha for n, r in self.revisions.items()}
            errors = dict(self.source_errors)
        clusters = []
        for name, st in self.fleet.status.items():
            held = self.leases is None or self.leases.holds(name)
            holder = self.leases.holder(name) if self.leases else ""
            sources = self._sources_of(name)
            app_heads = {app: heads[src] for app, src in sources.items() if src in heads}
            clusters.append(ClusterSnapshot(name, st, held=held, holder=holder, heads=app_heads))
        return Snapshot(
            agent=self.config.agent.name,
            clusters=tuple(clusters),
            replica=self.leases.s.identity if self.leases else "",
            sources=tuple((n, heads.get(n, ""), errors.get(n, "")) for n in self.sources.names),
        )

    def _may_write(self, cluster: str) -> bool:
        """Whether this replica records ``cluster``: the holder of its Lease, or the only agent."""
        return self.leases is None or self.leases.holds(cluster)

    def _notify_store(self, settings: LeaseSettings) -> notify_store.StateStore:
        """Beside the Leases in the management cluster; without one, under the cache directory."""
        if self.leases is not None:
            return notify_store.ConfigMapStore(
                self.leases.client, namespace=settings.namespace, agent=self.config.agent.name
            )
        root = Path(os.path.expanduser(self.config.agent.cache_dir))
        return notify_store.FileStore(root / "notify" / self.config.agent.name)

    # -- what the endpoints ask ---------------------------------------------------

    def _last_tick(self) -> float:
        return min(self.last_tick, self.leases.heartbeat) if self.leases else self.last_tick

    def _not_ready(self) -> str | None:
        if self.stopping:
            return "shutting down"
        return None if self.source_attempted else "first poll of every source pending"

    def _fence(self, name: str) -> str | None:
        if self._shut:
            return self._shut
        return self.leases.may_write(name) if self.leases else None

    def _sources_of(self, cluster: str) -> dict[str, str]:
        """App → its source, for the apps of ``cluster`` (none for a cluster not in the config)."""
        entry = next((c for c in self.config.clusters if c.name == cluster), None)
        return {a.name: a.source for a in cluster_apps(self.config, entry)} if entry else {}

    def _shas(self, names: Iterable[str]) -> dict[str, str | None]:
        """Source → the sha of its latest revision (None: none yet), for ``names``."""
        with self._source_lock:
            return {n: (r.sha if (r := self.revisions.get(n)) else None) for n in names}

    def _sources_json(self) -> list[dict[str, Any]]:
        out = []
        for name in self.sources.names:
            src, rev = self.sources.source(name), self.revisions.get(name)
            out.append(
                {
                    "name": name,
                    "url": src.masked_url,
                    "ref": src.config.ref,
                    "revision": rev.sha if rev else None,
                    "error": self.source_errors.get(name),
                }
            )
        return out

    def status_json(self) -> dict[str, Any]:
        """``GET /status``. Its top-level ``revision`` is the default source's (each app's own
        is in its row, each source's in ``sources``)."""
        clusters = []
        for name, st in self.fleet.status.items():
            for d in st.rows():  # one row per (cluster, app)
                if self.leases:
                    d["lease_held"] = self.leases.holds(name)
                    d["holder"] = self.leases.holder(name)
                clusters.append(d)
        return {
            "agent": self.config.agent.name,
            "replica": self.leases.s.identity if self.leases else None,
            "revision": self._shas([DEFAULT_SOURCE])[DEFAULT_SOURCE],
            "source_error": "; ".join(self.source_errors.values()) or None,
            "sources": self._sources_json(),
            "config_error": self.config_error,
            "stopping": self.stopping,
            "leases": self.leases.to_json() if self.leases else None,
            "notifications": self.notifier.to_json() if self.notifier else None,
            "receiver": self.receiver.to_json() if self.receiver else None,
            "clusters": clusters,
        }

    def sync(self, name: str, app: str | None = None) -> tuple[int, dict[str, Any]]:
        """``POST /sync?cluster=NAME[&app=APP]``: a pass of every app of the cluster now (or right
        after the running one); ``app`` is checked, and runs in that pass like the others."""
        if name not in self.fleet.status:
            return 404, {"error": f"no cluster named {name!r}"}
        apps = self.fleet.status[name].apps
        if app is not None and app not in apps:
            return 404, {"error": f"cluster {name!r} has no app named {app!r} (its apps: {', '.join(apps)})"}
        if self.stopping:
            return 503, {"error": "agent shutting down"}
        if self.leases and not self.leases.holds(name):
            holder = self.leases.holder(name) or "none"
            return 409, {"error": f"this replica does not hold {name!r}; holder: {holder}", "holder": holder}
        with self._lock:  # one pending forced pass per cluster; at most one per app per interval
            pending = name in self._forced
            wait = None if pending else self._syncs.take(name, app or "", self.config.agent.sync_interval)
            if not pending and wait is None:
                self._forced.add(name)
        if wait is not None:
            why = f"a pass of {name} was forced less than [agent] sync_interval ago"
            return 429, {"error": why, "retry_after": math.ceil(wait)}
        st = self.fleet.status[name]
        now = datetime.now(UTC)
        when = (st.next_run or now) if pending else self._schedule(name, now, "sync requested")
        return 202, {
            "cluster": name,
            "coalesced": pending,
            "next_run": _iso(when),
            "revision": self._shas([DEFAULT_SOURCE])[DEFAULT_SOURCE],
            "revisions": self._shas(sorted(set(self._sources_of(name).values()))),
        }

    # -- jobs ---------------------------------------------------------------------

    def start(self) -> None:
        if self.health is not None:
            self.health.start()
        if self.leases is not None:
            self.leases.start()
        if self.notifier is not None:
            self.notifier.start()
        if self.receiver is not None:
            self.receiver.start()
        for name in self.sources.names:
            self._add_source_job(name)
        self.scheduler.add_job(self._tick, "interval", seconds=self.opts.tick, id="tick", executor="loop")
        if self.opts.reload_interval > 0 and self.config.file:
            self.scheduler.add_job(
                self.check_reload,
                "interval",
                seconds=self.opts.reload_interval,
                id="reload",
                executor="reload",
            )
        for c in self.config.clusters:
            self._add_cluster_job(c)
        self.scheduler.start()

    def _add_health_job(self, name: str) -> None:
        """The cluster's waits on rollouts, on an executor of their own: a long wait never holds
        the cluster's pass, nor a pass the wait. Paused while nothing waits."""
        alias = f"health:{name}"
        self.scheduler.add_executor(ThreadPoolExecutor(max_workers=1), alias=alias)
        self.scheduler.add_job(
            self.follow_health,
            "interval",
            seconds=HEALTH_POLL_MAX,
            id=alias,
            args=[name],
            executor=alias,
            next_run_time=None,
        )

    def follow_health(self, name: str) -> None:
        """Read the cluster's due waits; run the apps a dependency's rollout unblocked."""
        if self.stopping:
            return
        healths = self.fleet.health.step(name)
        if self.page is not None and healths:
            self.page.record_healths(name, healths, may_write=self._may_write(name))
        unblocked = self.fleet.health.unblocks(name, healths)
        if unblocked:
            with self._lock:
                self._woken.setdefault(name, set()).update(unblocked)
            why = f"dependency rolled out (waiting: {', '.join(unblocked)})"
            self._schedule(name, datetime.now(UTC), why)
        self._wake_health(name)

    def _wake_health(self, name: str) -> None:
        """Time the cluster's health job for its soonest wait; pause it when nothing waits."""
        job = self.scheduler.get_job(f"health:{name}")
        if job is None:
            return
        nxt = self.fleet.health.next_step(name)
        if nxt is None:
            job.pause()
            return
        job.modify(next_run_time=datetime.now(UTC) + timedelta(seconds=max(0.0, nxt - time.monotonic())))

    def _add_cluster_job(self, c: ClusterConfig) -> None:
        self._add_health_job(c.name)
        alias = f"cluster:{c.name}"
        self.scheduler.add_executor(ThreadPoolExecutor(max_workers=1), alias=alias)
        interval = self._interval(c)
        self.scheduler.add_job(
            self.reconcile,
            "interval",
            seconds=interval,
            jitter=interval * self.opts.jitter,
            id=alias,
            args=[c.name],
            executor=alias,
            next_run_time=None,  # paused until the first revision
        )

    def _add_source_job(self, name: str) -> None:
        """Poll ``name`` now, then every ``poll_interval``: each source alone, like each cluster."""
        alias = f"source:{name}"
        self.scheduler.add_executor(ThreadPoolExecutor(max_workers=1), alias=alias)
        self.scheduler.add_job(
            self.poll,
            "interval",
            seconds=self.sources.source(name).config.poll_interval,
            id=alias,
            args=[name],
            executor=alias,
            next_run_time=datetime.now(UTC),
        )

    def _interval(self, c: ClusterConfig) -> float:
        """The job's own interval, its apps' shortest: a floor under the wakes its passes set."""
        return min((a.settings.reconcile_interval for a in self.config.apps_of(c.name)), default=None) or (
            c.settings.reconcile_interval
        )

    def _remove_cluster_job(self, name: str) -> None:
        self._remove_job(f"cluster:{name}")
        self._remove_job(f"health:{name}")

    def _remove_job(self, alias: str) -> None:
        if self.scheduler.get_job(alias) is not None:
            self.scheduler.remove_job(alias)
        try:
            executor = self.scheduler._lookup_executor(alias)
        except KeyError:
            return
        self.scheduler.remove_executor(alias, shutdown=False)
        executor.shutdown(wait=False)  # a pass still running finishes (fenced) on its own thread

    def _tick(self) -> None:
        self.last_tick = time.monotonic()
        self.metrics.tick.set(time.time())

    def request_poll(self, names: Iterable[str], why: str) -> None:
        """Poll ``names`` now, each on a thread of its own (the receiver's pushes): while a poll of
        a source runs, any number of further requests add up to one more poll after it."""
        for name in names:
            with self._lock:
                if self.stopping:
                    return
                self._dirty.add(name)
                if name in self._pushers:
                    continue
                self._pushers.add(name)
            log.info("poll requested", source=name, why=why)
            threading.Thread(target=self._push_loop, args=(name,), name=f"push-{name}", daemon=True).start()

    def _push_loop(self, name: str) -> None:
        while True:
            with self._lock:
                if name not in self._dirty or self.stopping:
                    self._pushers.discard(name)
                    return
                self._dirty.discard(name)
            try:
                if name in self.sources.names:
                    self.poll(name)
            except Exception as e:  # a bad poll must not end the pushes of this source
                log.exception("requested poll crashed", source=name, error=str(e))

    def poll(self, name: str | None = None) -> None:
        """Poll one source (every source when ``name`` is None); a new revision triggers the
        clusters with an app on that source. A failed source keeps its last revision. One poll
        of a source at a time: its job's and the ones pushes request wait for each other."""
        if name is None:
            self._poll(None)
            return
        with self._lock:
            lock = self._poll_locks.setdefault(name, threading.Lock())
        with lock:
            self._poll(name)

    def _poll(self, name: str | None) -> None:
        sources = self.sources
        t0 = time.monotonic()
        result = sources.poll(None if name is None else [name])
        elapsed = time.monotonic() - t0
        moved: set[str] = set()
        with self._source_lock:
            if sources is not self.sources:
                return  # a reload replaced the sources meanwhile; the new set's jobs poll them now
            for o in result.outcomes:
                self._polled.add(o.name)
                self.metrics.fetch_duration.labels(o.name).observe(elapsed)
                if o.revision is None:
                    self.metrics.fetch_failures.labels(o.name).inc()
                    self.source_errors[o.name] = str(o)
                    log.error(
                        "source poll failed; last good revision stays in force",
                        source=o.name,
                        error=str(o.error),
                    )
                    continue
                self.metrics.fetch_success.labels(o.name).set(time.time())
                self.source_errors.pop(o.name, None)
                previous = self.revisions.get(o.name)
                if previous is None or previous.sha != o.revision.sha:
                    self.revisions[o.name] = o.revision
                    moved.add(o.name)
                    log.info(
                        "new revision", source=o.name, revision=o.revision.short, subject=o.revision.subject
                    )
            self.source_attempted = self.source_attempted or set(sources.names) <= self._polled
        for cluster in self.fleet.names():
            hit = sorted(set(self._sources_of(cluster).values()) & moved)
            if hit:
                revs = ", ".join(f"{n} {self.revisions[n].short}" for n in hit)
                self._schedule(cluster, datetime.now(UTC), f"new revision {revs}")

    def reconcile(self, name: str) -> None:
        """One scheduled pass of ``name``: its apps that are due (every app after a ``sync``, a
        reload, a Lease acquired), each rendering its own source's latest revision (a failing
        source's last good one); then the job wakes at the earliest app due. An app whose source
        was never polled waits for that first poll, which triggers the cluster."""
        if self.stopping or name not in self.fleet.status:
            return
        with self._source_lock:
            revisions = dict(self.revisions)
            heard = self._polled | revisions.keys()
        if not set(self._sources_of(name).values()) & revisions.keys():
            return
        st = self.fleet.status[name]
        if self.leases is not None and not self.leases.holds(name):
            st.state, st.holder = PassState.STANDBY, self.leases.holder(name)
            self.metrics.lease_held.labels(name).set(0)
            return
        with self._lock:
            self._in_job.add(name)
            forced = name in self._forced
            self._forced.discard(name)
            woken = self._woken.pop(name, set())
        decision = self.fleet.schedule(name, revisions, self._timing, woken=woken, sources=heard)
        due = [a.app for a in decision.apps] if forced else list(decision.due)
        if due:
            results = self.fleet.run_apps(name, revisions, apps=due)
            if self.page is not None:
                subjects = {r.sha: r.subject for r in revisions.values()}
                self.page.record_passes(results, subjects, may_write=self._may_write)
            if self.stopping:
                return
            self._wake_health(name)
            if failed := [r for r in results if not r.ok]:
                log.warning(
                    "apps failed; each backs off on its own",
                    cluster=name,
                    apps=[r.app for r in failed],
                    error=failed[0].error,
                )
        self._next_pass(name, heard)

    def _next_pass(self, name: str, heard: set[str]) -> None:
        """Wake ``name``'s job at its earliest app due (plus jitter): each app on its own interval
        and backoff. A revision that arrived during the pass makes its apps due now."""
        with self._source_lock:
            revisions = dict(self.revisions)
        wake = self.fleet.schedule(name, revisions, self._timing, sources=heard).wake
        if wake is None:
            return
        delay = max(0.0, wake.at - time.monotonic()) + random.uniform(0, wake.spread)
        if wake.reason is DueReason.BACKOFF:
            log.warning("app backing off", cluster=name, app=wake.app, retry_in=round(delay, 2))
        why = wake.message(name_app=len(self.fleet.status[name].apps) > 1)
        self._schedule(name, datetime.now(UTC) + timedelta(seconds=delay), why)

    def _schedule(self, name: str, when: datetime, why: str) -> datetime:
        """Run ``name`` at ``when``; while its job runs, the request waits for the job's end."""
        with self._lock:
            if name in self._in_job:
                prev = self._queued.get(name)
                if prev is None or when < prev[0]:
                    self._queued[name] = (when, why)
                return when
        return self._modify(name, when, why)

    def _modify(self, name: str, when: datetime, why: str) -> datetime:
        job = self.scheduler.get_job(f"cluster:{name}")
        st = self.fleet.status.get(name)
        if job is None or st is None:
            return when
        job.modify(next_run_time=when)
        st.next_run = when
        st.schedule.append((datetime.now(UTC), (when - datetime.now(UTC)).total_seconds(), why))
        self.metrics.next_run_at(name, when.timestamp())
        return when

    def _job_done(self, event: JobExecutionEvent) -> None:
        """After a cluster's job returned (apscheduler counts it finished): apply what waited."""
        if not event.job_id.startswith("cluster:"):
            return
        name = event.job_id.removeprefix("cluster:")
        with self._lock:
            self._in_job.discard(name)
            queued = self._queued.pop(name, None)
        st = self.fleet.status.get(name)
        if queued is not None and not self.stopping:
            self._modify(name, *queued)
        elif st is not None and (job := self.scheduler.get_job(event.job_id)) is not None:
            st.next_run = job.next_run_time  # no pass ran: the job's own interval stands

    def _lease_changed(self, name: str, held: bool) -> None:
        self.metrics.lease_held.labels(name).set(1 if held else 0)
        if held and self.notifier is not None:
            self.notifier.lease_acquired(name)
        st = self.fleet.status.get(name)
        if st is not None:
            st.holder = self.leases.holder(name) if self.leases else ""
            st.state = st.state if held else PassState.STANDBY
        if held and self.page is not None:
            self.page.forget(name)  # another replica may have recorded it meanwhile
        if held and self.revisions and not self.stopping:
            with self._lock:
                self._forced.add(name)
            self._schedule(name, datetime.now(UTC), "lease acquired")

    # -- config reload ------------------------------------------------------------

    def _stamp(self) -> tuple[int, int] | None:
        try:
            s = os.stat(self.config.file)
        except OSError:
            return None
        return s.st_mtime_ns, s.st_size

    def check_reload(self) -> None:
        stamp = self._stamp()
        if stamp is None or stamp == self._config_stamp:
            return
        self._config_stamp = stamp
        try:
            new = load_config(self.config.file)
            # A cluster whose kubeconfig is gone is refused now, not at its next pass; [agent]
            # (the management cluster) changes only with a restart.
            check_access(new, management=False)
        except ConfigError as e:
            self.config_error = str(e)
            self.metrics.reloads.labels("error").inc()
            log.error("config reload failed; the running config stays in force", error=str(e))
            return
        self.apply_config(new)

    def apply_config(self, new: Config) -> None:
        """Clusters added, removed or changed take effect now; removal never deletes anything there."""
        old = self.config
        if new.agent != old.agent:
            log.warning("[agent] settings changed; they take effect after a restart")
            new = replace(new, agent=old.agent)
        kept = ("notifications", "alerts", "receiver", "receivers")
        if any(getattr(new, k) != getattr(old, k) for k in kept):
            log.warning(
                "[[notifications]], [alerts], [receiver] and [[receivers]] take effect after a restart"
            )
            new = replace(new, **{k: getattr(old, k) for k in kept})
        sources_changed = SourceSet.wanted(new) != SourceSet.wanted(old)
        added, removed, changed = self.fleet.update(new)
        self.config = new
        if sources_changed:
            # After the config: a new source's first poll triggers the clusters of its apps.
            self._replace_sources(self.source_factory(new))
        for name in removed:
            self._remove_cluster_job(name)
        for c in new.clusters:
            if c.name in added:
                self._add_cluster_job(c)
            elif c.name in changed:
                interval = self._interval(c)
                self.scheduler.reschedule_job(
                    f"cluster:{c.name}",
                    trigger="interval",
                    seconds=interval,
                    jitter=interval * self.opts.jitter,
                )
        if self.leases is not None:
            self.leases.set_clusters(self.fleet.names())
        if self.revisions:
            # Refused entries too: removing or re-pointing the entry they collided with lifts the
            # refusal, and they should not wait out their backoff to find out.
            refused = [n for n, st in self.fleet.status.items() if st.state is PassState.REFUSED]
            for name in dict.fromkeys(added + changed + refused):
                with self._lock:
                    self._forced.add(name)
                self._schedule(name, datetime.now(UTC), "config reloaded")
        self.config_error = None
        self.metrics.reloads.labels("ok").inc()
        log.info("config reloaded", added=added, removed=removed, changed=changed)

    def _replace_sources(self, fresh: SourceSet) -> None:
        """Poll ``fresh`` from now on. A source whose settings changed keeps its last revision
        in force until the new settings deliver one (as after a failed poll); a source no app
        uses any more is forgotten."""
        for name in self.sources.names:
            self._remove_job(f"source:{name}")
        with self._source_lock:
            gone = set(self.sources.names) - set(fresh.names)
            old, self.sources = self.sources, fresh
            old.close()  # its Git workers: a poll of the old set still running fails, unread
            for name in gone:
                self.revisions.pop(name, None)
                self.metrics.remove_source(name)
            self.source_errors.clear()  # about the old settings; the first polls tell anew
        for name in fresh.names:
            self._add_source_job(name)
        log.info("sources changed", sources=list(fresh.names))

    # -- shutdown -------------------------------------------------------------------

    def stop(self, grace: float | None = None) -> None:
        """Stop scheduling; let running passes finish within ``grace``; then fence, release, close."""
        grace = self.opts.grace if grace is None else grace
        self.stopping = True
        log.info("shutting down: no new passes; waiting for running ones", grace=grace)
        self.scheduler.shutdown(wait=False)
        deadline = time.monotonic() + grace
        while self.fleet.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self.fleet.running()
        if left:
            # Safe: the inventory is widened before applying and narrowed only after pruning,
            # so a pass cut short leaves every applied object tracked (docs/safety.md rule 10).
            log.warning("abandoning passes still running after the grace period", clusters=left)
        if self.receiver is not None:
            self.receiver.stop()
        if self.notifier is not None:  # what the passes told it: decided and sent, within the grace
            self.notifier.stop(flush=max(0.0, min(5.0, deadline - time.monotonic())))
        self._shut = "agent shut down"
        self.fleet.abandon_all(self._shut)
        if self.leases is not None:
            self.leases.stop(release=True)
        if self.health is not None:
            self.health.stop()
        self.fleet.close()
        self.sources.close()
        self._stop.set()

    def run_forever(self, *, grace: float | None = None) -> None:
        self.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self._stop.wait()
        self.stop(grace)
