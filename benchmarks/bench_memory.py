"""Benchmark 4: peak RSS of the agent process at 1k, 5k and 10k objects on each of 3 clusters.

Called by ``benchmarks.__main__`` (``python -m benchmarks memory``).

The agent runs as a subprocess, exactly as deployed for one pass: ``python -m agent.cli run
--once --config ...``. Its peak resident set comes from the kernel (``ru_maxrss`` of that one
child, via ``os.wait4``). Per size two runs: the pass that applies the new objects (the workload
of 1k is a subset of 5k, which is a subset of 10k, so the same clusters grow) and the steady pass
after it. The baseline is the same interpreter importing the agent and exiting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks import workload as w

TARGET_MB = 200.0
REPO_ROOT = Path(__file__).resolve().parent.parent


def measured_child(argv: list[str], timeout: float = 900.0) -> dict[str, Any]:
    """Run ``argv`` under a small helper that reports the child's own ``ru_maxrss`` (exact, per child)."""
    helper = (
        "import os, subprocess, sys, time, json\n"
        "t = time.perf_counter()\n"
        "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
        "err = p.stderr.read()\n"
        "_, status, usage = os.wait4(p.pid, 0)\n"
        "print(json.dumps({'peak_mb': usage.ru_maxrss / 1024, 'seconds': time.perf_counter() - t,\n"
        "  'exit': os.waitstatus_to_exitcode(status), 'stderr': err.decode()[-1500:]}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", helper, *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=timeout,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run(sizes: list[int], root: Path) -> dict[str, Any]:
    agent_cmd = [sys.executable, "-m", "agent.cli", "run", "--once", "--log-level", "warning"]
    base = measured_child(
        [sys.executable, "-c", "import agent.cli.main, agent.run.scheduler, agent.reconcile.reconciler"]
    )
    out: dict[str, Any] = {
        "baseline_import_mb": round(base["peak_mb"], 1),
        "target_mb": TARGET_MB,
        "rows": [],
    }
    repo = root / "repo-memory.git"
    with h.ClusterSet(root / "state") as cs:
        clusters = cs.start("mem-a", "mem-b", "mem-c")
        cfg = h.write_config(root / "memory.toml", repo, root / "cache-memory", clusters)
        for n in sizes:
            files = root / f"files-memory-{n}"
            w.write(w.generate(n), files)
            h.commit_workload(repo, files, f"{n} objects")
            row: dict[str, Any] = {"objects_per_cluster": n, "clusters": len(clusters)}
            for phase in ("apply", "steady"):
                r = measured_child([*agent_cmd, "--config", str(cfg)])
                if r["exit"] != 0:
                    raise RuntimeError(f"agent run --once at {n} ({phase}) exited {r['exit']}: {r['stderr']}")
                row[phase] = {"peak_mb": round(r["peak_mb"], 1), "seconds": round(r["seconds"], 2)}
            peak = max(row["apply"]["peak_mb"], row["steady"]["peak_mb"])
            row["peak_mb"] = peak
            row["ratio_to_baseline"] = h.ratio(peak, out["baseline_import_mb"])
            row["ratio_to_target"] = h.ratio(peak, TARGET_MB)
            row["met"] = peak <= TARGET_MB
            out["rows"].append(row)
            print(
                f"memory {n:>6} x3 clusters  peak {peak:7.1f} MB (x{row['ratio_to_baseline']} of the "
                f"{out['baseline_import_mb']} MB import baseline; target ≤ {TARGET_MB:g} MB"
                f"{'' if row['met'] else ' MISSED'})  apply pass {row['apply']['seconds']}s, "
                f"steady pass {row['steady']['seconds']}s",
                flush=True,
            )
    return out
