"""The health rules on simulated Pods: what the server holds once kwok's kubelets ran them.

The ``pods`` cluster (``agent.dev.simulation``) runs the workload controllers, kube-scheduler and
kwok: nothing here writes a status by hand. ``agent.plan.health.assess`` reads each object live,
with its ReplicaSets and Pods as children, as the agent does: a Deployment becomes Available, a
Job completes, and an image tagged ``:fail`` gives ImagePullBackOff (or, in a Job, a failed Pod).
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.dev import localcluster, simulation
from agent.model import Health, HealthState
from agent.plan.health import assess, child_index
from tests.clusters import TestNamespace, kubectl
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
    assert health.state is HealthState.FAILED and health.reason == "BackoffLimitExceeded", health
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


def test_a_rollout_to_an_image_tagged_fail_waits_on_the_new_pod_while_the_old_ones_serve(
    pods_namespace: TestNamespace,
) -> None:
    """tests/fixtures/health/deployment-bad-image.json, made by the controllers: InProgress, not
    Failed (the progress deadline decides that), the blocker the new ReplicaSet's Pod."""
    create(pods_namespace, "/apis/apps/v1/namespaces/{ns}/deployments", deployment("web", "nginx:1.27"))
    path = "/apis/apps/v1/namespaces/{ns}/deployments/web"
    wait_for(
        "the first rollout",
        lambda: health_of(pods_namespace, path).state is HealthState.CURRENT,
        ROLLOUT_SECONDS,
    )
    kubeconfig, ns = pods_namespace.cluster.kubeconfig, pods_namespace.name
    kubectl(kubeconfig, "set", "image", "deployment/web", "main=nginx:fail", "-n", ns)
    health = wait_for(
        "the new Pod's ImagePullBackOff to block the rollout",
        lambda: (h := health_of(pods_namespace, path)).blocker is not None and h,
        ROLLOUT_SECONDS,
    )
    assert health.state is HealthState.IN_PROGRESS, health
    assert health.blocker is not None and health.blocker.reason == "ImagePullBackOff"
    running = [p for p in pods(pods_namespace) if p["status"]["phase"] == "Running"]
    assert running and all(p["spec"]["containers"][0]["image"] == "nginx:1.27" for p in running)
