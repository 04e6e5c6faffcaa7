"""``python -m benchmarks COMMAND``: run one benchmark, or all of them, and write the results.

Commands: ``apply`` (1), ``steady`` (1+2), ``change`` (1+3), ``prune`` (1 and a prune of 10%),
``kube`` (1+2+3 and the prune), ``memory`` (4),
``git`` (5), ``isolation`` (6), ``apps`` (7), ``health`` (8), ``page`` (9), ``notify`` (10),
``capacity`` (11), ``corpus`` (12), ``charts`` (13), ``waves`` (14), ``all``; and
``chaos`` (not in ``all``: the chaos and soak run, ``benchmarks/chaos``, docs/reliability.md). Prints a
table while it runs; writes ``benchmarks/results/<command>-<UTC time>.json`` and ``.md``
(git-ignored); ``--docs`` also writes the Markdown table to ``docs/benchmarks.md`` (``corpus``,
``charts`` and ``waves`` alone: only their own section of it, the rest kept). Local control
planes are started under a temporary directory and deleted at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.run import heap
from benchmarks import (
    bench_apps,
    bench_capacity,
    bench_charts,
    bench_corpus,
    bench_git,
    bench_health,
    bench_isolation,
    bench_kube,
    bench_memory,
    bench_notify,
    bench_page,
    bench_waves,
    harness,
)
from benchmarks.markdown import render, with_section

HERE = Path(__file__).resolve().parent
KUBE_PARTS = {
    "apply": {"apply"},
    "steady": {"steady"},
    "change": {"change"},
    "prune": {"prune"},
    "kube": {"steady", "change", "prune"},
}


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    from agent.render import binaries as tools

    kubectl = subprocess.run(
        [str(tools.tool("kubectl")), "version", "--client", "-o", "json"], capture_output=True, text=True
    )
    try:
        kver = json.loads(kubectl.stdout)["clientVersion"]["gitVersion"]
    except (ValueError, KeyError):
        kver = "?"
    return {
        "nproc": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "cpu": model,
        "python": platform.python_version(),
        "kubectl": kver,
        "flux_engine": harness.flux_version(),
        "git": subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument(
        "command",
        choices=[
            *KUBE_PARTS,
            *(
                "memory",
                "git",
                "isolation",
                "apps",
                "health",
                "page",
                "notify",
                "capacity",
                "corpus",
                "charts",
                "waves",
                "all",
            ),
            "chaos",
        ],
    )
    ap.add_argument("--sizes", default="500,2000,5000", help="objects for benchmarks 1-3 and the prune")
    ap.add_argument("--memory-sizes", default="1000,5000,10000", help="objects per cluster (3 clusters)")
    ap.add_argument("--isolation-size", type=int, default=1000, help="objects per cluster (3 clusters)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of cheap steps (median reported)")
    ap.add_argument(
        "--apply-reps",
        type=int,
        default=bench_kube.APPLY_REPS,
        help="benchmarks 1-3: initial applies per size, each on fresh clusters, tools' order alternating",
    )
    ap.add_argument(
        "--concurrency", type=int, default=None, help="benchmarks 1-3: the agent's concurrency per cluster"
    )
    ap.add_argument("--apps", type=int, default=100, help="benchmark 7: apps on one cluster")
    ap.add_argument("--objects-per-app", type=int, default=50, help="benchmark 7: objects in each app")
    ap.add_argument("--health-apps", type=int, default=20, help="benchmark 8: waiting apps on one cluster")
    ap.add_argument(
        "--deployments-per-app", type=int, default=5, help="benchmark 8: Deployments in each waiting app"
    )
    ap.add_argument("--page-clusters", type=int, default=50, help="benchmark 9: clusters of the fleet")
    ap.add_argument("--page-apps", type=int, default=20, help="benchmark 9: apps on each cluster")
    ap.add_argument("--notify-size", type=int, default=500, help="benchmark 10: objects in Git")
    ap.add_argument(
        "--capacity-clusters", default="1,5,10", help="benchmark 11: fleet sizes (clusters served at once)"
    )
    ap.add_argument("--capacity-objects", type=int, default=500, help="benchmark 11: objects per cluster")
    ap.add_argument("--capacity-apps", type=int, default=5, help="benchmark 11: apps per cluster")
    ap.add_argument("--corpus-reps", type=int, default=7, help="benchmark 12: timed renders per app and tool")
    ap.add_argument(
        "--charts-reps", type=int, default=7, help="benchmark 13: polls, and timed renders per chart"
    )
    ap.add_argument("--waves", type=int, default=5, help="benchmark 14: sync waves of the app")
    ap.add_argument("--waves-objects", type=int, default=200, help="benchmark 14: objects of the app")
    ap.add_argument("--waves-reps", type=int, default=5, help="benchmark 14: repetitions, sides alternating")
    ap.add_argument("--git-files", type=int, default=bench_git.FILES)
    ap.add_argument("--git-commits", type=int, default=bench_git.COMMITS)
    ap.add_argument(
        "--duration", type=float, default=3600.0, help="chaos: seconds of faults (first round always whole)"
    )
    ap.add_argument(
        "--seed", type=int, default=1, help="chaos: the schedule's seed (a run is reproduced by it)"
    )
    ap.add_argument(
        "--faults", default="", help="chaos: only these fault kinds, comma-separated (default: all)"
    )
    ap.add_argument(
        "--plant",
        default=None,
        help="chaos: run an agent with this prune guard disabled (brake, fail-closed)",
    )
    ap.add_argument("--out", type=Path, default=HERE / "results", help="where the JSON and Markdown go")
    ap.add_argument("--docs", action="store_true", help="also write docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.concurrency is not None and args.concurrency < 1:
        ap.error("--concurrency must be at least 1")
    if args.apply_reps < 1:
        ap.error("--apply-reps must be at least 1")
    if args.apps < 1 or args.objects_per_app < 1:
        ap.error("--apps and --objects-per-app must be at least 1")
    capacity_sizes = [int(s) for s in args.capacity_clusters.split(",") if s]
    if not capacity_sizes or min(capacity_sizes) < 1:
        ap.error("--capacity-clusters must list fleet sizes of at least 1")
    if args.capacity_apps < 1 or args.capacity_objects < args.capacity_apps:
        ap.error("--capacity-apps must be at least 1 and --capacity-objects at least --capacity-apps")
    if args.corpus_reps < 1:
        ap.error("--corpus-reps must be at least 1")
    if args.health_apps < 1 or args.deployments_per_app < 1:
        ap.error("--health-apps and --deployments-per-app must be at least 1")
    if args.waves < 1 or args.waves_objects < args.waves or args.waves_reps < 1:
        ap.error("--waves and --waves-reps must be at least 1 and --waves-objects at least --waves")

    if args.command == "chaos":
        return chaos(ap, args)
    # The in-process agent (benchmarks 1-3, apps, health, isolation) runs in a process tuned as
    # ``gitops-agent run`` tunes its own: the C heap and the cycle collector (agent.run.heap).
    heap.tune()
    heap.tune_collector()
    bench_git.FILES, bench_git.COMMITS = args.git_files, args.git_commits
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    results: dict[str, Any] = {"command": args.command, "started": started.isoformat(), "machine": machine()}
    root = Path(tempfile.mkdtemp(prefix="gitops-bench-"))
    try:
        cmd = args.command
        if cmd in KUBE_PARTS or cmd == "all":
            parts = KUBE_PARTS.get(cmd, KUBE_PARTS["kube"]) | {"apply"}
            sizes = [int(s) for s in args.sizes.split(",") if s]
            results["kube"] = bench_kube.run(
                sizes, root, parts, reps=args.reps, concurrency=args.concurrency, apply_reps=args.apply_reps
            )
        if cmd in ("memory", "all"):
            sizes = [int(s) for s in args.memory_sizes.split(",") if s]
            results["memory"] = bench_memory.run(sizes, root)
        if cmd in ("git", "all"):
            results["git"] = bench_git.run(root, reps=max(3, args.reps))
        if cmd in ("isolation", "all"):
            results["isolation"] = bench_isolation.run(root, n=args.isolation_size, reps=args.reps)
        if cmd in ("apps", "all"):
            results["apps"] = bench_apps.run(root, args.apps, args.objects_per_app, reps=args.reps)
            print(bench_apps.format_line(results["apps"]), flush=True)
            results["tenants"] = bench_apps.run_tenants(root, reps=args.reps)
            print(bench_apps.format_tenants_line(results["tenants"]), flush=True)
        if cmd in ("health", "all"):
            results["health"] = bench_health.run(
                root, args.health_apps, args.deployments_per_app, reps=args.reps
            )
            print(bench_health.format_line(results["health"]), flush=True)
        if cmd in ("page", "all"):
            results["page"] = bench_page.run(args.page_clusters, args.page_apps)
            print(bench_page.format_line(results["page"]), flush=True)
        if cmd in ("notify", "all"):
            results["notify"] = bench_notify.run(root, n=args.notify_size, reps=args.reps)
        if cmd in ("capacity", "all"):
            results["capacity"] = bench_capacity.run(
                root,
                capacity_sizes,
                objects=args.capacity_objects,
                apps=args.capacity_apps,
                reps=args.reps,
            )
        if cmd in ("corpus", "all"):
            results["corpus"] = bench_corpus.run(root, reps=args.corpus_reps)
        if cmd in ("charts", "all"):
            results["charts"] = bench_charts.run(root, reps=args.charts_reps)
        if cmd in ("waves", "all"):
            results["waves"] = bench_waves.run(
                root, waves=args.waves, objects=args.waves_objects, reps=args.waves_reps
            )
            print(bench_waves.format_line(results["waves"]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["seconds"] = round(time.perf_counter() - t0, 1)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.command}-{stamp}.json").write_text(json.dumps(results, indent=1) + "\n")
    text = render(results)
    (args.out / f"{args.command}-{stamp}.md").write_text(text)
    if args.docs:
        docs = HERE.parent / "docs" / "benchmarks.md"
        if args.command in ("corpus", "charts", "waves") and docs.exists():  # its section alone
            text = with_section(docs.read_text(), results)
        docs.write_text(text)
    print(f"\nwrote {args.out / f'{args.command}-{stamp}.json'} ({results['seconds']}s in all)")
    return 0


def chaos(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from benchmarks.chaos import runner

    kinds = tuple(k for k in args.faults.split(",") if k) or runner.KINDS
    unknown = [k for k in kinds if k not in runner.KINDS]
    if unknown:
        ap.error(f"--faults: unknown kind(s) {', '.join(unknown)}; known: {', '.join(runner.KINDS)}")
    if args.plant is not None and args.plant not in runner.PLANTS:
        ap.error(f"--plant: unknown plant {args.plant!r}; known: {', '.join(runner.PLANTS)}")
    if args.duration < 0:
        ap.error("--duration must be at least 0")
    return runner.main(
        duration=args.duration, seed=args.seed, kinds=kinds, plant=args.plant, out=args.out, docs=args.docs
    )


if __name__ == "__main__":
    sys.exit(main())
