"""The version table that ships with the agent, and the pure checks built on it.

``agent/plan/data/removed_apis.json`` is checked against two independent sources: k8s.io/api's
prerelease-lifecycle data at the pinned version, printed by ``tools/go/apilifecycle`` (built by
``scripts/install-go-tools apilifecycle``; this test FAILS when it is missing), and the pinned
API server's discovery (nothing the table says is removed by the pinned release is served).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.kube.client import KubeClient
from agent.model import ApiProblem, DesiredObject, ObjectKey, Provenance
from agent.plan import apis
from agent.render import binaries
from tests.clusters import ClusterPool

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    lines = (ROOT / "tools" / "versions.env").read_text().splitlines()
    return dict(ln.split("=", 1) for ln in lines if "=" in ln and not ln.startswith("#"))


def _oracle() -> list[dict[str, Any]]:
    tool = binaries.go_tool("apilifecycle")
    if tool is None:
        pytest.fail(
            "tools/go/apilifecycle is not built: run scripts/install-go-tools apilifecycle", pytrace=False
        )
    out = subprocess.run([str(tool)], check=True, capture_output=True, text=True, timeout=60)
    doc: list[dict[str, Any]] = json.loads(out.stdout)
    return doc


def _gv(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def test_the_version_table_is_k8s_io_api_lifecycle_data_at_the_pinned_version() -> None:
    doc = json.loads((ROOT / "agent" / "plan" / "data" / "removed_apis.json").read_text())
    assert doc["k8s.io/api"] == _pins()["KUBERNETES_STAGING_VERSION"]
    go_mod = (ROOT / "tools" / "go" / "apilifecycle" / "go.mod").read_text()
    assert f"k8s.io/api {_pins()['KUBERNETES_STAGING_VERSION']}" in go_mod
    expected = {}
    for e in _oracle():
        repl = e.get("replacement")
        replacement = None
        if repl:
            kind = repl["kind"]
            # Upstream tags IngressClass's replacement as IngressClassList: a List is never applied.
            if kind.endswith("List") and not e["kind"].endswith("List"):
                kind = kind.removesuffix("List")
            replacement = (_gv(repl["group"], repl["version"]), kind)
        deprecated = apis.parse_release(e["deprecated"]) if e.get("deprecated") else None
        expected[(_gv(e["group"], e["version"]), e["kind"])] = (
            deprecated,
            apis.parse_release(e["removed"]),
            replacement,
        )
    shipped = {
        (x.api_version, x.kind): (x.deprecated, x.removed, x.replacement)
        for x in apis.table().entries
        if x.source == "k8s.io/api"
    }
    assert shipped == expected
    others = [x for x in apis.table().entries if x.source != "k8s.io/api"]
    assert {x.source for x in others} <= {"migration-guide"}
    assert not {(x.api_version, x.kind) for x in others} & set(expected)


@pytest.mark.cluster
def test_nothing_the_table_removes_by_the_pinned_release_is_served_by_the_pinned_api_server(
    cluster_pool: ClusterPool,
) -> None:
    pinned = apis.parse_release(_pins()["KUBERNETES_VERSION"])
    client = KubeClient.connect("discovery", kubeconfig=str(cluster_pool["pool-a"].kubeconfig))
    try:
        assert apis.parse_release(client.server_version()) == pinned
        served = {(r.api_version, r.kind) for r in client.discovery().all()}
    finally:
        client.close()
    gone = [x for x in apis.table().entries if x.removed <= pinned]
    assert {x.source for x in gone} == {"k8s.io/api", "migration-guide"}
    assert [(x.api_version, x.kind) for x in gone if (x.api_version, x.kind) in served] == []
    # Every replacement the table names for those is in a served group-version (the advice is
    # usable today); admission.k8s.io is a webhook's payload, never served by the API server.
    served_gvs = {av for av, _ in served}
    moves = {apis.table().follow(x.replacement, pinned) for x in gone if x.replacement}
    assert {m[0] for m in moves if m and m[0] not in served_gvs} == {"admission.k8s.io/v1"}


def _obj(api_version: str, kind: str, name: str = "x", file: str = "apps/a.yaml") -> DesiredObject:
    meta = {"name": name, "namespace": "ns"}
    return DesiredObject({"apiVersion": api_version, "kind": kind, "metadata": meta}, Provenance(file, 0, 3))


def test_an_unserved_version_names_its_file_and_the_served_version_of_the_same_kind() -> None:
    pdb = _obj("policy/v1beta1", "PodDisruptionBudget", "web")
    served = {("policy", "PodDisruptionBudget"): ["v1"], ("", "ConfigMap"): ["v1"]}
    found = apis.unserved([pdb, _obj("v1", "ConfigMap")], served)
    assert list(found) == [pdb.key]
    f = found[pdb.key]
    assert f.problem is ApiProblem.NOT_SERVED and f.replacement == "policy/v1"
    assert f.message == (
        "apiVersion policy/v1beta1 of kind PodDisruptionBudget is not served by this cluster "
        "(removed in Kubernetes 1.25): use apiVersion policy/v1 instead (apps/a.yaml:3)"
    )


def test_an_unserved_version_of_a_moved_kind_names_the_group_it_moved_to() -> None:
    ingress = _obj("extensions/v1beta1", "Ingress")
    found = apis.unserved([ingress], {("networking.k8s.io", "Ingress"): ["v1"]})
    assert found[ingress.key].replacement == "networking.k8s.io/v1"
    assert "use apiVersion networking.k8s.io/v1 instead" in found[ingress.key].message


def test_a_kind_a_crd_of_the_same_render_serves_is_not_a_finding_but_a_version_it_drops_is() -> None:
    crd = DesiredObject(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"kind": "Widget", "plural": "widgets"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": True, "storage": True}],
            },
        },
        Provenance("crds.yaml"),
    )
    new, old = _obj("example.com/v1", "Widget", "new"), _obj("example.com/v1alpha1", "Widget", "old")
    found = apis.unserved([crd, new, old], {("apiextensions.k8s.io", "CustomResourceDefinition"): ["v1"]})
    assert list(found) == [old.key]
    assert found[old.key].replacement == "example.com/v1"


def test_a_target_release_flags_exactly_the_versions_it_removes() -> None:
    cron, hpa = _obj("batch/v1beta1", "CronJob"), _obj("autoscaling/v2beta2", "HorizontalPodAutoscaler")
    ok = _obj("apps/v1", "Deployment")
    assert set(apis.removed_by([cron, hpa, ok], (1, 25))) == {cron.key}
    found = apis.removed_by([cron, hpa, ok], apis.parse_release("v1.26.3"))
    assert set(found) == {cron.key, hpa.key}
    assert found[hpa.key].problem is ApiProblem.REMOVED
    assert "removed in Kubernetes 1.26 (target 1.26): use apiVersion autoscaling/v2 instead" in (
        found[hpa.key].message
    )


def test_a_removed_replacement_is_followed_to_one_the_target_serves() -> None:
    schema = _obj("flowcontrol.apiserver.k8s.io/v1beta1", "FlowSchema")
    assert (
        apis.removed_by([schema], (1, 26))[schema.key].replacement == "flowcontrol.apiserver.k8s.io/v1beta3"
    )
    assert apis.removed_by([schema], (1, 32))[schema.key].replacement == "flowcontrol.apiserver.k8s.io/v1"


def test_a_replacement_chain_that_ends_removed_names_no_replacement() -> None:
    psp = _obj("extensions/v1beta1", "PodSecurityPolicy")
    found = apis.removed_by([psp], (1, 25))[psp.key]
    assert found.replacement == "" and found.message.endswith("no replacement is known (apps/a.yaml:3)")


def test_a_version_deprecated_in_the_release_or_by_its_crd_is_a_deprecation() -> None:
    pdb = _obj("policy/v1beta1", "PodDisruptionBudget")
    assert set(apis.deprecations([pdb], (1, 21))) == {pdb.key}
    assert apis.deprecations([pdb], (1, 20)) == {} and apis.deprecations([pdb], (1, 25)) == {}
    widget = _obj("example.com/v1alpha1", "Widget")
    live = {("example.com", "Widget"): {"v1alpha1": {"deprecated": True, "deprecationWarning": "use v1"}}}
    found = apis.deprecations([widget], None, live)
    assert found[widget.key].problem is ApiProblem.DEPRECATED and "use v1" in found[widget.key].message


@pytest.mark.parametrize("text", ["1.x", "", "one.two", "1"])
def test_a_malformed_release_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes release"):
        apis.parse_release(text)


def test_keys_are_object_keys() -> None:
    found = apis.removed_by([_obj("batch/v1beta1", "CronJob", "nightly")], (1, 30))
    assert list(found) == [ObjectKey("batch", "CronJob", "ns", "nightly")]


def test_an_unserved_object_in_a_report_is_a_difference_not_an_error_and_is_shown() -> None:
    from agent.report import format as fmt
    from agent.report.model import (
        ApiLine,
        ClusterReport,
        Mode,
        ObjectAction,
        ObjectReport,
        Report,
        RevisionInfo,
    )

    line = ApiLine(
        "not-served", "apiVersion policy/v1beta1 ... use apiVersion policy/v1 instead", "policy/v1"
    )
    pdb = ObjectReport(
        "policy", "PodDisruptionBudget", "ns", "web", "policy/v1beta1", ObjectAction.SKIP, api=(line,)
    )
    noted = ObjectReport("", "ConfigMap", "ns", "c", "v1", ObjectAction.SKIP, api=(ApiLine("warning", "w"),))
    report = Report(Mode.LIVE, RevisionInfo("main"), (ClusterReport.single("prod", objects=(pdb,)),))
    assert report.exit_code == 1 and not report.has_errors
    quiet = Report(Mode.LIVE, RevisionInfo("main"), (ClusterReport.single("prod", objects=(noted,)),))
    assert quiet.exit_code == 0, "a warning alone is no difference"
    assert f"not-served: {line.message}" in fmt.render_text(report)
    assert f"❌ not-served: {line.message}" in fmt.render_markdown(report)
    assert "1 object(s) use an API version that is not served" in fmt.render_text(report)
