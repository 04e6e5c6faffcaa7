"""Leaving a custom resource version: managedFields entries that name it, and charts that choose.

A manager that once wrote a custom resource through ``v1alpha1`` leaves a managedFields entry
naming ``v1alpha1``. Once the CRD drops that version, every server-side apply of the object
fails converting the entry, and the entry can no longer be removed (kubernetes#111937).
``takeover`` finds such entries while ``v1alpha1`` is still served and removes them (dry run by
default); after that the CRD drops ``v1alpha1`` and the next pass converges. And Helm is told
each cluster's version and served API versions, so a chart that switches its apiVersion on
``.Capabilities`` renders each cluster's choice (offline: the target release's).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.takeover import takeover
from agent.kube.client import KubeClient
from agent.model import Outcome
from agent.plan.fields import managed_entries
from agent.render.renderer import RenderSpec, render
from agent.report.diff_offline import run_offline
from tests.agentkit import E2E, make_repo, outcomes, unique, write_config
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster

SCHEMA = (
    "schema: {openAPIV3Schema: {type: object, properties: "
    "{spec: {type: object, properties: {size: {type: integer}}}}}}"
)


def _crd(group: str, *versions: str) -> str:
    listed = "".join(
        f"    - name: {v}\n      served: true\n      storage: {str(v == 'v1').lower()}\n      {SCHEMA}\n"
        for v in versions
    )
    return (
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        f"metadata:\n  name: gadgets.{group}\n"
        f"spec:\n  group: {group}\n  scope: Namespaced\n"
        "  names: {kind: Gadget, plural: gadgets, singular: gadget, listKind: GadgetList}\n"
        f"  versions:\n{listed}"
    )


def _gadget(group: str, ns: str, size: int) -> str:
    meta = f"metadata:\n  name: g\n  namespace: {ns}\n"
    return f"apiVersion: {group}/v1\nkind: Gadget\n{meta}spec:\n  size: {size}\n"


def test_takeover_removes_entries_naming_a_version_to_leave_and_the_pass_converges_after_it_goes(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    group = f"{unique('gad')}.example.com"
    e2e.delete_after(a, "crd", f"gadgets.{group}")
    ns = e2e.namespace("gad")
    nsdoc = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"

    def files(size: int, *versions: str) -> dict[str, str]:
        return {
            "clusters/pool-a/ns.yaml": nsdoc,
            "clusters/pool-a/crd.yaml": _crd(group, *versions),
            "clusters/pool-a/gadget.yaml": _gadget(group, ns, size),
        }

    repo = make_repo(tmp_path, files(1, "v1alpha1", "v1"))
    cfg = write_config(tmp_path, repo, {"pool-a": a}, agent=unique("gad-agent"))
    agent = e2e.agent(cfg)
    first = agent.reconcile()["pool-a"]
    assert first.ok, outcomes(first)
    # Another tool writes the gadget through v1alpha1: its managedFields entry names v1alpha1.
    client = KubeClient.connect("gadgets", kubeconfig=str(a.kubeconfig))
    e2e.at_end(client.close)
    old = client.resource(f"{group}/v1alpha1", "Gadget")
    client.patch(old, ns, "g", {"metadata": {"labels": {"tier": "gold"}}}, field_manager="legacy-tool")

    def versions() -> set[tuple[str, str]]:
        live = client.get(client.resource(f"{group}/v1", "Gadget"), ns, "g") or {}
        return {(e.manager, e.api_version) for e in managed_entries(live)}

    assert ("legacy-tool", f"{group}/v1alpha1") in versions()
    runner = CliRunner()
    args = ["--config", cfg.file, "--cluster", "pool-a"]
    shown = runner.invoke(takeover, args)
    assert shown.exit_code == 0, shown.output
    assert f"legacy-tool (Update) names {group}/v1alpha1: entry removed" in shown.output, shown.output
    assert "kubernetes#111937" in shown.output and "dry run" in shown.output
    assert ("legacy-tool", f"{group}/v1alpha1") in versions(), "a dry run writes nothing"
    done = runner.invoke(takeover, [*args, "--apply"])
    assert done.exit_code == 0, done.output
    assert not any(v.endswith("/v1alpha1") for _, v in versions()), versions()
    live = client.get(client.resource(f"{group}/v1", "Gadget"), ns, "g") or {}
    assert live["metadata"]["labels"]["tier"] == "gold", "only the entry goes, not the field"

    # The CRD drops v1alpha1 and the gadget changes: the pass applies both.
    repo.commit(files(2, "v1"), "drop v1alpha1")
    after = agent.reconcile()["pool-a"]
    assert after.ok, (after.error, [(str(r.key), r.message) for r in after.results if not r.ok])
    assert outcomes(after)[f"Gadget.{group}/{ns}/g"] == Outcome.CONFIGURED.value
    crd = json.loads(kubectl(a.kubeconfig, "get", "crd", f"gadgets.{group}", "-o", "json"))
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1"]
    live = client.get(client.resource(f"{group}/v1", "Gadget"), ns, "g") or {}
    assert live["spec"]["size"] == 2
    again = agent.reconcile()["pool-a"]
    assert again.ok and again.count(Outcome.UNCHANGED) == len(again.results), outcomes(again)


CHART = {
    "Chart.yaml": "apiVersion: v2\nname: picks\nversion: 0.1.0\n",
    "templates/choice.yaml": """apiVersion: v1
kind: ConfigMap
metadata:
  name: choice
  namespace: {{ .Values.ns }}
data:
  kube: {{ .Capabilities.KubeVersion.Version | quote }}
  {{- if .Capabilities.APIVersions.Has "GROUP/v2/Gadget" }}
  gadgets: GROUP/v2
  {{- else }}
  gadgets: GROUP/v1
  {{- end }}
""",
}


def test_a_chart_that_switches_on_capabilities_renders_each_clusters_choice(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    group = f"{unique('cap')}.example.com"
    # Only pool-a serves Gadget v2.
    (tmp_path / "crd.yaml").write_text(_crd(group, "v1").replace("- name: v1\n", "- name: v2\n"))
    e2e.delete_after(a, "crd", f"gadgets.{group}")
    kubectl(a.kubeconfig, "apply", "-f", str(tmp_path / "crd.yaml"))
    kubectl(a.kubeconfig, "wait", "--for=condition=Established", f"crd/gadgets.{group}", "--timeout=60s")
    ns = e2e.namespace("cap")
    nsdoc = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
    files = {f"chart/{k}": v.replace("GROUP", group) for k, v in CHART.items()}
    files["chart/values.yaml"] = f"ns: {ns}\n"
    files["clusters/pool-a/ns.yaml"] = files["clusters/pool-b/ns.yaml"] = nsdoc
    repo = make_repo(tmp_path, files)
    cfg = write_config(
        tmp_path,
        repo,
        {"pool-a": a, "pool-b": b},
        paths={"pool-a": ["clusters/pool-a", "chart"], "pool-b": ["clusters/pool-b", "chart"]},
    )
    results = e2e.agent(cfg).reconcile()
    assert all(r.ok for r in results.values()), {n: outcomes(r) for n, r in results.items()}
    chosen = {}
    for name, cluster in (("pool-a", a), ("pool-b", b)):
        cm = json.loads(kubectl(cluster.kubeconfig, "get", "configmap", "choice", "-n", ns, "-o", "json"))
        chosen[name] = cm["data"]
    assert chosen["pool-a"]["gadgets"] == f"{group}/v2" and chosen["pool-b"]["gadgets"] == f"{group}/v1"
    server = json.loads(kubectl(a.kubeconfig, "version", "-o", "json"))["serverVersion"]["gitVersion"]
    assert chosen["pool-a"]["kube"] == chosen["pool-b"]["kube"] == server

    # Offline, a target release is what the chart is told.
    work = tmp_path / "fleet-work"
    offline = render(work, RenderSpec("prod", ("chart",), kube_version="v1.29.0"))
    assert offline.objects[0].manifest["data"]["kube"] == "v1.29.0"
    report = run_offline(
        str(repo.path), "HEAD", "HEAD", config=cfg, cache_dir=tmp_path / "c", kubernetes_version="1.29"
    )
    assert report.kubernetes_version == "1.29" and not report.has_errors
