"""Benchmark 7: many apps on one cluster, steady state: requests per cluster pass, counted by the server.

Called by ``benchmarks.__main__`` (``python -m benchmarks apps``).

The benchmark workload of ``apps`` x ``per_app`` objects (``workload.py``: 16 kinds, a CRD and its
custom resources included) is cut into ``apps`` consecutive slices, one `[[apps]]` app each
(``workload/app-000`` ...), all on one local cluster served by one in-process ``Fleet``, as
deployed. Apps share the cluster pass's one read: one LIST per kind for every app's objects and one
labelled LIST for every app's ApplySet parent, so a steady pass costs the same requests whether
the objects are one app or a hundred (docs/architecture.md, "Apps"). The target is the one of the
other steady-state rows, per cluster pass: requests ≤ kinds + 5. There is no peer: kubectl has no
apps; the figure is the request count itself, with the pass's wall time and CPU beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks import workload as w

#: The request target of a steady pass is the number of kinds plus this handful (as the kube rows).
HANDFUL = 5
#: Passes before steady state: the CRD's custom resources can be applied only once it is served,
#: and its schema is loaded on the pass after (benchmarks/README.md, profiling notes).
SETTLE_PASSES = 4


def app_names(apps: int) -> list[str]:
    return [f"app-{i:03d}" for i in range(apps)]


def write_apps(items: list[w.Item], apps: int, directory: Path) -> list[str]:
    """``apps`` consecutive slices of ``items``, one directory each; the apps' names, in order."""
    names = app_names(apps)
    size = -(-len(items) // apps)  # ceiling: every item in some app
    for i, name in enumerate(names):
        w.write(items[i * size : (i + 1) * size], directory / name)
    return names


def _settle(agent: h.InProcessAgent, n: int) -> list[dict[str, Any]]:
    """Passes until every app is ok and the next pass would find every object unchanged."""
    rev = agent.source.poll()
    passes: list[dict[str, Any]] = []
    for i in range(SETTLE_PASSES):
        results = agent.fleet.reconcile_all(rev)
        counts = h.outcome_counts(results)
        failed = sorted(f"{r.app}: {r.error or 'objects failed'}"[:200] for r in results if not r.ok)
        passes.append({"pass": i + 1, "outcomes": counts, "failed_apps": len(failed)})
        if not failed and counts == {"unchanged": n}:
            return passes
    raise RuntimeError(f"{n} objects in apps never settled: {passes}; last failures: {failed[:3]}")


def run(root: Path, apps: int = 100, per_app: int = 50, reps: int = 3) -> dict[str, Any]:
    """One cluster, ``apps`` apps of ``per_app`` objects: settle, then ``reps`` counted steady passes."""
    if apps < 1 or per_app < 1:
        raise ValueError("apps and objects per app must be at least 1")
    h.quiet_logs()
    n = apps * per_app
    items = w.generate(n)
    files = root / f"files-apps-{apps}x{per_app}"
    names = write_apps(items, apps, files)
    repo = root / f"repo-apps-{apps}x{per_app}.git"
    h.commit_workload(repo, files, f"{apps} apps x {per_app} objects")
    kinds = w.kind_count(items)
    limit = kinds + HANDFUL
    out: dict[str, Any] = {"apps": apps, "objects_per_app": per_app, "objects": n, "kinds": kinds}
    with h.ClusterSet(root / "state") as cs:
        (cluster,) = cs.start(f"bapps-{apps}")
        cfg = h.write_config(
            root / f"apps-{apps}.toml", repo, root / f"cache-apps-{apps}", [cluster], apps=names
        )
        agent = h.InProcessAgent(cfg)
        try:
            rev = agent.source.poll()
            first = h.measure([cluster], lambda: agent.fleet.reconcile_all(rev))
            passes = _settle(agent, n)
            runs = [h.measure([cluster], lambda: agent.fleet.reconcile_all(rev)) for _ in range(reps)]
        finally:
            agent.close()
    for m in runs:
        if h.outcome_counts(m.value) != {"unchanged": n} or len(m.value) != apps:
            raise RuntimeError(
                f"steady state of {apps} apps: {h.outcome_counts(m.value)}, {len(m.value)} results"
            )
    worst = max(m.requests.total for m in runs)
    steady = sorted(runs, key=lambda m: m.seconds)[len(runs) // 2]
    out["first_pass"] = {**first.to_json(), "outcomes": h.outcome_counts(first.value)}
    out["settle_passes"] = passes
    out["rows"] = [
        {
            "metric": f"steady state, {apps} apps on one cluster",
            "agent": steady.to_json(),
            "agent_runs": [round(m.seconds, 3) for m in runs],
            "requests_per_pass": [m.requests.total for m in runs],
            "by_resource": dict(sorted(steady.requests.by_resource.items())),
            "target": f"requests per cluster pass <= {limit} (kinds + {HANDFUL})",
            "met": worst <= limit,
        }
    ]
    return out


def format_line(result: dict[str, Any]) -> str:
    """The console line of the apps row."""
    (row,) = result["rows"]
    a = row["agent"]
    status = "target met" if row["met"] else "TARGET MISSED"
    return (
        f"apps {result['apps']}x{result['objects_per_app']} ({result['kinds']} kinds)  steady pass "
        f"{a['seconds']:.3f}s, requests per pass {row['requests_per_pass']} "
        f"({' '.join(f'{v}={k}' for v, k in a['requests']['by_verb'].items())}) "
        f"cpu {a['cpu']['server']:.2f}+{a['cpu']['client']:.2f}s  {status}"
    )
