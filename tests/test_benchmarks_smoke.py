"""Smoke run of the benchmarks at their smallest size (the full run stays out of CI: benchmarks/README.md).

Real local control planes and the pinned kubectl; fails (never skips) when they are missing.
Checks that every figure is produced, that request counts come from the server (kubectl's
requests are counted too, and the agent's own counter plays no part), the CPU accounting of the
initial apply, and the steady-state request target, which holds at any size.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent.config import ClusterSettings, load_config
from agent.localcluster import LocalCluster, Pids, Ports
from benchmarks import harness
from benchmarks.__main__ import main
from tests import clusters


def test_write_config_sets_the_concurrency_of_every_cluster_only_when_asked(tmp_path: Path) -> None:
    records = [
        LocalCluster(
            name,
            tmp_path,
            tmp_path / f"{name}.kubeconfig",
            "https://127.0.0.1:1",
            tmp_path / "ca.crt",
            Ports(1, 2),
            Pids(1, 2, 3),
        )
        for name in ("one", "two")
    ]
    for c in records:
        c.kubeconfig.write_text("")  # the config loader checks that the file exists; nothing reads it here
    for asked, expected in ((8, 8), (None, ClusterSettings().concurrency)):
        cfg = harness.write_config(
            tmp_path / "c.toml", tmp_path / "repo", tmp_path, records, concurrency=asked
        )
        assert [c.settings.concurrency for c in load_config(cfg).clusters] == [expected, expected]


def test_benchmarks_smoke_smallest_size(tmp_path: Path) -> None:
    clusters.require_control_plane()
    assert main(["kube", "--sizes", "500", "--reps", "1", "--concurrency", "3", "--out", str(tmp_path)]) == 0
    assert main(["git", "--git-files", "200", "--git-commits", "300", "--out", str(tmp_path)]) == 0
    kube = json.loads(next(tmp_path.glob("kube-*.json")).read_text())
    assert kube["machine"]["nproc"] >= 1 and kube["machine"]["cpu"]
    (size,) = kube["kube"]
    assert size["objects"] == 500 and size["kinds"] >= 10
    assert size["noise_requests_5s"] == 0
    assert size["concurrency"] == 3
    rows = {(r["metric"], r["peer_name"]): r for r in size["rows"]}
    assert set(rows) == {
        ("initial apply", "kubectl apply --server-side"),
        ("steady state", "kubectl apply --server-side"),
        ("steady state", "kubectl diff --server-side"),
        ("1% change: diff report", "kubectl diff --server-side"),
        ("1% change: reconcile", "kubectl apply --server-side"),
    }
    initial = rows[("initial apply", "kubectl apply --server-side")]
    # Counted at the server: both tools sent one apply per object.
    assert initial["agent"]["requests"]["by_verb"]["APPLY"] >= 500
    assert initial["peer"]["requests"]["by_verb"]["APPLY"] >= 500
    # CPU of both sides, read per process: applying 500 objects costs every one of them CPU.
    for side in ("agent", "peer"):
        cpu = initial[side]["cpu"]
        assert cpu["apiserver"] > 0 and cpu["etcd"] > 0 and cpu["client"] > 0, (side, cpu)
        assert abs(cpu["server"] - cpu["apiserver"] - cpu["etcd"]) <= 0.011
        assert initial["cpu_bound_seconds"][side] > 0
    assert initial["cores"] >= 1
    assert initial["bound_throughput_ratio"] > 0 and initial["bounds_ratio"] > 0
    steady = rows[("steady state", "kubectl apply --server-side")]
    assert steady["agent"]["requests"]["total"] <= size["kinds"] + 5
    assert "APPLY" not in steady["agent"]["requests"]["by_verb"]
    change = rows[("1% change: reconcile", "kubectl apply --server-side")]
    assert change["agent"]["requests"]["by_verb"]["APPLY"] == change["changed"] == 5
    assert rows[("1% change: diff report", "kubectl diff --server-side")]["reported"] == 5
    git = json.loads(next(tmp_path.glob("git-*.json")).read_text())["git"]
    assert git["commits"] == 300 and git["files"] == 200
    assert [r["metric"] for r in git["rows"]][:3] == [
        "initial clone (+checkout)",
        "poll, no new commit",
        "poll, one new commit",
    ]
    md = next(tmp_path.glob("kube-*.md")).read_text()
    assert md.startswith("# Benchmarks") and "### CPU bound of the initial apply" in md
