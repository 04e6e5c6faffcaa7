"""Acting as the controllers the local control plane does not run (no tests of its own).

The local control plane runs no Deployment or ReplicaSet controller and no kubelet, so a test
that needs a rollout writes what they would: a ReplicaSet owned by the Deployment (named with
its ``pod-template-hash``), Pods owned by the ReplicaSet, and every status through the status
subresource. ``roll_out`` is one step of that, from what the Deployment is now.

On the ``pods`` cluster (simulated Pods) the controllers run; ``release`` then plays a queueing
controller: a test holds a Job's Pod with ``HOLD_GATE`` to look at a sync while the Job waits.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agent.errors import ApiError
from agent.kube.client import KubeClient

Manifest = dict[str, Any]


def _merge(client: KubeClient, path: str, body: Manifest) -> Manifest:
    result: Manifest = client.request("PATCH", path, body=body, content_type="application/merge-patch+json")
    return result


def _create(client: KubeClient, path: str, body: Manifest) -> Manifest:
    try:
        result: Manifest = client.request("POST", path, body=body)
        return result
    except ApiError as e:
        if e.status != 409:
            raise
        name = body["metadata"]["name"]
        got: Manifest = client.request("GET", f"{path}/{name}")
        return got


def deployment(client: KubeClient, ns: str, name: str) -> Manifest:
    got: Manifest = client.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
    return got


def _owner(obj: Manifest) -> Manifest:
    meta = obj["metadata"]
    return {
        "apiVersion": obj.get("apiVersion", "apps/v1"),
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def roll_out(
    client: KubeClient,
    ns: str,
    name: str,
    *,
    ready: int | None = None,
    waiting: str = "",
    message: str = "",
) -> str:
    """Write one rollout step of Deployment ``ns/name`` at its current generation; the Pod's name.

    ``ready``: how many of its replicas are ready (default: all). ``waiting``: the waiting reason
    of the Pods that are not (``ImagePullBackOff``), as a kubelet reports it.
    """
    d = deployment(client, ns, name)
    d.setdefault("kind", "Deployment")
    spec, meta = d["spec"], d["metadata"]
    wanted = int(spec.get("replicas", 1))
    ready = wanted if ready is None else ready
    template = spec["template"]
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
    rs_name = f"{name}-{digest}"
    labels = {**(template.get("metadata", {}).get("labels") or {}), "pod-template-hash": digest}
    base = f"/apis/apps/v1/namespaces/{ns}"
    rs = _create(
        client,
        f"{base}/replicasets",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": rs_name, "namespace": ns, "labels": labels, "ownerReferences": [_owner(d)]},
            "spec": {
                "replicas": wanted,
                "selector": {"matchLabels": labels},
                "template": {**template, "metadata": {**template.get("metadata", {}), "labels": labels}},
            },
        },
    )
    rs.setdefault("kind", "ReplicaSet")
    rs.setdefault("apiVersion", "apps/v1")
    _merge(
        client,
        f"{base}/replicasets/{rs_name}/status",
        {
            "status": {
                "replicas": wanted,
                "fullyLabeledReplicas": wanted,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "observedGeneration": rs["metadata"].get("generation", 1),
            }
        },
    )
    first = ""
    for i in range(wanted):
        pod_name = f"{rs_name}-{i:05d}"
        first = first or pod_name
        container = template["spec"]["containers"][0]
        _create(
            client,
            f"/api/v1/namespaces/{ns}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "namespace": ns,
                    "labels": labels,
                    "ownerReferences": [_owner(rs)],
                },
                "spec": template["spec"],
            },
        )
        ok = i < ready
        state = (
            {"running": {"startedAt": "2026-12-03T00:00:00Z"}}
            if ok
            else {"waiting": {"reason": waiting or "ContainerCreating", "message": message}}
        )
        _merge(
            client,
            f"/api/v1/namespaces/{ns}/pods/{pod_name}/status",
            {
                "status": {
                    "phase": "Running" if ok else "Pending",
                    "conditions": [{"type": "Ready", "status": "True" if ok else "False"}],
                    "containerStatuses": [
                        {
                            "name": container["name"],
                            "image": container["image"],
                            "imageID": "",
                            "ready": ok,
                            "restartCount": 0,
                            "state": state,
                        }
                    ],
                }
            },
        )
    done = ready >= wanted
    _merge(
        client,
        f"{base}/deployments/{name}/status",
        {
            "status": {
                "observedGeneration": meta["generation"],
                "replicas": wanted,
                "updatedReplicas": wanted,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "unavailableReplicas": wanted - ready,
                "conditions": [
                    {
                        "type": "Available",
                        "status": "True" if done else "False",
                        "reason": "MinimumReplicasAvailable" if done else "MinimumReplicasUnavailable",
                    },
                    {
                        "type": "Progressing",
                        "status": "True",
                        "reason": "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
                        "message": f'ReplicaSet "{rs_name}" is progressing.',
                    },
                ],
            }
        },
    )
    return first


def finish_job(client: KubeClient, ns: str, name: str, *, failed: bool = False) -> Manifest:
    """Write what the Job controller writes when Job ``ns/name`` completes (or fails: its backoff
    limit reached), through the status subresource, with the conditions the server requires first."""
    from datetime import UTC, datetime

    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def condition(kind: str, reason: str) -> Manifest:
        return {
            "type": kind,
            "status": "True",
            "lastTransitionTime": now,
            "reason": reason,
            "message": reason,
        }

    if failed:
        status: Manifest = {
            "startTime": now,
            "failed": 1,
            "conditions": [
                condition("FailureTarget", "BackoffLimitExceeded"),
                condition("Failed", "BackoffLimitExceeded"),
            ],
        }
    else:
        status = {
            "startTime": now,
            "completionTime": now,
            "succeeded": 1,
            "conditions": [
                condition("SuccessCriteriaMet", "CompletionsReached"),
                condition("Complete", "CompletionsReached"),
            ],
        }
    return _merge(client, f"/apis/batch/v1/namespaces/{ns}/jobs/{name}/status", {"status": status})


#: A scheduling gate a test puts in a Job's Pod template: the Pod waits unscheduled (so its Job
#: stays InProgress on simulated Pods) until ``release`` removes the gate.
HOLD_GATE = "gitops-agent.test/hold"


def release(client: KubeClient, ns: str) -> int:
    """What a queueing controller does: remove ``HOLD_GATE`` from the Pods of ``ns`` that carry it,
    so the scheduler binds them and kwok runs them. The number of Pods released."""
    released = 0
    for pod in client.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]:
        gates = pod["spec"].get("schedulingGates") or []
        if any(g["name"] == HOLD_GATE for g in gates):
            keep = [g for g in gates if g["name"] != HOLD_GATE]
            path = f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"
            client.request(
                "PATCH",
                path,
                body=[{"op": "replace", "path": "/spec/schedulingGates", "value": keep}],
                content_type="application/json-patch+json",
            )
            released += 1
    return released
