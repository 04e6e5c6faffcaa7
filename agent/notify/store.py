"""Where notification state lives: beside the Leases in the management cluster, or in a file.

``notifier.Notifier`` loads one cluster's ``policy.ClusterState``, decides, and saves it with the
version it loaded before sending anything: a save that finds another version raises ``Conflict``
(another replica wrote meanwhile; the notifier reloads and decides again), so no message goes out
twice across restarts or replicas. The served cluster is never used: it is unreachable exactly
when an alert matters.

- ``ConfigMapStore``: one ConfigMap per served cluster, ``<agent>-notify-<cluster>``, in the Lease
  namespace of the management cluster, written with its ``resourceVersion`` (a merge patch that
  carries it is refused with 409 when the object moved on). The agent's namespaced Role covers it.
- ``FileStore``: one JSON file per cluster under ``[agent] cache_dir`` for an agent without a
  management cluster (one replica, Leases off).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from agent.errors import ApiError
from agent.kube.client import KubeClient
from agent.model import CLUSTER_LABEL
from agent.notify.policy import ClusterState

DATA_KEY = "state.json"
#: Names the agent whose state this is; not ``AGENT_LABEL``, which finds ApplySet parents.
STATE_LABEL = "gitops-agent.io/notify-state"


class Conflict(Exception):
    """The state changed since it was loaded (another replica saved it)."""


class StoreError(Exception):
    """The state could not be read or written (the management cluster did not answer, ...)."""


class StateStore(Protocol):
    def load(self, cluster: str) -> tuple[ClusterState, str]:
        """The cluster's state and its version ("" when none was saved yet)."""
        ...

    def save(self, cluster: str, state: ClusterState, version: str) -> str:
        """Save over ``version``; the new version. Raises ``Conflict`` or ``StoreError``."""
        ...

    @property
    def where(self) -> str: ...


class ConfigMapStore:
    """One ConfigMap per served cluster in the management cluster (see the module docstring)."""

    def __init__(self, client: KubeClient, *, namespace: str, agent: str) -> None:
        self.client = client
        self.namespace = namespace
        self.agent = agent

    @property
    def where(self) -> str:
        return f"ConfigMaps {self.agent}-notify-* in namespace {self.namespace} of the management cluster"

    def name(self, cluster: str) -> str:
        return f"{self.agent}-notify-{cluster}"

    @property
    def _base(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    def load(self, cluster: str) -> tuple[ClusterState, str]:
        try:
            obj = self.client.request("GET", f"{self._base}/{self.name(cluster)}")
        except ApiError as e:
            if e.status == 404:
                return ClusterState(), ""
            raise StoreError(str(e)) from e
        raw = (obj.get("data") or {}).get(DATA_KEY) or "{}"
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = {}
        return ClusterState.from_json(doc), str(obj["metadata"]["resourceVersion"])

    def save(self, cluster: str, state: ClusterState, version: str) -> str:
        data = {DATA_KEY: json.dumps(state.to_json(), sort_keys=True)}
        try:
            if not version:
                body: dict[str, Any] = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": self.name(cluster),
                        "namespace": self.namespace,
                        "labels": {STATE_LABEL: self.agent, CLUSTER_LABEL: cluster},
                    },
                    "data": data,
                }
                out = self.client.request("POST", self._base, body=body)
            else:
                patch = {"metadata": {"resourceVersion": version}, "data": data}
                out = self.client.request(
                    "PATCH",
                    f"{self._base}/{self.name(cluster)}",
                    body=patch,
                    content_type="application/merge-patch+json",
                )
        except ApiError as e:
            if e.status == 409:  # AlreadyExists (created meanwhile) or Conflict (resourceVersion moved)
                raise Conflict(str(e)) from e
            if e.status == 404:  # deleted meanwhile: whoever deleted it meant to start over
                raise Conflict(str(e)) from e
            raise StoreError(str(e)) from e
        return str(out["metadata"]["resourceVersion"])


class FileStore:
    """One JSON file per cluster in ``directory``: one process, no management cluster."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return f"files in {self.directory}"

    def _path(self, cluster: str) -> Path:
        return self.directory / f"{cluster}.json"

    def _read(self, cluster: str) -> tuple[ClusterState, str]:
        try:
            doc = json.loads(self._path(cluster).read_text())
        except FileNotFoundError:
            return ClusterState(), ""
        except (OSError, ValueError) as e:
            raise StoreError(f"{self._path(cluster)}: {e}") from e
        return ClusterState.from_json(doc.get("state")), str(doc.get("version", ""))

    def load(self, cluster: str) -> tuple[ClusterState, str]:
        with self._lock:
            return self._read(cluster)

    def save(self, cluster: str, state: ClusterState, version: str) -> str:
        with self._lock:
            _, current = self._read(cluster)
            if current != version:
                raise Conflict(f"{self._path(cluster)} changed (version {current}, expected {version})")
            new = str(int(version or 0) + 1)
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{cluster}.")
                with os.fdopen(fd, "w") as f:
                    json.dump({"version": new, "state": state.to_json()}, f, sort_keys=True)
                os.replace(tmp, self._path(cluster))
            except OSError as e:
                raise StoreError(f"{self._path(cluster)}: {e}") from e
            return new
