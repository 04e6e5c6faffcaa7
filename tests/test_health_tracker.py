"""One wait over time: a Failed counts once it held the debounce, the timeout ends the wait, done is early.

No clock: each observation carries its time, as the follower passes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.model import Health, HealthCause, HealthState, ObjectKey
from agent.plan.health import assess, child_index
from agent.plan.health_tracker import Tracker

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "health"
WEB = ObjectKey("apps", "Deployment", "shop", "web")
DB = ObjectKey("apps", "StatefulSet", "shop", "db")
CR = ObjectKey("example.com", "Widget", "shop", "blue")


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())  # type: ignore[no-any-return]


STALLED = assess(fixture("widget-stalled"))
NOT_READY = assess(fixture("widget-not-ready"))
READY = assess(fixture("widget-ready"))


def test_a_stalled_flap_shorter_than_the_debounce_never_marks_the_app_failed() -> None:
    wait = Tracker(started=100.0, timeout=60.0, debounce=5.0, keys=[CR])
    assert wait.observe(CR, STALLED, 100.0).state is HealthState.IN_PROGRESS
    reported = wait.observe(CR, STALLED, 104.0)
    assert (reported.state, reported.cause) == (HealthState.IN_PROGRESS, HealthCause.DEBOUNCING)
    assert reported.message == "failing for 4s: spec.size must be at most 5"
    assert reported.blocker == STALLED.blocker
    wait.observe(CR, NOT_READY, 104.5)  # the flap ends: the next Failed starts its own count
    wait.observe(CR, STALLED, 106.0)
    assert wait.summary(110.9).state is HealthState.IN_PROGRESS
    assert not wait.done(110.9)


def test_a_failed_that_holds_the_debounce_counts_and_ends_the_wait() -> None:
    wait = Tracker(started=0.0, timeout=60.0, debounce=5.0, keys=[CR])
    wait.observe(CR, STALLED, 1.0)
    wait.observe(CR, STALLED, 3.0)
    assert not wait.done(5.9)
    reported = wait.reported(CR, 6.0)  # held 5 s since its first Failed observation, no new read needed
    assert reported == STALLED
    assert wait.done(6.0) and wait.summary(6.0).state is HealthState.FAILED


def test_a_debounce_of_zero_counts_a_failed_at_once() -> None:
    wait = Tracker(started=0.0, timeout=60.0, debounce=0.0, keys=[CR])
    assert wait.observe(CR, STALLED, 1.0) == STALLED


def test_what_is_still_in_progress_at_the_timeout_is_failed_naming_what_it_waited_for() -> None:
    pods = child_index(
        map(
            fixture,
            ("replicaset-old", "replicaset-bad-image", "pod-image-pull-backoff", "pod-err-image-pull"),
        )
    )
    stuck = assess(fixture("deployment-bad-image"), children=pods)
    wait = Tracker(started=0.0, timeout=300.0, debounce=30.0, keys=[WEB, DB])
    wait.observe(WEB, stuck, 1.0)
    wait.observe(DB, assess(fixture("statefulset-ready")), 1.0)
    assert wait.reported(WEB, 299.9) == stuck and wait.pending(299.9) == [WEB]
    timed_out = wait.reported(WEB, 300.0)
    assert (timed_out.state, timed_out.cause, timed_out.reason) == (
        HealthState.FAILED,
        HealthCause.TIMEOUT,
        "LessAvailable",
    )
    assert timed_out.describe() == (
        "Failed: still InProgress after 300s: 0 of 3 updated replicas available; Pod web-6c8d7f9b4-abcde: "
        'ImagePullBackOff (Back-off pulling image "registry.example.com/web:nope")'
    )
    assert wait.done(300.0) and wait.pending(300.0) == []
    assert wait.summary(300.0).state is HealthState.FAILED
    assert wait.reported(DB, 300.0).state is HealthState.CURRENT


def test_a_failed_still_debouncing_at_the_timeout_is_failed_by_the_timeout() -> None:
    wait = Tracker(started=0.0, timeout=10.0, debounce=30.0, keys=[CR])
    wait.observe(CR, STALLED, 8.0)
    reported = wait.reported(CR, 10.0)
    assert (reported.state, reported.cause) == (HealthState.FAILED, HealthCause.TIMEOUT)
    assert reported.message == "failing for 2s when the wait ended after 10s: spec.size must be at most 5"


def test_an_object_never_read_is_waited_for_and_times_out_unknown() -> None:
    wait = Tracker(started=0.0, timeout=10.0, debounce=1.0, keys=[WEB, CR])
    wait.observe(CR, READY, 1.0)
    assert wait.pending(5.0) == [WEB]
    assert wait.reported(WEB, 5.0).state is HealthState.UNKNOWN
    assert wait.reported(WEB, 10.0).message == "still Unknown after 10s: not read yet"


def test_the_wait_is_done_early_when_everything_is_current_suspended_or_failed() -> None:
    wait = Tracker(started=0.0, timeout=300.0, debounce=0.0, keys=[WEB, DB, CR])
    wait.observe(WEB, assess(fixture("deployment-paused")), 1.0)
    wait.observe(DB, assess(fixture("statefulset-ready")), 1.0)
    assert not wait.done(2.0)
    wait.observe(CR, READY, 2.0)
    assert wait.done(2.0)
    assert wait.summary(2.0).state is HealthState.SUSPENDED


def test_next_change_is_when_a_debounce_ends_or_the_deadline_comes() -> None:
    wait = Tracker(started=0.0, timeout=60.0, debounce=5.0, keys=[CR, DB])
    assert wait.next_change(0.0) == 60.0
    wait.observe(CR, STALLED, 10.0)
    assert wait.next_change(10.0) == 15.0
    wait.observe(DB, READY, 10.0)
    assert wait.next_change(16.0) is None  # done: the Failed counted, the other is Current
    late = Tracker(started=0.0, timeout=60.0, debounce=5.0, keys=[CR])
    assert late.next_change(61.0) is None


def test_observations_keep_only_the_latest_health_of_each_object() -> None:
    wait = Tracker(started=0.0, timeout=60.0, debounce=5.0)
    wait.observe(CR, NOT_READY, 1.0)
    wait.observe(CR, READY, 2.0)
    assert wait.report(3.0) == {CR: READY}
    assert wait.summary(3.0) == Health(HealthState.CURRENT, "1 of 1 objects Current")
