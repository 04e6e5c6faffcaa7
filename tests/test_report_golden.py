"""Golden files of a multi-cluster report built from typed values, in every format.

The report comes from ``tests/fixtures/report/state.yaml``: real ``Change``s
planned by ``plan_object`` from desired/live pairs (an image update with an
HPA-owned ``spec.replicas`` yielded, a released label and a foreign label, a
masked Secret forced over ``kubectl-edit``, a create, a prune, a conflict-only
object, an object the server rejected, a prune kept by the brake), a
cluster that failed, and a cluster with two apps declaring one object alike
(a heading per app; the conflict flagged in both, naming both apps and files).
The "after" side stands for the server's dry-run result (the plan's expected
object). Regenerate with ``UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from agent.config.types import DEFAULT_CONFLICT_RULES
from agent.model import DesiredObject, ObjectKey, Provenance
from agent.plan.planner import PlanOptions, expected_object, plan_object
from agent.plan.schema import SchemaIndex
from agent.report.diff import (
    Preview,
    change_report,
    flag_app_conflicts,
    new_object,
    pruned_report,
    sort_objects,
)
from agent.report.format import render_json, render_markdown, render_text
from agent.report.model import (
    SCHEMA_VERSION,
    AppReport,
    ClusterReport,
    Mode,
    ObjectAction,
    ObjectReport,
    Report,
    RevisionInfo,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "report"
SCHEMA = SchemaIndex.from_openapi_v3(
    [yaml.safe_load((Path(__file__).parent / "fixtures" / "plan" / "_openapi.yaml").read_text())]
)
SECRET_VALUES = ("hunter2-old", "hunter2-new", "aHVudGVyMi1vbGQ=", "aHVudGVyMi1uZXc=", "YWRtaW4=")
SHA = "0123456789abcdef0123456789abcdef01234567"


def _app(name: str, where: str, c: dict[str, Any], options: PlanOptions) -> Preview:
    """One app's part, from its desired/live pairs, prunes and kept objects in state.yaml."""
    objects: list[ObjectReport] = []
    declared: dict[ObjectKey, DesiredObject] = {}
    unchanged = 0
    for o in c.get("objects", []):
        m = o["desired"]
        desired = DesiredObject(m, Provenance(f"clusters/{where}/{m['metadata']['name']}.yaml", 0, 1))
        declared[desired.key] = desired
        change = plan_object(desired, o["live"], options)
        after = expected_object(desired, o["live"], options)
        if change.action.value == "noop":
            unchanged += 1
            continue
        rejected = o.get("rejected")
        objects.append(
            change_report(
                change,
                o["live"],
                after,
                basis="plan" if rejected else "server",
                to_label="plan" if rejected else "server dry-run",
                error=rejected,
            )
        )
    for live in c.get("prunes", []):
        objects.append(pruned_report(ObjectKey.of(live), live))
    for k in c.get("kept", []):
        kind, ns, n = k["key"]
        objects.append(new_object(ObjectKey("", kind, ns, n), "v1", ObjectAction.KEEP, reason=k["reason"]))
    report = AppReport(
        name, objects=sort_objects(objects), unchanged=unchanged, prune_refused=c.get("prune_refused")
    )
    return Preview(report, declared)


def build_report() -> Report:
    spec = yaml.safe_load((FIXTURES / "state.yaml").read_text())
    options = PlanOptions(field_manager="gitops-agent", rules=DEFAULT_CONFLICT_RULES, schema=SCHEMA)
    clusters: list[ClusterReport] = []
    for c in spec["clusters"]:
        if c.get("error"):
            clusters.append(ClusterReport.single(c["name"], error=c["error"]))
        elif "apps" in c:
            parts = [_app(a["name"], f"{c['name']}/{a['name']}", a, options) for a in c["apps"]]
            clusters.append(ClusterReport(c["name"], flag_app_conflicts(parts, skip_others=True)))
        else:
            clusters.append(ClusterReport(c["name"], (_app(c["name"], c["name"], c, options).report,)))
    return Report(Mode.LIVE, RevisionInfo("main", SHA), tuple(clusters), field_manager="gitops-agent")


def _check_golden(name: str, text: str) -> None:
    path = FIXTURES / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"golden file {path} missing: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize(
    ("name", "render"),
    [
        ("multi-cluster.md", lambda r: render_markdown(r)),
        ("multi-cluster.json", render_json),
        ("multi-cluster.txt", lambda r: render_text(r, color=False)),
    ],
)
def test_multi_cluster_report_matches_its_golden_file(name: str, render: Any) -> None:
    _check_golden(name, render(build_report()))


def test_golden_report_covers_every_case_the_issue_names() -> None:
    report = build_report()
    eu, us, staging, _shared = report.clusters
    by = {o.key: o for o in eu.objects}
    web = by["Deployment.apps/shop/web"]
    assert web.action is ObjectAction.UPDATE
    assert "-          image: nginx:1.27" in web.diff and "+          image: nginx:1.28" in web.diff
    assert [(c.path, c.manager, c.subresource, c.resolution) for c in web.conflicts] == [
        ("spec.replicas", "kube-controller-manager", "scale", "yield")
    ]
    assert [(r.path, r.removed) for r in web.released] == [("metadata.labels.tier", True)]
    assert "team" not in web.diff  # a foreign label is never shown as a removal
    assert "-    tier: frontend" in web.diff
    assert by["ConfigMap/shop/flags"].action is ObjectAction.CREATE
    assert by["ConfigMap/shop/legacy"].action is ObjectAction.PRUNE
    assert by["Secret/shop/db"].conflicts[0].manager == "kubectl-edit"
    assert us.apps[0].error and us.errors == 1 and not us.objects
    assert staging.objects[0].error and staging.objects[0].key == "Deployment.apps/shop/api"
    assert {o.action for o in staging.objects} >= {ObjectAction.KEEP}
    assert report.totals() == {
        "created": 3,
        "updated": 2,
        "pruned": 1,
        "conflicts": 5,
        "yielded": 2,
        "errors": 2,
    }
    assert report.exit_code == 2


def test_a_cluster_with_two_apps_reports_each_app_and_flags_the_object_both_declare() -> None:
    shared = build_report().clusters[3]
    infra, web = shared.apps
    assert (infra.name, web.name) == ("infra", "web")
    common = next(o for o in infra.objects if o.name == "common")
    assert common.action is ObjectAction.CREATE  # first in config order, held by neither: infra's
    theirs = next(o for o in web.objects if o.name == "common")
    assert theirs.action is ObjectAction.SKIP and "'infra' manages it" in theirs.reason
    for o in (common, theirs):
        (c,) = o.app_conflicts
        assert (c.holder, c.holder_file) == ("infra", "clusters/shared/infra/common.yaml")
        assert (c.other, c.other_file) == ("web", "clusters/shared/web/common.yaml")
    assert shared.count(ObjectAction.CREATE) == 2  # the object both declare is created once
    md = render_markdown(build_report())
    assert md.index("#### shared") < md.index("##### App `infra`") < md.index("##### App `web`")
    assert "##### App `prod-eu`" not in md  # a cluster's own app alone: no app heading


def test_secret_values_never_appear_in_any_format_of_the_golden_report() -> None:
    report = build_report()
    outputs = [
        render_markdown(report),
        render_json(report),
        render_text(report),
        render_text(report, color=True),
    ]
    for text in outputs:
        for value in SECRET_VALUES:
            assert value not in text
    db = next(o for o in report.clusters[0].objects if o.kind == "Secret")
    assert "*** (before)" in db.diff and "*** (after)" in db.diff


def test_json_report_follows_the_documented_versioned_schema() -> None:
    schema = json.loads((ROOT / "docs" / "report-schema.json").read_text())
    doc = json.loads(render_json(build_report()))
    assert doc["schemaVersion"] == SCHEMA_VERSION == schema["properties"]["schemaVersion"]["const"]
    jsonschema.validate(doc, schema)
