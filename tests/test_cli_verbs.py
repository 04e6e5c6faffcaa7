"""`gitops-agent events`, `tree` and `wait` on real local API servers, each as its own process.

`events` after a daemon's passes lists them and the Events they wrote; `tree` shows a
Deployment with the ReplicaSet and Pod it owns, each with its health (the local control plane
runs no Deployment controller or kubelet: ``tests/rollout.py`` writes what they would); `wait`
against a running daemon reaches synced and healthy (exit 0), times out (exit 2) and sees a
failing app fail (exit 1). Every run goes through ``test_cli_streams.cli``, which fails the test
if a log line reaches standard output.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config.load import load_config
from agent.config.types import CLUSTER_DEFAULTS, ClusterConfig, Config
from agent.kube.client import KubeClient
from tests import daemonkit
from tests.agentkit import E2E, make_repo, manifests, write_config
from tests.clusters import ClusterPool
from tests.daemonkit import TOKEN, cluster_status, configmaps, tune
from tests.rollout import roll_out
from tests.test_cli_streams import cli
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def deployment(ns: str, name: str) -> str:
    return f"""
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: {name}
      namespace: {ns}
    spec:
      replicas: 1
      selector:
        matchLabels: {{app: {name}}}
      template:
        metadata:
          labels: {{app: {name}}}
        spec:
          automountServiceAccountToken: false
          containers:
          - name: main
            image: nginx:1.27
    """


@pytest.fixture
def admin(cluster_pool: ClusterPool) -> Iterator[KubeClient]:
    """A client acting as the controllers and the kubelet the local control plane lacks."""
    client = KubeClient.from_config(
        ClusterConfig("pool-a", (), CLUSTER_DEFAULTS, kubeconfig=str(cluster_pool["pool-a"].kubeconfig))
    )
    yield client
    client.close()


def _synced(cfg: Config, sha: str) -> bool:
    row = cluster_status(cfg, "pool-a")
    return row["revision"] == sha and row["result"] in ("ok", "failed") and row["state"] != "running"


def test_events_after_a_pass_lists_the_pass_and_its_events(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: daemonkit.Daemons
) -> None:
    ns = e2e.namespace("events")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "one", "keep", "old")})
    cfg = tune(
        write_config(tmp_path, repo, {"pool-a": cluster_pool["pool-a"]}),
        defaults={"reconcile_interval": "1h"},
        poll="1s",
    )
    daemons(cfg)
    wait_for("the first pass", lambda: cluster_status(cfg, "pool-a")["result"] == "ok", 60)
    first = cluster_status(cfg, "pool-a")["revision"]
    second = repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "one", "keep")}, "drop old")
    wait_for("the pass that prunes", lambda: _synced(cfg, second), 60)

    at = ["--config", cfg.file, "--cluster", "pool-a"]

    def listed() -> subprocess.CompletedProcess[str] | None:
        out = cli("events", *at)
        return out if out.returncode == 0 and second[:12] in out.stdout else None

    out = wait_for("both passes listed", listed, 30)  # the record is saved just after the pass
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["LAST", "SEEN", "APP", "KIND", "TYPE", "REASON", "REVISION", "MESSAGE"]
    rows = [line.split() for line in lines[1:]]
    pruned = next(r for r in rows if r[2] == "Event" and r[4] == "Pruned")
    assert pruned[5] == second[:12] and f"ConfigMap/{ns}/old" in " ".join(pruned)
    passes = [(r[5], r[4]) for r in rows if r[2] == "Pass"]
    assert passes[:2] == [(second[:12], "ok"), (first[:12], "ok")]  # newest first

    out = cli("events", *at, "--app", "pool-a", "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["cluster"] == "pool-a" and doc["apps"] == ["pool-a"]
    kinds = {(e["kind"], e["reason"], e["revision"]) for e in doc["events"]}
    assert ("Event", "Pruned", second[:12]) in kinds and ("Pass", "ok", first[:12]) in kinds

    out = cli("events", *at, "--app", "nope")
    assert out.returncode == 2 and out.stdout == "" and "its apps: pool-a" in out.stderr


def test_tree_shows_a_deployment_with_its_replicaset_and_pod_and_their_health(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, admin: KubeClient
) -> None:
    ns = e2e.namespace("tree")
    files = {"clusters/pool-a/app.yaml": manifests(configmaps(ns, "one"), deployment(ns, "web"))}
    repo = make_repo(tmp_path, files)
    cfg = write_config(tmp_path, repo, {"pool-a": cluster_pool["pool-a"]})
    result = e2e.agent(cfg).reconcile()["pool-a"]
    assert result.ok, result
    pod = roll_out(admin, ns, "web", ready=0, waiting="ImagePullBackOff")

    at = ["--config", cfg.file, "--cluster", "pool-a"]
    out = cli("tree", *at)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "HEALTH", "REASON", "MESSAGE"]
    names = [line.split()[1] for line in lines[1:]]
    assert names[0] == f"Namespace/{ns}" and "ConfigMap/settings" in names  # its namespace in a column
    web = names.index("Deployment/web")
    assert names[web + 1].startswith("└─ReplicaSet/web-") and names[web + 2] == f"└─Pod/{pod}"
    assert f"    └─Pod/{pod}" in lines[1 + web + 2]  # indented under the ReplicaSet
    assert lines[1 + web].split()[2] == "InProgress" and pod in lines[1 + web]  # the blocker named
    assert lines[1 + web + 2].split()[2:4] == ["Failed", "ImagePullBackOff"]

    out = cli("tree", *at, "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["cluster"] == "pool-a" and doc["app"] == "pool-a" and doc["inventory"].endswith(cfg.agent.name)
    by_kind = {o["kind"]: o for o in doc["objects"]}
    assert set(by_kind) == {"Namespace", "ConfigMap", "Deployment"}
    (rs,) = by_kind["Deployment"]["children"]
    assert rs["kind"] == "ReplicaSet" and rs["member"] is False and rs["health"]["state"] == "InProgress"
    assert pod in by_kind["Deployment"]["health"]["blocker"]
    assert [p["name"] for p in rs["children"]] == [pod]
    assert by_kind["ConfigMap"]["health"]["state"] == "Current"


def test_wait_reaches_synced_and_healthy_times_out_and_sees_a_failing_app(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: daemonkit.Daemons
) -> None:
    ns = e2e.namespace("wait")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "one")})
    cfg = tune(
        write_config(tmp_path, repo, {"pool-a": cluster_pool["pool-a"]}),
        defaults={"reconcile_interval": "1h", "health_debounce": "1s"},
        token=True,
    )
    text = Path(cfg.file).read_text().replace("[defaults]\n", "[defaults]\nwait = true\n", 1)
    Path(cfg.file).write_text(text)
    cfg = load_config(cfg.file)
    daemons(cfg)
    sha = wait_for("the first pass", lambda: cluster_status(cfg, "pool-a")["revision"], 60)

    at = ["--config", cfg.file, "--cluster", "pool-a"]
    out = cli("wait", *at, "--for", "synced", "--revision", sha, "--timeout", "60s")
    assert (out.returncode, out.stdout) == (0, f"pool-a: synced at {sha[:12]}\n"), out.stderr

    # Without a config: the address and the token given, the app its cluster's only one.
    (tmp_path / "token").write_text(TOKEN)
    url = f"http://{cfg.agent.listen}"
    where = ["--cluster", "pool-a", "--url", url, "--token-file", str(tmp_path / "token")]
    out = cli("wait", *where, "--for", "healthy", "--timeout", "60s", "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc == {
        "cluster": "pool-a",
        "app": "pool-a",
        "for": "healthy",
        "result": "reached",
        "revision": sha,
        "message": f"healthy at {sha[:12]}",
        "waited_seconds": doc["waited_seconds"],
    }

    out = cli("wait", *at, "--for", "synced", "--revision", "0123456789abc", "--timeout", "2s")
    assert out.returncode == 2 and out.stdout.startswith("pool-a: timed out after 2s: "), out.stderr

    for bad in (["--app", "nope"], ["--timeout", "soon"], ["--revision", "main"]):
        out = cli("wait", *at, "--for", "synced", *bad)
        assert out.returncode == 2 and out.stdout == "", out.stderr
    out = cli("wait", "--cluster", "pool-a", "--url", url, "--for", "synced", "--timeout", "10s")
    assert out.returncode == 2 and "token" in out.stderr  # refused without one: bad input

    broken = configmaps(ns, "two") + "---\n" + configmaps("no-such-namespace-x1", "two").split("---\n")[1]
    failing = repo.commit({"clusters/pool-a/app.yaml": broken}, "a ConfigMap in a namespace nobody created")
    out = cli("wait", *at, "--for", "synced", "--revision", failing, "--timeout", "60s")
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.startswith(f"pool-a: pass failed at {failing[:12]}: ")
