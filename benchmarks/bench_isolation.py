"""Benchmark 6: a frozen cluster must not slow the others, nor a failing app its cluster's other
apps (docs/safety.md rule 6), measured.

Called by ``benchmarks.__main__`` (``python -m benchmarks isolation``).

Three clusters with the same workload, one in-process ``Fleet`` (as deployed). After the initial
apply, steady passes of all three at once are timed per cluster (the pass's own start and end),
first with every cluster healthy, then with the third frozen (``agent.dev.localcluster.freeze``:
SIGSTOP of its apiserver and etcd, so its connections hang). The figure is the healthy two's
median pass latency frozen versus not.

The apps row (``run_apps``), on the first cluster afterwards: the daemon in-process
(``scheduler.Daemon``, as ``gitops-agent run`` wires it) serving ``HEALTHY_APPS`` apps of
ConfigMaps and a fourth app, each on a ``reconcile_interval`` of ``APPS_INTERVAL``; first with the
fourth app rendering, then with a YAML error in it (every pass of it fails: backoff from
``APPS_BACKOFF``). The figure is the healthy apps' pass latency, the median time from one pass
of a healthy app to its next (how long a hand edit to it can wait), with the fourth app failing
versus not.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks import workload as w

TARGET = 1.10
#: The apps row: healthy apps beside the one that fails, each app's interval, the failing app's
#: first backoff (far above the interval: a healthy app held back by it cannot go unnoticed),
#: and the passes of each healthy app left out at the start (the first creates its objects).
HEALTHY_APPS = 3
APPS_INTERVAL = 2.0
APPS_BACKOFF = 10.0
APPS_SETTLE = 2


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
        apps_row = run_apps(root, clusters[0], n, passes=2 + 2 * reps)
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
    out["rows"].append(apps_row)
    return out


def _app_files(directory: Path, n: int, *, broken: bool) -> list[str]:
    """``HEALTHY_APPS`` apps of ConfigMaps (``n`` in all, at least one each), each in a namespace of
    its own, and ``broken``, which renders one ConfigMap, or (``broken``) fails on a YAML error."""
    from benchmarks.bench_apps import app_names

    names = app_names(HEALTHY_APPS)
    per_app = max(1, n // HEALTHY_APPS)
    for name in names:
        ns = f"bench-appsched-{name}"
        docs = [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"]
        docs += [
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i:05d}\n  namespace: {ns}\n"
            f"data:\n  k: v\n"
            for i in range(per_app)
        ]
        (directory / name).mkdir(parents=True, exist_ok=True)
        (directory / name / "objects.yaml").write_text("---\n".join(docs))
    (directory / "broken").mkdir(parents=True, exist_ok=True)
    ok = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: broken\n  namespace: default\ndata:\n  k: v\n"
    (directory / "broken" / "objects.yaml").write_text("kind: [\n" if broken else ok)
    return names


def _pass_starts(config_file: Path, healthy: list[str], passes: int) -> tuple[dict[str, list[float]], Any]:
    """Run the daemon on ``config_file`` until each of ``healthy`` had ``APPS_SETTLE + passes + 1``
    passes; when each app's passes started, and the status of the fourth app."""
    from agent.config.load import load_config
    from agent.model import ClusterResult, Revision
    from agent.reconcile.apps import Revisions
    from agent.run.fleet import Fleet
    from agent.run.lease_settings import LeaseSettings
    from agent.run.scheduler import Daemon, DaemonOptions
    from agent.source.sources import SourceSet

    starts: dict[str, list[float]] = {}

    class TimedFleet(Fleet):
        """The fleet, noting when each app's pass started."""

        def run_apps(
            self, name: str, revision: Revision | Revisions, *, dry_run: bool = False, apps: Any = None
        ) -> list[ClusterResult]:
            t = time.monotonic()
            results = super().run_apps(name, revision, dry_run=dry_run, apps=apps)
            for r in results:
                starts.setdefault(r.app, []).append(t)
            return results

    cfg = load_config(config_file)
    opts = DaemonOptions(leases=LeaseSettings(enabled=False), tick=0.2, backoff_base=APPS_BACKOFF)
    daemon = Daemon(cfg, SourceSet.from_config(cfg), TimedFleet, opts)
    want = APPS_SETTLE + passes + 1
    # Generous: held back by a backoff, the passes would take up to ten times their interval.
    end = time.monotonic() + 60 + 10 * want * APPS_INTERVAL
    daemon.start()
    try:
        while min(len(starts.get(a, [])) for a in healthy) < want:
            if time.monotonic() > end:
                raise RuntimeError(
                    f"healthy apps' passes: { ({a: len(starts.get(a, [])) for a in healthy}) }"
                )
            time.sleep(0.05)
    finally:
        daemon.stop(grace=5)
    cluster = cfg.clusters[0].name
    return starts, daemon.fleet.status[cluster].app("broken")


def _spacings(starts: dict[str, list[float]], healthy: list[str]) -> list[float]:
    """The time from each settled pass of a healthy app to its next."""
    return [b - a for app in healthy for a, b in itertools.pairwise(starts[app][APPS_SETTLE:])]


def run_apps(root: Path, cluster: Any, n: int, passes: int = 6) -> dict[str, Any]:
    """The apps row on ``cluster``: healthy apps' pass latency with a fourth app failing vs not."""
    files = root / "files-appsched"
    repo = root / "repo-appsched.git"
    measured: dict[bool, list[float]] = {}
    broken_status: Any = None
    for broken in (False, True):
        healthy = _app_files(files, n, broken=broken)
        h.commit_workload(repo, files, "a failing app" if broken else "every app renders")
        cfg = h.write_config(
            root / f"appsched-{broken}.toml",
            repo,
            root / "cache-appsched",
            [cluster],
            agent="bench-appsched",  # one name: the second daemon goes on from the first's inventories
            defaults=f'reconcile_interval = "{APPS_INTERVAL:g}s"',
            apps=[*healthy, "broken"],
        )
        starts, status = _pass_starts(cfg, healthy, passes)
        measured[broken] = _spacings(starts, healthy)
        if broken:
            broken_status = status
    f, b = h.median(measured[True]), h.median(measured[False])
    failing = broken_status.last_result
    row = {
        "metric": f"healthy apps' pass latency, one app of {HEALTHY_APPS + 1} failing",
        "agent_seconds": round(f, 3),
        "peer_name": "no app failing",
        "peer_seconds": round(b, 3),
        "time_ratio": h.ratio(f, b),
        "target": "<= 1.10x",
        "met": f <= TARGET * b,
        "interval_s": APPS_INTERVAL,
        "backoff_base_s": APPS_BACKOFF,
        "baseline_runs": [round(x, 3) for x in measured[False]],
        "failing_runs": [round(x, 3) for x in measured[True]],
        "failing_app_failures": broken_status.failures,
        "failing_app_error": ((failing.error if failing else "") or "")[:120],
    }
    if not row["failing_app_error"]:
        raise RuntimeError("the failing app did not fail")
    print(
        f"isolation apps {HEALTHY_APPS}+1  healthy apps' pass latency x{row['time_ratio']} with one failing:"
        f" {f:.3f}s vs {b:.3f}s (interval {APPS_INTERVAL:g}s)"
        f"{'  target met' if row['met'] else '  TARGET MISSED'}",
        flush=True,
    )
    return row
