"""When each app of a cluster is due and when its job wakes next (``agent.run.due``), and what
happens to wakes and polls asked for while a pass or a poll runs (``agent.run.coalesce``): pure.

Tables of apps' clocks at ``now`` → the apps a pass runs and the next wake with its reason.
Times are seconds (``time.monotonic`` in the agent); backoff 10 s doubling up to 600 s; jitter
10 %: an interval app rides along from its due time less 10 % of its interval less 1 s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent.run.coalesce import JobState, PollState, Request
from agent.run.due import (
    AppClock,
    Due,
    DueReason,
    Timing,
    decide,
    job_interval,
    pass_apps,
    triggered,
    wake_delay,
)

TIMING = Timing(base=10.0, cap=600.0, jitter=0.1)
NOW = 1000.0
SHA, NEW = "1" * 40, "2" * 40


def healthy(name: str, last_run: float, interval: float = 20.0, **changes: Any) -> AppClock:
    """An app whose last pass (at ``last_run``, a second long) succeeded at the current revision."""
    clock = AppClock(name, interval, last_run=last_run, last_end=last_run + 1, seen=SHA, current=SHA)
    return replace(clock, **changes)


def failing(name: str, failures: int, last_end: float, **changes: Any) -> AppClock:
    """An app whose last ``failures`` passes failed, the last ending at ``last_end``."""
    clock = AppClock(
        name, 20.0, last_run=last_end - 5, last_end=last_end, failures=failures, seen=SHA, current=SHA
    )
    return replace(clock, **changes)


@dataclass(frozen=True)
class Case:
    clocks: tuple[AppClock, ...]
    due: tuple[str, ...]
    #: The next wake: (app, reason, at), or None.
    wake: tuple[str, DueReason, float] | None
    now: float = NOW


CASES = {
    "an app that never ran is due now": Case(
        (AppClock("web", 20.0, current=SHA),), ("web",), ("web", DueReason.FIRST_PASS, NOW)
    ),
    "a new revision of its source makes an app due now": Case(
        (healthy("web", NOW - 1, current=NEW),), ("web",), ("web", DueReason.NEW_REVISION, NOW)
    ),
    "a new revision makes a failing app due now, its backoff notwithstanding": Case(
        (failing("web", 5, NOW - 1, current=NEW),), ("web",), ("web", DueReason.NEW_REVISION, NOW)
    ),
    "a source with no revision yet is no new revision": Case(
        (healthy("web", NOW - 10, current=None),), (), ("web", DueReason.INTERVAL, NOW + 10)
    ),
    "a healthy app is due once its interval since its last pass started is over": Case(
        (healthy("web", NOW - 25),), ("web",), ("web", DueReason.INTERVAL, NOW - 5)
    ),
    "a healthy app rides along within its jitter and a second of its due time": Case(
        (healthy("web", NOW - 17),), ("web",), ("web", DueReason.INTERVAL, NOW + 3)
    ),
    "a healthy app is not due earlier than that": Case(
        (healthy("web", NOW - 16.5),), (), ("web", DueReason.INTERVAL, NOW + 3.5)
    ),
    "a failing app waits out its backoff from its failed pass's end": Case(
        (failing("web", 1, NOW - 5),), (), ("web", DueReason.BACKOFF, NOW + 5)
    ),
    "a failing app's backoff doubles per failure": Case(
        (failing("web", 4, NOW - 60),), (), ("web", DueReason.BACKOFF, NOW + 20)
    ),
    "a failing app's backoff is capped": Case(
        (failing("web", 12, NOW - 1),), (), ("web", DueReason.BACKOFF, NOW + 599)
    ),
    "a failing app is due when its backoff is over, never earlier": Case(
        (failing("web", 2, NOW - 20),), ("web",), ("web", DueReason.BACKOFF, NOW)
    ),
    "one failing app does not hold back a healthy app: the job wakes at the healthy app's interval": Case(
        (failing("broken", 4, NOW - 1), healthy("web", NOW - 15)),
        (),
        ("web", DueReason.INTERVAL, NOW + 5),
    ),
    "a pass for a healthy app does not run a failing app before its backoff is over": Case(
        (failing("broken", 4, NOW - 40), healthy("web", NOW - 20)),
        ("web",),
        ("web", DueReason.INTERVAL, NOW),
    ),
    "each healthy app on its own interval: the job wakes at the soonest": Case(
        (healthy("slow", NOW - 10, interval=300), healthy("fast", NOW - 10, interval=20)),
        (),
        ("fast", DueReason.INTERVAL, NOW + 10),
    ),
    "an app waiting on a failing dependency is due with it, not before": Case(
        (failing("infra", 1, NOW - 5), healthy("web", NOW - 60, waiting_on=("infra",))),
        (),
        ("infra", DueReason.BACKOFF, NOW + 5),
    ),
    "an app waiting on a failing dependency is due once the dependency's backoff is over": Case(
        (failing("infra", 1, NOW - 10), healthy("web", NOW - 10, waiting_on=("infra",))),
        ("infra", "web"),
        ("infra", DueReason.BACKOFF, NOW),
    ),
    "a wait down a chain of dependencies follows the first of the chain": Case(
        (
            healthy("web", NOW - 1, waiting_on=("api",)),
            healthy("api", NOW - 1, waiting_on=("db",)),
            failing("db", 3, NOW - 1),
        ),
        (),
        ("db", DueReason.BACKOFF, NOW + 39),
    ),
    "an app waiting on an app not scheduled here is on its own interval": Case(
        (healthy("web", NOW - 5, waiting_on=("elsewhere",)),), (), ("web", DueReason.INTERVAL, NOW + 15)
    ),
    "an app whose dependency rolled out is due now": Case(
        (healthy("infra", NOW - 1), healthy("web", NOW - 1, waiting_on=("infra",), woken=True)),
        ("web",),
        ("web", DueReason.UNBLOCKED, NOW),
    ),
    "no apps: nothing due and no wake": Case((), (), None),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_apps_due_and_the_next_wake(case: Case) -> None:
    decision = decide(case.clocks, case.now, TIMING)
    assert decision.due == case.due
    wake = decision.wake
    assert (wake and (wake.app, wake.reason, pytest.approx(wake.at))) == (
        case.wake and (case.wake[0], case.wake[1], case.wake[2])
    )
    assert [d.app for d in decision.apps] == [c.name for c in case.clocks]


def test_a_wake_may_add_a_tenth_of_the_apps_interval_or_backoff_at_random() -> None:
    decision = decide((healthy("web", NOW - 1, interval=300.0), failing("db", 3, NOW - 1)), NOW, TIMING)
    spreads = {d.app: d.spread for d in decision.apps}
    assert spreads == {"web": pytest.approx(30.0), "db": pytest.approx(4.0)}
    assert decide((AppClock("web", 20.0),), NOW, TIMING).apps[0].spread == 0.0  # a first pass: now


@pytest.mark.parametrize(
    ("due", "name_app", "message"),
    [
        (Due("web", DueReason.BACKOFF, NOW, NOW, failures=2), False, "backoff after 2 failure(s)"),
        (Due("web", DueReason.BACKOFF, NOW, NOW, failures=2), True, "backoff after 2 failure(s) (app web)"),
        (Due("web", DueReason.INTERVAL, NOW, NOW), True, "interval (app web)"),
        (Due("web", DueReason.WAITING, NOW, NOW), True, "waiting on dependency (app web)"),
    ],
)
def test_the_schedule_entry_names_the_reason_and_with_several_apps_the_app(
    due: Due, name_app: bool, message: str
) -> None:
    assert due.message(name_app=name_app) == message


@pytest.mark.parametrize(
    ("clocks", "forced", "apps"),
    [
        ((healthy("web", NOW - 1), healthy("db", NOW - 25)), False, ("db",)),
        ((healthy("web", NOW - 1), healthy("db", NOW - 25)), True, ("web", "db")),
        ((failing("web", 3, NOW - 1),), True, ("web",)),
        ((healthy("web", NOW - 1),), False, ()),
        ((), True, ()),
    ],
    ids=[
        "a scheduled pass runs the apps that are due",
        "a forced pass runs every app, due or not",
        "a forced pass runs a failing app before its backoff is over",
        "a scheduled pass with no app due runs none",
        "a forced pass of a cluster without apps runs none",
    ],
)
def test_the_apps_a_pass_runs(clocks: tuple[AppClock, ...], forced: bool, apps: tuple[str, ...]) -> None:
    assert pass_apps(decide(clocks, NOW, TIMING), forced=forced) == apps


@pytest.mark.parametrize(
    ("at", "spread", "draw", "delay"),
    [
        (NOW + 20, 2.0, 0.0, 20.0),
        (NOW + 20, 2.0, 0.5, 21.0),
        (NOW - 5, 2.0, 0.0, 0.0),
        (NOW - 5, 2.0, 0.25, 0.5),
        (NOW, 0.0, 0.9, 0.0),
    ],
    ids=[
        "the job sleeps until the app is due",
        "plus the drawn fraction of its jitter span",
        "an app overdue wakes the job at once",
        "an app overdue still gets its jitter",
        "no span, no jitter",
    ],
)
def test_the_job_sleeps_until_the_earliest_app_due_plus_jitter(
    at: float, spread: float, draw: float, delay: float
) -> None:
    wake = Due("web", DueReason.INTERVAL, at, at, spread)
    assert wake_delay(wake, NOW, draw) == pytest.approx(delay)


@pytest.mark.parametrize(
    ("intervals", "default", "interval"),
    [((300.0, 60.0, 600.0), 900.0, 60.0), ((), 900.0, 900.0), ((120.0,), 30.0, 120.0)],
    ids=[
        "a cluster's job runs at its apps' shortest interval",
        "without apps, at the cluster's own",
        "an app's longer interval than the cluster's own stands",
    ],
)
def test_the_cluster_jobs_own_interval(intervals: tuple[float, ...], default: float, interval: float) -> None:
    assert job_interval(intervals, default) == interval


@pytest.mark.parametrize(
    ("moved", "hits"),
    [
        ({"main"}, {"prod": ["main"], "dev": ["main"]}),
        ({"charts", "main"}, {"prod": ["charts", "main"], "dev": ["main"]}),
        ({"tools"}, {}),
        (set(), {}),
    ],
    ids=[
        "a new revision triggers every cluster with an app on its source",
        "each cluster names its moved sources, sorted",
        "a source no app of a cluster uses triggers none",
        "no new revision triggers none",
    ],
)
def test_the_clusters_a_new_revision_triggers(moved: set[str], hits: dict[str, list[str]]) -> None:
    sources_of = {"prod": {"main", "charts"}, "dev": {"main"}, "idle": set[str]()}
    assert triggered(sources_of, moved) == hits


T0 = datetime(2025, 1, 1, tzinfo=UTC)
SOON, LATER = Request(T0, "sync requested"), Request(T0 + timedelta(seconds=30), "interval")


@pytest.mark.parametrize(
    ("state", "asked", "after", "now"),
    [
        (JobState(), SOON, JobState(), SOON),
        (JobState(running=True), LATER, JobState(running=True, queued=LATER), None),
        (JobState(running=True, queued=LATER), SOON, JobState(running=True, queued=SOON), None),
        (JobState(running=True, queued=SOON), LATER, JobState(running=True, queued=SOON), None),
    ],
    ids=[
        "a wake asked for while the job is idle acts now",
        "a wake asked for while a pass runs waits for the job's end",
        "of the wakes that wait, an earlier one replaces a later one",
        "a later one does not replace an earlier one",
    ],
)
def test_wakes_asked_for_while_a_pass_runs_coalesce_into_the_earliest(
    state: JobState, asked: Request, after: JobState, now: Request | None
) -> None:
    assert state.request(asked) == (after, now)


def test_a_pass_takes_the_forced_flag_and_the_woken_apps_and_its_end_the_wake_that_waited() -> None:
    state = JobState().force().wake(["web"]).wake(["db"])
    running, forced, woken = state.begin()
    assert (running, forced, woken) == (JobState(running=True), True, frozenset({"web", "db"}))
    running, _ = running.request(LATER)
    assert running.begin()[1:] == (False, frozenset())  # taken: the next pass runs the due apps
    assert running.end() == (JobState(), LATER)
    assert JobState().end() == (JobState(), None)  # a job that returned early: nothing waited


@pytest.mark.parametrize(
    ("state", "after", "start"),
    [
        (PollState(), PollState(running=True, dirty=True), True),
        (PollState(running=True), PollState(running=True, dirty=True), False),
        (PollState(running=True, dirty=True), PollState(running=True, dirty=True), False),
    ],
    ids=[
        "a push to a source not being polled starts a poller",
        "a push during a poll asks for one more",
        "any number of pushes during a poll add up to one more",
    ],
)
def test_a_push_starts_a_poller_only_when_none_runs(state: PollState, after: PollState, start: bool) -> None:
    assert state.push() == (after, start)


@pytest.mark.parametrize(
    ("state", "stopping", "after", "again"),
    [
        (PollState(running=True, dirty=True), False, PollState(running=True), True),
        (PollState(running=True), False, PollState(), False),
        (PollState(running=True, dirty=True), True, PollState(dirty=True), False),
    ],
    ids=[
        "the poller polls while a poll was asked for",
        "and ends once none was since its last",
        "and ends when the agent stops",
    ],
)
def test_the_poller_polls_again_only_when_asked(
    state: PollState, stopping: bool, after: PollState, again: bool
) -> None:
    assert state.next(stopping=stopping) == (after, again)
