"""The decisions behind apps, without a cluster: membership before field ownership, who holds an
object two apps declare, dependency order, which apps a scheduled pass runs, and the tables."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.config.load import load_config
from agent.config.types import Adopt, Config
from agent.errors import RenderError, RenderProblem
from agent.model import (
    PART_OF,
    Action,
    AppConflict,
    ApplyResult,
    ClusterResult,
    DesiredObject,
    Failure,
    FailureReason,
    ObjectKey,
    Outcome,
    PassState,
    Provenance,
    Revision,
    SkipReason,
)
from agent.plan.planner import PlanOptions, plan_object
from agent.reconcile.apps import Declared, assign, dependency_order, with_dependencies
from agent.report.summary import format_summary
from agent.run.fleet import Fleet

MANAGER = "gitops-agent"
KEY = ObjectKey("", "ConfigMap", "shop", "settings")


def _desired(set_id: str) -> DesiredObject:
    meta = {"name": "settings", "namespace": "shop", "labels": {PART_OF: set_id}}
    return DesiredObject(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}, Provenance("a.yaml")
    )


def _live(set_id: str) -> dict[str, Any]:
    """Applied by this agent's field manager (every app of an agent shares it) into ``set_id``."""
    owned = {"f:data": {"f:k": {}}, "f:metadata": {"f:labels": {f"f:{PART_OF}": {}}}}
    entry = {
        "manager": MANAGER,
        "operation": "Apply",
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": owned,
    }
    meta = {
        "name": "settings",
        "namespace": "shop",
        "uid": "u1",
        "resourceVersion": "7",
        "labels": {PART_OF: set_id},
        "managedFields": [entry],
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}


def _options(**kw: Any) -> PlanOptions:
    return PlanOptions(field_manager=MANAGER, rules=(), membership_label=(PART_OF, "mine"), **kw)


@pytest.mark.parametrize("adopt", list(Adopt))
def test_a_member_of_another_apps_set_is_never_adopted_though_our_field_manager_applied_it(
    adopt: Adopt,
) -> None:
    change = plan_object(
        _desired("mine"), _live("theirs"), _options(adopt=adopt, protected=frozenset({"theirs"}))
    )
    assert change.action is Action.SKIP and change.skip is SkipReason.OTHER_SET, change
    assert "theirs" in change.reason


def test_a_member_of_a_set_this_app_takes_over_is_adopted_in_place() -> None:
    change = plan_object(_desired("mine"), _live("theirs"), _options(handover_from=frozenset({"theirs"})))
    assert change.action is Action.UPDATE and change.uid == "u1", change
    assert change.body is not None and change.body["metadata"]["labels"][PART_OF] == "mine"


def test_a_member_of_an_unknown_set_is_refused_unless_adopt_is_always_whoever_applied_it() -> None:
    refused = plan_object(_desired("mine"), _live("another-agents"), _options())
    assert refused.action is Action.SKIP and refused.skip is SkipReason.OTHER_SET, refused
    taken = plan_object(_desired("mine"), _live("another-agents"), _options(adopt=Adopt.ALWAYS))
    assert taken.action is Action.UPDATE, taken


def test_our_own_member_is_planned_as_before() -> None:
    assert plan_object(_desired("mine"), _live("mine"), _options()).action is Action.NOOP


def _d(*apps: str) -> list[Declared]:
    return [Declared(a, f"apps/{a}/x.yaml") for a in apps]


@pytest.mark.parametrize(
    ("declared", "holder", "known", "owner"),
    [
        (("a", "b"), None, {"a", "b"}, "a"),  # held by nobody: first in config order
        (("a", "b"), "b", {"a", "b"}, "b"),  # the holder keeps it: no flip-flop
        (("b",), "a", {"a", "b"}, "b"),  # handover: the holder no longer declares it
        (("b",), "a", {"b"}, None),  # the holder's declarations are unknown: nobody takes it
        (("b", "a"), "a", {"a", "b"}, "a"),  # the holder keeps it though later in config order
    ],
)
def test_the_holder_keeps_what_it_declares_and_hands_over_what_it_no_longer_declares(
    declared: tuple[str, ...], holder: str | None, known: set[str], owner: str | None
) -> None:
    got = assign(KEY, _d(*declared), holder, known)
    assert got.owner == owner, got
    others = [a for a in declared if a != owner]
    if owner is not None and others:
        assert [(c.holder, c.other) for c in got.conflicts] == [(owner, o) for o in others]
        assert f"apps/{owner}/x.yaml" in got.reason and f"apps/{others[0]}/x.yaml" in got.reason


def _config(tmp_path: Path, apps: str) -> Config:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    (tmp_path / "agent.toml").write_text(
        '[source]\nurl = "https://git.example.com/fleet.git"\n\n'
        '[[clusters]]\nname = "c"\nkubeconfig = "kc"\n' + apps
    )
    return load_config(tmp_path / "agent.toml")


APPS = """
[[apps]]
name = "web"
cluster = "c"
path = "apps/web"
depends_on = ["infra"]
reconcile_interval = "10m"

[[apps]]
name = "infra"
cluster = "c"
path = "apps/infra"
reconcile_interval = "1m"

[[apps]]
name = "batch"
cluster = "c"
path = "apps/batch"
"""


def test_dependencies_come_first_and_run_unless_they_succeeded_at_their_revision(tmp_path: Path) -> None:
    cfg = _config(tmp_path, APPS)
    apps = cfg.apps_of("c")
    assert [a.name for a in dependency_order(apps)] == ["infra", "web", "batch"]
    rev = {"default": Revision("1" * 40, "main", tmp_path)}
    assert with_dependencies(apps, ["web"], {}, rev) == {"web", "infra"}
    assert with_dependencies(apps, ["web"], {"infra": "1" * 40}, rev) == {"web"}
    assert with_dependencies(apps, ["web"], {"infra": "0" * 40}, rev) == {"web", "infra"}


def _result(app: str, revision: str, *, failed: bool = False, waiting: tuple[str, ...] = ()) -> ClusterResult:
    failure = Failure(FailureReason.RENDER, "broken") if failed else None
    now = datetime.now(UTC)
    return ClusterResult(
        "c", revision, failure=failure, app=app, waiting_on=waiting, started=now, finished=now
    )


def test_a_scheduled_pass_runs_the_apps_that_are_due_each_on_its_own_interval_and_backoff(
    tmp_path: Path,
) -> None:
    fleet = Fleet(_config(tmp_path, APPS), emit_events=False)
    rev = Revision("1" * 40, "main", tmp_path)
    assert fleet.due_apps("c", rev) == ["web", "infra", "batch"]  # never ran
    st = fleet.status["c"]
    for app in ("web", "infra", "batch"):
        st.app(app).last_run = 1000.0
    fleet.record(_result("web", rev.sha, waiting=("infra",)))
    fleet.record(_result("infra", rev.sha, failed=True))
    fleet.record(_result("batch", rev.sha))
    assert st.app("web").state is PassState.WAITING and st.app("web").failures == 0
    # 5 s later: infra's first backoff (base 10 s) is not over, and web, waiting on it, is due
    # with it (not before: web's pass would run infra too, before its backoff is over).
    assert fleet.due_apps("c", rev, now=1005.0, base=10.0) == []
    assert fleet.due_apps("c", rev, now=1011.0, base=10.0) == ["web", "infra"]
    fleet.record(_result("web", rev.sha))
    fleet.record(_result("infra", rev.sha))
    # Healthy: each on its own interval (infra 1m, batch 5m by default, web 10m).
    assert fleet.due_apps("c", rev, now=1000.0 + 61) == ["infra"]
    assert fleet.due_apps("c", rev, now=1000.0 + 301) == ["infra", "batch"]
    assert fleet.due_apps("c", rev, now=1000.0 + 601) == ["web", "infra", "batch"]
    # A new revision makes every app due at once.
    assert fleet.due_apps("c", Revision("2" * 40, "main", tmp_path), now=1001.0) == ["web", "infra", "batch"]
    rows = st.rows()
    assert [(r["cluster"], r["app"], r["state"]) for r in rows] == [
        ("c", "web", "ok"),
        ("c", "infra", "ok"),
        ("c", "batch", "ok"),
    ]


def test_the_summary_has_an_app_column_once_a_config_has_apps_and_names_both_apps_of_a_conflict() -> None:
    key = ObjectKey("", "ConfigMap", "shop", "settings")
    conflict = AppConflict(key, "infra", "apps/infra/a.yaml", "web", "apps/web/b.yaml")
    rows = [
        ClusterResult("c", "1" * 40, app="infra", conflicts=[conflict]),
        ClusterResult("c", "1" * 40, app="web", waiting_on=("infra",)),
    ]
    text = format_summary(rows)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["CLUSTER", "APP", "REVISION"]
    assert lines[1].split()[:2] == ["c", "infra"] and lines[2].endswith("waiting on infra")
    assert "apps/infra/a.yaml" in text and "apps/web/b.yaml" in text
    only_clusters = format_summary([ClusterResult("c", "1" * 40, app="c")])
    assert only_clusters.splitlines()[0].split()[:2] == ["CLUSTER", "REVISION"]


def test_the_summary_names_an_object_left_to_another_set_so_ok_never_hides_it() -> None:
    key = ObjectKey("apps", "Deployment", "default", "guestbook-ui")
    why = "belongs to another set (applyset.kubernetes.io/part-of=applyset-x-v1); adopt = if-unowned refuses"
    skipped = ClusterResult(
        "prod", "1" * 40, app="guestbook", results=[ApplyResult(key, Outcome.SKIPPED, message=why)]
    )
    text = format_summary([skipped])
    assert f"  prod/guestbook: {key}: skipped: {why}" in text.splitlines()


def test_an_apps_render_error_names_the_app_and_its_cluster() -> None:
    problem = RenderProblem("helm-guestbook", "helm chart directory has no Chart.yaml")
    assert str(RenderError([problem], cluster="prod", app="helm")).startswith(
        "render of app 'helm' on cluster 'prod' failed"
    )
    # A cluster entry's own app is named after the entry: the message is the one before apps.
    assert str(RenderError([problem], cluster="prod", app="prod")).startswith(
        "render of cluster 'prod' failed"
    )
