"""Golden files of a multi-cluster report built from typed values, in every format.

The report comes from ``tests/fixtures/report/state.yaml``: real ``Change``s
planned by ``plan_object`` from desired/live pairs (an image update with an
HPA-owned ``spec.replicas`` yielded, a released label and a foreign label, a
masked Secret forced over ``kubectl-edit``, a create, a prune, a conflict-only
object, an object the server rejected, a prune kept by the brake) and a
cluster that failed. The "after" side stands for the server's dry-run result
(the plan's expected object). Regenerate with ``UPDATE_GOLDEN=1``.
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
from agent.report.diff import change_report, new_object, pruned_report, sort_objects
from agent.report.format import render_json, render_markdown, render_text
from agent.report.model import (
    SCHEMA_VERSION,
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


def build_report() -> Report:
    spec = yaml.safe_load((FIXTURES / "state.yaml").read_text())
    options = PlanOptions(field_manager="gitops-agent", rules=DEFAULT_CONFLICT_RULES, schema=SCHEMA)
    clusters: list[ClusterReport] = []
    for c in spec["clusters"]:
        if c.get("error"):
            clusters.append(ClusterReport(c["name"], error=c["error"]))
            continue
        objects: list[ObjectReport] = []
        unchanged = 0
        for o in c.get("objects", []):
            m = o["desired"]
            desired = DesiredObject(m, Provenance(f"clusters/{c['name']}/{m['metadata']['name']}.yaml", 0, 1))
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
            kind, ns, name = k["key"]
            objects.append(
                new_object(ObjectKey("", kind, ns, name), "v1", ObjectAction.KEEP, reason=k["reason"])
            )
        clusters.append(
            ClusterReport(
                c["name"],
                objects=sort_objects(objects),
                unchanged=unchanged,
                prune_refused=c.get("prune_refused"),
            )
        )
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
    eu, us, staging = report.clusters
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
    assert us.error and us.errors == 1 and not us.objects
    assert staging.objects[0].error and staging.objects[0].key == "Deployment.apps/shop/api"
    assert {o.action for o in staging.objects} >= {ObjectAction.KEEP}
    assert report.totals() == {"created": 1, "updated": 2, "pruned": 1, "conflicts": 3, "errors": 2}
    assert report.exit_code == 2


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
