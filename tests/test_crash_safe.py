"""Crash-safe inventory (docs/safety.md rule 10): kill `run --once` at random points, 20 times.

Between kills Git grows and shrinks, so passes are interrupted while widening,
applying, pruning and narrowing. After every kill, every object carrying our
membership label in the cluster must be listed in the ApplySet parent; after
the last, one clean pass converges and prunes exactly what left Git.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.apply.inventory import InventoryStore
from agent.kube.client import KubeClient
from agent.model import PART_OF, ObjectKey, Outcome
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster


def objects(ns: str, names: list[str]) -> dict[str, str]:
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"]
    docs += [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {n}\n  namespace: {ns}\ndata:\n  k: v\n"
        for n in names
    ]
    return {"clusters/pool-a/objects.yaml": "---\n".join(docs)}


def labelled(kubeconfig: Path, ns: str, inventory_id: str) -> set[ObjectKey]:
    out = json.loads(
        kubectl(kubeconfig, "get", "configmaps", "-n", ns, "-l", f"{PART_OF}={inventory_id}", "-o", "json")
    )
    return {ObjectKey("", "ConfigMap", ns, i["metadata"]["name"]) for i in out["items"]}


def test_crash_safe_inventory_survives_20_kills_at_random_points(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("crash")
    rng = random.Random(20261202)
    universe = [f"cm{i:02d}" for i in range(60)]
    current = universe[:30]
    repo = make_repo(tmp_path, objects(ns, current))
    # The brake would (rightly) stop big random removals; this test is about the inventory.
    cfg = write_config(tmp_path, repo, {"pool-a": a}, defaults="max_prune_fraction = 1.0\nconcurrency = 1")
    client = KubeClient.connect("pool-a", kubeconfig=str(a.kubeconfig))
    e2e.at_end(client.close)
    store = InventoryStore(
        client, name=cfg.agent.name, namespace=cfg.agent.namespace, field_manager=cfg.agent.name
    )
    kills = 0
    argv = [sys.executable, "-m", "agent.cli", "run", "--once", "--config", cfg.file]
    # How long an uninterrupted pass takes here: kills land anywhere inside one.
    start = time.monotonic()
    first = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    duration = time.monotonic() - start
    attempts = 0
    while kills < 20 and attempts < 60:
        attempts += 1
        current = sorted(rng.sample(universe, rng.randint(10, 55)))
        repo.commit(objects(ns, current), f"{len(current)} objects")
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        time.sleep(rng.uniform(0.1, 0.95) * duration)  # on purpose: a random point of the pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        else:
            # Finished before the kill: passes are quicker than measured; aim earlier next time.
            duration = min(duration, time.monotonic() - started)
        proc.wait(timeout=30)
        inventory = store.load()
        untracked = labelled(a.kubeconfig, ns, store.id) - inventory.keys()
        assert not untracked, f"applied but not in the inventory after a kill: {sorted(map(str, untracked))}"
    assert kills == 20, f"only {kills} of {attempts} passes were interrupted: the test lost its point"

    final = e2e.agent(cfg).reconcile()["pool-a"]
    assert final.ok, final.error
    live = {k.name for k in labelled(a.kubeconfig, ns, store.id)}
    assert live == set(current)
    members = {k.name for k in store.load().members if k.kind == "ConfigMap"}
    assert members == set(current)
    assert e2e.agent(cfg).reconcile()["pool-a"].count(Outcome.UNCHANGED) == len(current) + 1
