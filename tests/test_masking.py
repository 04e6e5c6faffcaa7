"""Secret masking (agent/plan/masking.py): which keys changed is shown, values never are."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
import structlog.testing

from agent.config.load import load_config
from agent.model import DECRYPTED_FIELDS, ApplyResult, ClusterResult, ObjectKey, Outcome
from agent.plan.masking import (
    LAST_APPLIED,
    MASK,
    MASK_AFTER,
    MASK_BEFORE,
    mask_pair,
    mask_secret,
    mask_value,
    masks_of,
)
from agent.report import events
from agent.report.diff_fields import diff_objects, scrub, secret_strings
from agent.run.fleet import Fleet

SECRET: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "db", "annotations": {LAST_APPLIED: '{"data":{"p":"c2VjcmV0"}}', "note": "kept"}},
    "data": {"p": "c2VjcmV0", "u": "YWRtaW4="},
}


def test_masks_every_value_and_the_last_applied_annotation() -> None:
    masked = mask_secret(SECRET)
    assert masked["data"] == {"p": MASK, "u": MASK}
    assert masked["metadata"]["annotations"] == {LAST_APPLIED: MASK, "note": "kept"}
    assert SECRET["data"]["p"] == "c2VjcmV0", "the input is not modified"


def test_a_pair_says_which_keys_changed_without_their_values() -> None:
    after = json.loads(json.dumps(SECRET))
    after["data"]["p"] = "bmV3"
    after["data"]["n"] = "YWRkZWQ="
    del after["data"]["u"]
    before_m, after_m = mask_pair(SECRET, after)
    assert before_m["data"] == {"p": MASK_BEFORE, "u": MASK}
    assert after_m["data"] == {"p": MASK_AFTER, "n": MASK}
    text = json.dumps([before_m, after_m])
    assert "c2VjcmV0" not in text and "bmV3" not in text and "YWRtaW4=" not in text


def test_other_kinds_and_paths_are_left_alone() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}}
    assert mask_secret(cm) is cm
    assert mask_value(("f:data", "f:a"), "b", secret=False) == "b"
    assert mask_value(("f:data", "f:a"), "b", secret=True) == MASK
    assert mask_value(("f:type",), "Opaque", secret=True) == "Opaque"


# ---------------------------------------------------------------------------
# Fields decrypted from Git (SOPS) on any kind: the render lists them in an annotation.

DECRYPTED: dict[str, Any] = {
    "apiVersion": "example.com/v1",
    "kind": "Database",
    "metadata": {"name": "db", "annotations": {DECRYPTED_FIELDS: '["/spec/auth/password","/spec/hosts"]'}},
    "spec": {"auth": {"password": "pw-SENTINEL", "user": "app"}, "hosts": ["h1-SENTINEL"], "size": 3},
}


def test_decrypted_fields_are_masked_on_any_kind_and_the_rest_is_shown() -> None:
    masked = mask_secret(DECRYPTED)
    assert masked["spec"] == {"auth": {"password": MASK, "user": "app"}, "hosts": MASK, "size": 3}
    assert DECRYPTED["spec"]["auth"]["password"] == "pw-SENTINEL", "the input is not modified"


def test_the_annotation_on_either_version_masks_both_and_says_what_changed() -> None:
    """A live object keeps the annotation once applied: a view of it alone (a prune) is masked too."""
    live = json.loads(json.dumps(DECRYPTED))
    git = json.loads(json.dumps(DECRYPTED))
    del git["metadata"]["annotations"]
    git["spec"]["auth"]["password"] = "new-SENTINEL"
    before, after = mask_pair(live, git)
    assert (before["spec"]["auth"]["password"], after["spec"]["auth"]["password"]) == (
        MASK_BEFORE,
        MASK_AFTER,
    )
    assert before["spec"]["hosts"] == after["spec"]["hosts"] == MASK
    assert "SENTINEL" not in json.dumps([before, after])


def test_a_conflict_value_inside_or_around_a_decrypted_field_is_masked() -> None:
    masks = masks_of(DECRYPTED)
    assert mask_value(("f:spec", "f:auth", "f:password"), "pw", secret=masks) == MASK
    assert mask_value(("f:spec", "f:auth"), {"password": "pw"}, secret=masks) == {"password": MASK}
    assert mask_value(("f:spec", "f:hosts"), ["h1"], secret=masks) == MASK
    assert mask_value(("f:spec", "f:size"), 3, secret=masks) == 3
    assert mask_value(("f:spec", "f:auth", "f:user"), "app", secret=masks) == "app"


def test_a_diff_report_and_its_messages_never_show_a_decrypted_value() -> None:
    after = json.loads(json.dumps(DECRYPTED))
    after["spec"]["auth"]["password"] = "new-SENTINEL"
    after["spec"]["size"] = 4
    text, fields = diff_objects(DECRYPTED, after, from_label="live", to_label="git")
    assert "SENTINEL" not in text + repr(fields)
    assert "size: 4" in text and "password" in text
    secrets = secret_strings([DECRYPTED, after])
    assert scrub('spec.auth.password: Invalid value: "new-SENTINEL"', secrets) == (
        'spec.auth.password: Invalid value: "***"'
    )


def test_an_event_for_a_failed_object_with_decrypted_fields_carries_the_status_only() -> None:
    key = ObjectKey("example.com", "Database", "ns", "db")
    failed = ApplyResult(
        key, Outcome.FAILED, status=422, message='Invalid value: "pw-SENTINEL"', sensitive=True
    )
    assert events.message_for(failed) == "Database.example.com/ns/db: HTTP 422"


# ---------------------------------------------------------------------------
# docs/safety.md rule 11 beyond plans: a failed Secret's server message (which may quote a value) reaches
# neither the Kubernetes Events nor the agent's per-object log lines.

SECRET_VALUE = "hunter2-xyzzy"
SECRET_KEY = ObjectKey("", "Secret", "ns", "s")


def _failed_secret() -> ApplyResult:
    return ApplyResult(
        SECRET_KEY,
        Outcome.FAILED,
        status=422,
        message=f'Secret "s" is invalid: data[password]: Invalid value: "{SECRET_VALUE}": too long',
    )


def _result(*results: ApplyResult) -> ClusterResult:
    return ClusterResult("a", "0123456789abcdef0123", results=list(results))


def test_an_event_for_a_failed_secret_carries_the_status_not_the_servers_message() -> None:
    secret = _failed_secret()
    configmap = replace(secret, key=ObjectKey("", "ConfigMap", "ns", "c"))
    assert events.message_for(secret) == "Secret/ns/s: HTTP 422"
    # The same message for any other kind is passed on: the Secret is what makes the difference.
    assert SECRET_VALUE in events.message_for(configmap)


def test_the_fleets_per_object_log_line_for_a_failed_secret_does_not_quote_its_value(tmp_path: Path) -> None:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    (tmp_path / "agent.toml").write_text(
        '[source]\nurl = "https://git.example.com/fleet.git"\n\n'
        '[[clusters]]\nname = "a"\nkubeconfig = "kc"\npath = "clusters/a"\n'
    )
    fleet = Fleet(load_config(tmp_path / "agent.toml"), emit_events=False)
    configmap = replace(_failed_secret(), key=ObjectKey("", "ConfigMap", "ns", "c"))
    with structlog.testing.capture_logs() as logs:
        fleet.record(_result(_failed_secret(), configmap))
    lines = [e for e in logs if e["event"] == "object failed"]
    assert [e["object"] for e in lines] == ["Secret/ns/s", "ConfigMap/ns/c"]
    assert lines[0]["log_level"] == "warning" and "HTTP 422" in lines[0]["detail"]
    assert SECRET_VALUE in lines[1]["detail"], "a ConfigMap's message is logged: the check below can fail"
    assert SECRET_VALUE not in repr([e for e in logs if e is not lines[1]])
