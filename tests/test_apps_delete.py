"""Deleting an app's objects: never by removing the app from the config, only on purpose, behind
the mass-deletion brake (docs/operations.md, "Deleting an app's objects on purpose").

Real local API servers; ``prune approve`` runs as its own process (``python -m agent.cli``), as an
operator would run it. Each test runs an agent of its own name in a namespace of its own on pool-a.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.apply.inventory import Inventory
from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.model import PART_OF, ObjectKey, Outcome, PruneReason
from tests.agentkit import E2E, Repo, make_repo, unique
from tests.appkit import AppsAgent, members, parent, write_apps_config
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: v\n"
NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
A_NAMES = [f"a-{i}" for i in range(10)]
B_NAMES = [f"b-{i}" for i in range(10)]
APP_A = {"name": "alpha", "path": "apps/alpha"}
APP_B = {"name": "beta", "path": "apps/beta"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def two_apps_repo(tmp_path: Path, ns: str) -> Repo:
    """alpha: the namespace and 10 ConfigMaps; beta: 10 ConfigMaps; and an empty directory."""
    return make_repo(
        tmp_path,
        {
            "apps/alpha/objects.yaml": "---\n".join(
                [NS.format(ns=ns), *(CM.format(name=n, ns=ns) for n in A_NAMES)]
            ),
            "apps/beta/objects.yaml": "---\n".join(CM.format(name=n, ns=ns) for n in B_NAMES),
            "apps/empty/README.md": "Renders nothing: the app pointed here has its objects deleted.\n",
        },
    )


def live(cluster: LocalCluster, ns: str) -> dict[str, dict[str, Any]]:
    """The ConfigMaps of ``ns`` by name: uid, resourceVersion and part-of label."""
    out = json.loads(kubectl(cluster.kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))
    return {
        i["metadata"]["name"]: {
            "uid": i["metadata"]["uid"],
            "rv": i["metadata"]["resourceVersion"],
            "part_of": (i["metadata"].get("labels") or {}).get(PART_OF),
        }
        for i in out["items"]
        if i["metadata"]["name"] != "kube-root-ca.crt"
    }


def inventory_of(cfg: Config, cluster: LocalCluster, app: str) -> Inventory:
    """``app``'s ApplySet parent as read now."""
    store = parent(cfg, cluster, app)
    try:
        return store.load()
    finally:
        store.client.close()


def parent_of(cfg: Config, cluster: LocalCluster, app: str) -> tuple[bool, set[ObjectKey]]:
    """Whether ``app``'s ApplySet parent exists, and its members."""
    inv = inventory_of(cfg, cluster, app)
    return inv.exists, set(inv.members)


def cm_keys(ns: str, names: list[str]) -> set[ObjectKey]:
    return {ObjectKey("", "ConfigMap", ns, n) for n in names}


def apps_agent(e2e: E2E, cfg: Config) -> AppsAgent:
    """An agent whose results are keyed by app, closed after the test."""
    agent = AppsAgent(cfg)
    e2e.at_end(agent.close)
    return agent


def first_pass(e2e: E2E, tmp_path: Path, a: LocalCluster, ns: str, agent_name: str) -> tuple[Repo, Config]:
    repo = two_apps_repo(tmp_path, ns)
    cfg = write_apps_config(tmp_path, repo, a, [APP_A, APP_B], agent=agent_name)
    results = apps_agent(e2e, cfg).reconcile()
    assert results["alpha"].ok and results["alpha"].count(Outcome.CREATED) == 11, results["alpha"]
    assert results["beta"].ok and results["beta"].count(Outcome.CREATED) == 10, results["beta"]
    return repo, cfg


def test_removing_an_app_from_the_config_deletes_none_of_its_objects_and_leaves_its_parent(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("appdel")
    agent_name = unique("agent")
    repo, cfg = first_pass(e2e, tmp_path, a, ns, agent_name)
    before = live(a, ns)
    without = write_apps_config(tmp_path, repo, a, [APP_A], agent=agent_name, file="without-beta.toml")
    agent = apps_agent(e2e, without)
    for _ in range(3):
        results = agent.reconcile()
        assert set(results) == {"alpha"}, results
        assert results["alpha"].ok and results["alpha"].applied == 0, results["alpha"]
        assert results["alpha"].count(Outcome.PRUNED) == 0, results["alpha"]
    assert live(a, ns) == before, "an object was deleted, re-created or written"
    assert parent_of(cfg, a, "beta") == (True, cm_keys(ns, B_NAMES)), "beta's parent lost members or went"
    assert members(cfg, a, "alpha") == {ObjectKey("", "Namespace", "", ns)} | cm_keys(ns, A_NAMES)


def test_an_app_pointed_at_an_empty_directory_is_deleted_only_after_its_brake_digest_is_approved(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("appdel")
    agent_name = unique("agent")
    repo, _ = first_pass(e2e, tmp_path, a, ns, agent_name)
    before = live(a, ns)
    emptied = {"name": "beta", "path": "apps/empty", "allow_empty": True}
    cfg = write_apps_config(tmp_path, repo, a, [APP_A, emptied], agent=agent_name, file="emptied.toml")
    conf = str(cfg.file)
    agent = apps_agent(e2e, cfg)

    braked = agent.reconcile()
    refusal = braked["beta"].prune_refusal
    assert refusal is not None and refusal.reason is PruneReason.BRAKE, braked["beta"]
    assert "10 deletions" in refusal.message and "--app beta" in refusal.message, refusal.message
    assert braked["beta"].count(Outcome.PRUNED) == 0
    assert braked["alpha"].ok and braked["alpha"].applied == 0 and braked["alpha"].prune_refusal is None
    digest = refusal.message.split("--digest ")[1].split("`")[0]
    assert live(a, ns) == before, "the brake let a write or deletion through"

    # The pass recorded the set it holds; a digest that is not one, or not that set's, is refused.
    assert inventory_of(cfg, a, "beta").held_digest == digest
    out = cli("prune", "approve", "--config", conf, "--cluster", "pool-a", "--app", "beta", "--digest", "no!")
    assert out.returncode == 2 and "--digest" in out.stderr, (out.returncode, out.stderr)
    wrong = "0" * len(digest)
    out = cli("prune", "approve", "--config", conf, "--cluster", "pool-a", "--app", "beta", "--digest", wrong)
    assert out.returncode == 2 and f"holds prune set {digest}" in out.stderr, (out.returncode, out.stderr)
    assert "nothing approved" in out.stderr and not inventory_of(cfg, a, "beta").approved_digest
    held = agent.reconcile()["beta"]
    assert held.prune_refusal is not None and held.prune_refusal.reason is PruneReason.BRAKE, held
    assert digest in held.prune_refusal.message and held.count(Outcome.PRUNED) == 0
    assert live(a, ns) == before, "a wrong digest deleted something"

    out = cli(
        "prune", "approve", "--config", conf, "--cluster", "pool-a", "--app", "beta", "--digest", digest
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"approved prune set {digest} for app beta on cluster pool-a;"), out.stdout
    approved = agent.reconcile()
    assert approved["beta"].ok and approved["beta"].count(Outcome.PRUNED) == 10, approved["beta"]
    assert {str(r.key) for r in approved["beta"].results if r.outcome is Outcome.PRUNED} == {
        str(k) for k in cm_keys(ns, B_NAMES)
    }
    assert approved["alpha"].ok and approved["alpha"].applied == 0, approved["alpha"]
    after = live(a, ns)
    assert after == {n: before[n] for n in A_NAMES}, "alpha's objects changed, or beta's survived"
    assert parent_of(cfg, a, "beta") == (True, set())
    assert inventory_of(cfg, a, "beta").held_digest == "", "the released hold stayed recorded"

    # Then the app leaves the config; the agent leaves its empty parent, for the operator to delete.
    final = write_apps_config(tmp_path, repo, a, [APP_A], agent=agent_name, file="final.toml")
    last = apps_agent(e2e, final).reconcile()
    assert set(last) == {"alpha"} and last["alpha"].ok and last["alpha"].applied == 0, last
    assert parent_of(cfg, a, "beta") == (True, set())
    assert live(a, ns) == after
