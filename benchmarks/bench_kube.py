"""Benchmarks 1-3: initial apply, steady state and a 1% change, agent versus kubectl, per size.

Called by ``benchmarks.__main__`` (``python -m benchmarks apply|steady|change``).

Per size N two fresh local control planes: ``ba-N`` for the agent and ``bk-N`` for the pinned
``kubectl`` (the same files, so each tool owns its own copy and neither fights the other's field
manager). The agent runs in-process as deployed: ``GitSource`` + ``Fleet`` kept warm between
passes (discovery and OpenAPI cached); the Git poll happens before the clock starts and is
measured by the Git benchmark. kubectl gets a warm discovery cache before its first measured step.
Request counts are the API server's own and CPU seconds are read per process (``harness.measure``);
the initial apply's row also gives the wall time that CPU allows on this machine's cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks import workload as w
from benchmarks.markdown import bound_line


def _kubectl_initial(k: Any, files: Path) -> None:
    # A CRD and its custom resources cannot go in one kubectl invocation (the CR kind is not
    # mapped yet): the CRD first, wait until it is served, then everything.
    h.kubectl(k, "apply", "--server-side", "-f", str(files / w.CRD_FILE))
    h.kubectl(k, "wait", "--for=condition=established", "--timeout=60s", f"crd/{w.CRD_NAME}")
    h.kubectl(k, "apply", "--server-side", "-f", str(files))


def _row(metric: str, agent: h.Measured, peer: h.Measured, peer_name: str, **extra: Any) -> dict[str, Any]:
    return {
        "metric": metric,
        "agent": agent.to_json(),
        "peer_name": peer_name,
        "peer": peer.to_json(),
        "time_ratio": h.ratio(agent.seconds, peer.seconds),
        "request_ratio": h.ratio(agent.requests.total, peer.requests.total),
        **extra,
    }


def _median(runs: list[h.Measured]) -> h.Measured:
    ordered = sorted(runs, key=lambda m: m.seconds)
    mid = ordered[len(ordered) // 2]
    mid.value = [round(m.seconds, 3) for m in runs]
    return mid


def _bound(agent: h.Measured, kube: h.Measured) -> dict[str, Any]:
    """Where the initial apply's time goes: CPU of server and client over the cores, per tool."""
    ncpu = h.cores()
    bound, peer_bound = h.cpu_bound(agent, ncpu), h.cpu_bound(kube, ncpu)
    return {
        "cores": ncpu,
        "cpu_bound_seconds": {"agent": round(bound, 3), "peer": round(peer_bound, 3)},
        "bound_throughput_ratio": h.ratio(kube.seconds, bound),
        # Both tools at their bounds: what the CPU each one costs allows, whatever else ran meanwhile.
        "bounds_ratio": h.ratio(peer_bound, bound),
    }


def run_size(
    n: int, root: Path, parts: set[str], reps: int, concurrency: int | None = None
) -> dict[str, Any]:
    """Measure ``parts`` (apply, steady, change) for a workload of ``n`` objects."""
    from agent.diff import run_live

    out: dict[str, Any] = {"objects": n, "rows": []}
    items = w.generate(n)
    out["kinds"] = w.kind_count(items)
    v1 = root / f"files-{n}-v1"
    w.write(items, v1)
    repo = root / f"repo-{n}.git"
    h.commit_workload(repo, v1, "v1")
    kube_reps = reps if n <= 500 else 1  # kubectl at 5,000 objects takes a minute per diff
    with h.ClusterSet(root / "state") as cs:
        a, k = cs.start(f"ba-{n}", f"bk-{n}")
        idle = h.noise(a)
        out["noise_requests_5s"] = idle.requests.total
        out["idle_server_cpu_5s"] = round(idle.cpu["server"], 2)
        cfg = h.write_config(
            root / f"bench-{n}.toml", repo, root / f"cache-{n}", [a], concurrency=concurrency
        )
        agent = h.InProcessAgent(cfg)
        out["concurrency"] = agent.config.clusters[0].settings.concurrency
        try:
            rev = agent.source.poll()
            h.kubectl(k, "api-resources")  # warm kubectl's discovery cache, as a user's would be
            kube = h.measure([k], lambda: _kubectl_initial(k, v1), client="children")
            first = h.measure([a], lambda: agent.fleet.reconcile_all(rev))
            outcomes = h.outcome_counts(first.value)
            if outcomes.get("created") != n:
                raise RuntimeError(f"agent initial apply of {n}: {outcomes}")
            out["rows"].append(
                _row(
                    "initial apply",
                    first,
                    kube,
                    "kubectl apply --server-side",
                    throughput_ratio=h.ratio(kube.seconds, first.seconds),
                    target="throughput >= 2x kubectl",
                    met=kube.seconds >= 2 * first.seconds,
                    **_bound(first, kube),
                )
            )
            if parts & {"steady", "change"}:
                # The pass after the first also loads the CRD's schema (not served before it).
                agent.fleet.reconcile_all(rev)
            if "steady" in parts:
                runs = [h.measure([a], lambda: agent.fleet.reconcile_all(rev)) for _ in range(reps)]
                for m in runs:
                    if h.outcome_counts(m.value) != {"unchanged": n}:
                        raise RuntimeError(f"steady state of {n}: {h.outcome_counts(m.value)}")
                steady = _median(runs)
                again = _median(
                    [
                        h.measure(
                            [k],
                            lambda: h.kubectl(k, "apply", "--server-side", "-f", str(v1)),
                            client="children",
                        )
                        for _ in range(kube_reps)
                    ]
                )
                kdiff = _median(
                    [
                        h.measure(
                            [k],
                            lambda: h.kubectl(k, "diff", "--server-side", "-f", str(v1), ok=(0,)),
                            client="children",
                        )
                        for _ in range(kube_reps)
                    ]
                )
                limit = out["kinds"] + 5
                out["rows"].append(
                    _row(
                        "steady state",
                        steady,
                        again,
                        "kubectl apply --server-side",
                        target=f"requests <= {limit} (kinds + 5), time <= 0.1x kubectl apply",
                        met=steady.requests.total <= limit and steady.seconds <= 0.1 * again.seconds,
                        agent_runs=steady.value,
                    )
                )
                out["rows"].append(
                    _row("steady state", steady, kdiff, "kubectl diff --server-side", agent_runs=steady.value)
                )
            if "change" in parts:
                changed = w.change_set(n)
                v2 = root / f"files-{n}-v2"
                w.write(w.generate(n, changed=changed), v2)
                h.commit_workload(repo, v2, "1% changed")
                rev2 = agent.source.poll()
                report = h.measure([a], lambda: run_live(agent.config, rev2))
                kdiff = h.measure(
                    [k],
                    lambda: h.kubectl(k, "diff", "--server-side", "-f", str(v2), ok=(1,)),
                    client="children",
                )
                errors = [c.error for c in report.value.clusters if c.error]
                if errors:
                    raise RuntimeError(f"diff report of {n}: {errors}")
                shown = sum(len(c.objects) for c in report.value.clusters)
                out["rows"].append(
                    _row(
                        "1% change: diff report",
                        report,
                        kdiff,
                        "kubectl diff --server-side",
                        changed=len(changed),
                        reported=shown,
                    )
                )
                passed = h.measure([a], lambda: agent.fleet.reconcile_all(rev2))
                counts = h.outcome_counts(passed.value)
                if counts.get("configured") != len(changed):
                    raise RuntimeError(f"1% change of {n}: {counts}, expected {len(changed)} configured")
                kapply = h.measure(
                    [k], lambda: h.kubectl(k, "apply", "--server-side", "-f", str(v2)), client="children"
                )
                out["rows"].append(
                    _row(
                        "1% change: reconcile",
                        passed,
                        kapply,
                        "kubectl apply --server-side",
                        changed=len(changed),
                    )
                )
        finally:
            agent.close()
    return out


def run(
    sizes: list[int], root: Path, parts: set[str], reps: int = 3, concurrency: int | None = None
) -> list[dict[str, Any]]:
    """``concurrency``: the agent's per-cluster setting (None: its default)."""
    h.quiet_logs()
    results = []
    for n in sizes:
        r = run_size(n, root, parts, reps, concurrency)
        results.append(r)
        for row in r["rows"]:
            print(h.format_row(n, row), flush=True)
            if "cpu_bound_seconds" in row:
                print("  " + bound_line(n, row), flush=True)
    return results
