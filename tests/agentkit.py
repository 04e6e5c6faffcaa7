"""Helpers for end-to-end tests: a real Git repository, a config, and the fleet.

Each test gets its own agent name (so its own field manager and ApplySet
parent) and its own namespaces, so tests can share the pool clusters.
"""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent

import yaml

from agent.apply.inventory import InventoryStore
from agent.config.load import load_config
from agent.config.types import Config
from agent.dev.demo import commit_directory
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import ClusterResult, ObjectKey, Outcome, Revision
from agent.run.fleet import Fleet
from agent.source.git import GitSource


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
    lines = [
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
        return {r.cluster: r for r in self.fleet.reconcile_all(self.revision(), dry_run=dry_run)}

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
