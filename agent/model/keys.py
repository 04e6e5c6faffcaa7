"""Object identity: ``ObjectKey``, apiVersion and Kubernetes release parsing, apply order.

The vocabulary every stage names objects in; ``phase_of`` orders them for apply and deletion.
"""

from __future__ import annotations

import re
import sys
from typing import Any, NamedTuple

Manifest = dict[str, Any]
#: A field path in managedFields' own vocabulary: ``("f:spec", "f:containers",
#: 'k:{"name":"app"}', "f:image")``. Elements are ``f:<name>``, ``k:<json>``
#: (keys sorted, compact), ``v:<json>`` or ``i:<n>``.
FieldPath = tuple[str, ...]


def split_api_version(api_version: str) -> tuple[str, str]:
    """``apps/v1`` → (``apps``, ``v1``); ``v1`` → (``""``, ``v1``)."""
    if "/" in api_version:
        group, _, version = api_version.partition("/")
        return group, version
    return "", api_version


#: A Kubernetes release as (major, minor): what the version table, a cluster's
#: ``kubernetes_version`` and ``--kubernetes-version`` compare.
Release = tuple[int, int]
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


def parse_release(text: str) -> Release:
    """``1.25``, ``v1.25`` or ``v1.25.3`` → (1, 25); ``ValueError`` naming the text otherwise."""
    m = _RELEASE.match(text.strip())
    if not m:
        raise ValueError(f"not a Kubernetes release (expected 1.NN, v1.NN or v1.NN.P): {text!r}")
    return int(m.group(1)), int(m.group(2))


def release_text(release: Release) -> str:
    return f"{release[0]}.{release[1]}"


class ObjectKey(NamedTuple):
    """Identity of an object in one cluster: group, kind, namespace, name (no version).

    A tuple, not a dataclass: a pass looks each key up some thirty times (declared, live, memo,
    members), and a tuple hashes and compares in C, a dataclass in a Python call each time.
    """

    group: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, manifest: Manifest) -> ObjectKey:
        group, _ = split_api_version(str(manifest.get("apiVersion", "")))
        meta = manifest.get("metadata") or {}
        # A hook named by ``generateName`` only (its object's name is the server's): known by that.
        name = meta.get("name") or meta.get("generateName") or ""
        return cls.interned(group, str(manifest.get("kind", "")), str(meta.get("namespace") or ""), str(name))

    @classmethod
    def interned(cls, group: str, kind: str, namespace: str, name: str) -> ObjectKey:
        """A key whose group, kind and namespace are shared with every other key's: a pass holds
        tens of thousands of keys (live, members, verdicts), each with its own copy otherwise."""
        return cls(sys.intern(group), sys.intern(kind), sys.intern(namespace), name)

    @property
    def group_kind(self) -> str:
        """``Deployment.apps`` / ``ConfigMap``: the ApplySet ``contains-group-kinds`` spelling."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def __str__(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.group_kind}/{ns}{self.name}"


#: The group and kind of a CustomResourceDefinition (applied, and waited for, before its resources).
CRD_KEY = ("apiextensions.k8s.io", "CustomResourceDefinition")


def phase_of(key: ObjectKey) -> int:
    """Apply order: Namespaces, CRDs, other cluster-scoped objects, namespaced ones; deletion reverses it."""
    if key.group == "" and key.kind == "Namespace":
        return 0
    if (key.group, key.kind) == CRD_KEY:
        return 1
    return 2 if not key.namespace else 3
