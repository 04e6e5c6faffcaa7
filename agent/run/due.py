"""When each app of a cluster is due, and when the cluster's job wakes next: pure.

A cluster has one job (its pass renders every app, so it knows who declares what), but each
app keeps its own clock: its ``reconcile_interval``, its backoff after failures, a new revision
of its source, a dependency it waits on. ``decide`` reads the apps' clocks (``AppClock``) at
``now`` and returns which apps a pass runs now and the earliest app due, which is when the
job wakes next, with its typed reason (``Due``). A failing app's backoff therefore never
holds back its cluster's healthy apps (docs/safety.md rule 6). Called by ``fleet.Fleet``
(``due_apps``, ``schedule``) for ``scheduler.Daemon``, which also asks here which apps a pass
runs (``pass_apps``), how long its job sleeps (``wake_delay``), its job's own interval
(``job_interval``) and which clusters a new revision triggers (``triggered``); no clock and no
randomness inside: times are the caller's ``time.monotonic`` seconds, the jitter is drawn by
the caller.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = [
    "AppClock",
    "Decision",
    "Due",
    "DueReason",
    "Timing",
    "backoff_delay",
    "decide",
    "job_interval",
    "pass_apps",
    "triggered",
    "wake_delay",
]

#: Seconds before its interval is over within which an app still rides along with a pass (on top
#: of its jitter span): two apps due a moment apart share one pass, one read of the cluster.
RIDE_ALONG = 1.0


class DueReason(StrEnum):
    """Why an app is due."""

    FIRST_PASS = "first pass"
    NEW_REVISION = "new revision"
    INTERVAL = "interval"
    BACKOFF = "backoff"
    #: Waiting on a dependency: due with the dependency it waits on.
    WAITING = "waiting on dependency"
    #: Waiting on a dependency whose rollout the health job saw complete: due now.
    UNBLOCKED = "dependency rolled out"
    #: Its sync waits on a wave to become healthy: due when its last pass said to look again.
    WAVE = "sync wave"


def backoff_delay(failures: int, *, base: float, cap: float) -> float:
    """Exponential backoff after ``failures`` consecutive failures (0 → no delay)."""
    return 0.0 if failures <= 0 else min(cap, base * 2 ** (failures - 1))


@dataclass(frozen=True)
class Timing:
    """The backoff after failures (``base`` doubling per consecutive failure, up to ``cap``) and
    the fraction of an interval or backoff a wake may add at random (``jitter``)."""

    base: float
    cap: float
    jitter: float

    def delay(self, failures: int) -> float:
        return backoff_delay(failures, base=self.base, cap=self.cap)


@dataclass(frozen=True)
class AppClock:
    """What decides when one app is due, as its status holds it."""

    name: str
    #: Its own ``reconcile_interval`` (seconds).
    interval: float
    #: When its last pass started and ended (``time.monotonic``); None: never (ended: unknown).
    last_run: float | None = None
    last_end: float | None = None
    #: Consecutive failed passes (its backoff).
    failures: int = 0
    #: The revision its last pass ran at (a pass that waited included), and its source's now.
    seen: str = ""
    current: str | None = None
    #: The apps it waited on in its last pass (state ``waiting``); empty: not waiting.
    waiting_on: tuple[str, ...] = ()
    #: A dependency it waited on rolled out since (the health job saw it): due now.
    woken: bool = False
    #: Its last pass ended ``syncing`` (a wave not healthy yet): seconds after that pass's end
    #: when it is due again; None: not syncing.
    recheck: float | None = None


@dataclass(frozen=True)
class Due:
    """When one app is due, and why."""

    app: str
    reason: DueReason
    #: When it is due, and from when a pass may take it along already (``early <= at``).
    at: float
    early: float
    #: Seconds of jitter a wake for it may add at random (a fraction of its interval or backoff).
    spread: float = 0.0
    #: Its consecutive failures (the backoff's, or for ``waiting``, the dependency's).
    failures: int = 0

    def message(self, *, name_app: bool = True) -> str:
        """The schedule entry ``/status`` shows: ``backoff after 2 failure(s) (app web)``."""
        what = str(self.reason)
        if self.reason is DueReason.BACKOFF:
            what = f"backoff after {self.failures} failure(s)"
        return f"{what} (app {self.app})" if name_app else what


@dataclass(frozen=True)
class Decision:
    """What a cluster's job does at ``now``: the apps its pass runs, and when it wakes next."""

    #: The apps due now, in the order given.
    due: tuple[str, ...]
    #: The earliest app due (now or later): when the job wakes next; None: no app.
    wake: Due | None
    #: Every app's own due time, in the order given.
    apps: tuple[Due, ...]


def _own(clock: AppClock, now: float, timing: Timing) -> Due:
    """When ``clock``'s app is due by its own clock alone (its dependencies aside)."""
    if clock.last_run is None:
        return Due(clock.name, DueReason.FIRST_PASS, now, now)
    if clock.current is not None and clock.current != clock.seen:
        return Due(clock.name, DueReason.NEW_REVISION, now, now)
    if clock.woken:
        return Due(clock.name, DueReason.UNBLOCKED, now, now)
    if clock.recheck is not None:
        at = (clock.last_end if clock.last_end is not None else clock.last_run) + clock.recheck
        return Due(clock.name, DueReason.WAVE, at, at)
    if clock.failures and not clock.waiting_on:
        # From the failed pass's end: a pass that ran into its deadline does not eat its backoff.
        delay = timing.delay(clock.failures)
        at = (clock.last_end if clock.last_end is not None else clock.last_run) + delay
        return Due(clock.name, DueReason.BACKOFF, at, at, delay * timing.jitter, clock.failures)
    spread = clock.interval * timing.jitter
    at = clock.last_run + clock.interval
    return Due(clock.name, DueReason.INTERVAL, at, at - spread - RIDE_ALONG, spread)


def _with_dependencies(
    name: str, clocks: Mapping[str, AppClock], own: Mapping[str, Due], seen: frozenset[str] = frozenset()
) -> Due:
    """A waiting app is due with the soonest of the apps it waits on (a failing one's backoff, a
    rolling one's interval), so it never pulls a failing dependency into a pass before its
    backoff is over; with none of them known here, on its own interval."""
    mine = own[name]
    if mine.reason is not DueReason.INTERVAL or not clocks[name].waiting_on:
        return mine
    deps = [
        _with_dependencies(d, clocks, own, seen | {name})
        for d in clocks[name].waiting_on
        if d in clocks and d not in seen and d != name
    ]
    if not deps:
        return mine
    first = min(deps, key=lambda d: d.at)
    return replace(first, app=name, reason=DueReason.WAITING)


def decide(clocks: Sequence[AppClock], now: float, timing: Timing) -> Decision:
    """Which of ``clocks``' apps are due at ``now``, and the earliest due (the next wake).

    An app is due on its first pass, on a new revision of its source and once a dependency it
    waits on rolled out (all three: now), once its backoff after failures is over (counted from
    its failed pass's end), with the app it waits on, or once its ``reconcile_interval`` since
    its last pass started is over (within its jitter span and ``RIDE_ALONG``: coalesced into a
    pass that runs anyway).
    """
    by_name = {c.name: c for c in clocks}
    own = {c.name: _own(c, now, timing) for c in clocks}
    apps = tuple(_with_dependencies(c.name, by_name, own) for c in clocks)
    due = tuple(d.app for d in apps if d.early <= now)
    # The soonest; on a tie the app's own reason before a dependent's ``waiting``.
    wake = min(apps, key=lambda d: (d.at, d.reason is DueReason.WAITING), default=None)
    return Decision(due, wake, apps)


def pass_apps(decision: Decision, *, forced: bool) -> tuple[str, ...]:
    """The apps a pass runs: every app when it was forced (a ``sync``, a config reload, a Lease
    acquired), else the ones ``decision`` finds due."""
    return tuple(d.app for d in decision.apps) if forced else decision.due


def wake_delay(wake: Due, now: float, draw: float) -> float:
    """Seconds the job sleeps until ``wake`` (never negative), plus ``draw`` (the caller's random
    fraction in [0, 1)) of its jitter span."""
    return max(0.0, wake.at - now) + draw * wake.spread


def job_interval(app_intervals: Iterable[float], default: float) -> float:
    """A cluster job's own interval: its apps' shortest ``reconcile_interval`` (without apps, the
    cluster's ``default``), a floor under the wakes its passes set."""
    return min(app_intervals, default=None) or default


def triggered(sources_of: Mapping[str, Collection[str]], moved: Collection[str]) -> dict[str, list[str]]:
    """The clusters a new revision of ``moved`` sources makes due now, each with its moved sources
    (sorted); ``sources_of``: cluster → the sources its apps use."""
    hits = {cluster: sorted(set(sources) & set(moved)) for cluster, sources in sources_of.items()}
    return {cluster: hit for cluster, hit in hits.items() if hit}
