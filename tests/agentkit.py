"""Helpers for end-to-end tests: a real Git repository, a config, the fleet, and their teardown.

Each test gets its own agent name (so its own field manager and ApplySet
parent) and its own namespaces, so tests can share the pool clusters. The
``e2e`` fixture (``E2E``) hands out both and undoes them after the test.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent

import yaml

from agent.apply.inventory import InventoryStore
from agent.config.load import load_config
from agent.config.types import Config
from agent.dev import localcluster
from agent.dev.demo import commit_directory
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import ClusterResult, ObjectKey, Outcome, Revision
from agent.run.fleet import Fleet
from agent.source.git import GitSource
from tests.clusters import ClusterPool, kubectl


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@dataclass
class Repo:
    """A bare repository on disk whose whole tree each ``commit`` replaces."""

    path: Path
    work: Path

    def commit(self, files: dict[str, str], message: str = "change") -> str:
        if self.work.exists():
            shutil.rmtree(self.work)
        for rel, text in files.items():
            f = self.work / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(dedent(text).lstrip())
        return commit_directory(self.path, self.work, message)


def make_repo(tmp_path: Path, files: dict[str, str]) -> Repo:
    repo = Repo(tmp_path / "fleet.git", tmp_path / "fleet-work")
    repo.commit(files, "initial")
    return repo


def config_head(tmp_path: Path, repo: Repo, name: str, defaults: str = "") -> list[str]:
    """The `[agent]`, `[source]` and `[defaults]` tables every test config starts with."""
    return [
        "[agent]",
        f'name = "{name}"',
        f'cache_dir = "{tmp_path / "cache"}"',
        'listen = ""',
        "",
        "[source]",
        f'url = "{repo.path}"',
        "",
        "[defaults]",
        'pass_deadline = "60s"',
        'request_timeout = "10s"',
        'connect_timeout = "2s"',
        defaults,
        "",
    ]


def write_config(
    tmp_path: Path,
    repo: Repo,
    clusters: dict[str, LocalCluster | Path],
    *,
    agent: str | None = None,
    paths: dict[str, list[str]] | None = None,
    defaults: str = "",
    cluster_extra: str = "",
) -> Config:
    """A config serving ``clusters`` (name → cluster or kubeconfig) from ``repo``."""
    name = agent or unique("agent")
    lines = config_head(tmp_path, repo, name, defaults)
    for cname, target in clusters.items():
        kc = target.kubeconfig if isinstance(target, LocalCluster) else target
        cpaths = (paths or {}).get(cname, [f"clusters/{cname}"])
        lines += [
            "[[clusters]]",
            f'name = "{cname}"',
            f'kubeconfig = "{kc}"',
            f"paths = {cpaths!r}".replace("'", '"'),
            cluster_extra,
            "",
        ]
    p = tmp_path / f"{name}.toml"
    p.write_text("\n".join(lines))
    return load_config(p)


class Agent:
    """The fleet plus its source, as `gitops-agent run --once` wires them."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.source = GitSource.from_config(config)
        self.fleet = Fleet(config)

    def revision(self) -> Revision:
        return self.source.poll()

    def reconcile(self, *, dry_run: bool = False) -> dict[str, ClusterResult]:
        """One pass; each cluster's result (a cluster with several apps: use ``appkit.AppsAgent``)."""
        results = self.fleet.reconcile_all(self.revision(), dry_run=dry_run)
        by_cluster = {r.cluster: r for r in results}
        assert len(by_cluster) == len(results), (
            "several apps on one cluster: keyed by cluster, some would be lost"
        )
        return by_cluster

    def tracked(self, cluster: str = "pool-a") -> set[ObjectKey]:
        return tracked(self.config, cluster)

    def close(self) -> None:
        self.fleet.close()


def tracked(config: Config, cluster: str = "pool-a") -> set[ObjectKey]:
    """The members of the inventory ``config``'s agent keeps on ``cluster``, read from the cluster."""
    client = KubeClient.from_config(config.cluster(cluster))
    try:
        name, ns = config.agent.name, config.agent.namespace
        return set(InventoryStore(client, name=name, namespace=ns, field_manager=name).load().members)
    finally:
        client.close()


def outcomes(result: ClusterResult) -> dict[str, str]:
    """``"Kind/ns/name" → outcome`` for compact assertions."""
    return {str(r.key): r.outcome.value for r in result.results}


def count(result: ClusterResult, outcome: Outcome) -> int:
    return result.count(outcome)


def manifests(*docs: str) -> str:
    return "---\n".join(dedent(d).lstrip() for d in docs)


def dump(obj: object) -> str:
    return yaml.safe_dump(obj, sort_keys=False)


class E2E:
    """What an end-to-end test leaves on the pool clusters and in this process, undone after it.

    ``teardown`` (run by the ``e2e`` fixture, whether the test passed or not) first runs what
    was registered to run at the end, newest first: closing agents, stopping daemons; then
    deletes the registered objects and the namespaces the test was given, on every pool cluster
    (not waited for: the namespace controller finishes them in the background). It runs after
    ``cluster_ctl`` has thawed and restarted the clusters the test froze or stopped. A failing
    step does not keep the others from running; the first error is raised at the end.
    """

    def __init__(self, pool: ClusterPool | None) -> None:
        self._pool = pool
        self._at_end: list[Callable[[], object]] = []
        self._objects: list[tuple[LocalCluster, tuple[str, ...]]] = []
        self._namespaces: list[str] = []

    def namespace(self, prefix: str) -> str:
        """A unique namespace name (``<prefix>-<hex>``), deleted from every pool cluster after the test.

        Only from the pool's: a test of fresh clusters only leaves nothing behind (they are deleted).
        """
        name = unique(prefix)
        self._namespaces.append(name)
        return name

    def delete_namespace_after(self, name: str) -> str:
        """Delete the namespace ``name`` (which the test named itself) from every pool cluster after it."""
        self._namespaces.append(name)
        return name

    def delete_after(self, cluster: LocalCluster, *what: str) -> None:
        """``kubectl delete <what>`` on ``cluster`` after the test: cluster-scoped objects, or others
        outside the test's namespaces (``"clusterrole", name``; ``"role,rolebinding", name, "-n", ns``)."""
        self._objects.append((cluster, what))

    def at_end(self, step: Callable[[], object]) -> None:
        """Run ``step`` after the test, before anything is deleted (newest first)."""
        self._at_end.append(step)

    def agent(self, config: Config) -> Agent:
        """An ``Agent`` serving ``config``, closed after the test (closing it earlier is harmless)."""
        agent = Agent(config)
        self.at_end(agent.close)
        return agent

    def teardown(self) -> None:
        errors: list[BaseException] = []
        for step in reversed(self._at_end):
            try:
                step()
            except Exception as e:  # every step runs; the first failure is raised below
                errors.append(e)
        for cluster, what in self._objects:
            kubectl(cluster.kubeconfig, "delete", *what, "--ignore-not-found", "--wait=false", check=False)
        pool = self._pool.all if self._pool is not None else ()
        for name in self._namespaces:
            for cluster in pool:  # the pool's current handles: cluster_ctl may have restarted one
                # A cluster still down (its restart failed) has nothing left to clean.
                with contextlib.suppress(OSError):
                    localcluster.api_request(cluster, "DELETE", f"/api/v1/namespaces/{name}")
        if errors:
            raise errors[0]
