"""Where the status page's records live, so history survives restarts and every replica sees the
whole fleet (docs/status-page.md, "Where history lives").

- ``FileStore`` (an agent without Leases: a laptop, one agent outside any cluster): one JSON file
  per app under ``<cache_dir>/status/``, written atomically (temp file and rename).
- ``ConfigMapStore`` (Leases on: always in a cluster): one ConfigMap per app,
  ``<agent>-status-<id>``, in the Lease namespace of the management cluster, labelled
  ``gitops-agent.io/agent`` and ``gitops-agent.io/record: status``, written by server-side
  apply (the ``patch`` and ``create`` the agent's Role already grants on ConfigMaps) by the
  replica holding the app's cluster; every replica reads them all with one labelled LIST.

Callers write only a record that changed (``run.statuspage``); a store never decides that.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import structlog

from agent.config.types import Config
from agent.errors import AgentError, ApiError
from agent.kube.client import KubeClient
from agent.model import AGENT_LABEL, RECORD_LABEL
from agent.run.lease_settings import LeaseSettings, lease_settings, management_client
from agent.ui.records import AppRecord, record_id

log = structlog.get_logger("gitops_agent.status_page")

#: The key of a status ConfigMap's ``data`` that holds the record.
DATA_KEY = "record.json"
RECORD_KIND = "status"


class RecordStore(Protocol):
    """Loads and saves ``AppRecord``s; ``text`` is ``records.encode(record)``."""

    def load_all(self) -> list[AppRecord]: ...

    def load(self, cluster: str, app: str) -> AppRecord | None: ...

    def save(self, record: AppRecord, text: str) -> None: ...


def _decode(text: str, where: str) -> AppRecord | None:
    try:
        doc = json.loads(text)
    except ValueError:
        log.warning("status record unreadable; starting it anew", where=where)
        return None
    record = AppRecord.from_json(doc)
    if record is None:
        log.info("status record of another version; starting it anew", where=where)
    return record


class FileStore:
    """One file per app in ``directory`` (created on the first save)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, cluster: str, app: str) -> Path:
        return self.directory / f"{record_id(cluster, app)}.json"

    def load_all(self) -> list[AppRecord]:
        if not self.directory.is_dir():
            return []
        out = []
        for p in sorted(self.directory.glob("*.json")):
            with contextlib.suppress(OSError):
                if (r := _decode(p.read_text(), str(p))) is not None:
                    out.append(r)
        return out

    def load(self, cluster: str, app: str) -> AppRecord | None:
        p = self._path(cluster, app)
        try:
            return _decode(p.read_text(), str(p))
        except OSError:
            return None

    def save(self, record: AppRecord, text: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self._path(record.cluster, record.app)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class ConfigMapStore:
    """One ConfigMap per app in ``namespace`` of the management cluster."""

    def __init__(self, client: KubeClient, *, namespace: str, agent: str) -> None:
        self.client = client
        self.namespace = namespace
        self.agent = agent
        self.field_manager = f"{agent}-status"

    @property
    def _base(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    def name(self, cluster: str, app: str) -> str:
        return f"{self.agent}-status-{record_id(cluster, app)}"

    def load_all(self) -> list[AppRecord]:
        """Every app's record, one labelled LIST (raises ``AgentError`` when it cannot be read)."""
        doc = self.client.request(
            "GET",
            self._base,
            query={"labelSelector": f"{AGENT_LABEL}={self.agent},{RECORD_LABEL}={RECORD_KIND}"},
        )
        out = []
        for item in doc.get("items") or []:
            text = (item.get("data") or {}).get(DATA_KEY)
            name = (item.get("metadata") or {}).get("name", "")
            if isinstance(text, str) and (r := _decode(text, name)) is not None:
                out.append(r)
        return out

    def load(self, cluster: str, app: str) -> AppRecord | None:
        try:
            item = self.client.request("GET", f"{self._base}/{self.name(cluster, app)}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        text = (item.get("data") or {}).get(DATA_KEY)
        return _decode(text, self.name(cluster, app)) if isinstance(text, str) else None

    def save(self, record: AppRecord, text: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name(record.cluster, record.app),
                "namespace": self.namespace,
                "labels": {AGENT_LABEL: self.agent, RECORD_LABEL: RECORD_KIND},
                "annotations": {"gitops-agent.io/cluster": record.cluster, "gitops-agent.io/app": record.app},
            },
            "data": {DATA_KEY: text},
        }
        self.client.apply(body, field_manager=self.field_manager, force=True)


def save_quietly(store: RecordStore, record: AppRecord, text: str) -> bool:
    """Save, logging (never raising) a failure: the page is best effort, passes are not."""
    try:
        store.save(record, text)
        return True
    except (AgentError, OSError) as e:
        log.warning("status record not saved", cluster=record.cluster, app=record.app, error=str(e))
        return False


def records_of(config: Config, settings: LeaseSettings) -> RecordStore:
    """Where the status page's records live: the management cluster with Leases, else
    ``<cache_dir>/status/`` (the page, and the commands reading them)."""
    a = config.agent
    if settings.enabled:
        return ConfigMapStore(management_client(settings), namespace=settings.namespace, agent=a.name)
    return FileStore(Path(a.cache_dir).expanduser() / "status")


@contextlib.contextmanager
def opened(config: Config) -> Iterator[RecordStore]:
    """``records_of`` for one command (``history``, ``rollback``, ``events``): the management
    cluster's client is closed when it is done. Raises ``AgentError`` or ``ConfigError``."""
    store = records_of(config, lease_settings(config))
    try:
        yield store
    finally:
        if isinstance(store, ConfigMapStore):
            store.client.close()
