"""Smoke run of the benchmarks at their smallest size (the full run stays out of CI: benchmarks/README.md).

Real local control planes and the pinned kubectl; fails (never skips) when they are missing.
Checks that every figure is produced, that request counts come from the server (kubectl's
requests are counted too, and the agent's own counter plays no part), and the steady-state
request target, which holds at any size.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.__main__ import main
from tests import clusters


def test_benchmarks_smoke_smallest_size(tmp_path: Path) -> None:
    clusters.require_control_plane()
    assert main(["kube", "--sizes", "500", "--reps", "1", "--out", str(tmp_path)]) == 0
    assert main(["git", "--git-files", "200", "--git-commits", "300", "--out", str(tmp_path)]) == 0
    kube = json.loads(next(tmp_path.glob("kube-*.json")).read_text())
    assert kube["machine"]["nproc"] >= 1 and kube["machine"]["cpu"]
    (size,) = kube["kube"]
    assert size["objects"] == 500 and size["kinds"] >= 10
    assert size["noise_requests_5s"] == 0
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
    assert (tmp_path / next(tmp_path.glob("kube-*.md")).name).read_text().startswith("# Benchmarks")
