"""The health fixtures are what a real API server holds: each namespaced one of a built-in kind is
created on the local kube-apiserver, given its status through the status subresource (as its
controller would: this control plane runs no workload controllers), read back, and assessed the same.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agent.dev import localcluster
from agent.plan.health import assess
from tests.clusters import TestNamespace

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "health"

#: kind → its collection under a namespace.
PATHS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "CronJob": "/apis/batch/v1/namespaces/{ns}/cronjobs",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Ingress": "/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses",
    "HorizontalPodAutoscaler": "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
}
#: A status the server refuses on purpose: the point of the fixture is a type it never gives.
NOT_FROM_A_SERVER = {"deployment-malformed"}
#: A spec change of each kind whose fixture has a generation its controller has not observed.
NUDGE = {"Deployment": lambda n: {"minReadySeconds": n + 1}}
#: What the server assigns itself and a fixture cannot carry over.
ASSIGNED = ("uid", "resourceVersion", "creationTimestamp", "generation", "ownerReferences")


def namespaced_fixtures() -> list[Path]:
    found = []
    for path in sorted(FIXTURES.glob("*.json")):
        obj = json.loads(path.read_text())
        if obj["kind"] in PATHS and path.stem not in NOT_FROM_A_SERVER:
            found.append(path)
    return found


def created(ns: TestNamespace, fixture: dict[str, Any]) -> dict[str, Any]:
    """The fixture created in ``ns`` with its status written as its controller would, read back."""
    body = copy.deepcopy(fixture)
    status = body.pop("status", None)
    meta = body["metadata"]
    for key in ASSIGNED:
        meta.pop(key, None)
    meta["namespace"] = ns.name
    if body["kind"] == "Service":  # addresses and ports come from this cluster's ranges
        for key in ("clusterIP", "clusterIPs"):
            body["spec"].pop(key, None)
        for port in body["spec"]["ports"]:
            port.pop("nodePort", None)
    collection = PATHS[body["kind"]].format(ns=ns.name)
    code, made = localcluster.api_request(ns.cluster, "POST", collection, body)
    assert code == 201, (fixture["metadata"]["name"], made.get("message"))
    if status is None:
        return made  # type: ignore[no-any-return]
    lag = 0
    if "observedGeneration" in status:  # observed as created; a lag comes from spec writes after
        lag = fixture["metadata"]["generation"] - status["observedGeneration"]
        status["observedGeneration"] = made["metadata"]["generation"]
    made["status"] = status
    path = f"{collection}/{meta['name']}"
    code, made = localcluster.api_request(ns.cluster, "PUT", f"{path}/status", made)
    assert code == 200, (fixture["metadata"]["name"], made.get("message"))
    for n in range(lag):  # a user's spec change the controller has not seen yet
        made["spec"].update(NUDGE[body["kind"]](n))
        code, made = localcluster.api_request(ns.cluster, "PUT", path, made)
        assert code == 200, (fixture["metadata"]["name"], made.get("message"))
    return made  # type: ignore[no-any-return]


@pytest.mark.cluster
def test_every_namespaced_fixture_is_accepted_by_a_real_api_server_and_reads_the_same(
    namespace: TestNamespace,
) -> None:
    paths = namespaced_fixtures()
    assert len(paths) >= 40
    differ = {}
    for path in paths:
        fixture = json.loads(path.read_text())
        fixture["metadata"]["name"] = path.stem  # one object per fixture in the namespace
        live = created(namespace, fixture)
        ours, theirs = assess(fixture), assess(live)
        if (ours.state, ours.reason) != (theirs.state, theirs.reason):
            differ[path.stem] = (ours.describe(), theirs.describe())
    assert not differ, differ
