"""The pure cores of `events`, `tree` and `wait`, and the JSON shapes they print.

No cluster: a `/status` document, Events and records, and objects written here. The same
commands on real API servers are tests/test_cli_verbs.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent.cli.output import results_json, table
from agent.model import ClusterResult, HealthState, ObjectKey
from agent.report.events import split_message
from agent.report.tree import build, format_tree
from agent.run.wait_for import Goal, Verdict, answer
from agent.ui.records import AppRecord, EventEntry, PassEntry
from agent.ui.timeline import EntryKind, timeline

SHA1, SHA2 = "a" * 40, "b" * 40


def status(**row: Any) -> dict[str, Any]:
    base = {
        "cluster": "prod",
        "app": "web",
        "state": "ok",
        "revision": SHA1,
        "result": "ok",
        "error": None,
        "waiting_on": [],
        "prune_reason": None,
        "prune_refused": None,
        "refused": None,
        "health": None,
        "source": "default",
        "follows_health": True,
    }
    return {
        "revision": SHA1,
        "sources": [{"name": "default", "revision": SHA1}],
        "clusters": [{**base, **row}],
    }


@pytest.mark.parametrize(
    ("row", "goal", "revision", "verdict"),
    [
        ({}, Goal.SYNCED, "", Verdict.REACHED),
        ({}, Goal.SYNCED, SHA1[:7], Verdict.REACHED),
        ({}, Goal.SYNCED, SHA2, Verdict.PENDING),
        ({"state": "running"}, Goal.SYNCED, SHA2, Verdict.PENDING),
        ({"result": "failed", "error": "render: bad\nmore"}, Goal.SYNCED, SHA1, Verdict.FAILED),
        ({"result": "failed", "revision": SHA2}, Goal.SYNCED, SHA1, Verdict.PENDING),
        ({"prune_reason": "brake", "prune_refused": "held"}, Goal.SYNCED, "", Verdict.FAILED),
        ({"prune_reason": "suspended"}, Goal.SYNCED, "", Verdict.PENDING),
        ({"prune_reason": "disabled"}, Goal.SYNCED, "", Verdict.REACHED),
        ({"waiting_on": ["infra"]}, Goal.SYNCED, "", Verdict.PENDING),
        ({}, Goal.HEALTHY, "", Verdict.PENDING),
        ({"follows_health": False}, Goal.HEALTHY, "", Verdict.UNANSWERABLE),
        ({"health": {"state": "Current", "revision": SHA1}}, Goal.HEALTHY, "", Verdict.REACHED),
        ({"health": {"state": "Current", "revision": SHA2}}, Goal.HEALTHY, "", Verdict.PENDING),
        ({"health": {"state": "InProgress", "revision": SHA1}}, Goal.HEALTHY, "", Verdict.PENDING),
        (
            {"health": {"state": "Failed", "revision": SHA1, "blocker": "Pod x"}},
            Goal.HEALTHY,
            "",
            Verdict.FAILED,
        ),
    ],
)
def test_wait_answers_from_one_status_document(
    row: dict[str, Any], goal: Goal, revision: str, verdict: Verdict
) -> None:
    got = answer(status(**row), "prod", "web", goal, revision)
    assert got.verdict is verdict, got.message


def test_wait_names_the_apps_and_clusters_it_knows_for_an_unknown_one() -> None:
    doc = status()
    got = answer(doc, "prod", "api", Goal.SYNCED)
    assert got.verdict is Verdict.UNANSWERABLE and "its apps: web" in got.message
    got = answer(doc, "staging", "web", Goal.SYNCED)
    assert got.verdict is Verdict.UNANSWERABLE and "its clusters: prod" in got.message


def test_wait_without_a_revision_follows_the_apps_own_source() -> None:
    doc = status(source="charts")
    doc["sources"].append({"name": "charts", "revision": SHA2})
    assert answer(doc, "prod", "web", Goal.SYNCED).verdict is Verdict.PENDING
    doc["sources"][1]["revision"] = None
    got = answer(doc, "prod", "web", Goal.SYNCED)
    assert got.verdict is Verdict.PENDING and "no revision yet" in got.message


def test_an_events_message_splits_into_its_revision_and_its_text() -> None:
    assert split_message("revision abcdef012345 app web: ConfigMap/ns/x") == (
        "abcdef012345",
        "ConfigMap/ns/x",
    )
    assert split_message("revision abcdef012345: Failed: Pod x") == ("abcdef012345", "Failed: Pod x")
    assert split_message("something else: entirely") == ("", "something else: entirely")


def test_timeline_is_newest_first_and_says_a_recorded_event_once() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def at(minutes: int) -> str:
        return (t0 + timedelta(minutes=minutes)).isoformat()

    live = {
        "type": "Normal",
        "reason": "Pruned",
        "message": f"revision {SHA2[:12]} app web: ConfigMap/ns/old",
        "lastTimestamp": "2026-01-01T00:03:00Z",
        "count": 2,
    }
    record = AppRecord(
        "prod",
        "web",
        history=(
            PassEntry(at(1), SHA1, "first", "ok", 0.5, applied=2),
            PassEntry(at(3), SHA2, "second", "failed", 0.2, failed=1, error="1 object failed"),
        ),
        events=(
            EventEntry(at(3), "Normal", "Pruned", "ConfigMap/ns/old", SHA2, "ConfigMap/ns/old"),
            EventEntry(at(0), "Warning", "ApplyFailed", "ConfigMap/ns/x: HTTP 422", SHA1, "ConfigMap/ns/x"),
        ),
    )
    entries = timeline({"web": [live]}, {"web": record})
    said = [(e.kind, e.reason, e.revision) for e in entries]
    assert said[-1] == (EntryKind.EVENT, "ApplyFailed", SHA1[:12])  # kept only by the record
    assert said.count((EntryKind.EVENT, "Pruned", SHA2[:12])) == 1  # live and recorded: once
    assert [e.at for e in entries] == sorted((e.at for e in entries), reverse=True)
    doc = entries[0].to_json()
    assert set(doc) == {"at", "app", "kind", "type", "reason", "revision", "message", "count"}
    failed = next(e for e in entries if e.kind is EntryKind.PASS and e.reason == "failed")
    assert failed.type == "Warning" and failed.message.endswith(": 1 object failed")


def _obj(kind: str, name: str, uid: str, owner: str = "", **status: Any) -> dict[str, Any]:
    api = {"Deployment": "apps/v1", "ReplicaSet": "apps/v1"}.get(kind, "v1")
    meta: dict[str, Any] = {"name": name, "namespace": "shop", "uid": uid}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "kind": "x", "name": "x", "apiVersion": "v1"}]
    return {"apiVersion": api, "kind": kind, "metadata": meta, "status": status}


def test_tree_puts_children_under_their_owners_with_health() -> None:
    web = ObjectKey("apps", "Deployment", "shop", "web")
    gone = ObjectKey("", "ConfigMap", "shop", "gone")
    unread = ObjectKey("example.com", "Widget", "shop", "w")
    ns = ObjectKey("", "Namespace", "", "shop")
    deployment = _obj("Deployment", "web", "d1")
    rs = _obj("ReplicaSet", "web-1", "r1", owner="d1")
    pod = _obj("Pod", "web-1-a", "p1", owner="r1", phase="Pending")
    stranger = _obj("Pod", "other", "p9", owner="zz")
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop", "uid": "n1"}}
    nodes = build(
        {web: deployment, gone: None, ns: namespace}, {unread: "not read: HTTP 403"}, [rs, pod, stranger]
    )
    assert [n.key for n in nodes] == [ns, gone, web, unread]  # cluster-scoped first
    assert nodes[1].health is not None and nodes[1].health.state is HealthState.NOT_FOUND
    assert nodes[3].health is not None and nodes[3].health.state is HealthState.UNKNOWN
    (child,) = nodes[2].children
    assert child.key.kind == "ReplicaSet" and [c.key.name for c in child.children] == ["web-1-a"]
    doc = nodes[2].to_json()
    assert set(doc) == {"group", "kind", "namespace", "name", "uid", "member", "health", "children"}
    assert doc["children"][0]["children"][0]["member"] is False
    assert set(doc["health"]) == {"state", "reason", "message", "blocker"}
    lines = table(format_tree(nodes))
    assert lines[0].split() == ["NAMESPACE", "NAME", "HEALTH", "REASON", "MESSAGE"]
    assert "└─ReplicaSet/web-1" in lines[4] and "  └─Pod/web-1-a" in lines[5]


def test_run_once_json_is_a_status_row_of_each_app() -> None:
    r = ClusterResult("prod", SHA1, app="web")
    (row,) = results_json([r])["results"]
    assert row["cluster"] == "prod" and row["app"] == "web" and row["result"] == "ok"
    assert "consecutive_failures" not in row and "health" in row


def test_the_daemon_refuses_an_output_format_it_would_ignore() -> None:
    from click.testing import CliRunner

    from agent.cli.main import main

    out = CliRunner().invoke(main, ["run", "--config", "agent.toml", "-o", "json"])
    assert out.exit_code == 2 and "-o apply to one pass: add --once" in out.output
