"""Benchmark 9: how long the status page takes to answer, in the server, for a large fleet.

Called by ``benchmarks.__main__`` (``python -m benchmarks page``).

``clusters`` x ``apps`` apps (default 50 x 20), each recorded by the real ``StatusPage`` from
synthetic passes (``objects`` objects each, one with a yielded field, every tenth app failing
an object, the history of ``passes`` revisions), then each page asked ``reps`` times through
``StatusPage.handle``: the server's time from request to the last byte of HTML (view building,
Jinja2 rendering, encoding), no network, no browser. The target is 200 ms for the grid. No
cluster is started: the page renders what the agent holds in memory, whatever the clusters do.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent.model import ApplyResult, ClusterResult, FieldConflict, Note, ObjectKey, Outcome, Resolution
from agent.run.record_store import FileStore
from agent.run.status import ClusterStatus
from agent.run.statuspage import ClusterSnapshot, Snapshot, StatusPage
from agent.ui.auth import Access

TARGET_MS = 200.0
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _results(cluster: str, app: str, objects: int, failing: bool, revision: str, at: int) -> ClusterResult:
    hpa = FieldConflict(
        ("f:spec", "f:replicas"), "kube-controller-manager", "Update", "scale", Resolution.YIELD, 3, 5
    )
    out = [
        ApplyResult(
            ObjectKey("apps", "Deployment", app, "web"), Outcome.UNCHANGED, note=Note.YIELDED, yielded=(hpa,)
        )
    ]
    out += [
        ApplyResult(ObjectKey("", "ConfigMap", app, f"cm-{i}"), Outcome.CONFIGURED)
        for i in range(objects - 1)
    ]
    if failing:
        out[-1] = ApplyResult(out[-1].key, Outcome.FAILED, status=422, message="data: Invalid value")
    start = T0 + timedelta(minutes=at)
    return ClusterResult(
        cluster, revision, results=out, started=start, finished=start + timedelta(seconds=2), app=app
    )


def build(clusters: int, apps: int, objects: int, passes: int) -> StatusPage:
    statuses = {}
    for c in range(clusters):
        st = ClusterStatus(f"cluster-{c:02d}")
        for a in range(apps):
            st.app(f"app-{a:02d}")
        statuses[st.name] = st
    snap = Snapshot(
        "gitops-agent",
        tuple(ClusterSnapshot(n, s, heads=dict.fromkeys(s.apps, "f" * 40)) for n, s in statuses.items()),
    )
    page = StatusPage(lambda: snap, FileStore(Path(tempfile.mkdtemp())), access=Access.OPEN)
    subjects = {f"{p:040x}": f"change {p}" for p in range(passes)}
    for p in range(passes):
        revision = f"{p:040x}"
        results = [
            _results(name, app, objects, (i * apps + j) % 10 == 0, revision, p)
            for i, (name, st) in enumerate(statuses.items())
            for j, app in enumerate(st.apps)
        ]
        page.record_passes(results, subjects, may_write=lambda _c: False)
    return page


def _time(page: StatusPage, path: str, reps: int) -> dict[str, Any]:
    times, size = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        answer = page.handle("GET", path, {})
        times.append((time.perf_counter() - t0) * 1000)
        assert answer.code == 200, (path, answer.code)
        size = len(answer.body)
    times.sort()
    return {
        "path": path,
        "median_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
        "bytes": size,
    }


def run(
    clusters: int = 50, apps: int = 20, *, objects: int = 20, passes: int = 5, reps: int = 20
) -> dict[str, Any]:
    t0 = time.perf_counter()
    page = build(clusters, apps, objects, passes)
    built = time.perf_counter() - t0
    rows = [
        _time(page, p, reps)
        for p in (
            "/ui/",
            "/ui/clusters/cluster-00",
            "/ui/clusters/cluster-00/apps/app-00",
            "/ui/history",
            "/ui/events",
        )
    ]
    return {
        "clusters": clusters,
        "apps_per_cluster": apps,
        "objects_per_app": objects,
        "passes": passes,
        "reps": reps,
        "target_ms": TARGET_MS,
        "record_seconds": round(built, 2),
        "rows": rows,
        "grid_met": rows[0]["median_ms"] <= TARGET_MS,
    }


def format_line(result: dict[str, Any]) -> str:
    grid = result["rows"][0]
    verdict = "met" if result["grid_met"] else "NOT met"
    return (
        f"page: grid of {result['clusters']} x {result['apps_per_cluster']} apps in {grid['median_ms']} ms "
        f"(p95 {grid['p95_ms']} ms; target {result['target_ms']:g} ms: {verdict})"
    )


if __name__ == "__main__":
    print(format_line(run()))
