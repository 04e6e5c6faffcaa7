"""``--app`` beside ``--cluster`` on the operator commands, and ``run --once`` with a revision per
source, each command run as its own process (``python -m agent.cli``) on a real local API server.

Bad input (an unknown app, a command that must not guess among several apps) exits 2 naming the
cluster's apps, before any source or cluster is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.model import SUSPENDED
from tests.agentkit import Repo, make_repo, unique
from tests.appkit import parent, write_apps_config
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: v\n"
NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture
def ns(cluster_pool: ClusterPool) -> Iterator[str]:
    name = unique("appcli")
    yield name
    kubectl(cluster_pool["pool-a"].kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


def two_apps(tmp_path: Path, cluster: LocalCluster, ns: str, *, sources: str = "") -> tuple[Repo, Config]:
    """``web`` and ``db`` on pool-a, from the default source (``sources`` may add more)."""
    repo = make_repo(
        tmp_path,
        {
            "apps/web/objects.yaml": NS.format(ns=ns) + "---\n" + CM.format(name="web", ns=ns),
            "apps/db/cm.yaml": CM.format(name="db", ns=ns),
        },
    )
    apps = [{"name": "web", "path": "apps/web"}, {"name": "db", "path": "apps/db", "depends_on": ["web"]}]
    return repo, write_apps_config(tmp_path, repo, cluster, apps, defaults=sources)


def configmaps(cluster: LocalCluster, ns: str) -> set[str]:
    out = kubectl(cluster.kubeconfig, "get", "configmaps", "-n", ns, "-o", "json", check=False)
    try:
        return {o["metadata"]["name"] for o in json.loads(out)["items"]} - {"kube-root-ca.crt"}
    except ValueError:
        return set()


def parent_exists(cfg: Config, cluster: LocalCluster, app: str) -> bool:
    store = parent(cfg, cluster, app)
    try:
        return store.load().exists
    finally:
        store.client.close()


def test_an_unknown_app_exits_2_naming_the_clusters_apps_and_touches_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    _, cfg = two_apps(tmp_path, a, ns)
    conf = str(cfg.file)
    for command in (
        ["suspend"],
        ["resume"],
        ["sync", "--local"],
        ["prune", "approve", "--digest", "abc123"],
        ["takeover"],
        ["render"],
    ):
        out = cli(*command, "--config", conf, "--cluster", "pool-a", "--app", "nope")
        assert out.returncode == 2, (command, out.stderr)
        assert "'nope'" in out.stderr and "web, db" in out.stderr, (command, out.stderr)
        assert out.stdout == "", (command, out.stdout)
    out = cli("diff", "--config", conf, "--cluster", "pool-a", "--app", "nope")
    assert out.returncode == 2 and "web, db" in out.stderr, out.stderr
    assert not parent_exists(cfg, a, "web") and not parent_exists(cfg, a, "db")
    assert configmaps(a, ns) == set()


def test_commands_that_must_not_guess_refuse_a_cluster_of_several_apps_without_app(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    _, cfg = two_apps(tmp_path, a, ns)
    conf = str(cfg.file)
    for command in (["prune", "approve", "--digest", "abc123"], ["takeover"], ["render"]):
        out = cli(*command, "--config", conf, "--cluster", "pool-a")
        assert out.returncode == 2, (command, out.stderr)
        assert "several apps (web, db)" in out.stderr and "--app" in out.stderr, (command, out.stderr)
    assert not parent_exists(cfg, a, "web") and not parent_exists(cfg, a, "db")


def test_render_with_app_prints_that_apps_objects_only(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    _, cfg = two_apps(tmp_path, cluster_pool["pool-a"], ns)
    out = cli("render", "--config", str(cfg.file), "--cluster", "pool-a", "--app", "db")
    assert out.returncode == 0, out.stderr
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out.stdout) if d] == ["db"]


def test_suspend_with_app_suspends_that_app_alone_and_sync_without_app_runs_every_app(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    _, cfg = two_apps(tmp_path, a, ns)
    conf = str(cfg.file)
    out = cli("suspend", "--config", conf, "--cluster", "pool-a", "--app", "db")
    assert out.returncode == 0 and out.stdout == "pool-a/db: suspended\n", (out.stdout, out.stderr)
    store = parent(cfg, a, "db")
    try:
        assert store.load().annotations.get(SUSPENDED) == "true"
    finally:
        store.client.close()
    assert not parent_exists(cfg, a, "web")
    out = cli("sync", "--local", "--config", conf, "--cluster", "pool-a")
    assert "acting on every app of pool-a (web, db)" in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr
    assert configmaps(a, ns) == {"web"}, "the suspended app wrote"
    out = cli("resume", "--config", conf, "--cluster", "pool-a")
    assert out.stdout.splitlines() == ["pool-a/web: resumed", "pool-a/db: resumed"], out.stdout
    out = cli("sync", "--local", "--config", conf, "--cluster", "pool-a", "--app", "db")
    assert out.returncode == 0, out.stderr
    assert configmaps(a, ns) == {"web", "db"}


def test_run_once_fails_the_apps_of_a_failing_source_and_applies_the_others(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    broken = tmp_path / "no-such-repo"
    sources = f'\n[[sources]]\nname = "extra"\nurl = "{broken}"\n'
    repo = make_repo(
        tmp_path, {"apps/web/objects.yaml": NS.format(ns=ns) + "---\n" + CM.format(name="web", ns=ns)}
    )
    apps = [{"name": "web", "path": "apps/web"}, {"name": "other", "path": "apps/x", "source": "extra"}]
    cfg = write_apps_config(tmp_path, repo, a, apps, defaults=sources)
    out = cli("run", "--once", "--config", str(cfg.file))
    assert out.returncode == 1, out.stderr
    assert "source error: source 'extra'" in out.stderr, out.stderr
    assert configmaps(a, ns) == {"web"}
    rows = {line.split()[1]: line for line in out.stdout.splitlines()[1:] if line.strip()}
    assert "source" in rows["other"], out.stdout
