"""The notifier: hears what passes and waits did, decides with ``policy``, saves, then sends.

``scheduler.Daemon`` builds one when ``[[notifications]]`` exist and hands it to the fleet as its
``observer``: ``Fleet`` calls ``started`` and ``finished`` around each app's pass, ``HealthWatch``
calls ``health`` when a wait ends. Those calls only queue (a pass never waits for a sink or for the
management cluster); a thread of its own then, per cluster:

1. skips the cluster unless this replica holds its Lease (``fence``): one sender per cluster;
2. loads its ``ClusterState`` (cached while the Lease stays held; dropped when it is acquired
   again, since another replica may have sent meanwhile);
3. decides (``policy.observe``, ``policy.status_step``; every second ``policy.remind``);
4. saves the new state over the version it loaded (``store``; a ``Conflict`` reloads and decides
   again) and only then queues the messages to each sink that takes them (``delivery``).

A crash between 4's save and the send loses that message rather than sending it twice; a still
failing condition is reminded of on schedule.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from agent.config.types import STATUS_SINKS, Config
from agent.errors import ConfigError
from agent.model import AppHealth, ClusterResult, FailureReason, HealthState, PassState
from agent.notify import policy
from agent.notify.delivery import Delivery, NotifyMetrics
from agent.notify.policy import ClusterState, Observation, Step
from agent.notify.secrets import Masker
from agent.notify.sinks import Message, Sink
from agent.notify.store import Conflict, StateStore, StoreError

log = structlog.get_logger("gitops_agent.notify")

#: Seconds between looks for reminders due.
TICK = 1.0
#: Observations waiting for the notifier's thread at most (the oldest dropped past it).
INBOX = 10_000

Decide = Callable[[ClusterState, float], tuple[ClusterState, list[Message]]]


class PassObserver(Protocol):
    """What the fleet tells about each app's pass and wait (``Fleet.observer``)."""

    def started(self, cluster: str, app: str, revision: str) -> None: ...

    def finished(self, result: ClusterResult) -> None: ...

    def health(self, cluster: str, health: AppHealth) -> None: ...


@dataclass(frozen=True)
class _Item:
    cluster: str
    decide: Decide


class Notifier:
    """Decides and sends the alerts and commit statuses of the clusters this replica holds."""

    def __init__(
        self,
        config: Config,
        *,
        store: StateStore,
        metrics: NotifyMetrics,
        fence: Callable[[str], str | None],
        clusters: Callable[[], list[str]],
        instance: str,
        config_of: Callable[[], Config] | None = None,
        clock: Callable[[], float] = time.time,
        tick: float = TICK,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.fence = fence
        self.clusters = clusters
        self.config_of = config_of or (lambda: config)
        self.settings = config.alerts
        self.clock = clock
        self.tick = tick
        self.masker = Masker()
        self.sinks = [
            Sink(
                cfg,
                i,
                masker=self.masker,
                agent=config.agent.name,
                instance=instance,
                public_url=config.agent.public_url,
                source_url=self._source_url,
                file=config.file,
            )
            for i, cfg in enumerate(config.notifications)
        ]
        for s in self.sinks:
            s.check()  # a secret that cannot be read stops the agent now (exit 2), naming its key
        self.deliveries = [Delivery(s, metrics) for s in self.sinks]
        self._alerts = any(s.kind not in STATUS_SINKS for s in self.sinks)
        self._statuses = any(s.kind in STATUS_SINKS for s in self.sinks)
        self._inbox: deque[_Item] = deque()
        self._cv = threading.Condition()
        self._cache: dict[str, tuple[ClusterState, str]] = {}
        self._cache_lock = threading.Lock()
        self._stop = threading.Event()
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name="notifier", daemon=True)

    # -- what the fleet tells (never blocks) --------------------------------------------

    def started(self, cluster: str, app: str, revision: str) -> None:
        if self._statuses and self._wanted(cluster, app, status=True):
            self._step(cluster, app, revision, Step.STARTED, f"applying to {cluster}/{app}")

    def finished(self, result: ClusterResult) -> None:
        if result.dry_run or result.reason is FailureReason.FENCED:
            return
        cluster, app = result.cluster, result.app or result.cluster
        if self._alerts and self._wanted(cluster, app, status=False):
            for obs in policy.pass_observations(result):
                self._observe(obs)
        if not self._statuses or not self._wanted(cluster, app, status=True):
            return
        if result.state in (PassState.WAITING, PassState.SUSPENDED, PassState.WINDOW, PassState.SYNCING):
            return
        if not result.ok:
            why = result.error or f"{result.failed} object(s) failed"
            self._step(cluster, app, result.revision, Step.FAILED, why)
        elif self._waits(cluster, app):
            self._step(
                cluster, app, result.revision, Step.APPLIED_WAITING, "applied; waiting for the rollout"
            )
        else:
            self._step(cluster, app, result.revision, Step.APPLIED, f"applied to {cluster}/{app}")

    def health(self, cluster: str, health: AppHealth) -> None:
        """An ended wait (``HealthWatch`` calls this once per wait's end)."""
        obs = policy.health_observation(cluster, health)
        if obs is None:
            return
        if self._alerts and self._wanted(cluster, health.app, status=False):
            self._observe(obs)
        if self._statuses and self._wanted(cluster, health.app, status=True):
            failed = health.state is HealthState.FAILED
            step = Step.ROLLOUT_FAILED if failed else Step.ROLLED_OUT
            why = health.health.describe() if failed else f"rolled out on {cluster}/{health.app}"
            self._step(cluster, health.app, health.revision, step, why)

    def lease_acquired(self, cluster: str) -> None:
        """Another replica may have sent while this one did not hold ``cluster``: read it anew."""
        with self._cache_lock:
            self._cache.pop(cluster, None)

    # -- helpers ------------------------------------------------------------------------

    def _wanted(self, cluster: str, app: str, *, status: bool) -> bool:
        return any((s.kind in STATUS_SINKS) == status and s.cfg.wants(cluster, app) for s in self.sinks)

    def _app(self, cluster: str, app: str) -> Any:
        return next((a for a in self.config_of().apps_of(cluster) if a.name == app), None)

    def _waits(self, cluster: str, app: str) -> bool:
        a = self._app(cluster, app)
        return a is not None and bool(a.settings.wait)

    def _source_url(self, cluster: str, app: str) -> str:
        a = self._app(cluster, app)
        if a is None:
            return ""
        try:
            return self.config_of().source_named(a.source).url
        except ConfigError:
            return ""

    def _observe(self, obs: Observation) -> None:
        settings = self.settings

        def decide(state: ClusterState, now: float) -> tuple[ClusterState, list[Message]]:
            new, out = policy.observe(state, obs, now, settings)
            return new, list(out)

        self._put(_Item(obs.cluster, decide))

    def _step(self, cluster: str, app: str, revision: str, step: Step, description: str) -> None:
        def decide(state: ClusterState, now: float) -> tuple[ClusterState, list[Message]]:
            new, out = policy.status_step(state, cluster, app, revision, step, description, now)
            return new, list(out)

        self._put(_Item(cluster, decide))

    def _put(self, item: _Item) -> None:
        with self._cv:
            if len(self._inbox) >= INBOX:
                self._inbox.popleft()
                log.warning("notification observation dropped: the notifier is behind")
            self._inbox.append(item)
            self._cv.notify()

    # -- the thread -----------------------------------------------------------------------

    def start(self) -> None:
        for d in self.deliveries:
            d.start()
        self._thread.start()

    def idle(self) -> bool:
        """Nothing waiting to be decided or sent (tests and benchmarks wait for this)."""
        with self._cv:
            if self._inbox or self._busy:
                return False
        return all(d.idle() for d in self.deliveries)

    def stop(self, flush: float = 0.0) -> None:
        """Decide what is queued, send for at most ``flush`` seconds, stop."""
        end = time.monotonic() + flush
        while flush > 0 and not self.idle() and time.monotonic() < end:
            time.sleep(0.02)
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread.ident is not None:  # started
            self._thread.join(2)
        for d in self.deliveries:
            d.stop(max(0.0, end - time.monotonic()))

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            with self._cv:
                while not self._inbox and not self._stop.is_set() and time.monotonic() < next_tick:
                    self._cv.wait(max(0.0, next_tick - time.monotonic()))
                items = list(self._inbox)
                self._inbox.clear()
                self._busy = True
            try:
                for item in items:
                    self._apply(item.cluster, item.decide)
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + self.tick
                    if self._alerts:
                        self._remind()
            except Exception as e:  # the thread must outlive any one bad decision
                log.exception("notifier crashed", error=type(e).__name__)
            finally:
                with self._cv:
                    self._busy = False

    def _remind(self) -> None:
        settings = self.settings
        for cluster in self.clusters():

            def decide(
                state: ClusterState, now: float, cluster: str = cluster
            ) -> tuple[ClusterState, list[Message]]:
                new, out = policy.remind(state, cluster, now, settings)
                return new, list(out)

            self._apply(cluster, decide)

    def _load(self, cluster: str) -> tuple[ClusterState, str]:
        with self._cache_lock:
            hit = self._cache.get(cluster)
        if hit is not None:
            return hit
        loaded = self.store.load(cluster)
        with self._cache_lock:
            self._cache[cluster] = loaded
        return loaded

    def _forget(self, cluster: str) -> None:
        with self._cache_lock:
            self._cache.pop(cluster, None)

    def _apply(self, cluster: str, decide: Decide) -> None:
        """Decide for ``cluster``, save, then send; only while this replica holds its Lease."""
        for _ in range(5):
            if self.fence(cluster) is not None:
                return
            try:
                state, version = self._load(cluster)
            except StoreError as e:
                self.metrics.state_errors.inc()
                log.warning(
                    "notification state not read; nothing sent",
                    cluster=cluster,
                    error=self.masker.scrub(str(e)),
                )
                return
            new, messages = decide(state, self.clock())
            if new == state:
                return
            if self.fence(cluster) is not None:
                return
            try:
                saved = self.store.save(cluster, new, version)
            except Conflict:
                self._forget(cluster)  # another replica saved meanwhile: decide again on its state
                continue
            except StoreError as e:
                self._forget(cluster)
                self.metrics.state_errors.inc()
                log.warning(
                    "notification state not saved; nothing sent",
                    cluster=cluster,
                    error=self.masker.scrub(str(e)),
                )
                return
            with self._cache_lock:
                self._cache[cluster] = (new, saved)
            self._dispatch(messages)
            return
        log.warning("notification state kept changing under this replica; gave up", cluster=cluster)

    def _dispatch(self, messages: list[Message]) -> None:
        for m in messages:
            for d in self.deliveries:
                if d.sink.takes(m):
                    d.put(m)

    def to_json(self) -> dict[str, Any]:
        """``/status``'s ``notifications``: each sink's counts, never its address or secrets."""
        return {"state": self.store.where, "sinks": [d.to_json() for d in self.deliveries]}
