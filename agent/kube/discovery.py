"""What a cluster serves: resources by group/version/kind, read from aggregated discovery.

``KubeClient.discovery`` sends the two requests (``/api``, ``/apis``) and hands the answers
to ``parse_aggregated``; ``DiscoveryCache`` keeps the result, the server's version and the
cluster's identity for every view of one client (the agent's own and the ServiceAccounts it
acts as share one cache: discovery is the agent's read, never a tenant's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from agent.config.types import DISCOVERY_TTL
from agent.errors import ClusterError
from agent.model import split_api_version

#: The ``Accept`` of a discovery request: the aggregated document, or plain JSON from an old server.
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"


@dataclass(frozen=True)
class ResourceInfo:
    """One served resource: where to send requests for a group/version/kind."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: frozenset[str]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def base_path(self, namespace: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{root}/{self.plural}"

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = self.base_path(namespace)
        return f"{base}/{quote(name, safe='')}" if name else base


class Discovery:
    """Served resources by (group, kind) with each group's preferred version first."""

    def __init__(self, resources: list[ResourceInfo]) -> None:
        self._by_gvk = {(r.group, r.version, r.kind): r for r in resources}
        self._by_gk: dict[tuple[str, str], ResourceInfo] = {}
        for r in resources:  # first seen is the preferred version (discovery order)
            self._by_gk.setdefault((r.group, r.kind), r)

    def find(self, api_version: str, kind: str) -> ResourceInfo | None:
        group, version = split_api_version(api_version)
        return self._by_gvk.get((group, version, kind))

    def find_group_kind(self, group: str, kind: str) -> ResourceInfo | None:
        return self._by_gk.get((group, kind))

    def served(self) -> dict[tuple[str, str], list[str]]:
        """(group, kind) → the versions served, the preferred first (``plan.apis`` reads it)."""
        out: dict[tuple[str, str], list[str]] = {}
        for r in self._by_gvk.values():
            versions = out.setdefault((r.group, r.kind), [])
            if r.version not in versions:
                versions.append(r.version)
        return out

    def api_versions(self) -> list[str]:
        """``group/version`` and ``group/version/Kind`` of everything served: Helm's ``--api-versions``."""
        gvs = {r.api_version for r in self._by_gvk.values()}
        gvks = {f"{r.api_version}/{r.kind}" for r in self._by_gvk.values() if r.kind}
        return sorted(gvs | gvks)

    def all(self) -> list[ResourceInfo]:
        return list(self._by_gvk.values())

    def __len__(self) -> int:
        return len(self._by_gvk)


def parse_aggregated(cluster: str, doc: Mapping[str, Any]) -> list[ResourceInfo]:
    """The resources of one aggregated discovery document (``/api`` or ``/apis``), in its order."""
    if doc.get("kind") != "APIGroupDiscoveryList":
        raise ClusterError(cluster, "server does not serve aggregated discovery (Kubernetes < 1.30?)")
    resources: list[ResourceInfo] = []
    for group in doc.get("items", []):
        gname = (group.get("metadata") or {}).get("name", "")
        for ver in group.get("versions", []):
            for res in ver.get("resources", []):
                rk = res.get("responseKind") or {}
                resources.append(
                    ResourceInfo(
                        group=gname,
                        version=ver["version"],
                        kind=rk.get("kind", ""),
                        plural=res["resource"],
                        namespaced=res.get("scope") == "Namespaced",
                        verbs=frozenset(res.get("verbs", [])),
                    )
                )
    return resources


class DiscoveryCache:
    """One cluster's discovery, version and identity, shared by every view of its client.

    Discovery holds for ``DISCOVERY_TTL`` (a cluster upgraded under a long-running agent stops
    serving versions); the version is forgotten with it, the identity never (a client talks to
    one API server).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._discovery: Discovery | None = None
        self._discovered_at = 0.0
        self.server_version: str | None = None
        self.cluster_uid: str | None = None

    def fresh(self) -> Discovery | None:
        """The cached discovery while it is younger than ``DISCOVERY_TTL``."""
        with self._lock:
            if self._discovery is not None and time.monotonic() - self._discovered_at < DISCOVERY_TTL:
                return self._discovery
            return None

    def store(self, discovery: Discovery) -> None:
        with self._lock:
            self._discovery = discovery
            self._discovered_at = time.monotonic()
            self.server_version = None  # an upgrade changes both: read it again when asked
