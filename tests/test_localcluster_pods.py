"""Local clusters whose Pods run: kube-scheduler and kwok's simulated kubelets on fake Nodes.

The API server and the workload controllers are real; kwok writes what a kubelet would. The
health rules (``agent.plan.health``) read what the server then holds, with no status written
by hand: a Deployment becomes Available, a Job completes, an image tagged ``:fail`` fails.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.dev import localcluster, simulation
from agent.dev.process import LocalCluster
from agent.errors import LocalClusterError
from agent.model import Health, HealthState
from agent.plan.health import assess, child_index
from agent.render import binaries as tools
from tests import clusters
from tests.clusters import ClusterControl, TestNamespace, kubectl
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

ROLLOUT_SECONDS = 60.0


def deployment(name: str, image: str, replicas: int = 2) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": image}]},
            },
        },
    }


def job(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,  # one failed Pod fails the Job (the default retries for minutes)
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": image}]},
            },
        },
    }


def create(ns: TestNamespace, collection: str, body: dict[str, Any]) -> None:
    code, answer = localcluster.api_request(ns.cluster, "POST", collection.format(ns=ns.name), body)
    assert code == 201, answer


def get(ns: TestNamespace, path: str) -> dict[str, Any]:
    code, answer = localcluster.api_request(ns.cluster, "GET", path.format(ns=ns.name))
    assert code == 200, answer
    return answer  # type: ignore[no-any-return]


def pods(ns: TestNamespace) -> list[dict[str, Any]]:
    return get(ns, "/api/v1/namespaces/{ns}/pods")["items"]  # type: ignore[no-any-return]


def health_of(ns: TestNamespace, path: str) -> Health:
    """``assess`` of the live object, with its ReplicaSets and Pods as children (as the agent reads)."""
    obj = get(ns, path)
    children = [
        *get(ns, "/apis/apps/v1/namespaces/{ns}/replicasets")["items"],
        *pods(ns),
    ]
    for child in children:
        child.setdefault("apiVersion", "v1" if "containers" in child.get("spec", {}) else "apps/v1")
        child.setdefault("kind", "Pod" if "containers" in child.get("spec", {}) else "ReplicaSet")
    return assess(obj, children=child_index(children))


def test_a_deployment_becomes_available_on_simulated_nodes(pods_namespace: TestNamespace) -> None:
    create(pods_namespace, "/apis/apps/v1/namespaces/{ns}/deployments", deployment("web", "nginx:1.27"))
    path = "/apis/apps/v1/namespaces/{ns}/deployments/web"
    health = wait_for(
        "the Deployment to become Current",
        lambda: (h := health_of(pods_namespace, path)).state is HealthState.CURRENT and h,
        ROLLOUT_SECONDS,
    )
    assert health.state is HealthState.CURRENT
    status = get(pods_namespace, path)["status"]
    assert status["availableReplicas"] == 2
    assert {p["spec"]["nodeName"] for p in pods(pods_namespace)} <= set(simulation.NODES)
    assert all(p["status"]["phase"] == "Running" for p in pods(pods_namespace))


def test_a_job_completes_and_its_pod_succeeds(pods_namespace: TestNamespace) -> None:
    create(pods_namespace, "/apis/batch/v1/namespaces/{ns}/jobs", job("migrate", "busybox:1.36"))
    path = "/apis/batch/v1/namespaces/{ns}/jobs/migrate"
    wait_for(
        "the Job to complete",
        lambda: health_of(pods_namespace, path).state is HealthState.CURRENT,
        ROLLOUT_SECONDS,
    )
    conditions = {c["type"]: c["status"] for c in get(pods_namespace, path)["status"]["conditions"]}
    assert conditions.get("Complete") == "True"
    assert [p["status"]["phase"] for p in pods(pods_namespace)] == ["Succeeded"]


def test_a_job_whose_image_is_tagged_fail_fails(pods_namespace: TestNamespace) -> None:
    create(pods_namespace, "/apis/batch/v1/namespaces/{ns}/jobs", job("hook", "busybox:fail"))
    path = "/apis/batch/v1/namespaces/{ns}/jobs/hook"
    health = wait_for(
        "the Job to fail",
        lambda: (h := health_of(pods_namespace, path)).state is HealthState.FAILED and h,
        ROLLOUT_SECONDS,
    )
    assert health.state is HealthState.FAILED
    (pod,) = pods(pods_namespace)
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1


def test_an_image_tagged_fail_gives_image_pull_back_off_named_as_the_blocker(
    pods_namespace: TestNamespace,
) -> None:
    create(pods_namespace, "/apis/apps/v1/namespaces/{ns}/deployments", deployment("web", "web:fail", 1))
    path = "/apis/apps/v1/namespaces/{ns}/deployments/web"
    health = wait_for(
        "the Pod's ImagePullBackOff to be named",
        lambda: (h := health_of(pods_namespace, path)).blocker is not None and h,
        ROLLOUT_SECONDS,
    )
    assert health.state is HealthState.IN_PROGRESS
    assert health.blocker is not None and health.blocker.reason == "ImagePullBackOff"
    (pod,) = pods(pods_namespace)
    assert pod["status"]["phase"] == "Pending"
    assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"


def test_deleting_a_pod_on_a_simulated_node_finishes(pods_namespace: TestNamespace) -> None:
    create(pods_namespace, "/apis/apps/v1/namespaces/{ns}/deployments", deployment("web", "nginx:1.27", 1))
    (first,) = wait_for(
        "a running Pod",
        lambda: [p for p in pods(pods_namespace) if p["status"]["phase"] == "Running"],
        ROLLOUT_SECONDS,
    )
    name = first["metadata"]["name"]
    kubectl(
        pods_namespace.cluster.kubeconfig, "delete", "pod", name, "-n", pods_namespace.name, "--wait=false"
    )
    wait_for(
        "the deleted Pod to be gone and replaced by a running one",
        lambda: (
            [p["metadata"]["name"] for p in pods(pods_namespace) if p["status"]["phase"] == "Running"]
            not in ([], [name])
        ),
        ROLLOUT_SECONDS,
    )


def test_a_cluster_with_pods_is_found_again_restarts_with_them_and_stops_every_process(
    fresh_cluster: Callable[..., LocalCluster], cluster_ctl: ClusterControl
) -> None:
    cluster = fresh_cluster(pods=True)
    assert cluster.pids.scheduler is not None and cluster.pids.kwok is not None
    assert localcluster.start(cluster.name, cluster.state_dir) == cluster  # found again, as it runs
    with pytest.raises(LocalClusterError, match="runs with simulated Pods: stop it first"):
        localcluster.start(cluster.name, cluster.state_dir, pods=False)
    state = localcluster.status(cluster.name, cluster.state_dir)
    assert state.running and set(state.pids) == {*localcluster.COMPONENTS, *localcluster.SIMULATION}

    cluster_ctl.stop(cluster)
    assert set(localcluster.status(cluster.name, cluster.state_dir).pids.values()) == {None}
    for pid in (cluster.pids.scheduler, cluster.pids.kwok):
        assert not _alive(pid)

    restarted = cluster_ctl.start(cluster)  # as it last ran: with Pods
    assert restarted.pids.kwok is not None and restarted.pids.kwok != cluster.pids.kwok
    nodes = kubectl(restarted.kubeconfig, "get", "nodes", "-o", "name").split()
    assert nodes == [f"node/{n}" for n in simulation.NODES]


def test_a_cluster_started_without_pods_runs_no_scheduler_nor_kwok(
    fresh_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = fresh_cluster()
    assert cluster.pids.scheduler is None and cluster.pids.kwok is None
    assert set(localcluster.status(cluster.name, cluster.state_dir).pids) == set(localcluster.COMPONENTS)


def test_the_stages_test_container_images_against_the_failing_image_pattern() -> None:
    by_name = {s["metadata"]["name"]: s for s in simulation.stages(r"/broken-")}
    keys = [e["jq"]["key"] for e in by_name["pod-image-pull-backoff"]["spec"]["selector"]["matchExpressions"]]
    assert '.spec.containers.[].image | test("/broken-")' in keys
    assert set(by_name) == {
        "node-ready",
        "pod-delete",
        "pod-ready",
        "pod-job-fails",
        "pod-image-pull-backoff",
        "pod-job-completes",
    }


def _alive(pid: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_missing_scheduler_or_kwok_fails_the_start_with_pods_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A control plane without the simulation's binaries still starts without Pods; asked for Pods,
    it fails before starting anything, naming the script that builds the missing one."""
    bins = tmp_path / "bins"
    bins.mkdir()
    for component in (*localcluster.COMPONENTS, "kubectl"):
        (bins / component).symlink_to(tools.tool(component))
    monkeypatch.setenv("GITOPS_AGENT_BIN_DIR", str(bins))
    monkeypatch.setenv("GITOPS_AGENT_CACHE", str(tmp_path / "cache"))
    tools.cache_clear()
    try:
        with pytest.raises(
            LocalClusterError, match=r"kube-scheduler not found: run scripts/install-control-plane"
        ):
            localcluster.start("nopods", tmp_path / "state", pods=True)
        (bins / "kube-scheduler").write_text("#!/bin/sh\n")  # found: only kwok is missing now
        (bins / "kube-scheduler").chmod(0o755)
        with pytest.raises(LocalClusterError, match=r"kwok not found: run scripts/install-go-tools kwok"):
            localcluster.start("nopods", tmp_path / "state", pods=True)
        with pytest.raises(pytest.fail.Exception, match="local control plane unavailable"):
            clusters.require_control_plane(pods=True)
    finally:
        monkeypatch.undo()
        tools.cache_clear()
    assert not (tmp_path / "state" / "nopods").exists()
