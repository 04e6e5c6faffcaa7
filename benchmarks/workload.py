"""Workload generator for the benchmarks: N Kubernetes objects of 16 kinds, written as YAML files.

Called by ``benchmarks.bench`` (and runnable alone: ``python -m benchmarks.workload 2000 DIR``).

The objects come from one deterministic, endless sequence and a workload of size N is its first
N items, so the workload of 1,000 objects is a subset of the one of 5,000 (the memory benchmark
grows the same clusters). The sequence starts with a CustomResourceDefinition; then, per block of
100, a Namespace followed by 99 objects cycling through the namespaced kinds (custom resources of
that CRD included) and, now and then, a cluster-scoped ClusterRole. Fields exercise the planner's
normalisation (quantities, int-or-string ports, list-map keys). Services are headless: the local
control plane's Service CIDR has only 254 addresses.

Files, one per kind, named so that ``kubectl apply -f DIR`` meets Namespaces before their members::

    00-crd.yaml            the CRD (kubectl applies it alone first and waits for Established)
    01-namespace.yaml
    10-<kind>.yaml ...     everything else

``revision`` is written into an annotation of every object; ``changed`` (indices) get another
value, which is how the small-change benchmark changes 1% of the objects; ``prune_set`` picks the
10% the prune benchmark removes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GROUP = "bench.gitops-agent.io"
CRD_NAME = f"widgets.{GROUP}"
REV_ANNOTATION = "bench.gitops-agent.io/rev"
BLOCK = 100
CRD_FILE = "00-crd.yaml"

Manifest = dict[str, Any]


def _meta(name: str, ns: str | None, rev: str) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "labels": {"app": name[:50], "bench": "yes"}}
    if ns:
        m["namespace"] = ns
    m["annotations"] = {REV_ANNOTATION: rev}
    return m


def _container(name: str) -> dict[str, Any]:
    return {
        "name": "main",
        "image": f"registry.example/{name[:40]}:1.0",
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "env": [{"name": "MODE", "value": "bench"}, {"name": "NAME", "value": name}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "0.125Gi"}},
    }


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": name[:50]}}, "spec": {"containers": [_container(name)]}}


def configmap(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(name, ns, rev),
        "data": {"app.properties": f"name={name}\nlevel=info\n", "mode": "bench"},
    }


def secret(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(name, ns, rev),
        "type": "Opaque",
        "stringData": {"password": f"pw-{name}"},
    }


def service_account(name: str, ns: str, rev: str) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, ns, rev)}


def service(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, ns, rev),
        "spec": {
            "clusterIP": "None",
            "selector": {"app": name[:50]},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def role(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(name, ns, rev),
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    }


def role_binding(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(name, ns, rev),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
    }


def deployment(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, ns, rev),
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name[:50]}}, "template": _pod(name)},
    }


def stateful_set(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(name, ns, rev),
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name[:50]}},
            "template": _pod(name),
        },
    }


def cron_job(name: str, ns: str, rev: str) -> Manifest:
    pod = _pod(name)
    pod["spec"]["restartPolicy"] = "OnFailure"
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": _meta(name, ns, rev),
        "spec": {"schedule": "*/30 * * * *", "jobTemplate": {"spec": {"template": pod}}},
    }


def pdb(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(name, ns, rev),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name[:50]}}},
    }


def network_policy(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(name, ns, rev),
        "spec": {
            "podSelector": {"matchLabels": {"app": name[:50]}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"port": "http", "protocol": "TCP"}]}],
        },
    }


def hpa(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(name, ns, rev),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": 5,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }


def widget(name: str, ns: str, rev: str) -> Manifest:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": _meta(name, ns, rev),
        "spec": {"size": "1Gi", "replicas": 3, "ports": [{"name": "http", "port": 80}], "tier": "gold"},
    }


def cluster_role(name: str, rev: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(name, None, rev),
        "rules": [{"apiGroups": [GROUP], "resources": ["widgets"], "verbs": ["get", "list", "watch"]}],
    }


def namespace(name: str, rev: str) -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name, None, rev)}


def crd(rev: str) -> Manifest:
    port = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
        "required": ["name"],
    }
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "size": {
                        "x-kubernetes-int-or-string": True,
                        "anyOf": [{"type": "integer"}, {"type": "string"}],
                    },
                    "replicas": {"type": "integer"},
                    "tier": {"type": "string"},
                    "ports": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": port,
                    },
                },
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": _meta(CRD_NAME, None, rev),
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


NAMESPACED: list[tuple[str, Callable[[str, str, str], Manifest]]] = [
    ("configmap", configmap),
    ("secret", secret),
    ("serviceaccount", service_account),
    ("service", service),
    ("role", role),
    ("rolebinding", role_binding),
    ("deployment", deployment),
    ("statefulset", stateful_set),
    ("cronjob", cron_job),
    ("pdb", pdb),
    ("networkpolicy", network_policy),
    ("hpa", hpa),
    ("widget", widget),
]
#: Kinds in a workload of 200 or more objects (for the "kinds + a handful" request target).
KINDS = len(NAMESPACED) + 3  # + Namespace, CRD, ClusterRole


@dataclass(frozen=True)
class Item:
    index: int
    file: str
    manifest: Manifest


def sequence(rev: str = "1", changed: frozenset[int] = frozenset()) -> Iterator[Item]:
    """The endless object sequence; ``changed`` indices carry revision ``rev + "-changed"``."""

    def r(i: int) -> str:
        return f"{rev}-changed" if i in changed else rev

    yield Item(0, CRD_FILE, crd(r(0)))
    i = 1
    block = 0
    while True:
        ns = f"bench-{block:03d}"
        yield Item(i, "01-namespace.yaml", namespace(ns, r(i)))
        i += 1
        for j in range(BLOCK - 1):
            if j % 50 == 49:
                name = f"bench-reader-{block:03d}-{j:02d}"
                yield Item(i, "10-clusterrole.yaml", cluster_role(name, r(i)))
            else:
                kind, make = NAMESPACED[j % len(NAMESPACED)]
                yield Item(i, f"10-{kind}.yaml", make(f"{kind}-{block:03d}-{j:02d}", ns, r(i)))
            i += 1
        block += 1


def generate(n: int, rev: str = "1", changed: frozenset[int] = frozenset()) -> list[Item]:
    out: list[Item] = []
    for item in sequence(rev, changed):
        if len(out) == n:
            break
        out.append(item)
    return out


def change_set(n: int, fraction: float = 0.01) -> frozenset[int]:
    """Indices of ``fraction`` of a workload of ``n``, spread evenly, never a Namespace or the CRD."""
    want = max(1, round(n * fraction))
    step = max(1, n // want)
    picked = [i for i in range(step // 2 + 1, n, step) if i % BLOCK != 1][:want]
    return frozenset(picked)


def prune_set(n: int, fraction: float = 0.1) -> frozenset[int]:
    """Indices of ``fraction`` of a workload of ``n`` to remove from Git (the prune benchmark): as
    ``change_set`` picks them, so never a Namespace (its removal would delete its members too) or
    the CRD, and none of the 1% ``change_set`` picks at the default fractions."""
    return change_set(n, fraction)


def write(items: list[Item], directory: Path) -> dict[str, int]:
    """Write the items as multi-document YAML files (JSON documents: valid YAML, fast to write)."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.yaml"):
        old.unlink()
    files: dict[str, list[str]] = {}
    for it in items:
        files.setdefault(it.file, []).append(json.dumps(it.manifest, sort_keys=False))
    for name, docs in files.items():
        (directory / name).write_text("---\n" + "\n---\n".join(docs) + "\n")
    return {k: len(v) for k, v in sorted(files.items())}


def kind_count(items: list[Item]) -> int:
    return len({(it.manifest["apiVersion"], it.manifest["kind"]) for it in items})


if __name__ == "__main__":
    size, target = int(sys.argv[1]), Path(sys.argv[2])
    written = write(generate(size), target)
    print(json.dumps({"objects": size, "files": written}, indent=1))
