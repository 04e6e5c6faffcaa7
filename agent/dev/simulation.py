"""Simulated kubelets for a local cluster: kube-scheduler and kwok beside the controller manager.

``agent.dev.process`` calls this when a cluster starts with ``pods=True``: ``prepare`` issues the
two components' identities and writes their kubeconfigs and kwok's Stages, ``arguments`` gives their
command lines, and ``nodes_ready`` is what the start waits for. The API server stays real; kwok
(sigs.k8s.io/kwok) only writes what a kubelet would: Node and Pod status. What a Pod does follows
from its container images (``FAIL_IMAGE``, a regular expression):

- no image matches: the Pod runs and is Ready; a Job's Pod then exits 0 (Succeeded);
- an image matches, in a Job's Pod: it runs and exits 1 (Failed), so a hook fails on purpose;
- an image matches, in any other Pod: Pending, its container waiting in ``ImagePullBackOff``.

The Stages select with jq expressions (kwok's ``matchExpressions``), the image by ``test``.

A Job retries a failed Pod ``backoffLimit`` times (default 6, minutes of back-off): a Job meant to
fail fast sets ``backoffLimit: 0``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from agent.dev.layout import KWOK, SCHEDULER, Paths
from agent.dev.pki import Endpoint, b64, ensure_client_cert, https, write_kubeconfig
from agent.errors import LocalClusterError

#: Images of containers that fail: tag ``fail`` (``busybox:fail``, ``registry.example/app:fail``).
FAIL_IMAGE = r":fail$"
#: The workload controllers whose objects need running Pods; without the simulation they stay off,
#: so tests that write a Deployment's status by hand are not overwritten by its controller.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "ttl-after-finished-controller",
)
NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODES = ("kwok-node-0", "kwok-node-1")
#: Roomy but finite: resource requests still count, and 220 Pods fit.
CAPACITY = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
_KWOK_USER = "system:kwok-controller"
_RBAC = "rbac.authorization.k8s.io"

_NODE_READY = """conditions:
{{ range list "MemoryPressure" "DiskPressure" "PIDPressure" }}
- type: {{ . }}
  status: "False"
  reason: KubeletHasSufficient{{ trimSuffix "Pressure" . }}
  lastHeartbeatTime: {{ Now | Quote }}
  lastTransitionTime: {{ Now | Quote }}
{{ end }}
- type: Ready
  status: "True"
  reason: KubeletReady
  message: kwok plays this node's kubelet
  lastHeartbeatTime: {{ Now | Quote }}
  lastTransitionTime: {{ Now | Quote }}
addresses:
- type: InternalIP
  address: {{ NodeIP | Quote }}
- type: Hostname
  address: {{ .metadata.name | Quote }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: fake
  kubeProxyVersion: fake
phase: Running
"""

_POD_RUNNING = """conditions:
{{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
- type: {{ . }}
  status: "True"
  lastTransitionTime: {{ Now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ Now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ Now | Quote }}
      finishedAt: {{ Now | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace | Quote }}
phase: Running
startTime: {{ Now | Quote }}
"""

_POD_EXITED = """conditions:
{{ range list "Ready" "ContainersReady" }}
- type: {{ . }}
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{ Now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: EXIT_CODE
      reason: REASON
      startedAt: {{ Now | Quote }}
      finishedAt: {{ Now | Quote }}
{{ end }}
phase: PHASE
"""

_POD_PULL_BACKOFF = """conditions:
- type: PodScheduled
  status: "True"
  lastTransitionTime: {{ Now | Quote }}
- type: Ready
  status: "False"
  reason: ContainersNotReady
  lastTransitionTime: {{ Now | Quote }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    waiting:
      reason: ImagePullBackOff
      message: Back-off pulling image {{ .image | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
phase: Pending
"""


#: A selector requirement: jq ``key``, operator, values (kwok's ``matchExpressions``). Not CEL:
#: kwok v0.8.0 types ``self`` as the Go struct, and its CEL cannot resolve list elements
#: (``v1.NodeCondition``, ``v1.Container``) inside ``exists``.
Requirement = tuple[str, str, tuple[str, ...]]

_LIVE: Requirement = (".metadata.deletionTimestamp", "DoesNotExist", ())
_PENDING: Requirement = (".status.phase", "In", ("Pending",))
_NOT_READY: Requirement = ('.status.conditions.[] | select(.type == "Ready") | .status', "NotIn", ("True",))
_JOB: Requirement = (".metadata.ownerReferences.[].kind", "In", ("Job",))
_NOT_JOB: Requirement = (".metadata.ownerReferences.[].kind", "NotIn", ("Job",))
_NOT_PULLING: Requirement = (
    ".status.containerStatuses.[].state.waiting.reason",
    "NotIn",
    ("ImagePullBackOff",),
)


def _stage(name: str, kind: str, requirements: list[Requirement], next_: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {
                "matchExpressions": [
                    {"jq": {"key": key, "operator": op, **({"values": list(values)} if values else {})}}
                    for key, op, values in requirements
                ]
            },
            "next": next_,
        },
    }


def stages(fail_image: str = FAIL_IMAGE) -> list[dict[str, Any]]:
    """kwok's Stages: what a Node and a Pod go through (kwok ships none by default in its binary)."""
    fails_key = f".spec.containers.[].image | test({json.dumps(fail_image)})"
    fails: Requirement = (fails_key, "In", ("true",))
    runs: Requirement = (fails_key, "NotIn", ("true",))

    def exited(code: int, reason: str, phase: str) -> str:
        return _POD_EXITED.replace("EXIT_CODE", str(code)).replace("REASON", reason).replace("PHASE", phase)

    return [
        _stage("node-ready", "Node", [_NOT_READY], {"statusTemplate": _NODE_READY}),
        _stage("pod-delete", "Pod", [(".metadata.deletionTimestamp", "Exists", ())], {"delete": True}),
        _stage("pod-ready", "Pod", [_LIVE, _PENDING, _NOT_READY, runs], {"statusTemplate": _POD_RUNNING}),
        _stage(
            "pod-job-fails",
            "Pod",
            [_LIVE, _PENDING, _JOB, fails],
            {"statusTemplate": exited(1, "Error", "Failed")},
        ),
        _stage(
            "pod-image-pull-backoff",
            "Pod",
            [_LIVE, _PENDING, _NOT_JOB, fails, _NOT_PULLING],
            {"statusTemplate": _POD_PULL_BACKOFF},
        ),
        _stage(
            "pod-job-completes",
            "Pod",
            [_LIVE, (".status.phase", "In", ("Running",)), _JOB],
            {"statusTemplate": exited(0, "Completed", "Succeeded")},
        ),
    ]


def prepare(paths: Paths, endpoint: Endpoint, *, fail_image: str = FAIL_IMAGE) -> None:
    """Identities, kubeconfigs and Stages of the scheduler and kwok; kwok's RBAC and the fake Nodes.

    Needs a ready API server (it writes RBAC objects and Nodes through ``endpoint``); idempotent.
    """
    server = f"https://127.0.0.1:{endpoint.port}"
    for kubeconfig, stem, user in (
        (paths.scheduler_kubeconfig, "scheduler", "system:kube-scheduler"),
        (paths.kwok_kubeconfig, "kwok", _KWOK_USER),
    ):
        # kube-scheduler's rights come with the API server's bootstrap RBAC (system:kube-scheduler).
        cert, key = ensure_client_cert(paths.pki, stem, cn=user)
        credentials = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
        write_kubeconfig(kubeconfig, paths.name, server, paths.pki.ca_cert, user, credentials)
    paths.kwok_config.write_text(yaml.safe_dump_all(stages(fail_image), sort_keys=False))
    for collection, obj in (*_kwok_rbac(), *(("/api/v1/nodes", _node(name)) for name in NODES)):
        _ensure(endpoint, collection, obj)


def arguments(paths: Paths, binaries: dict[str, Path]) -> dict[str, list[str]]:
    """Command lines of the scheduler and kwok, by component."""
    return {
        SCHEDULER: [
            str(binaries[SCHEDULER]),
            f"--kubeconfig={paths.scheduler_kubeconfig}",
            f"--authentication-kubeconfig={paths.scheduler_kubeconfig}",
            f"--authorization-kubeconfig={paths.scheduler_kubeconfig}",
            "--secure-port=0",  # nothing scrapes it, and it would need one more free port
            "--leader-elect=false",
        ],
        KWOK: [
            str(binaries[KWOK]),
            f"--kubeconfig={paths.kwok_kubeconfig}",
            f"--config={paths.kwok_config}",
            f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
            # No Leases and no heartbeats: nothing here marks a silent node NotReady (the node
            # lifecycle controller is off), and periodic writes would be counted by the benchmarks.
            "--node-lease-duration-seconds=0",
            "--node-ip=10.0.1.1",
            "--cidr=10.0.2.0/24",
        ],
    }


def nodes_ready(endpoint: Endpoint) -> bool:
    """Every fake Node reports Ready: kwok runs, with its rights, and has read its Stages."""
    code, body = https(endpoint, "GET", "/api/v1/nodes?labelSelector=type%3Dkwok", timeout=2.0)
    if code != 200:
        return False
    ready = {
        n["metadata"]["name"]
        for n in body.get("items", [])
        if any(
            c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])
        )
    }
    return ready >= set(NODES)


def _node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "status": {"capacity": CAPACITY, "allocatable": CAPACITY},
    }


def _kwok_rbac() -> list[tuple[str, dict[str, Any]]]:
    """What kwok writes as the kubelets it plays: Node and Pod status, Pod deletion, events."""
    name = "gitops-agent-local:kwok-controller"
    rules = [
        {
            "apiGroups": [""],
            "resources": ["nodes", "pods"],
            "verbs": ["get", "list", "watch", "patch", "update"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
        {"apiGroups": [""], "resources": ["nodes/status", "pods/status"], "verbs": ["patch", "update"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    ]
    role = {"apiVersion": f"{_RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules}
    binding = {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": _RBAC, "kind": "User", "name": _KWOK_USER}],
    }
    return [
        (f"/apis/{_RBAC}/v1/clusterroles/{name}", role),
        (f"/apis/{_RBAC}/v1/clusterrolebindings/{name}", binding),
    ]


def _ensure(endpoint: Endpoint, path: str, obj: dict[str, Any]) -> None:
    """PUT (create or replace) an RBAC object by its path; POST a Node to its collection (409: there)."""
    method = "POST" if path == "/api/v1/nodes" else "PUT"
    code, body = https(endpoint, method, path, obj)
    if code not in (200, 201, 409):
        what = f"{obj['kind']} {obj['metadata']['name']}"
        raise LocalClusterError(f"{endpoint.cluster}: creating {what} failed: HTTP {code}: {body}")
