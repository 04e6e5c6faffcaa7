"""What the chaos runner's Git repository declares for each cluster: files and expected objects (pure).

Per cluster two apps: the cluster entry's own app (plain YAML under ``plain/<cluster>``, 18
objects, so the brake applies) and an ``[[apps]]`` app rendered by kustomize
(``kust/<cluster>``, 5 objects). A cluster's content is a ``ClusterContent``: a generation
(the ConfigMaps' data and the Deployments' generation annotation), a rotation (the name of one
ConfigMap, so a force-push to other content removes one object and adds another: a legitimate
prune) and a mode (full, a mass removal, or a render error in one app).

Names that left Git never come back (the rotation only grows), so an object's UID is tracked
from the moment it is protected until it leaves Git, without races against a slow pass.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace
from typing import Any

NS, NS_K = "chaos", "chaos-k"
PLAIN_CONFIGMAPS = 10
EXTRA_CONFIGMAPS = 3
KUST_CONFIGMAPS = 4
IMAGE = "registry.invalid/chaos:1"
GENERATION = "chaos.example/generation"
DRIFT_TARGET = "drift-target"
#: Deployments: ``web`` leaves replicas to others (an HPA), ``api`` declares them (an HPA may
#: still own them through ``/scale``: the agent yields).
DEPLOYMENTS = {"web": None, "api": 2}

#: (kind, namespace, name); cluster-scoped objects have namespace "".
Key = tuple[str, str, str]


class Mode(enum.StrEnum):
    FULL = "full"
    #: Most of the plain app's objects removed: the brake must hold.
    MASS = "mass"
    #: A file of the plain app does not parse: fail closed.
    BROKEN_PLAIN = "broken-plain"
    #: The kustomize app's kustomization names a file that does not exist: fail closed.
    BROKEN_KUST = "broken-kust"


@dataclass(frozen=True)
class ClusterContent:
    generation: int = 1
    rotation: int = 1
    mode: Mode = Mode.FULL

    def next(self, *, rotate: bool) -> ClusterContent:
        """Other content: a new generation, and with ``rotate`` one ConfigMap replaced by a new name."""
        return replace(self, generation=self.generation + 1, rotation=self.rotation + rotate, mode=Mode.FULL)


def plain_app(cluster: str) -> str:
    """The cluster entry's own app is named after the entry."""
    return cluster


def kust_app(cluster: str) -> str:
    return f"kust-{cluster}"


def _doc(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True) + "\n"  # JSON is YAML: no quoting surprises


def _cm(name: str, ns: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": data,
    }


def _deployment(name: str, replicas: int | None, generation: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": name, "image": IMAGE}]},
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    meta = {"name": name, "namespace": NS, "annotations": {GENERATION: f"g{generation}"}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def _stream(objs: list[dict[str, Any]]) -> str:
    return "---\n".join(_doc(o) for o in objs)


def plain_objects(c: ClusterContent) -> dict[str, list[dict[str, Any]]]:
    """The plain app's files (name → objects) for content ``c`` (its mode ignored but MASS)."""
    value = {"value": f"g{c.generation}"}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    drift = [_cm(DRIFT_TARGET, NS, {"mode": "git"})]
    if c.mode is Mode.MASS:
        return {"namespace.yaml": [ns], "drift.yaml": drift}
    return {
        "namespace.yaml": [ns],
        "configmaps.yaml": [_cm(f"cm-{i:02d}", NS, value) for i in range(PLAIN_CONFIGMAPS)],
        "extra.yaml": [_cm(f"extra-{i}", NS, value) for i in range(EXTRA_CONFIGMAPS)],
        "rotating.yaml": [_cm(f"rot-{c.rotation}", NS, value)],
        "deployments.yaml": [_deployment(n, r, c.generation) for n, r in DEPLOYMENTS.items()],
        "drift.yaml": drift,
    }


def kust_objects(c: ClusterContent) -> list[dict[str, Any]]:
    value = {"value": f"g{c.generation}"}
    return [_cm(f"k-{i}", NS_K, value) for i in range(KUST_CONFIGMAPS)]


def files(cluster: str, c: ClusterContent) -> dict[str, str]:
    """Every file of ``cluster``'s two apps, repository-relative."""
    out = {f"plain/{cluster}/{name}": _stream(objs) for name, objs in plain_objects(c).items()}
    if c.mode is Mode.BROKEN_PLAIN:
        # A syntax error in the first document: the whole file is unusable, so an agent that
        # skipped files it cannot parse would see its objects as gone from Git.
        out[f"plain/{cluster}/extra.yaml"] = "broken: [unclosed\n---\n" + out[f"plain/{cluster}/extra.yaml"]
    resources = ["namespace.yaml", "configmaps.yaml"]
    if c.mode is Mode.BROKEN_KUST:
        resources.append("missing.yaml")
    kust = f"kust/{cluster}"
    out[f"{kust}/kustomization.yaml"] = _doc(
        {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": NS_K,
            "resources": resources,
        }
    )
    out[f"{kust}/namespace.yaml"] = _doc(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_K}}
    )
    out[f"{kust}/configmaps.yaml"] = _stream(kust_objects(c))
    return out


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def declared(c: ClusterContent) -> dict[str, dict[Key, dict[str, Any]]]:
    """Per app (``plain``/``kust``), each object Git declares and the fields the checks compare.

    ConfigMaps: ``data``; Deployments: the generation annotation and the image (replicas are
    left out: an HPA may own them); Namespaces: nothing beyond existing.
    """
    ns_k = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_K}}
    apps = {
        "plain": [o for objs in plain_objects(c).values() for o in objs],
        "kust": [ns_k, *kust_objects(c)],
    }
    return {app: {key_of(o): _checked(o) for o in objs} for app, objs in apps.items()}


def _checked(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "ConfigMap":
        return {"data": obj["data"]}
    if obj["kind"] == "Deployment":
        return {
            "generation": obj["metadata"]["annotations"][GENERATION],
            "image": obj["spec"]["template"]["spec"]["containers"][0]["image"],
        }
    return {}
