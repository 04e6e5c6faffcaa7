"""The notification policy, pure: edge-triggered alerts, reminders on a backoff, one resolved
message, and one commit status per state and revision (agent/notify/policy.py)."""

from __future__ import annotations

import itertools
import json

from agent.config.types import AlertSettings, Severity
from agent.model import ClusterResult, Failure, FailureReason, PruneReason, PruneRefusal
from agent.notify.policy import (
    Alert,
    ClusterState,
    CommitState,
    Condition,
    NoticeKind,
    Observation,
    Step,
    observe,
    pass_observations,
    remind,
    status_step,
)

SETTINGS = AlertSettings(after_failures=3, after=0.0, remind=(300.0, 1800.0, 7200.0))


def bad(message: str = "unreachable", condition: Condition = Condition.RECONCILE) -> Observation:
    return Observation("prod", "web", condition, True, "a" * 40, message, "unreachable")


def good(condition: Condition = Condition.RECONCILE) -> Observation:
    return Observation("prod", "web", condition, False, "b" * 40, "reconciled")


def test_a_failing_app_alerts_once_after_n_passes_reminds_on_the_backoff_and_resolves_once() -> None:
    state, sent = ClusterState(), []
    for t in (0.0, 60.0, 120.0, 180.0):
        state, out = observe(state, bad(), t, SETTINGS)
        sent += [(t, n.kind) for n in out]
    assert sent == [(120.0, NoticeKind.FIRING)]  # the third failed pass, and only then
    # Reminders after 5m, then 30m, then every 2h (the last step repeats), never between.
    reminders = []
    for t in range(121, 120 + 5 * 7200, 30):
        state, out = remind(state, "prod", float(t), SETTINGS)
        reminders += [t for n in out if n.kind is NoticeKind.REMINDER]
    gaps = [b - a for a, b in itertools.pairwise([120, *reminders])]
    assert [round(g, -1) for g in gaps[:4]] == [300, 1800, 7200, 7200]
    state, out = observe(state, good(), 99999.0, SETTINGS)
    assert [(n.kind, n.reason, n.severity) for n in out] == [
        (NoticeKind.RESOLVED, "ReconcileSucceeded", Severity.INFO)
    ]
    state, out = observe(state, good(), 100000.0, SETTINGS)
    assert out == [] and state.alerts == {}


def test_a_failure_that_recovers_before_n_passes_sends_nothing_at_all() -> None:
    state = ClusterState()
    for t in (0.0, 60.0):
        state, out = observe(state, bad(), t, SETTINGS)
        assert out == []
    state, out = observe(state, good(), 120.0, SETTINGS)
    assert out == [] and state.alerts == {}


def test_the_first_alert_also_comes_after_t_seconds_of_failing_whatever_the_count() -> None:
    settings = AlertSettings(after_failures=100, after=600.0, remind=())
    state, out = observe(ClusterState(), bad(), 0.0, settings)
    assert out == []
    state, out = remind(state, "prod", 599.0, settings)
    assert out == []
    state, out = remind(state, "prod", 600.0, settings)
    assert [n.kind for n in out] == [NoticeKind.FIRING]
    state, out = remind(state, "prod", 100000.0, settings)
    assert out == []  # no reminders configured


def test_the_brake_and_a_failed_rollout_alert_at_once() -> None:
    for condition, reason in ((Condition.PRUNE, "PruneBlocked"), (Condition.HEALTH, "HealthFailed")):
        _, out = observe(ClusterState(), bad("held", condition), 0.0, SETTINGS)
        assert [(n.kind, n.reason) for n in out] == [(NoticeKind.FIRING, reason)]


def test_the_state_survives_a_round_trip_through_json_so_a_restart_sends_no_duplicate() -> None:
    state = ClusterState()
    for t in (0.0, 1.0, 2.0):
        state, _ = observe(state, bad(), t, SETTINGS)
    state, _ = status_step(state, "prod", "web", "a" * 40, Step.STARTED, "applying", 0.0)
    again = ClusterState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state
    assert observe(again, bad(), 3.0, SETTINGS)[1] == []  # already announced
    assert remind(again, "prod", 10.0, SETTINGS)[1] == []  # the reminder is not due yet
    assert status_step(again, "prod", "web", "a" * 40, Step.STARTED, "applying", 4.0)[1] == []


def test_an_unreadable_stored_state_is_dropped_entry_by_entry() -> None:
    doc = {
        "alerts": [{"app": "web", "condition": "nope"}, {"app": "web", "condition": "health", "failures": 1}]
    }
    assert ClusterState.from_json(doc).alerts == {("web", Condition.HEALTH): Alert(failures=1)}
    assert ClusterState.from_json("garbage") == ClusterState()


def test_commit_status_goes_pending_then_success_once_and_a_drift_pass_never_turns_it_back() -> None:
    rev, state = "c" * 40, ClusterState()
    states = []
    for step in (
        Step.STARTED,
        Step.APPLIED_WAITING,
        Step.ROLLED_OUT,
        Step.STARTED,
        Step.APPLIED,
        Step.ROLLED_OUT,
    ):
        state, out = status_step(state, "prod", "web", rev, step, "x", 0.0)
        states += [u.state for u in out]
    assert states == [CommitState.PENDING, CommitState.SUCCESS]
    state, out = status_step(state, "prod", "web", "d" * 40, Step.STARTED, "x", 0.0)
    assert [u.state for u in out] == [CommitState.PENDING]
    state, out = status_step(state, "prod", "web", "d" * 40, Step.FAILED, "boom", 0.0)
    assert [(u.state, u.description) for u in out] == [(CommitState.FAILURE, "boom")]
    # The same revision retried and applied: failure turns into success.
    state, out = status_step(state, "prod", "web", "d" * 40, Step.APPLIED, "ok", 0.0)
    assert [u.state for u in out] == [CommitState.SUCCESS]


def test_a_fenced_pass_says_nothing_and_a_brake_is_read_only_from_a_pass_that_got_to_its_deletions() -> None:
    fenced = ClusterResult("prod", "a" * 40, app="web", failure=Failure(FailureReason.FENCED, "lease lost"))
    assert pass_observations(fenced) == []
    down = ClusterResult(
        "prod", "a" * 40, app="web", failure=Failure(FailureReason.UNREACHABLE, "refused\nmore")
    )
    (obs,) = pass_observations(down)
    assert (obs.condition, obs.bad, obs.message, obs.cause) == (
        Condition.RECONCILE,
        True,
        "refused\nmore",
        "unreachable",
    )
    braked = ClusterResult(
        "prod", "a" * 40, app="web", prune_refusal=PruneRefusal(PruneReason.BRAKE, "would prune 9 of 10")
    )
    assert [(o.condition, o.bad) for o in pass_observations(braked)] == [
        (Condition.RECONCILE, False),
        (Condition.PRUNE, True),
        (Condition.DRIFT, False),
    ]
