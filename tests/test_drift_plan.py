"""Drift decided from the plan, pure (``agent.plan.drift``), and its alert (``notify.policy``).

Who changed a field is the ``managedFields`` entry that owns it (its manager, operation and the
server's time); a field removed by hand is owned by nobody, so the latest other writer is named
and said to be only that. Values of Secrets are masked. At an unchanged revision updates with
drift and the re-creation of objects deleted by hand are held; ownership repairs are sent. The
alert fires once while drift lasts, is never reminded of, and resolves once.
"""

from __future__ import annotations

from typing import Any

from agent.config.types import ALERT_DEFAULTS, DEFAULT_CONFLICT_RULES
from agent.model import (
    Action,
    Change,
    ClusterResult,
    DesiredObject,
    Drift,
    DriftFate,
    DriftKind,
    Evidence,
    ObjectKey,
    Provenance,
)
from agent.notify.policy import ClusterState, Condition, NoticeKind, observe, pass_observations, remind
from agent.plan import drift
from agent.plan.fields import encode_fields_v1
from agent.plan.planner import PlanOptions, plan_object
from agent.report.summary import format_summary

OPTIONS = PlanOptions(field_manager="agent", rules=DEFAULT_CONFLICT_RULES)
WEB = ObjectKey("apps", "Deployment", "shop", "web")
CM = ObjectKey("", "ConfigMap", "shop", "settings")


def entry(manager: str, operation: str, time: str, *paths: tuple[str, ...]) -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "v1",
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": encode_fields_v1(paths),
    }


def configmap(data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "shop"},
        "data": data,
    }


def desired(manifest: dict[str, Any]) -> DesiredObject:
    return DesiredObject(manifest, Provenance("app.yaml", 1))


def live_of(manifest: dict[str, Any], *entries: dict[str, Any]) -> dict[str, Any]:
    meta = {**manifest["metadata"], "resourceVersion": "7", "uid": "u1", "managedFields": list(entries)}
    return {**manifest, "metadata": meta}


def seen(obj: DesiredObject, live: dict[str, Any]) -> tuple[Drift, ...]:
    change = plan_object(obj, live, OPTIONS)
    return drift.observe(obj, live, change, field_manager="agent", schema=None)


def test_a_hand_edit_names_the_owning_entrys_manager_operation_and_time() -> None:
    obj = desired(configmap({"greeting": "hello", "colour": "blue"}))
    live = live_of(
        configmap({"greeting": "by-hand", "colour": "blue"}),
        entry("agent", "Apply", "2030-01-01T00:00:00Z", ("f:data", "f:colour")),
        entry("kubectl-edit", "Update", "2030-01-01T00:05:00Z", ("f:data", "f:greeting")),
        entry("kubectl-patch", "Update", "2030-01-01T00:09:00Z", ("f:metadata", "f:labels", "f:x")),
    )
    (d,) = seen(obj, live)
    assert (d.key, d.kind, d.path, d.git, d.live) == (
        CM,
        DriftKind.CHANGED,
        "data.greeting",
        "hello",
        "by-hand",
    )
    assert (d.manager, d.operation, d.time, d.evidence) == (
        "kubectl-edit",
        "Update",
        "2030-01-01T00:05:00Z",
        Evidence.OWNER,
    )
    assert d.describe() == (
        'ConfigMap/shop/settings: data.greeting: Git "hello", live "by-hand", '
        "by kubectl-edit (Update) at 2030-01-01T00:05:00Z"
    )


def test_a_field_removed_by_hand_names_the_latest_other_writer_as_only_that() -> None:
    obj = desired(configmap({"greeting": "hello", "colour": "blue"}))
    live = live_of(
        configmap({"colour": "blue"}),
        entry("agent", "Apply", "2030-01-01T00:00:00Z", ("f:data", "f:colour")),
        entry("kubectl-edit", "Update", "2030-01-01T00:05:00Z", ("f:metadata", "f:labels", "f:x")),
        entry("helm", "Update", "2029-01-01T00:00:00Z", ("f:metadata", "f:labels", "f:y")),
    )
    (d,) = seen(obj, live)
    assert (d.path, d.git, d.live, d.manager, d.evidence) == (
        "data.greeting",
        "hello",
        None,
        "kubectl-edit",
        Evidence.LATEST,
    )
    assert "the latest writer (no entry owns the field)" in d.who


def test_a_secrets_values_are_masked_whatever_git_or_live_hold() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "stringData": {"password": "SENTINEL-git"},
    }
    live = {
        **{k: v for k, v in secret.items() if k != "stringData"},
        "data": {"password": "U0VOVElORUwtbGl2ZQ=="},
    }
    live = live_of(live, entry("kubectl-patch", "Update", "2030-01-01T00:05:00Z", ("f:data", "f:password")))
    (d,) = seen(desired(secret), live)
    assert (d.path, d.manager) == ("data.password", "kubectl-patch")
    assert "SENTINEL" not in repr(d) and "U0VOVElORUwtbGl2ZQ==" not in repr(d)


def test_a_field_yielded_to_its_owner_is_no_drift() -> None:
    obj = desired(configmap({"greeting": "hello"}))
    live = live_of(
        configmap({"greeting": "controller"}),
        entry("kube-controller-manager", "Update", "2030-01-01T00:05:00Z", ("f:data", "f:greeting")),
    )
    change = plan_object(obj, live, OPTIONS)
    assert change.action is Action.UPDATE and change.yielded  # adopting it, the field left to its owner
    assert drift.observe(obj, live, change, field_manager="agent", schema=None) == ()


def _change(key: ObjectKey, action: Action) -> Change:
    return Change(key, action)


def test_at_an_unchanged_revision_drift_and_re_creations_are_held_and_repairs_sent() -> None:
    evidence = {WEB: (Drift(WEB, DriftKind.CHANGED, "spec.replicas", 2, 5, "kubectl-edit"),)}
    gone, new = ObjectKey("", "ConfigMap", "shop", "gone"), ObjectKey("", "ConfigMap", "shop", "new")
    repair = ObjectKey("", "ConfigMap", "shop", "repair")
    changes = [
        _change(WEB, Action.UPDATE),
        _change(gone, Action.CREATE),
        _change(new, Action.CREATE),
        _change(repair, Action.UPDATE),
        _change(CM, Action.NOOP),
    ]
    held = drift.hold(changes, evidence, members={WEB, gone, CM})
    assert [c.key for c in held.changes] == [new, repair, CM]
    assert held.held[WEB] == evidence[WEB]
    assert held.held[gone] == (Drift(gone, DriftKind.DELETED),)
    assert "not re-created" in drift.held_message(held.held[gone])
    assert (
        drift.held_message(held.held[WEB])
        == 'drift reported, not corrected (drift = "report"): spec.replicas'
    )


def test_a_new_revision_says_which_drift_its_apply_overwrote() -> None:
    by_hand = Drift(WEB, DriftKind.CHANGED, "spec.replicas", 2, 5, "kubectl-edit", evidence=Evidence.OWNER)
    removed = Drift(WEB, DriftKind.CHANGED, "spec.paused", True, None, "x", evidence=Evidence.LATEST)
    gone = ObjectKey("", "ConfigMap", "shop", "gone")
    changes = [_change(WEB, Action.UPDATE), _change(gone, Action.CREATE), _change(CM, Action.UPDATE)]
    evidence = {
        WEB: (by_hand, removed),
        CM: (Drift(CM, DriftKind.CHANGED, "data.a", evidence=Evidence.OWNER),),
    }
    out = drift.corrected(changes, evidence, members={gone}, applied={WEB, gone})
    assert [(d.key, d.path, d.fate) for d in out] == [
        (WEB, "spec.replicas", DriftFate.CORRECTED),  # a field nobody owns may be Git's own change
        (gone, "", DriftFate.CORRECTED),
    ]


def _result(*found: Drift) -> ClusterResult:
    return ClusterResult("prod", "a" * 40, app="web", drift=list(found))


def test_the_drift_alert_fires_once_is_never_reminded_of_and_resolves_once() -> None:
    d = Drift(WEB, DriftKind.CHANGED, "spec.replicas", 2, 5, "kubectl-edit", "Update", time="T1")
    state, sent = ClusterState(), []
    for at in (0.0, 10.0, 20.0):
        (obs,) = [o for o in pass_observations(_result(d)) if o.condition is Condition.DRIFT]
        state, out = observe(state, obs, at, ALERT_DEFAULTS)
        sent += out
        state, out = remind(state, "prod", at + 100_000.0, ALERT_DEFAULTS)
        sent += out
    assert [(n.kind, n.reason) for n in sent] == [(NoticeKind.FIRING, "DriftDetected")]
    assert "kubectl-edit (Update) at T1" in sent[0].message
    (obs,) = [o for o in pass_observations(_result()) if o.condition is Condition.DRIFT]
    state, out = observe(state, obs, 30.0, ALERT_DEFAULTS)
    assert [(n.kind, n.reason, n.message) for n in out] == [
        (NoticeKind.RESOLVED, "DriftResolved", "no drift left")
    ]
    corrected = Drift(WEB, DriftKind.CHANGED, "spec.replicas", fate=DriftFate.CORRECTED)
    (obs,) = [o for o in pass_observations(_result(corrected)) if o.condition is Condition.DRIFT]
    assert not obs.bad and obs.message.startswith("drift corrected by revision aaaaaaaaaaaa on 1 object")


def test_run_once_table_says_drift_was_reported_and_names_each_field_and_who() -> None:
    """A `drift = "report"` pass that left drift is not a plain "ok": the STATUS cell says so and a
    line per field names the values and the writer (what `gitops-agent status` shows)."""
    key = ObjectKey("", "ConfigMap", "trial", "settings")
    drift = Drift(
        key,
        DriftKind.CHANGED,
        "data.mode",
        git="prod",
        live="debug",
        manager="kubectl-patch",
        operation="Update",
        time="2026-12-06T06:55:43Z",
        evidence=Evidence.OWNER,
    )
    result = ClusterResult("dev", "f2a141edd34d", app="web", drift=[drift])
    lines = format_summary([result]).splitlines()
    assert lines[1].endswith("ok (drift reported in 1 object(s), not corrected)"), lines
    assert lines[2] == (
        '  dev/web: drift reported: ConfigMap/trial/settings: data.mode: Git "prod", live "debug", '
        "by kubectl-patch (Update) at 2026-12-06T06:55:43Z"
    ), lines
