"""End to end on two real local clusters: Git commit → render → server-side apply.

One pass of the whole pipeline: both clusters get the commit; a label added
with the pinned ``kubectl label`` survives the next reconcile (never revert
what others own); a field changed in Git is applied; a stopped cluster fails
alone with a readable reason (each cluster alone).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.model import Outcome
from agent.render.binaries import tool
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterControl, ClusterPool, kubectl

pytestmark = pytest.mark.cluster


def app(ns: str, greeting: str) -> dict[str, str]:
    body = f"""
        apiVersion: v1
        kind: Namespace
        metadata:
          name: {ns}
        ---
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: settings
          namespace: {ns}
        data:
          greeting: {greeting}
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: web
          namespace: {ns}
        spec:
          replicas: 1
          selector:
            matchLabels: {{app: web}}
          template:
            metadata:
              labels: {{app: web}}
            spec:
              containers:
                - name: web
                  image: nginx:1.27
        """
    return {"clusters/pool-a/app.yaml": body, "clusters/pool-b/app.yaml": body}


def get(kubeconfig: Path, *args: str) -> dict:  # type: ignore[type-arg]
    return json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))


def test_commit_is_applied_to_both_clusters_and_foreign_label_is_never_reverted(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("e2e")
    repo = make_repo(tmp_path, app(ns, "hello"))
    agent = e2e.agent(write_config(tmp_path, repo, {c.name: c for c in cluster_pool.all}))
    first = agent.reconcile()
    for c in cluster_pool.all:
        assert first[c.name].ok, first[c.name].error
        assert first[c.name].count(Outcome.CREATED) == 3
        assert get(c.kubeconfig, "configmap", "settings", "-n", ns)["data"]["greeting"] == "hello"

    a = cluster_pool["pool-a"]
    kubectl(a.kubeconfig, "label", "deployment", "web", "-n", ns, "team=payments")
    second = agent.reconcile()
    assert second["pool-a"].ok and second["pool-a"].count(Outcome.UNCHANGED) == 3
    assert get(a.kubeconfig, "deployment", "web", "-n", ns)["metadata"]["labels"]["team"] == "payments"

    repo.commit(app(ns, "bonjour"), "new greeting")
    third = agent.reconcile()
    for c in cluster_pool.all:
        assert third[c.name].ok, third[c.name].error
        assert third[c.name].count(Outcome.CONFIGURED) == 1
        assert get(c.kubeconfig, "configmap", "settings", "-n", ns)["data"]["greeting"] == "bonjour"
    assert get(a.kubeconfig, "deployment", "web", "-n", ns)["metadata"]["labels"]["team"] == "payments"


def test_each_cluster_alone_a_stopped_cluster_fails_alone_with_a_reason(
    tmp_path: Path, cluster_pool: ClusterPool, cluster_ctl: ClusterControl, e2e: E2E
) -> None:
    ns = e2e.namespace("e2e")
    repo = make_repo(tmp_path, app(ns, "hello"))
    agent = e2e.agent(write_config(tmp_path, repo, {c.name: c for c in cluster_pool.all}))
    cluster_ctl.stop(cluster_pool["pool-b"])
    results = agent.reconcile()
    assert results["pool-a"].ok and results["pool-a"].count(Outcome.CREATED) == 3
    assert not results["pool-b"].ok
    assert "connection refused" in (results["pool-b"].error or "")
    assert results["pool-b"].count(Outcome.PRUNED) == 0


def test_run_once_prints_a_per_cluster_summary_and_exits_1_when_a_cluster_failed(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("e2e")
    repo = make_repo(tmp_path, app(ns, "hello"))
    dead = tmp_path / "dead.kubeconfig"
    # A kubeconfig pointing at a closed port: that cluster fails, the other is applied.
    kc = (cluster_pool["pool-a"].kubeconfig).read_text()
    server = next(line.split("server:")[1].strip() for line in kc.splitlines() if "server:" in line)
    dead.write_text(kc.replace(server, "https://127.0.0.1:1"))
    cfg = write_config(tmp_path, repo, {"pool-a": cluster_pool["pool-a"], "pool-b": dead})
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--once", "--config", cfg.file],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:8] == [
        "CLUSTER",
        "REVISION",
        "APPLIED",
        "UNCHANGED",
        "YIELDED",
        "PRUNED",
        "FAILED",
        "STATUS",
    ]
    row_a = next(line for line in lines if line.startswith("pool-a"))
    row_b = next(line for line in lines if line.startswith("pool-b"))
    assert row_a.split()[2] == "3" and row_a.endswith("ok")
    assert "failed: " in row_b and "connection refused" in row_b
    assert tool("kubectl").exists()


def test_run_refuses_dry_run_and_cluster_without_once_and_writes_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """Without --once, ``run`` is the daemon, which would apply for real: a --dry-run it cannot
    honour is refused up front (exit 2), not ignored."""
    ns = e2e.namespace("e2e")
    a = cluster_pool["pool-a"]
    cfg = write_config(tmp_path, make_repo(tmp_path, app(ns, "hello")), {"pool-a": a})
    for flags in (["--dry-run"], ["--cluster", "pool-a"]):
        out = subprocess.run(
            [sys.executable, "-m", "agent.cli", "run", "--config", cfg.file, *flags],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"{flags[0]} apply to one pass: add --once" in out.stderr
    assert kubectl(a.kubeconfig, "get", "namespace", ns, "--ignore-not-found") == ""
