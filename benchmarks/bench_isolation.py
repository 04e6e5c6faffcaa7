"""Benchmark 6: a frozen cluster must not slow the others (docs/safety.md rule 6), measured.

Called by ``benchmarks.__main__`` (``python -m benchmarks isolation``).

Three clusters with the same workload, one in-process ``Fleet`` (as deployed). After the initial
apply, steady passes of all three at once are timed per cluster (the pass's own start and end),
first with every cluster healthy, then with the third frozen (``agent.dev.localcluster.freeze``:
SIGSTOP of its apiserver and etcd, so its connections hang). The figure is the healthy two's
median pass latency frozen versus not.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks import workload as w

TARGET = 1.10


def _latencies(agent: h.InProcessAgent, names: list[str]) -> tuple[dict[str, float], dict[str, str]]:
    rev = agent.source.poll()
    results = agent.fleet.reconcile_all(rev)
    took = {r.cluster: (r.finished - r.started).total_seconds() for r in results if r.finished and r.started}
    errors = {r.cluster: (r.error or "")[:120] for r in results if not r.ok}
    return {n: took[n] for n in names}, errors


def run(root: Path, n: int = 1000, reps: int = 3) -> dict[str, Any]:
    from agent.dev import localcluster

    h.quiet_logs()
    repo = root / "repo-isolation.git"
    files = root / "files-isolation"
    w.write(w.generate(n), files)
    h.commit_workload(repo, files, "isolation")
    out: dict[str, Any] = {"objects_per_cluster": n, "rows": []}
    with h.ClusterSet(root / "state") as cs:
        clusters = cs.start("iso-a", "iso-b", "iso-c")
        healthy = [c.name for c in clusters[:2]]
        frozen = clusters[2]
        cfg = h.write_config(
            root / "isolation.toml",
            repo,
            root / "cache-isolation",
            clusters,
            defaults='request_timeout = "5s"\nconnect_timeout = "2s"',
        )
        agent = h.InProcessAgent(cfg)
        try:
            agent.reconcile()  # initial apply
            agent.reconcile()  # schema of the CRD, then steady
            base: list[float] = []
            for _ in range(reps):
                lat, errors = _latencies(agent, healthy)
                if errors:
                    raise RuntimeError(f"isolation baseline: {errors}")
                base.extend(lat.values())
            froze: list[float] = []
            frozen_errors: dict[str, str] = {}
            localcluster.freeze(frozen.name, cs.state_dir)
            try:
                for _ in range(reps):
                    lat, errors = _latencies(agent, healthy)
                    if set(errors) - {frozen.name}:
                        raise RuntimeError(f"a healthy cluster failed while another was frozen: {errors}")
                    frozen_errors = errors
                    froze.extend(lat.values())
            finally:
                with contextlib.suppress(Exception):
                    localcluster.thaw(frozen.name, cs.state_dir)
        finally:
            agent.close()
    b, f = h.median(base), h.median(froze)
    row = {
        "metric": "healthy clusters' pass latency, one of 3 frozen",
        "agent_seconds": round(f, 3),
        "peer_name": "no cluster frozen",
        "peer_seconds": round(b, 3),
        "time_ratio": h.ratio(f, b),
        "target": "<= 1.10x",
        "met": f <= TARGET * b,
        "baseline_runs": [round(x, 3) for x in base],
        "frozen_runs": [round(x, 3) for x in froze],
        "frozen_cluster_error": frozen_errors.get(frozen.name, ""),
    }
    out["rows"].append(row)
    print(
        f"isolation {n}x3  healthy pass x{row['time_ratio']} with one frozen: {f:.3f}s vs {b:.3f}s"
        f"{'  target met' if row['met'] else '  TARGET MISSED'}",
        flush=True,
    )
    return out
