"""The long-running agent: apscheduler jobs, leases, health, config reload, SIGTERM.

``Daemon`` acts; the decisions are pure and live elsewhere. It builds its ``fleet.Fleet``
(handing it the write gate and the notifier) and runs: one poll job per source an app uses
(``polling.SourcePoller`` over a ``SourceSet``), each at its own ``poll_interval`` on an
executor of its own, whose new revision triggers the clusters with an app on that source
(``due.triggered``), where each app renders its own source's latest revision (a failing
source's last good one); one reconcile job per cluster on an executor of its own (one worker:
with ``max_instances=1`` a hung cluster never holds a worker another cluster needs), triggered
by a new revision and by ``sync``, and after each pass woken at its earliest app due
(``due.decide``: each app's own interval or backoff, jitter; ``due.wake_delay``). A pass runs
the apps that are due; a ``sync``, a config reload or a Lease acquired runs all of them
(``due.pass_apps``). Wakes asked for while a pass runs wait for its end (``coalesce.JobState``).
A tick job whose silence is the only thing ``/healthz`` reports (docs/safety.md rule 7); config
reload (``reload``); Leases (``agent.run.lease``) when running in a cluster; graceful SIGTERM.
With ``[[notifications]]``, a ``Notifier`` the fleet tells of every pass and wait (alerts,
commit statuses: ``agent.notify``); with ``[receiver] listen``, a ``Receiver`` whose pushes
poll their sources at once (``SourcePoller.request``). ``/status`` and the status page read it
through ``snapshot``. Called by ``gitops-agent run`` (``cli``) and the tests.
"""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from apscheduler.events import JobExecutionEvent

from agent.config.types import (
    DEFAULT_SOURCE,
    HEALTH_POLL_MAX,
    ClusterConfig,
    Config,
)
from agent.errors import ConfigError
from agent.model import PassState, Revision
from agent.notify import store as notify_store
from agent.notify.delivery import NotifyMetrics
from agent.notify.notifier import Notifier
from agent.reconcile.apps import cluster_apps
from agent.reconcile.charts import ChartPolls
from agent.run import snapshot
from agent.run.coalesce import JobState, Request
from agent.run.daemon_options import DaemonOptions
from agent.run.due import DueReason, Timing, job_interval, pass_apps, triggered, wake_delay
from agent.run.fleet import Fleet
from agent.run.jobs import Jobs
from agent.run.lease import LeaseManager
from agent.run.lease_settings import LeaseSettings, lease_settings, management_client
from agent.run.listener import allowed_hosts
from agent.run.polling import SourcePoller
from agent.run.receiver import Receiver
from agent.run.reload import ConfigFile, carry_over
from agent.run.server import HealthServer, Metrics, main_limits
from agent.run.status import ClusterStatus
from agent.run.statuspage import Snapshot, StatusPage, ui_token
from agent.run.synclimit import ForcedSyncs
from agent.run.triggers import triggers
from agent.source.sources import SourceSet

__all__ = ["Daemon", "DaemonOptions", "FleetFactory"]

log = structlog.get_logger("gitops_agent.scheduler")

#: Builds the daemon's fleet: ``Fleet`` itself, or a subclass, or a ``functools.partial`` of one;
#: called with the config and the keywords ``metrics``, ``fence`` and ``observer``.
FleetFactory = Callable[..., Fleet]


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


class Daemon:
    """The long-running agent: poll Git, reconcile each cluster on its own schedule."""

    def __init__(
        self,
        config: Config,
        sources: SourceSet,
        fleet: FleetFactory = Fleet,
        options: DaemonOptions | None = None,
        *,
        source_factory: Callable[[Config], SourceSet] = SourceSet.from_config,
    ) -> None:
        self.config = config
        self.opts = options or DaemonOptions.from_config(config)
        self._timing = Timing(self.opts.backoff_base, self.opts.backoff_cap, self.opts.jitter)
        #: Builds the sources of a reloaded config whose sources changed.
        self.source_factory = source_factory
        self.metrics = Metrics()
        self.last_tick = time.monotonic()
        self.config_error: str | None = None
        self.stopping = False
        self._shut = ""
        self._stop = threading.Event()
        #: Guards the clusters' job states.
        self._lock = threading.Lock()
        self._jobs: dict[str, JobState] = {}
        #: Sources a push asked to poll, and per cluster those whose new revision a push announced.
        self._pushes: set[str] = set()
        self._pushed_moved: dict[str, set[str]] = {}
        self._syncs = ForcedSyncs()
        self._config_file = ConfigFile(config.file)
        self.poller = SourcePoller(
            sources, self.metrics, on_moved=self._revisions_moved, stopping=lambda: self.stopping
        )
        self.charts = ChartPolls(config, collect=True)  # it alone knows every source's pins
        self.poller.attach = self.charts.attach
        settings = self.opts.leases or lease_settings(config)
        self.leases = self._lease_manager(settings)
        self.notifier = self._notifier(settings) if config.notifications else None
        self.receiver = self._receiver() if config.receiver.listen else None
        # Read before the fleet exists: an unreadable token file is a ConfigError with nothing to close.
        token = ui_token(config.agent) if config.agent.listen else ""
        self.fleet = fleet(config, metrics=self.metrics, fence=self._fence, observer=self.notifier)
        self.jobs = Jobs(self._job_done)
        self.scheduler = self.jobs.scheduler
        self.health: HealthServer | None = None
        self.page: StatusPage | None = None
        if config.agent.listen:
            self.page, self.health = self._endpoints(settings, token)

    # -- what it is built of ------------------------------------------------------

    def _lease_manager(self, settings: LeaseSettings) -> LeaseManager | None:
        if not settings.enabled:
            return None
        return LeaseManager(
            management_client(settings),
            settings,
            agent=self.config.agent.name,
            clusters=[c.name for c in self.config.clusters],
            on_change=self._lease_changed,
            busy=lambda name: self.fleet.busy(name),
        )

    def _notifier(self, settings: LeaseSettings) -> Notifier:
        return Notifier(
            self.config,
            store=self._notify_store(settings),
            metrics=NotifyMetrics(self.metrics.registry),
            fence=self._fence,
            clusters=lambda: self.fleet.names(),
            instance=settings.identity or socket.gethostname(),
            config_of=lambda: self.config,
        )

    def _notify_store(self, settings: LeaseSettings) -> notify_store.StateStore:
        """Beside the Leases in the management cluster; without one, under the cache directory."""
        if self.leases is not None:
            return notify_store.ConfigMapStore(
                self.leases.client, namespace=settings.namespace, agent=self.config.agent.name
            )
        root = Path(os.path.expanduser(self.config.agent.cache_dir))
        return notify_store.FileStore(root / "notify" / self.config.agent.name)

    def _receiver(self) -> Receiver:
        return Receiver(
            self.config,
            on_push=self._pushed,
            registry=self.metrics.registry,
            sources=lambda: {n: self.poller.sources.source(n).config for n in self.poller.sources.names},
        )

    def _endpoints(self, settings: LeaseSettings, token: str) -> tuple[StatusPage, HealthServer]:
        """The status page and the server of every endpoint, on ``[agent] listen``."""
        a = self.config.agent
        page = snapshot.status_page(self.config, settings, token, self._page_snapshot)
        health = HealthServer(
            a.listen,
            metrics=self.metrics,
            last_tick=self._last_tick,
            ready=self._not_ready,
            status=self.status_json,
            sync=self.sync,
            stuck_after=self.opts.stuck_after,
            page=page,
            token=token,
            limits=main_limits(a),
            allowed=allowed_hosts(a.public_url, a.allowed_hosts),
        )
        return page, health

    # -- what the endpoints ask ---------------------------------------------------

    def cluster_status(self) -> dict[str, ClusterStatus]:
        return self.fleet.status

    def sources_of(self, cluster: str) -> dict[str, str]:
        """App → its source, for the apps of ``cluster`` (none for a cluster not in the config)."""
        entry = next((c for c in self.config.clusters if c.name == cluster), None)
        return {a.name: a.source for a in cluster_apps(self.config, entry)} if entry else {}

    def status_json(self) -> dict[str, Any]:
        """``GET /status`` (``snapshot.status_json``)."""
        return snapshot.status_json(self)

    def _page_snapshot(self) -> Snapshot:
        return snapshot.page_snapshot(self)

    def _may_write(self, cluster: str) -> bool:
        """Whether this replica records ``cluster``: the holder of its Lease, or the only agent."""
        return self.leases is None or self.leases.holds(cluster)

    def _last_tick(self) -> float:
        return min(self.last_tick, self.leases.heartbeat) if self.leases else self.last_tick

    def _not_ready(self) -> str | None:
        if self.stopping:
            return "shutting down"
        return None if self.poller.attempted else "first poll of every source pending"

    def _fence(self, name: str) -> str | None:
        if self._shut:
            return self._shut
        return self.leases.may_write(name) if self.leases else None

    def sync(
        self, name: str, app: str | None = None, *, force_window: bool = False
    ) -> tuple[int, dict[str, Any]]:
        """``POST /sync?cluster=NAME[&app=APP]``: a pass of every app of the cluster now (or right
        after the running one); ``app`` is checked, and runs in that pass like the others.
        ``force_window``: that pass of ``app`` (without one: of every app) overrides a closed
        change window, once (recorded in its result)."""
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
            job = self._job(name)
            pending = job.forced
            wait = None if pending else self._syncs.take(name, app or "", self.config.agent.sync_interval)
            if not pending and wait is None:
                self._jobs[name] = job.force("manual sync")
        if wait is not None:
            why = f"a pass of {name} was forced less than [agent] sync_interval ago"
            return 429, {"error": why, "retry_after": math.ceil(wait)}
        if force_window:
            self.fleet.force_window(name, [app] if app else list(apps))
            log.warning("change window override requested", cluster=name, app=app or "*")
        st = self.fleet.status[name]
        now = datetime.now(UTC)
        when = (st.next_run or now) if pending else self._schedule(name, now, "sync requested")
        return 202, {
            "cluster": name,
            "coalesced": pending,
            "next_run": _iso(when),
            "revision": self.poller.shas([DEFAULT_SOURCE])[DEFAULT_SOURCE],
            "revisions": self.poller.shas(sorted(set(self.sources_of(name).values()))),
            "force_window": force_window,
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
        for name in self.poller.sources.names:
            self._add_source_job(name)
        self.jobs.shared(self._tick, "tick", self.opts.tick, "loop")
        if self.opts.reload_interval > 0 and self.config.file:
            self.jobs.shared(self.check_reload, "reload", self.opts.reload_interval, "reload")
        for c in self.config.clusters:
            self._add_cluster_job(c)
        self.jobs.start()

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
                self._jobs[name] = self._job(name).wake(unblocked)
            why = f"dependency rolled out (waiting: {', '.join(unblocked)})"
            self._schedule(name, datetime.now(UTC), why)
        self._wake_health(name)

    def _wake_health(self, name: str) -> None:
        """Time the cluster's health job for its soonest wait; pause it when nothing waits."""
        if not self.jobs.exists(f"health:{name}"):
            return
        nxt = self.fleet.health.next_step(name)
        if nxt is None:
            self.jobs.pause(f"health:{name}")
            return
        self.jobs.wake(
            f"health:{name}", datetime.now(UTC) + timedelta(seconds=max(0.0, nxt - time.monotonic()))
        )

    def _add_cluster_job(self, c: ClusterConfig) -> None:
        """The cluster's pass, paused until the first revision; its waits on rollouts on a job of
        their own (a long wait never holds the pass, nor a pass the wait), paused while none waits."""
        self.jobs.add(self.follow_health, f"health:{c.name}", HEALTH_POLL_MAX, args=[c.name])
        interval = self._interval(c)
        self.jobs.add(
            self.reconcile, f"cluster:{c.name}", interval, args=[c.name], jitter=interval * self.opts.jitter
        )

    def _add_source_job(self, name: str) -> None:
        """Poll ``name`` now, then every ``poll_interval``: each source alone, like each cluster."""
        seconds = self.poller.sources.source(name).config.poll_interval
        self.jobs.add(self.poll, f"source:{name}", seconds, args=[name], first=datetime.now(UTC))

    def _interval(self, c: ClusterConfig) -> float:
        """The job's own interval (``due.job_interval``)."""
        apps = self.config.apps_of(c.name)
        return job_interval((a.settings.reconcile_interval for a in apps), c.settings.reconcile_interval)

    def _remove_cluster_job(self, name: str) -> None:
        self.jobs.remove(f"cluster:{name}")
        self.jobs.remove(f"health:{name}")

    def _tick(self) -> None:
        self.last_tick = time.monotonic()
        self.metrics.tick.set(time.time())

    def request_poll(self, names: list[str], why: str) -> None:
        """Poll ``names`` now (the receiver's pushes; ``SourcePoller.request``)."""
        self.poller.request(names, why)

    def poll(self, name: str | None = None) -> None:
        """Poll one source (every source when ``name`` is None): ``SourcePoller.poll``."""
        self.poller.poll(name)

    def _pushed(self, names: list[str], why: str) -> None:
        """A verified push asks for a poll of ``names``: their next new revision is a webhook push's."""
        with self._lock:
            self._pushes |= set(names)
        self.poller.request(names, why)

    def _revisions_moved(self, moved: set[str]) -> None:
        """A poll found new revisions of ``moved``: the clusters with an app on them run now."""
        sources_of = {c: set(self.sources_of(c).values()) for c in self.fleet.names()}
        revisions, _ = self.poller.latest()
        with self._lock:
            pushed, self._pushes = self._pushes & moved, self._pushes - moved
        for cluster, hit in triggered(sources_of, moved).items():
            if pushed & set(hit):
                with self._lock:
                    self._pushed_moved.setdefault(cluster, set()).update(pushed & set(hit))
            revs = ", ".join(f"{n} {revisions[n].short}" for n in hit)
            self._schedule(cluster, datetime.now(UTC), f"new revision {revs}")

    # -- one cluster's pass and its next wake ---------------------------------------

    def _job(self, name: str) -> JobState:
        """``name``'s job state (caller locks)."""
        return self._jobs.get(name) or JobState()

    def reconcile(self, name: str) -> None:
        """One scheduled pass of ``name``: its apps that are due (every app after a ``sync``, a
        reload, a Lease acquired), each rendering its own source's latest revision (a failing
        source's last good one); then the job wakes at the earliest app due. An app whose source
        was never polled waits for that first poll, which triggers the cluster."""
        if self.stopping or name not in self.fleet.status:
            return
        revisions, heard = self.poller.latest()
        if not set(self.sources_of(name).values()) & revisions.keys():
            return
        if self.leases is not None and not self.leases.holds(name):
            self.fleet.standby(name, self.leases.holder(name))
            self.metrics.lease_held.labels(name).set(0)
            return
        with self._lock:
            forced_by = self._job(name).forced_by
            self._jobs[name], forced, woken = self._job(name).begin()
            pushed, self._pushed_moved[name] = self._pushed_moved.get(name, set()), set()
        decision = self.fleet.schedule(name, revisions, self._timing, woken=woken, sources=heard)
        due = pass_apps(decision, forced=forced)
        if due:
            why = triggers(
                decision,
                due,
                forced_by=forced_by if forced else "",
                pushed=pushed,
                source_of=self.sources_of(name),
            )
            self._run(name, revisions, list(due), why)
            if self.stopping:
                return
        self._next_pass(name, heard)

    def _run(
        self, name: str, revisions: dict[str, Revision], apps: list[str], why: dict[str, str] | None = None
    ) -> None:
        """The pass of ``apps`` (``why``: app → its trigger): recorded for the page, the cluster's
        waits timed anew."""
        results = self.fleet.run_apps(name, revisions, apps=apps)
        if self.page is not None:
            subjects = {r.sha: r.subject for r in revisions.values()}
            self.page.record_passes(results, subjects, may_write=self._may_write, triggers=why or {})
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

    def _next_pass(self, name: str, heard: set[str]) -> None:
        """Wake ``name``'s job at its earliest app due (plus jitter): each app on its own interval
        and backoff. A revision that arrived during the pass makes its apps due now."""
        revisions, _ = self.poller.latest()
        wake = self.fleet.schedule(name, revisions, self._timing, sources=heard).wake
        if wake is None:
            return
        delay = wake_delay(wake, time.monotonic(), random.random())
        if wake.reason is DueReason.BACKOFF:
            log.warning("app backing off", cluster=name, app=wake.app, retry_in=round(delay, 2))
        why = wake.message(name_app=len(self.fleet.status[name].apps) > 1)
        self._schedule(name, datetime.now(UTC) + timedelta(seconds=delay), why)

    def _schedule(self, name: str, when: datetime, why: str) -> datetime:
        """Run ``name`` at ``when``; while its job runs, the request waits for the job's end."""
        with self._lock:
            self._jobs[name], now = self._job(name).request(Request(when, why))
        if now is not None:
            self._modify(name, now)
        return when

    def _force(self, name: str, why: str) -> None:
        """A pass of every app of ``name`` now."""
        with self._lock:
            self._jobs[name] = self._job(name).force(why)
        self._schedule(name, datetime.now(UTC), why)

    def _modify(self, name: str, request: Request) -> None:
        if name in self.fleet.status and self.jobs.wake(f"cluster:{name}", request.when):
            self.fleet.scheduled(name, request.when, request.why)

    def _job_done(self, event: JobExecutionEvent) -> None:
        """After a cluster's job returned (apscheduler counts it finished): apply what waited."""
        if not event.job_id.startswith("cluster:"):
            return
        name = event.job_id.removeprefix("cluster:")
        with self._lock:
            self._jobs[name], queued = self._job(name).end()
        if queued is not None and not self.stopping:
            self._modify(name, queued)
        elif name in self.fleet.status:
            exists, when = self.jobs.next_run(event.job_id)
            if exists:  # no pass ran: the job's own interval stands
                self.fleet.next_run_is(name, when)

    def _lease_changed(self, name: str, held: bool) -> None:
        self.metrics.lease_held.labels(name).set(1 if held else 0)
        if held and self.notifier is not None:
            self.notifier.lease_acquired(name)
        self.fleet.lease_changed(name, held, self.leases.holder(name) if self.leases else "")
        if held and self.page is not None:
            self.page.forget(name)  # another replica may have recorded it meanwhile
        if held and self.poller.revisions and not self.stopping:
            self._force(name, "lease acquired")

    # -- config reload ------------------------------------------------------------

    def check_reload(self) -> None:
        if not self._config_file.changed():
            return
        try:
            new = self._config_file.load()
        except ConfigError as e:
            self.config_error = str(e)
            self.metrics.reloads.labels("error").inc()
            log.error("config reload failed; the running config stays in force", error=str(e))
            return
        self.apply_config(new)

    def apply_config(self, new: Config) -> None:
        """Clusters added, removed or changed take effect now; removal never deletes anything there."""
        old = self.config
        new, warnings = carry_over(old, new)
        for warning in warnings:
            log.warning(warning)
        sources_changed = SourceSet.wanted(new) != SourceSet.wanted(old)
        added, removed, changed = self.fleet.update(new)
        self.config = new
        self.charts.configure(new)
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
                self.jobs.reschedule(f"cluster:{c.name}", interval, interval * self.opts.jitter)
        if self.leases is not None:
            self.leases.set_clusters(self.fleet.names())
        if self.poller.revisions:
            # Refused entries too: removing or re-pointing the entry they collided with lifts the
            # refusal, and they should not wait out their backoff to find out.
            refused = [n for n, st in self.fleet.status.items() if st.state is PassState.REFUSED]
            for name in dict.fromkeys(added + changed + refused):
                self._force(name, "config reloaded")
        self.config_error = None
        self.metrics.reloads.labels("ok").inc()
        log.info("config reloaded", added=added, removed=removed, changed=changed)

    def _replace_sources(self, fresh: SourceSet) -> None:
        """Poll ``fresh`` from now on (``SourcePoller.replace``), each source on a job of its own."""
        for name in self.poller.sources.names:
            self.jobs.remove(f"source:{name}")
        self.poller.replace(fresh)
        for name in fresh.names:
            self._add_source_job(name)
        log.info("sources changed", sources=list(fresh.names))

    # -- shutdown -------------------------------------------------------------------

    def stop(self, grace: float | None = None) -> None:
        """Stop scheduling; let running passes finish within ``grace``; then fence, release, close."""
        grace = self.opts.grace if grace is None else grace
        self.stopping = True
        log.info("shutting down: no new passes; waiting for running ones", grace=grace)
        self.jobs.shutdown()
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
        self.poller.close()
        self._stop.set()

    def run_forever(self, *, grace: float | None = None) -> None:
        self.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self._stop.wait()
        self.stop(grace)
