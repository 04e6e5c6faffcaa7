"""``gitops-agent diff`` in live mode, against the real pool clusters.

Each test applies a first commit with the agent (its own agent name and
namespace), changes the cluster and/or Git, and runs the ``diff`` command
(click's runner) to read its JSON report and exit code. The diff never writes:
tests check that what it previews as deleted is still there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agent.cli.diff import diff
from agent.config.types import Config
from agent.reconcile.reconciler import ClusterReconciler
from agent.source.git import GitSource
from tests.agentkit import E2E, Repo, make_repo, write_config
from tests.clusters import ClusterControl, ClusterPool, kubectl

pytestmark = pytest.mark.cluster


def namespace(ns: str) -> str:
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"


def config_map(ns: str, name: str, **data: str) -> str:
    body = "".join(f"\n  {k}: {json.dumps(v)}" for k, v in data.items())
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:{body}\n"


def deployment(ns: str, name: str, image: str, replicas: int = 1) -> str:
    return f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {ns}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
        - name: {name}
          image: {image}
"""


def docs(*parts: str) -> str:
    return "---\n".join(parts)


def run_diff(*args: str) -> tuple[Result, dict[str, Any]]:
    result = CliRunner().invoke(diff, [*args, "--format", "json"], catch_exceptions=False)
    return result, json.loads(result.stdout)


def objects(doc: dict[str, Any], cluster: str) -> dict[str, dict[str, Any]]:
    section = next(c for c in doc["clusters"] if c["name"] == cluster)
    return {o["key"]: o for a in section["apps"] for o in a["objects"]}


def applied(tmp_path: Path, pool: ClusterPool, files: dict[str, str], **kw: Any) -> tuple[Repo, Config]:
    """A repository with ``files``, applied once by the agent to the clusters named in the paths."""
    repo = make_repo(tmp_path, files)
    names = sorted({p.split("/")[1] for p in files})
    cfg = write_config(tmp_path, repo, {n: pool[n] for n in names}, **kw)
    revision = GitSource.from_config(cfg).poll()
    for cluster in cfg.clusters:
        rec = ClusterReconciler(cfg, cluster)
        try:
            result = rec.reconcile(revision)
        finally:
            rec.close()
        assert result.ok, f"{cluster.name}: {result.error} {result.results}"
    return repo, cfg


def test_never_revert_a_foreign_label_is_not_shown_as_a_removal(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("diff-label")
    a = cluster_pool["pool-a"]
    files = {"clusters/pool-a/app.yaml": docs(namespace(ns), deployment(ns, "web", "nginx:1.27"))}
    repo, cfg = applied(tmp_path, cluster_pool, files)
    kubectl(a.kubeconfig, "label", "deployment", "web", "-n", ns, "team=payments")
    kubectl(a.kubeconfig, "annotate", "deployment", "web", "-n", ns, "owner=alice")
    result, doc = run_diff("--config", cfg.file)
    assert result.exit_code == 0, result.output
    assert objects(doc, "pool-a") == {}
    assert doc["summary"]["differences"] is False

    repo.commit({"clusters/pool-a/app.yaml": docs(namespace(ns), deployment(ns, "web", "nginx:1.28"))})
    result, doc = run_diff("--config", cfg.file)
    assert result.exit_code == 1, result.output
    web = objects(doc, "pool-a")["Deployment.apps/" + ns + "/web"]
    assert "team" not in web["diff"] and "owner" not in web["diff"]
    assert all("labels" not in f["path"] and "annotations" not in f["path"] for f in web["fields"])


def test_a_changed_image_is_shown_as_confirmed_by_the_server(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("diff-image")
    files = {"clusters/pool-a/app.yaml": docs(namespace(ns), deployment(ns, "web", "nginx:1.27"))}
    repo, cfg = applied(tmp_path, cluster_pool, files)
    repo.commit({"clusters/pool-a/app.yaml": docs(namespace(ns), deployment(ns, "web", "nginx:1.28"))})
    # --path: the PR's working tree (the repository's work directory holds the new commit's files).
    for args in (("--revision", "main"), ("--path", str(repo.work))):
        result, doc = run_diff("--config", cfg.file, *args)
        assert result.exit_code == 1, result.output
        found = objects(doc, "pool-a")
        assert list(found) == [f"Deployment.apps/{ns}/web"]
        web = found[f"Deployment.apps/{ns}/web"]
        assert web["action"] == "update" and web["basis"] == "server" and web["error"] is None
        assert "-          image: nginx:1.27" in web["diff"]
        assert "+          image: nginx:1.28" in web["diff"]
        assert [f["path"] for f in web["fields"]] == ["spec.template.spec.containers[name=web].image"]
        assert doc["clusters"][0]["summary"]["unchanged"] == 1  # the namespace
    image = kubectl(
        cluster_pool["pool-a"].kubeconfig,
        "get",
        "deploy",
        "web",
        "-n",
        ns,
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    )
    assert image == "nginx:1.27"  # a diff never writes


def test_an_object_removed_from_git_is_shown_as_a_prune_and_not_deleted(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("diff-prune")
    a = cluster_pool["pool-a"]
    files = {
        "clusters/pool-a/app.yaml": docs(
            namespace(ns), config_map(ns, "settings", greeting="hi"), config_map(ns, "old", mode="legacy")
        )
    }
    repo, cfg = applied(tmp_path, cluster_pool, files)
    repo.commit({"clusters/pool-a/app.yaml": docs(namespace(ns), config_map(ns, "settings", greeting="hi"))})
    result, doc = run_diff("--config", cfg.file)
    assert result.exit_code == 1, result.output
    old = objects(doc, "pool-a")[f"ConfigMap/{ns}/old"]
    assert old["action"] == "prune" and old["error"] is None
    assert "-  mode: legacy" in old["diff"]
    assert doc["summary"]["pruned"] == 1
    assert "old" in kubectl(a.kubeconfig, "get", "configmap", "old", "-n", ns, "-o", "name")


def test_mass_deletion_brake_a_prune_the_brake_would_stop_is_shown_as_refused(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("diff-brake")
    cms = [config_map(ns, f"cm{i}", n=str(i)) for i in range(3)]
    files = {"clusters/pool-a/app.yaml": docs(namespace(ns), *cms)}
    repo, cfg = applied(
        tmp_path, cluster_pool, files, defaults="brake_min_inventory = 2\nmax_prune_fraction = 0.25"
    )
    repo.commit({"clusters/pool-a/app.yaml": docs(namespace(ns), cms[0])})
    result, doc = run_diff("--config", cfg.file)
    assert result.exit_code == 1, result.output
    section = doc["clusters"][0]
    assert "mass-deletion brake" in section["apps"][0]["pruneRefused"]
    found = objects(doc, "pool-a")
    for i in (1, 2):
        assert found[f"ConfigMap/{ns}/cm{i}"]["action"] == "keep"
        assert "mass-deletion brake" in found[f"ConfigMap/{ns}/cm{i}"]["reason"]
    assert section["summary"]["pruned"] == 0


def test_an_object_the_server_rejects_is_an_error_on_that_object_and_the_rest_is_complete(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("diff-reject")
    files = {"clusters/pool-a/app.yaml": docs(namespace(ns), config_map(ns, "settings", greeting="hi"))}
    repo, cfg = applied(tmp_path, cluster_pool, files)
    repo.commit(
        {
            "clusters/pool-a/app.yaml": docs(
                namespace(ns),
                config_map(ns, "settings", greeting="bonjour"),
                deployment(ns, "bad", "nginx:1.28", replicas=-1),
                deployment(ns, "good", "nginx:1.28"),
            )
        }
    )
    result, doc = run_diff("--config", cfg.file)
    assert result.exit_code == 2, result.output
    found = objects(doc, "pool-a")
    bad = found[f"Deployment.apps/{ns}/bad"]
    assert bad["error"] and "422" in bad["error"] and "spec.replicas" in bad["error"]
    assert next(iter(found)) == f"Deployment.apps/{ns}/bad"  # errors first
    good = found[f"Deployment.apps/{ns}/good"]
    assert good["action"] == "create" and good["error"] is None and good["basis"] == "server"
    assert "terminationMessagePath" in good["diff"]  # server defaults show in a dry-run create
    settings = found[f"ConfigMap/{ns}/settings"]
    assert settings["action"] == "update" and "+  greeting: bonjour" in settings["diff"]
    assert doc["summary"]["errors"] == 1 and doc["clusters"][0]["error"] is None


def test_each_cluster_alone_a_stopped_cluster_gets_an_error_section_the_other_is_complete(
    tmp_path: Path, cluster_pool: ClusterPool, cluster_ctl: ClusterControl, e2e: E2E
) -> None:
    ns = e2e.namespace("diff-stop")
    body = docs(namespace(ns), config_map(ns, "settings", greeting="hi"), deployment(ns, "web", "nginx:1.27"))
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": body, "clusters/pool-b/app.yaml": body})
    cfg = write_config(tmp_path, repo, {c.name: c for c in cluster_pool.all})
    cluster_ctl.stop(cluster_pool["pool-b"])
    result, doc = run_diff("--config", cfg.file)
    assert result.exit_code == 2, result.output
    a, b = doc["clusters"]
    assert (a["name"], b["name"]) == ("pool-a", "pool-b")
    (b_app,) = b["apps"]
    assert "connection refused" in b_app["error"] and b_app["objects"] == []
    assert a["error"] is None and a["apps"][0]["error"] is None
    # A namespace created by this change: its objects cannot be dry-run yet, and that is no error.
    assert {o["key"]: o["action"] for o in a["apps"][0]["objects"]} == {
        f"Namespace/{ns}": "create",
        f"ConfigMap/{ns}/settings": "create",
        f"Deployment.apps/{ns}/web": "create",
    }
    assert all(o["error"] is None for o in a["apps"][0]["objects"])
    assert "namespace" in objects(doc, "pool-a")[f"ConfigMap/{ns}/settings"]["note"]

    md = CliRunner().invoke(diff, ["--config", cfg.file, "--format", "markdown"])
    assert md.exit_code == 2
    assert "| pool-b | 0 | 0 | 0 | 0 | 1 | error: " in md.stdout
    assert "| pool-a | 3 | 0 | 0 | 0 | 0 | changes |" in md.stdout
