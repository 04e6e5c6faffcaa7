"""Upgrade safety on real local clusters: API versions a cluster does not serve, deprecated ones,
and the versions a target release removes (docs/upgrades.md).

An object whose apiVersion the cluster does not serve is named, with its file and the served
replacement, by ``diff`` (exit 1: a difference, not an error) and failed alone by the pass with
the same words, before anything is sent for it; the other objects are applied. A deprecated
version that is served is applied, and the server's ``Warning`` shows in the report, the
pass's result and an Event. ``diff --offline --kubernetes-version`` flags every object whose
version that release removes, from the version table alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.kube.client import KubeClient
from agent.model import ApiProblem, Note, Outcome, parse_release, release_text
from agent.plan import apis
from agent.report.diff_offline import run_offline
from agent.report.events import events_for
from tests.agentkit import E2E, make_repo, unique, write_config
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _cm(ns: str, name: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: v\n"


def _pdb(ns: str) -> str:
    return (
        "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\n"
        f"metadata:\n  name: web\n  namespace: {ns}\n"
        "spec:\n  minAvailable: 1\n  selector:\n    matchLabels: {app: web}\n"
    )


def _objects(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["key"]: o for c in doc["clusters"] for a in c["apps"] for o in a["objects"]}


def test_an_unserved_version_is_named_with_its_replacement_by_diff_and_fails_alone_in_the_pass(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("upg")
    files = {
        "clusters/pool-a/ns.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n",
        "clusters/pool-a/pdb.yaml": _pdb(ns),
        **{f"clusters/pool-a/cm-{i}.yaml": _cm(ns, f"cm-{i}") for i in range(8)},
    }
    repo = make_repo(tmp_path, files)
    cfg = write_config(tmp_path, repo, {"pool-a": cluster_pool["pool-a"]})
    words = (
        "apiVersion policy/v1beta1 of kind PodDisruptionBudget is not served by this cluster "
        "(removed in Kubernetes 1.25): use apiVersion policy/v1 instead (clusters/pool-a/pdb.yaml:1)"
    )

    out = cli("diff", "--config", str(cfg.file), "--format", "json")
    assert out.returncode == 1, out.stderr + out.stdout
    doc = json.loads(out.stdout)
    pdb = _objects(doc)[f"PodDisruptionBudget.policy/{ns}/web"]
    assert pdb["api"] == [{"problem": "not-served", "message": words, "replacement": "policy/v1"}]
    assert pdb["error"] is None and doc["summary"]["errors"] == 0
    assert doc["summary"]["created"] == 9
    text = cli("diff", "--config", str(cfg.file))
    assert text.returncode == 1 and f"not-served: {words}" in text.stdout, text.stdout

    out = cli("run", "--once", "--config", str(cfg.file))
    assert out.returncode == 1, out.stderr + out.stdout
    assert f"PodDisruptionBudget.policy/{ns}/web: HTTP 404: {words}" in out.stdout, out.stdout
    live = json.loads(kubectl(cluster_pool["pool-a"].kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))
    assert {i["metadata"]["name"] for i in live["items"]} >= {f"cm-{i}" for i in range(8)}
    pdbs = kubectl(cluster_pool["pool-a"].kubeconfig, "get", "pdb", "-n", ns, "-o", "name")
    assert pdbs.strip() == ""

    agent = e2e.agent(cfg)
    result = agent.reconcile()["pool-a"]
    failed = [r for r in result.results if r.outcome is Outcome.FAILED]
    assert [(str(r.key), r.note, r.message) for r in failed] == [
        (f"PodDisruptionBudget.policy/{ns}/web", Note.API_NOT_SERVED, words)
    ]
    assert result.count(Outcome.UNCHANGED) == 9
    assert [f.problem for f in result.api_findings] == [ApiProblem.NOT_SERVED]
    row = agent.fleet.status["pool-a"].to_json()  # what /status shows
    assert [(f["problem"], f["message"], f["replacement"]) for f in row["api"]] == [
        ("not-served", words, "policy/v1")
    ]


CRD = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{group}
spec:
  group: {group}
  names: {{kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}}
  scope: Namespaced
  versions:
    - name: v1beta1
      served: true
      storage: false
      deprecated: true
      deprecationWarning: "{group}/v1beta1 Widget is deprecated; use {group}/v1 Widget"
      schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
    - name: v1
      served: true
      storage: true
      schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
"""


def test_a_deprecated_served_version_is_applied_and_its_warning_is_reported_and_an_event(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    group = f"{unique('dep')}.example.com"
    (tmp_path / "crd.yaml").write_text(CRD.format(group=group))
    e2e.delete_after(a, "crd", f"widgets.{group}")
    kubectl(a.kubeconfig, "apply", "-f", str(tmp_path / "crd.yaml"))
    kubectl(a.kubeconfig, "wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s")
    ns = e2e.namespace("dep")
    widget = (
        f"apiVersion: {group}/v1beta1\nkind: Widget\nmetadata:\n  name: w\n  namespace: {ns}\n"
        "spec:\n  size: 1\n"
    )
    files = {
        "clusters/pool-a/ns.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n",
        "clusters/pool-a/widget.yaml": widget,
    }
    repo = make_repo(tmp_path, files)
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    said = f"{group}/v1beta1 Widget is deprecated; use {group}/v1 Widget"

    agent = e2e.agent(cfg)
    agent.reconcile()  # the namespace exists: the widget's dry-run reaches the server
    kubectl(a.kubeconfig, "delete", "widgets.v1." + group, "w", "-n", ns)
    out = cli("diff", "--config", str(cfg.file), "--format", "json")
    assert out.returncode == 1, out.stderr + out.stdout
    entry = _objects(json.loads(out.stdout))[f"Widget.{group}/{ns}/w"]
    assert entry["action"] == "create" and entry["error"] is None
    assert {"problem": "warning", "message": said, "replacement": ""} in entry["api"]

    result = agent.reconcile()["pool-a"]
    assert result.ok, result
    assert [(str(r.key), r.outcome) for r in result.results if r.key.kind == "Widget"] == [
        (f"Widget.{group}/{ns}/w", Outcome.CREATED)
    ]
    assert [(f.problem, f.message) for f in result.api_findings] == [(ApiProblem.WARNING, said)]
    client = KubeClient.connect("events", kubeconfig=str(a.kubeconfig))
    e2e.at_end(client.close)
    events = events_for(client, cfg.agent.namespace, cfg.agent.name)
    assert any(e["reason"] == "DeprecatedAPIVersion" and said in e["message"] for e in events), events
    out = cli("run", "--once", "--config", str(cfg.file))
    assert out.returncode == 0, out.stderr + out.stdout


def _manifest(api_version: str, kind: str, name: str) -> str:
    namespaced = kind not in {"ClusterRole", "ClusterRoleBinding", "PriorityClass", "StorageClass"}
    ns = "\n  namespace: apps" if namespaced else ""
    return f"apiVersion: {api_version}\nkind: {kind}\nmetadata:\n  name: {name}{ns}\n"


def test_diff_offline_with_a_kubernetes_version_flags_every_removal_of_each_release_in_the_table(
    tmp_path: Path,
) -> None:
    table = apis.table()
    releases = sorted({e.removed for e in table.entries})
    # One object per removal release of the table, plus one that every release serves.
    chosen = {r: next(e for e in table.entries if e.removed == r) for r in releases}
    files = {
        f"clusters/prod/{i:02d}.yaml": _manifest(e.api_version, e.kind, f"o{i}")
        for i, e in enumerate(chosen.values())
    }
    files["clusters/prod/keep.yaml"] = _manifest("v1", "ConfigMap", "keep")
    repo = make_repo(tmp_path, {"clusters/prod/keep.yaml": files["clusters/prod/keep.yaml"]})
    base = "HEAD"
    base_sha = _head(repo.path)
    repo.commit(files, "every removal release")
    for target in releases:
        report = run_offline(
            str(repo.path),
            base_sha,
            base,
            config=None,
            cache_dir=tmp_path / "c",
            kubernetes_version=release_text(target),
        )
        flagged = {o.name for o in report.clusters[0].objects if o.blocked}
        want = {f"o{i}" for i, e in enumerate(chosen.values()) if e.removed <= target}
        assert flagged == want, (target, flagged ^ want)
    last = release_text(releases[-1])
    out = cli("diff", "--offline", "--repo", str(repo.path), "--base", base_sha, "--head", "HEAD",
              "--kubernetes-version", last, "--format", "json")  # fmt: skip
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kubernetesVersion"] == last
    removed = {o["name"]: o["api"] for o in _objects(doc).values() if o["api"]}
    assert set(removed) == {f"o{i}" for i in range(len(chosen))}
    for i, e in enumerate(chosen.values()):
        (line,) = [x for x in removed[f"o{i}"] if x["problem"] == "removed"]
        assert f"removed in Kubernetes {release_text(e.removed)}" in line["message"]
        assert f"clusters/prod/{i:02d}.yaml" in line["message"]
        final = table.follow(e.replacement, releases[-1]) if e.replacement else None
        assert line["replacement"] == (final[0] if final else "")
    # The same check from a cluster's own target in the config.
    conf = tmp_path / "agent.toml"
    conf.write_text(
        f'[source]\nurl = "{repo.path}"\n\n[[clusters]]\nname = "prod"\nkubeconfig = "nowhere"\n'
        f'path = "clusters/prod"\nkubernetes_version = "{last}"\n'
    )
    out = cli("diff", "--offline", "--config", str(conf), "--repo", str(repo.path), "--base", base_sha,
              "--head", "HEAD", "--format", "json")  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert {o["name"] for o in _objects(json.loads(out.stdout)).values() if o["api"]} == set(removed)
    bad = cli("diff", "--offline", "--repo", str(repo.path), "--base", base_sha, "--head", "HEAD",
              "--kubernetes-version", "one.two")  # fmt: skip
    assert bad.returncode == 2 and "--kubernetes-version" in bad.stderr and "one.two" in bad.stderr
    assert parse_release(last) == releases[-1]


def _head(repo: Path) -> str:
    import pygit2

    return str(pygit2.Repository(str(repo)).head.target)


def test_a_version_a_crd_stops_serving_under_a_running_agent_is_named_in_the_same_words_at_once(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    group = f"{unique('gone')}.example.com"
    crd = CRD.format(group=group)
    (tmp_path / "crd.yaml").write_text(crd)
    e2e.delete_after(a, "crd", f"widgets.{group}")
    kubectl(a.kubeconfig, "apply", "-f", str(tmp_path / "crd.yaml"))
    kubectl(a.kubeconfig, "wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s")
    ns = e2e.namespace("gone")

    def files(size: int) -> dict[str, str]:
        head = f"apiVersion: {group}/v1beta1\nkind: Widget\nmetadata:\n  name: w\n  namespace: {ns}\n"
        return {
            "clusters/pool-a/ns.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n",
            "clusters/pool-a/widget.yaml": f"{head}spec:\n  size: {size}\n",
        }

    repo = make_repo(tmp_path, files(1))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    # Someone drops v1beta1 from the CRD; the agent's discovery still says it is served.
    start, end = crd.index("    - name: v1beta1"), crd.index("    - name: v1\n")
    (tmp_path / "crd.yaml").write_text(crd[:start] + crd[end:])
    kubectl(a.kubeconfig, "apply", "-f", str(tmp_path / "crd.yaml"))
    repo.commit(files(2), "bigger")
    words = (
        f"apiVersion {group}/v1beta1 of kind Widget is not served by this cluster: "
        f"use apiVersion {group}/v1 instead (clusters/pool-a/widget.yaml:1)"
    )
    for _ in range(2):  # the write that finds out, then the check before the next pass's writes
        result = agent.reconcile()["pool-a"]
        (failed,) = [r for r in result.results if r.outcome is Outcome.FAILED]
        assert (failed.note, failed.message) == (Note.API_NOT_SERVED, words), failed
