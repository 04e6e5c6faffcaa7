"""Waiting for an app's rollout after its pass, without holding the cluster's worker.

A pass that applied an app with ``wait`` set begins a ``Follow`` of the objects it applied; the
daemon's health job (``run --once``: the command itself) then steps every follow of the cluster
until each is done: one labelled LIST per kind (``health_read``), the readings fed to the
app's ``Tracker`` (debounce, timeout). A step is a handful of requests, each bounded by the
client's timeout, so a long rollout never delays another app's pass.

Steps come quickly after a pass and further apart while nothing changes (``HEALTH_POLL_MIN``
doubling up to ``HEALTH_POLL_MAX``), and never later than the moment a debounce or the
timeout ends. A new revision's pass replaces the app's follow: the wait on the old revision is
cancelled, not finished.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from agent.config.health_checks import HealthCheck, Wait
from agent.config.types import HEALTH_POLL_MAX, HEALTH_POLL_MIN, AppConfig
from agent.kube.client import KubeClient
from agent.model import AppHealth, ApplyResult, Health, HealthState, Note, ObjectKey, Outcome
from agent.plan.health_tracker import TERMINAL, Tracker
from agent.reconcile.health_read import read

log = structlog.get_logger("gitops_agent.health")

#: Outcomes of a pass whose objects are in the cluster as Git says: what a wait follows.
_APPLIED = (Outcome.CREATED, Outcome.CONFIGURED, Outcome.UNCHANGED)


def followed(wait: Wait, results: Iterable[ApplyResult]) -> tuple[list[ObjectKey], list[str]]:
    """What a wait follows of a pass's results, and the ``wait`` entries no applied object matches."""
    # A hook is the sync's, not the rollout's (and no member: the membership read never finds it).
    keys = [
        r.key for r in results if r.outcome in _APPLIED and r.note is not Note.HOOK and wait.includes(r.key)
    ]
    return sorted(keys), [str(ref) for ref in wait.unmatched(keys)]


@dataclass
class Follow:
    """One app's wait at one revision."""

    app: str
    revision: str
    #: The app's ApplySet id: its objects' membership label value.
    membership: str
    keys: tuple[ObjectKey, ...]
    tracker: Tracker
    checks: Sequence[HealthCheck] = ()
    #: The app's ``service_account``: health is read as it ("": as the agent).
    service_account: str = ""
    #: ``wait`` entries the app did not apply: NotFound until the timeout fails them.
    missing: tuple[str, ...] = ()
    latest: AppHealth | None = None
    #: Seconds to the next step when nothing changes (doubles up to ``HEALTH_POLL_MAX``).
    beat: float = HEALTH_POLL_MIN
    due: float = 0.0
    requests: int = 0

    def done(self, now: float) -> bool:
        return self.tracker.done(now)


@dataclass
class Follows:
    """The follows of one cluster's apps; shared by its passes and its health job."""

    follows: dict[str, Follow] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(
        self,
        app: AppConfig,
        revision: str,
        membership: str,
        results: Iterable[ApplyResult],
        now: float,
    ) -> Follow:
        """Follow ``app``'s objects after its pass at ``revision`` (replacing its follow of another).

        Another pass at the same revision goes on with the same wait (its timeout counts from the
        first pass at that revision); a new revision cancels the old wait.
        """
        keys, missing = followed(app.settings.wait, results)
        ghost = [_ghost(ref) for ref in missing]
        with self._lock:
            prev = self.follows.get(app.name)
            started = now
            if prev is not None and prev.revision == revision and not prev.done(now):
                started = prev.tracker.started
            elif prev is not None and prev.revision != revision and not prev.done(now):
                log.info(
                    "wait cancelled: a new revision",
                    app=app.name,
                    revision=prev.revision[:12],
                    new_revision=revision[:12],
                )
            s = app.settings
            tracker = Tracker(
                started=started, timeout=s.health_timeout, debounce=s.health_debounce, keys=[*keys, *ghost]
            )
            f = Follow(
                app.name,
                revision,
                membership,
                tuple(keys),
                tracker,
                checks=app.health_checks,
                service_account=app.settings.service_account,
                missing=tuple(missing),
                due=now,
            )
            self.follows[app.name] = f
            return f

    def drop(self, app: str) -> None:
        with self._lock:
            self.follows.pop(app, None)

    def pending(self, now: float) -> list[Follow]:
        """Follows not done whose next step is due at ``now``."""
        with self._lock:
            return [f for f in self.follows.values() if f.due <= now and not _finished(f)]

    def next_step(self, now: float) -> float | None:
        """When the soonest follow wants its next step; None when every follow is done."""
        with self._lock:
            times = [f.due for f in self.follows.values() if not _finished(f)]
        return min(times, default=None)

    def postpone(self, follow: Follow, now: float) -> None:
        """A step that could not read: the next one after the longest beat."""
        follow.beat = HEALTH_POLL_MAX
        follow.due = now + HEALTH_POLL_MAX

    def step(
        self, client: KubeClient, follow: Follow, now: float, namespaced: set[tuple[str, str]] | None = None
    ) -> AppHealth:
        """Read ``follow``'s objects once and record what the wait makes of them (``namespaced``:
        see ``health_read.read``)."""
        reading = read(client, follow.membership, follow.keys, checks=follow.checks, namespaced=namespaced)
        follow.requests += reading.requests
        tracker = follow.tracker
        for key in reading.excluded:
            tracker.forget(key)
        for key, seen in reading.healths.items():
            tracker.observe(key, seen, now)
        for ref in follow.missing:
            tracker.observe(_ghost(ref), _not_declared(ref, follow.app), now)
        report = tracker.report(now)
        summary = tracker.summary(now)
        done = tracker.done(now)
        previous = follow.latest
        app_health = AppHealth(
            follow.app,
            follow.revision,
            summary,
            done,
            objects=len(report),
            current=sum(1 for h in report.values() if h.state is HealthState.CURRENT),
            waited=now - tracker.started,
            reads=follow.requests,
            by_object=tuple(sorted(report.items())),
        )
        follow.latest = app_health
        moved = previous is None or (previous.state, previous.current) != (
            app_health.state,
            app_health.current,
        )
        follow.beat = HEALTH_POLL_MIN if moved else min(follow.beat * 2, HEALTH_POLL_MAX)
        nxt = now + follow.beat
        change = tracker.next_change(now)
        follow.due = min(nxt, change) if change is not None else nxt
        return app_health


def _finished(f: Follow) -> bool:
    """Done as of its last step (a follow never stepped is not)."""
    return f.latest is not None and f.latest.done


def _ghost(ref: str) -> ObjectKey:
    """A key for a ``wait`` entry no applied object matches (reported NotFound under its spelling)."""
    return ObjectKey("", "wait", "", ref)


def _not_declared(ref: str, app: str) -> Health:
    return Health(
        HealthState.NOT_FOUND,
        f"wait names {ref}, which app {app!r} did not apply in this revision",
        reason="NotDeclared",
    )


__all__ = ["TERMINAL", "Follow", "Follows", "followed"]
