"""Helpers for tests of apps: a config with `[[apps]]`, results per (cluster, app), inventories
per app, and requests counted by the API server.

Built on ``tests/agentkit.py`` (repository, fleet) and ``benchmarks/harness.py`` (the server's
``apiserver_request_total``, with the controller manager paused while counting so that only the
agent's requests are counted).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.apply.inventory import InventoryStore, parent_name
from agent.config.load import load_config
from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import ClusterResult, ObjectKey, Revision
from agent.run.fleet import Fleet
from agent.source.git import GitSource
from benchmarks import harness
from tests.agentkit import Repo, config_head, unique

#: Verbs that change something (``apiserver_request_total``'s spelling; APPLY is a server-side apply).
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)


def write_apps_config(
    tmp_path: Path,
    repo: Repo,
    cluster: LocalCluster,
    apps: list[dict[str, Any]],
    *,
    agent: str | None = None,
    cluster_name: str = "pool-a",
    cluster_paths: list[str] | None = None,
    defaults: str = "",
    file: str | None = None,
) -> Config:
    """A config serving ``cluster`` with ``apps`` (each a table of `[[apps]]` keys; ``cluster``
    defaults to ``cluster_name``), and the entry's own app when ``cluster_paths`` is given."""
    name = agent or unique("agent")
    lines = [
        *config_head(tmp_path, repo, name, defaults),
        "[[clusters]]",
        f'name = "{cluster_name}"',
        f'kubeconfig = "{cluster.kubeconfig}"',
    ]
    if cluster_paths is not None:
        lines.append(f"paths = {toml_value(cluster_paths)}")
    for app in apps:
        lines += ["", "[[apps]]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in {"cluster": cluster_name, **app}.items()]
    p = tmp_path / (file or f"{name}.toml")
    p.write_text("\n".join(lines) + "\n")
    return load_config(p)


class AppsAgent:
    """The fleet and its source, with results keyed by (cluster, app)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.source = GitSource.from_config(config)
        self.fleet = Fleet(config)

    def revision(self) -> Revision:
        return self.source.poll()

    def reconcile(self) -> dict[str, ClusterResult]:
        """One pass over every cluster; results by app name (the tests use one cluster)."""
        return {r.app: r for r in self.fleet.reconcile_all(self.revision())}

    def close(self) -> None:
        self.fleet.close()


def parent(config: Config, cluster: LocalCluster, app: str, *, implicit: bool = False) -> InventoryStore:
    client = KubeClient.from_config(config.cluster(config.clusters[0].name))
    name = parent_name(config.agent.name, app, implicit=implicit)
    ag = config.agent
    return InventoryStore(client, name=name, namespace=ag.namespace, field_manager=ag.name, agent=ag.name)


def members(config: Config, cluster: LocalCluster, app: str, *, implicit: bool = False) -> set[ObjectKey]:
    """The members of ``app``'s inventory, read from the cluster."""
    store = parent(config, cluster, app, implicit=implicit)
    try:
        return set(store.load().members)
    finally:
        store.client.close()


@dataclass
class Counted:
    """Requests the API server counted during a ``counting`` block."""

    requests: harness.Requests = field(default_factory=harness.Requests)

    @property
    def writes(self) -> dict[str, int]:
        """``VERB resource`` → count, of the verbs that change something."""
        return {k: n for k, n in self.requests.by_resource.items() if k.split(" ")[0] in WRITE_VERBS}

    @property
    def total(self) -> int:
        return self.requests.total


@contextlib.contextmanager
def counting(cluster: LocalCluster) -> Iterator[Counted]:
    """Count the requests ``cluster``'s API server serves in the block (controllers paused)."""
    out = Counted()
    with harness.controllers_paused(cluster):
        before = harness.scrape(cluster)
        yield out
        out.requests = harness.difference(before, harness.scrape(cluster))
