"""Benchmark 11: capacity. What a steady-state pass costs per cluster at 1, 5 and 10 clusters.

Called by ``benchmarks.__main__`` (``python -m benchmarks capacity``); the agent under
measurement is a ``harness.AgentProcess``.

Real local clusters, each with the same modest workload (``objects`` objects cut into ``apps``
`[[apps]]` apps). For each fleet size ``k`` the agent runs in a child process of its own (its
heap tuned as ``gitops-agent run`` tunes it), serving the first ``k`` clusters: ``Fleet`` and a
Git revision polled once (a poll is per source, not per cluster), passes until every object is
unchanged, then ``reps`` counted steady passes over all ``k`` clusters at once, as the daemon's
drift passes run. Around each counted pass the parent reads, from outside the child:

* CPU seconds of the agent process (``/proc/PID/stat``, all its threads);
* its resident set after the pass and its peak (``VmRSS``, ``VmHWM`` of ``/proc/PID/status``);
* its open connections to the clusters' API servers (its sockets in ``/proc/PID/fd`` that are
  established TCP connections to an API server's port, from ``/proc/PID/net/tcp``);
* the requests the API servers counted (``harness.measure``, controller managers paused).

The model (``model``) fits memory as a base plus a slope per cluster (the 1- and the largest
fleet), takes the CPU per cluster pass from the largest fleet, and turns both into the clusters one
replica with 1 CPU and 1 GiB serves at a reconcile interval; its assumptions are in its result.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks import workload as w
from benchmarks.bench_apps import write_apps

#: Passes before steady state (the CRD's custom resources wait for it to be served; see bench_apps),
#: then passes a second apart for up to ``SETTLE_SECONDS``: the planner plans the custom resources'
#: list-maps from the CRD's OpenAPI, which the server publishes seconds after the CRD is served
#: (a daemon's passes are minutes apart; these are back to back).
SETTLE_PASSES = 4
SETTLE_SECONDS = 60.0
#: The replica the model sizes, and the share of it steady passes may take (the rest: headroom
#: for a new commit's render and first passes, a restart's cold passes, GC and bursts).
REPLICA_CPU = 1.0
REPLICA_MB = 1024.0
CPU_SHARE = 0.5
MEMORY_SHARE = 0.75
#: Reconcile intervals the model is given for (the agent's default is 5m).
INTERVALS = (60.0, 300.0, 600.0)


# -- the benchmark -------------------------------------------------------------------------------


def run(
    root: Path,
    sizes: list[int] | None = None,
    *,
    objects: int = 500,
    apps: int = 5,
    reps: int = 3,
) -> dict[str, Any]:
    """Per fleet size in ``sizes`` (default 1, 5, 10): ``reps`` counted steady passes of all of it."""
    sizes = sorted(set(sizes or [1, 5, 10]))
    if sizes[0] < 1 or objects < apps or apps < 1:
        raise ValueError("fleet sizes must be at least 1, and objects at least apps (at least 1)")
    items = w.generate(objects)
    files = root / f"files-capacity-{objects}"
    names = write_apps(items, apps, files)
    repo = root / f"repo-capacity-{objects}.git"
    h.commit_workload(repo, files, f"{apps} apps, {objects} objects")
    out: dict[str, Any] = {
        "objects_per_cluster": objects,
        "apps_per_cluster": apps,
        "kinds": w.kind_count(items),
        "rows": [],
    }
    with h.ClusterSet(root / "state") as cs:
        clusters = cs.start(*(f"cap-{i:02d}" for i in range(sizes[-1])))
        for k in sizes:
            fleet = clusters[:k]
            cfg = h.write_config(
                root / f"capacity-{k}.toml", repo, root / f"cache-capacity-{k}", fleet, apps=names
            )
            out["rows"].append(_measure_fleet(fleet, cfg, objects * k, reps))
            print(format_line(out["rows"][-1]), flush=True)
    out["model"] = model(out["rows"], objects=objects, apps=apps)
    for line in model_lines(out["model"]):
        print(line, flush=True)
    return out


def _wait_for_widget_schema(cluster: Any) -> None:
    """Until the API server's OpenAPI v3 holds the Widget CRD's schema (published seconds after
    the CRD is served): before it, each pass asks for it again, which is not the steady state."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while "Widget" not in h.kubectl(cluster, "get", "--raw", f"/openapi/v3/apis/{w.GROUP}/v1", ok=(0, 1)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Widget schema was never published on {cluster.name}")
        time.sleep(0.5)


def _measure_fleet(fleet: list[Any], cfg: Path, n: int, reps: int) -> dict[str, Any]:
    agent = h.AgentProcess(cfg)
    ports = {c.ports.apiserver for c in fleet}
    try:
        settle = []
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            reply = agent.one_pass()
            settle.append(reply["outcomes"])
            if not reply["failed"] and reply["outcomes"] == {"unchanged": n}:
                break
            if len(settle) >= SETTLE_PASSES and time.monotonic() > deadline:
                raise RuntimeError(f"{len(fleet)} clusters never settled: {settle}; {reply['failed'][:3]}")
            if len(settle) >= SETTLE_PASSES:
                time.sleep(1.0)  # a new CRD's OpenAPI is published seconds after it is served
        for c in fleet:  # steady means the agent asks nothing more: the CRD's schema is published
            _wait_for_widget_schema(c)
        agent.one_pass()  # the pass that reads that schema
        passes = []
        for _ in range(reps):
            m = agent.measured_pass(fleet)
            if m.value["outcomes"] != {"unchanged": n} or m.value["failed"]:
                raise RuntimeError(f"steady pass of {len(fleet)} clusters: {m.value}")
            passes.append(
                {
                    "seconds": round(m.value["seconds"], 3),
                    "agent_cpu": round(m.cpu["client"], 3),
                    "server_cpu": round(m.cpu["server"], 3),
                    "rss_mb": round(m.value["rss_mb"], 1),
                    "peak_rss_mb": round(m.value["peak_rss_mb"], 1),
                    "connections": h.connections(agent.pid, ports),
                    "requests": m.requests.total,
                }
            )
    finally:
        agent.close()
    k = len(fleet)
    mid = sorted(passes, key=lambda p: p["agent_cpu"])[len(passes) // 2]
    return {
        "clusters": k,
        "settle_passes": len(settle),
        "passes": passes,
        "pass_seconds": mid["seconds"],
        "agent_cpu": mid["agent_cpu"],
        "agent_cpu_per_cluster": round(mid["agent_cpu"] / k, 4),
        "rss_mb": max(p["rss_mb"] for p in passes),
        "peak_rss_mb": max(p["peak_rss_mb"] for p in passes),
        "connections": max(p["connections"] for p in passes),
        "connections_per_cluster": round(max(p["connections"] for p in passes) / k, 2),
        "requests_per_pass": mid["requests"],
        "requests_per_cluster": round(mid["requests"] / k, 2),
    }


def model(rows: list[dict[str, Any]], *, objects: int, apps: int) -> dict[str, Any]:
    """Clusters per replica (1 CPU, 1 GiB) from the measured rows; pure."""
    small, large = rows[0], rows[-1]
    span = large["clusters"] - small["clusters"]
    per_cluster_mb = (large["peak_rss_mb"] - small["peak_rss_mb"]) / span if span else large["peak_rss_mb"]
    per_cluster_mb = max(per_cluster_mb, 0.1)
    base_mb = small["peak_rss_mb"] - per_cluster_mb * small["clusters"]
    cpu = large["agent_cpu_per_cluster"]
    by_memory = int((REPLICA_MB * MEMORY_SHARE - base_mb) // per_cluster_mb)
    limits = []
    for interval in INTERVALS:
        by_cpu = int(REPLICA_CPU * CPU_SHARE * interval // cpu) if cpu > 0 else by_memory
        limits.append(
            {
                "interval_s": interval,
                "by_cpu": by_cpu,
                "by_memory": by_memory,
                "clusters": min(by_cpu, by_memory),
                "bound": "cpu" if by_cpu < by_memory else "memory",
            }
        )
    return {
        "base_mb": round(base_mb, 1),
        "per_cluster_mb": round(per_cluster_mb, 2),
        "cpu_per_cluster_pass": cpu,
        "connections_per_cluster": large["connections_per_cluster"],
        "requests_per_cluster_pass": large["requests_per_cluster"],
        "limits": limits,
        "assumptions": [
            f"a replica of {REPLICA_CPU:g} CPU and {REPLICA_MB:g} MiB; steady passes may use "
            f"{CPU_SHARE:.0%} of its CPU and {MEMORY_SHARE:.0%} of its memory (the rest is headroom for "
            "a new commit's render and first passes, a restart's cold passes of every cluster, GC)",
            f"every cluster like the measured ones: {objects} objects of the benchmark's workload in "
            f"{apps} apps, every object unchanged (drift passes); one Git source, polled apart from "
            "the passes",
            "memory: peak RSS as a base plus a slope per cluster, fitted on the smallest and the "
            "largest fleet; CPU: the agent's CPU per cluster pass in the largest fleet",
            "API servers on loopback on this machine: a remote server's latency adds wall time, not CPU",
        ],
    }


def format_line(row: dict[str, Any]) -> str:
    return (
        f"capacity {row['clusters']:>3} clusters  pass {row['pass_seconds']:.3f}s  agent CPU "
        f"{row['agent_cpu']:.3f}s ({row['agent_cpu_per_cluster']:.4f}s per cluster)  RSS {row['rss_mb']} MB "
        f"(peak {row['peak_rss_mb']} MB)  connections {row['connections']}  requests per pass "
        f"{row['requests_per_pass']} ({row['requests_per_cluster']} per cluster)"
    )


def model_lines(m: dict[str, Any]) -> list[str]:
    out = [
        f"capacity model: {m['base_mb']} MB + {m['per_cluster_mb']} MB per cluster, "
        f"{m['cpu_per_cluster_pass']:.4f} CPU s per cluster pass"
    ]
    for lim in m["limits"]:
        out.append(
            f"  1 CPU / 1 GiB at reconcile_interval {lim['interval_s']:g}s: {lim['clusters']} clusters "
            f"(CPU allows {lim['by_cpu']}, memory {lim['by_memory']}; bound by {lim['bound']})"
        )
    return out
