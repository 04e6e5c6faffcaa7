"""Smoke run of the benchmarks at their smallest size (the full run stays out of CI: benchmarks/README.md).

Real local control planes, the pinned kubectl and Flux's engine (``benchmarks/fluxssa``, built by
``scripts/install-go-tools``); fails (never skips) when they are missing. Checks that every figure
is produced, that request counts come from the server (kubectl's and Flux's requests are counted
too, and the agent's own counter plays no part), the CPU accounting of the initial apply, its
repetitions on fresh clusters in alternating order, and the steady-state request target, which
holds at any size (for one app per cluster and for many apps on one).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent.config.load import load_config
from agent.config.types import ClusterSettings
from agent.dev.process import LocalCluster, Pids, Ports
from benchmarks import bench_apps, bench_charts, bench_corpus, bench_kube, bench_waves, harness, workload
from benchmarks.__main__ import main
from benchmarks.bench_kube import initial_row
from benchmarks.markdown import render, with_section
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
    # No kubeconfig file: loading a config does not check cluster access (nothing connects here).
    for asked, expected in ((3, 3), (None, ClusterSettings().concurrency)):
        cfg = harness.write_config(
            tmp_path / "c.toml", tmp_path / "repo", tmp_path, records, concurrency=asked
        )
        assert [c.settings.concurrency for c in load_config(cfg).clusters] == [expected, expected]


def test_write_config_with_apps_gives_each_cluster_one_app_per_name_and_no_app_of_its_own(
    tmp_path: Path,
) -> None:
    record = LocalCluster(
        "one",
        tmp_path,
        tmp_path / "one.kubeconfig",
        "https://127.0.0.1:1",
        tmp_path / "ca.crt",
        Ports(1, 2),
        Pids(1, 2, 3),
    )
    names = bench_apps.app_names(3)
    cfg = load_config(
        harness.write_config(tmp_path / "c.toml", tmp_path / "repo", tmp_path, [record], apps=names)
    )
    assert [(a.name, a.cluster, a.paths, a.implicit) for a in cfg.apps] == [
        (n, "one", (f"workload/{n}",), False) for n in ("app-000", "app-001", "app-002")
    ]


def _side(seconds: float, applies: int, server: float) -> dict[str, Any]:
    cpu = {"apiserver": server - 1, "etcd": 1.0, "server": server, "client": 2.0}
    requests = {"total": applies + 3, "by_verb": {"APPLY": applies, "LIST": 3}}
    return {"seconds": seconds, "requests": requests, "cpu": cpu}


def _rep(r: int, agent_s: float, kubectl_s: float, agent_server: float) -> dict[str, Any]:
    bound = (agent_server + 2) / 2
    return {
        "rep": r,
        "order": ["kubectl", "agent"] if r % 2 == 0 else ["agent", "kubectl"],
        "agent": _side(agent_s, 100 + r, agent_server),
        "peer": _side(kubectl_s, 100, 5.0),
        "time_ratio": round(agent_s / kubectl_s, 3),
        "throughput_ratio": round(kubectl_s / agent_s, 3),
        "request_ratio": 1.0,
        "cores": 2,
        "cpu_bound_seconds": {"agent": bound, "peer": 3.5},
        "bound_throughput_ratio": round(kubectl_s / bound, 3),
        "bounds_ratio": round(3.5 / bound, 3),
    }


def test_initial_apply_row_gives_the_median_of_per_repetition_ratios_and_keeps_every_repetition() -> None:
    # Throughput ratios 1.9, 2.8 and 2.31, unsorted: the target is judged on the middle ratio.
    reps = [_rep(0, 2.0, 3.8, 4.0), _rep(1, 5.0, 14.0, 9.0), _rep(2, 4.329, 10.0, 6.0)]
    row = initial_row(reps)
    assert row["throughput_ratio"] == 2.31 and row["throughput_ratio_range"] == [1.9, 2.8]
    assert row["met"] and row["apply_reps"] == 3 and row["reps"] == reps
    assert row["agent"]["seconds"] == 4.329 and row["peer"]["seconds"] == 10.0
    assert row["agent"]["requests"] == {"total": 104, "by_verb": {"APPLY": 101, "LIST": 3}}
    assert row["agent"]["cpu"]["server"] == 6.0 and row["cpu_bound_seconds"]["agent"] == 4.0
    assert not initial_row([reps[0], _rep(1, 5.0, 9.0, 9.0)])["met"]  # median of 1.9 and 1.8
    results = {
        "command": "apply",
        "started": "2026-01-01T00:00:00",
        "seconds": 1.0,
        "machine": {"nproc": 2, "cpu": "x", "memory_gb": 1, "python": "3", "kubectl": "v", "git": "g"},
        "kube": [{"objects": 10, "kinds": 2, "concurrency": 4, "idle_server_cpu_5s": 0.1, "rows": [row]}],
    }
    md = render(results)
    assert "throughput x2.31 (1.90\N{EN DASH}2.80, 3 reps)" in md
    assert "| 10 (2) | 0.43 (0.36\N{EN DASH}0.53, 3 reps) |" in md
    assert md.count("| 10 | ") == 3  # one line per repetition
    assert "x2.31 (1.90\N{EN DASH}2.80, 3 reps)" in harness.format_row(10, row)


def _flux_rep(r: int, agent_s: float, flux_s: float) -> dict[str, Any]:
    rep = _rep(r, agent_s, 10.0, 4.0)
    rep["order"] = ["kubectl", "agent", "flux"] if r % 2 == 0 else ["flux", "agent", "kubectl"]
    rep["flux"] = _side(flux_s, 100, 7.0)
    rep["cpu_bound_seconds"]["flux"] = 4.5
    rep.update(
        flux_time_ratio=round(agent_s / flux_s, 3),
        flux_throughput_ratio=round(flux_s / agent_s, 3),
        flux_request_ratio=1.0,
    )
    return rep


def test_flux_targets_are_judged_from_2000_objects_on_median_initial_throughput_and_steady_figures() -> None:
    # Throughput ratios to Flux's engine 0.9, 1.2 and 1.1: the middle one, 1.1, meets ">= 1x".
    reps = [_flux_rep(0, 5.0, 4.5), _flux_rep(1, 5.0, 6.0), _flux_rep(2, 5.0, 5.5)]
    row = initial_row(reps, 2000)
    assert row["flux_throughput_ratio"] == 1.1 and row["flux_throughput_ratio_range"] == [0.9, 1.2]
    assert row["flux_met"] and row["flux"]["seconds"] == 5.5 and row["cpu_bound_seconds"]["flux"] == 4.5
    assert not initial_row([reps[0], _flux_rep(1, 5.0, 4.0), reps[2]], 2000)["flux_met"]  # median 0.9
    assert "flux_target" not in initial_row(reps, 500) and "flux_met" not in initial_row(reps, 500)
    # Steady state: requests at most 1/50 of Flux's and time at most 0.2x, both.
    for agent_requests, agent_s, met in ((17, 0.2, True), (41, 0.2, False), (17, 1.1, False)):
        steady = {"agent": _side(agent_s, agent_requests - 3, 0.1), "flux": _side(5.0, 2000, 3.0)}
        bench_kube._flux_steady_target(2000, steady)
        assert steady["flux_met"] is met, (agent_requests, agent_s)
        small = {"agent": steady["agent"], "flux": steady["flux"]}
        bench_kube._flux_steady_target(500, small)
        assert "flux_met" not in small
    results = {
        "command": "apply",
        "started": "2026-01-01T00:00:00",
        "seconds": 1.0,
        "machine": {"nproc": 2, "cpu": "x", "memory_gb": 1, "python": "3", "kubectl": "v", "git": "g"},
        "kube": [{"objects": 2000, "kinds": 16, "concurrency": 8, "idle_server_cpu_5s": 0.1, "rows": [row]}],
    }
    md = render(results)
    assert "- initial apply against Flux's engine, 2000 objects: met — throughput >= 1x Flux's engine" in md
    assert "throughput x1.10 (0.90\N{EN DASH}1.20, 3 reps)" in harness.format_row(2000, row)


def test_corpus_rows_judge_the_median_render_ratio_and_steady_requests_with_and_without_refused_objects() -> (
    None
):
    # Medians 0.3 and 0.2 (ratio 1.5, missed); minimums 0.1 and 0.2 (ratio 0.5).
    row = bench_corpus.render_row("cert-manager", 50, [0.3, 0.1, 0.4], [0.2, 0.25, 0.2])
    assert (row["time_ratio"], row["min_ratio"], row["met"]) == (1.5, 0.5, False)
    assert row["reference"] == "helm template" and row["source"] == "chart"
    assert bench_corpus.render_row("argo-cd", 59, [0.3], [0.3])["met"]
    assert bench_corpus.render_row("otel", 20, [1.0], [1.0])["reference"] == "kustomize build"
    # 26 kinds: 31 requests allowed; the refused objects' applies and Events cost 5 more.
    by_resource = {"LIST configmaps": 27, "GET namespaces": 4, "APPLY certificates": 1, "POST events": 4}
    requests = harness.Requests(Counter({"LIST": 27, "GET": 4, "APPLY": 1, "POST": 4}), Counter(by_resource))
    steady = bench_corpus.steady_row("third pass", harness.Measured(0.4, requests), {"unchanged": 270}, 26)
    assert (steady["met"], steady["met_but_refused"], steady["refused_requests"]) == (False, True, 5)
    assert steady["objects_written"] == 0 and steady["write_requests"] == {
        "APPLY certificates": 1,
        "POST events": 4,
    }
    written = bench_corpus.steady_row("second pass", harness.Measured(0.4, requests), {"configured": 1}, 26)
    assert not written["met"] and not written["met_but_refused"]
    results = {
        "command": "corpus",
        "started": "2026-01-01T00:00:00",
        "seconds": 1.0,
        "machine": {"nproc": 2, "cpu": "x", "memory_gb": 1, "python": "3", "kubectl": "v", "git": "g"},
        "corpus": {
            "apps": 6,
            "reps": 3,
            "kinds": 26,
            "first_pass": {"seconds": 9.0, "requests": {"total": 0, "by_verb": {}}},
            "render": [row],
            "steady": [steady],
        },
    }
    doc = "# Benchmarks\n\n## Capacity\n\nkept\n\n## Reading these numbers\n\n- kept too\n"
    once = with_section(doc, results)
    assert "| cert-manager (`cert-manager-chart`) | chart | 50 |" in once and "x1.5 (x0.5)" in once
    assert once.index("## Capacity") < once.index("## Real-world corpus") < once.index("## Reading")
    assert with_section(once, results) == once  # a second run replaces its section, keeps the rest
    assert "## Real-world corpus" in render(results)


def test_benchmarks_refuse_to_start_without_the_flux_engine_and_name_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITOPS_AGENT_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(RuntimeError, match="run scripts/install-go-tools fluxssa"):
        bench_kube.run([10], tmp_path, {"apply"}, reps=1, apply_reps=1)
    assert not (tmp_path / "state").exists()  # no cluster was started


def test_benchmarks_smoke_smallest_size(tmp_path: Path) -> None:
    clusters.require_control_plane()
    argv = ["kube", "--sizes", "500", "--reps", "1", "--apply-reps", "2", "--concurrency", "3"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert main(["git", "--git-files", "200", "--git-commits", "300", "--out", str(tmp_path)]) == 0
    kube = json.loads(next(tmp_path.glob("kube-*.json")).read_text())
    assert kube["machine"]["nproc"] >= 1 and kube["machine"]["cpu"]
    (size,) = kube["kube"]
    assert size["objects"] == 500 and size["kinds"] >= 10
    assert size["noise_requests_5s"] == 0
    assert size["concurrency"] == 3
    rows = {(r["metric"], r.get("peer_name")): r for r in size["rows"]}
    assert set(rows) == {
        ("initial apply", "kubectl apply --server-side"),
        ("steady state", "kubectl apply --server-side"),
        ("steady state", "kubectl diff --server-side"),
        ("1% change: diff report", "kubectl diff --server-side"),
        ("1% change: reconcile", "kubectl apply --server-side"),
        ("prune of 10%", None),
    }
    initial = rows[("initial apply", "kubectl apply --server-side")]
    # Two repetitions, each on its own fresh trio of clusters, the order of the tools reversing.
    first, second = initial["reps"]
    assert [first["order"], second["order"]] == [["kubectl", "agent", "flux"], ["flux", "agent", "kubectl"]]
    assert [first["clusters"], second["clusters"]] == [
        {"agent": "ba-500-0", "peer": "bk-500-0", "flux": "bf-500-0"},
        {"agent": "ba-500-1", "peer": "bk-500-1", "flux": "bf-500-1"},
    ]
    assert initial["apply_reps"] == 2
    lo, hi = initial["throughput_ratio_range"]
    assert [lo, hi] == sorted([first["throughput_ratio"], second["throughput_ratio"]])
    assert lo <= initial["throughput_ratio"] <= hi
    for rep in (first, second):
        # Counted at the server: every tool sent one apply per object, on a fresh cluster each time;
        # Flux's engine a GET and a server-side dry-run before each.
        assert rep["agent"]["requests"]["by_verb"]["APPLY"] >= 500
        assert rep["peer"]["requests"]["by_verb"]["APPLY"] >= 500
        flux = rep["flux"]["requests"]["by_verb"]
        assert flux["APPLY"] == flux["APPLY(dry-run)"] == 500 and flux["GET"] >= 500
        # CPU of every side, read per process: applying 500 objects costs every one of them CPU.
        for side in ("agent", "peer", "flux"):
            cpu = rep[side]["cpu"]
            assert cpu["apiserver"] > 0 and cpu["etcd"] > 0 and cpu["client"] > 0, (side, cpu)
            assert abs(cpu["server"] - cpu["apiserver"] - cpu["etcd"]) <= 0.011
            assert rep["cpu_bound_seconds"][side] > 0
    for side in ("agent", "peer"):
        assert initial[side]["requests"]["by_verb"]["APPLY"] >= 500 and initial[side]["cpu"]["server"] > 0
        assert initial["cpu_bound_seconds"][side] > 0
    assert initial["cores"] >= 1
    assert initial["bound_throughput_ratio"] > 0 and initial["bounds_ratio"] > 0
    assert initial["flux_throughput_ratio"] > 0 and "flux_met" not in initial  # judged from 2,000 on
    steady = rows[("steady state", "kubectl apply --server-side")]
    assert steady["agent"]["requests"]["total"] <= size["kinds"] + 5
    assert "APPLY" not in steady["agent"]["requests"]["by_verb"]
    # Flux's engine in steady state: a GET and a dry-run per object, no apply.
    flux_steady = steady["flux"]["requests"]["by_verb"]
    assert flux_steady["APPLY(dry-run)"] == 500 and flux_steady["GET"] >= 500 and "APPLY" not in flux_steady
    change = rows[("1% change: reconcile", "kubectl apply --server-side")]
    assert change["agent"]["requests"]["by_verb"]["APPLY"] == change["changed"] == 5
    assert change["flux"]["requests"]["by_verb"]["APPLY"] == 5
    assert rows[("1% change: diff report", "kubectl diff --server-side")]["reported"] == 5
    # The prune of 10%: both delete exactly the 50 objects removed from Git, counted at the server.
    prune = rows[("prune of 10%", None)]
    assert prune["removed"] == 50 and "peer" not in prune
    assert prune["agent"]["requests"]["by_verb"]["DELETE"] == 50
    assert prune["flux"]["requests"]["by_verb"]["DELETE"] == 50
    git = json.loads(next(tmp_path.glob("git-*.json")).read_text())["git"]
    assert git["commits"] == 300 and git["files"] == 200
    assert [r["metric"] for r in git["rows"]][:6] == [
        "initial clone (+checkout), local path",
        "initial clone (+checkout), git://",
        "initial clone (+checkout), git://, shallow",
        "initial clone (+checkout), http://",
        "poll, no new commit, git://",
        "poll, no new commit, git://",
    ]
    targets = [(r["metric"], r["peer_name"]) for r in git["rows"] if "met" in r]
    assert targets == [
        ("poll, no new commit, git://", "git ls-remote"),
        ("poll, one new commit, git://", "git fetch"),
        ("poll, no new commit, http://", "git ls-remote"),
        ("poll, one new commit, http://", "git fetch"),
    ]
    assert git["worker_starts"] == {"git://": 1, "http://": 1}
    md = next(tmp_path.glob("kube-*.md")).read_text()
    assert md.startswith("# Benchmarks") and "### CPU bound of the initial apply" in md
    assert "### Initial apply, every repetition" in md and ", 2 reps)" in md
    assert "| Flux time ratio |" in md and "| prune of 10% | 500 (16) | — |" in md


def test_benchmarks_apps_smoke_small_size_reads_every_app_with_one_list_per_kind(tmp_path: Path) -> None:
    clusters.require_control_plane()
    argv = ["apps", "--apps", "6", "--objects-per-app", "40", "--reps", "2"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    apps = json.loads(next(tmp_path.glob("apps-*.json")).read_text())["apps"]
    assert (apps["apps"], apps["objects"], apps["kinds"]) == (
        6,
        240,
        workload.kind_count(workload.generate(240)),
    )
    assert apps["first_pass"]["outcomes"] == {"created": 240}
    (row,) = apps["rows"]
    # Counted at the server, every steady pass: reads only, one LIST per kind for all six apps'
    # objects, and the ConfigMap kind listed twice (the apps' objects, and their parents by label).
    assert row["met"] and all(n <= apps["kinds"] + 5 for n in row["requests_per_pass"])
    passes = row["by_resource_per_pass"]
    assert all(k.startswith(("LIST ", "GET ")) for p in passes for k in p), passes  # reads only
    # The server also counts its own periodic loopback reads, which only ever add to a pass: the
    # quietest of the identical passes is the agent's alone, and that one is exact.
    quietest = min(passes, key=lambda p: sum(p.values()))
    assert sum(quietest.values()) == apps["kinds"] + 1 and all(k.startswith("LIST ") for k in quietest)
    assert quietest["LIST configmaps"] == 2
    assert all(v == 1 for k, v in quietest.items() if k != "LIST configmaps")
    assert row["peak_rss_mb"] >= row["rss_mb"] > 50  # the agent's own process, read from /proc
    md = next(tmp_path.glob("apps-*.md")).read_text()
    assert "## Apps (6 apps x 40 objects on one cluster, steady state)" in md
    assert "The agent's RSS after a steady pass:" in md
    assert "- steady state, 6 apps on one cluster: met" in md


def test_benchmarks_health_smoke_counts_a_waiting_step_as_kinds_plus_children_per_namespace(
    tmp_path: Path,
) -> None:
    clusters.require_control_plane()
    argv = ["health", "--health-apps", "3", "--deployments-per-app", "2", "--reps", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    health = json.loads(next(tmp_path.glob("health-*.json")).read_text())["health"]
    waiting, current, after = health["rows"]
    # Per app and step, counted at the server: its 4 kinds by label, and for its one namespace of
    # waiting Deployments their ReplicaSets and Pods; reads only.
    assert waiting["requests_per_app"] == 6 and waiting["agent"]["requests"]["by_verb"] == {"LIST": 18}
    assert waiting["by_resource"]["LIST pods"] == 3 and waiting["by_resource"]["LIST replicasets"] == 3
    # The step that finds them rolled out reads no children and writes each app's HealthCurrent Event.
    assert "LIST pods" not in current["by_resource"] and current["by_resource"]["POST events"] == 3
    assert after["agent"]["requests"]["total"] == 0  # every wait has ended: nothing more to read
    assert health["steps"]["5 min"] > health["steps"]["1 min"] >= 4
    md = next(tmp_path.glob("health-*.md")).read_text()
    assert "## Health (3 apps x 2 Deployments waiting on one cluster)" in md


def test_benchmarks_tenants_smoke_apps_of_one_service_account_share_its_reads(tmp_path: Path) -> None:
    """Apps acting as namespace-bound ServiceAccounts: a steady pass is one LIST per kind per
    identity in its namespace, plus the inventories' one LIST (no refused cluster-wide LIST)."""
    result = bench_apps.run_tenants(tmp_path, tenants=2, apps_per_tenant=2, per_app=8, reps=2)
    (row,) = result["rows"]
    kinds = result["kinds"]
    assert row["met"], row
    # The quietest pass is the agent's alone (the server's own periodic reads only add to a pass).
    quietest = min(row["by_resource_per_pass"], key=lambda p: sum(p.values()))
    assert sum(quietest.values()) == kinds * 2 + 1, quietest
    assert all(k.startswith("LIST ") for k in quietest), quietest


def test_benchmarks_page_smoke_times_every_page_of_a_small_fleet_in_the_server(tmp_path: Path) -> None:
    argv = ["page", "--page-clusters", "3", "--page-apps", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    page = json.loads(next(tmp_path.glob("page-*.json")).read_text())["page"]
    assert [r["path"] for r in page["rows"]][:3] == [
        "/ui/",
        "/ui/clusters/cluster-00",
        "/ui/clusters/cluster-00/apps/app-00",
    ]
    assert page["grid_met"] and all(r["bytes"] > 0 for r in page["rows"])
    md = next(tmp_path.glob("page-*.md")).read_text()
    assert "## Status page (3 clusters x 2 apps, 20 objects and 5 passes each)" in md


def test_benchmarks_notify_smoke_times_a_push_and_a_hanging_sink_against_their_peers(tmp_path: Path) -> None:
    clusters.require_control_plane()
    assert main(["notify", "--notify-size", "30", "--reps", "1", "--out", str(tmp_path)]) == 0
    notify = json.loads(next(tmp_path.glob("notify-*.json")).read_text())["notify"]
    push, sink, cost = notify["rows"]
    assert push["peer_name"] == "polling every 2 s" and len(push["push_runs"]) == 1
    assert sink["peer_name"] == "a sink that answers at once" and len(sink["hanging_runs"]) == 10
    assert cost["peer_name"] == "no notifications" and len(cost["none_runs"]) == 10
    # The sink did hang: nothing reached it; the statuses piled up in its queue or were dropped.
    assert sink["sink"]["sent"] == 0
    assert sink["sink"]["queued"] + sink["sink"]["dropped"] + sink["sink"]["failed"] >= 10
    md = next(tmp_path.glob("notify-*.md")).read_text()
    assert "## Notifications and the webhook receiver (30 objects on one cluster)" in md


def test_benchmarks_capacity_smoke_measures_each_fleet_size_from_outside_the_agent(tmp_path: Path) -> None:
    """Two fleet sizes of tiny clusters: every figure read from the agent's own process, requests
    counted by the servers (reads only, the same per cluster at both sizes), and the model."""
    clusters.require_control_plane()
    argv = ["capacity", "--capacity-clusters", "1,2", "--capacity-objects", "40", "--capacity-apps", "2"]
    assert main([*argv, "--reps", "1", "--out", str(tmp_path)]) == 0
    cap = json.loads(next(tmp_path.glob("capacity-*.json")).read_text())["capacity"]
    one, two = cap["rows"]
    assert (one["clusters"], two["clusters"]) == (1, 2)
    kinds = cap["kinds"]
    for row in (one, two):
        # Steady state: one LIST per kind and one for the apps' parents, per cluster; no write.
        assert row["requests_per_cluster"] == kinds + 1, row
        assert row["agent_cpu"] > 0 and row["peak_rss_mb"] >= row["rss_mb"] > 50
        # Keep-alive connections to each API server the pass talked to, and to no other.
        assert row["clusters"] <= row["connections"] <= row["clusters"] * 8
    model = cap["model"]
    assert model["per_cluster_mb"] > 0 and model["cpu_per_cluster_pass"] > 0
    assert [lim["interval_s"] for lim in model["limits"]] == [60.0, 300.0, 600.0]
    for lim in model["limits"]:
        assert lim["clusters"] == min(lim["by_cpu"], lim["by_memory"]) > 0
    md = next(tmp_path.glob("capacity-*.md")).read_text()
    assert "## Capacity (40 objects in 2 apps per cluster, steady state)" in md
    assert "| reconcile_interval | clusters | CPU allows | memory allows | bound by |" in md


def test_benchmarks_memory_and_isolation_smoke_measure_the_agent_on_three_tiny_clusters(
    tmp_path: Path,
) -> None:
    """Benchmarks 4 and 6 at tiny sizes: the agent's peak RSS from the kernel for both passes, the
    healthy clusters' pass latencies with one of three frozen (its error named), and the healthy
    apps' pass latencies with one app failing (its error named)."""
    clusters.require_control_plane()
    assert main(["memory", "--memory-sizes", "30", "--out", str(tmp_path / "m")]) == 0
    mem = json.loads(next((tmp_path / "m").glob("memory-*.json")).read_text())["memory"]
    (row,) = mem["rows"]
    assert row["objects_per_cluster"] == 30 and row["clusters"] == 3
    assert mem["baseline_import_mb"] > 20 and row["peak_mb"] >= mem["baseline_import_mb"]
    assert row["peak_mb"] == max(row["apply"]["peak_mb"], row["steady"]["peak_mb"])
    assert main(["isolation", "--isolation-size", "20", "--reps", "1", "--out", str(tmp_path / "i")]) == 0
    iso = json.loads(next((tmp_path / "i").glob("isolation-*.json")).read_text())["isolation"]
    row, apps = iso["rows"]
    assert row["baseline_runs"] and row["frozen_runs"] and row["frozen_cluster_error"], row
    assert apps["baseline_runs"] and apps["failing_runs"] and apps["failing_app_error"], apps
    # Not the 1.10x target (a smoke run is too short to judge it), but no backoff in the way.
    assert apps["failing_app_failures"] >= 1 and apps["time_ratio"] < 2, apps


def test_benchmarks_charts_smoke_counts_a_poll_at_the_repository_and_renders_the_corpus_charts(
    tmp_path: Path,
) -> None:
    assert main(["charts", "--charts-reps", "2", "--out", str(tmp_path)]) == 0
    results = json.loads(next(tmp_path.glob("charts-*.json")).read_text())
    charts = results["charts"]
    http, oci = charts["poll"]
    # Counted by the repository's server: one conditional request per poll for both charts; the
    # registry's access log: one tag list per chart (each is a repository there).
    assert http["requests_per_poll"] == [1, 1] and http["downloads"] == 0 and http["met"]
    assert oci["requests_per_poll"] == [2, 2] and oci["downloads"] == 0 and oci["met"]
    assert not bench_charts.poll_row("HTTP", 2, [1, 2], 0, per_chart=False)["met"]
    assert bench_charts.poll_row("OCI", 2, [2, 2], 0, per_chart=True)["met"]
    rendered = {r["chart"].split()[0]: r for r in charts["render"]}
    assert sorted(rendered) == ["cert-manager", "ingress-nginx"]
    assert all(r["objects"] > 10 and r["agent_seconds"]["min"] > 0 for r in rendered.values())
    md = next(tmp_path.glob("charts-*.md")).read_text()
    assert "## Charts from a repository (cert-manager, ingress-nginx" in md
    # --docs replaces only its own section of a document.
    doc = with_section("# B\n\n## Other\n\nx\n\n## Reading these numbers\n", results)
    assert doc.index("## Other") < doc.index("## Charts from a repository") < doc.index("## Reading")


def test_benchmarks_waves_smoke_times_an_apps_waves_against_each_wave_alone(tmp_path: Path) -> None:
    clusters.require_control_plane(pods=True)
    argv = ["waves", "--waves", "3", "--waves-objects", "30", "--waves-reps", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    results = json.loads(next(tmp_path.glob("waves-*.json")).read_text())
    waves = results["waves"]
    assert (waves["waves"], waves["objects"], waves["deployments_per_wave"]) == (3, 30, 8)
    assert len(waves["agent_runs"]) == len(waves["peer_runs"]) == 2
    for run in waves["agent_runs"]:
        # At least one pass per wave, each ended ``syncing`` but the last; its last wave healthy after.
        states = [p["state"] for p in run["passes"]]
        assert len(states) >= 3 and states[-1] == "ok" and set(states[:-1]) == {"syncing"}, run
        assert run["seconds"] >= run["last_pass_end"] > 0
    for run in waves["peer_runs"]:
        assert len(run["apply_seconds"]) == len(run["wait_seconds"]) == 3
        assert run["seconds"] > 0 and all(s >= 0 for s in run["wait_seconds"])
    row = waves["row"]
    assert row["met"] == (row["overhead"] <= bench_waves.TARGET_OVERHEAD)
    assert not bench_waves.row([1.2, 1.3], [1.0, 1.0])["met"] and bench_waves.row([1.05], [1.0])["met"]
    md = next(tmp_path.glob("waves-*.md")).read_text()
    assert "## Sync waves (3 waves x 10 objects, 8 Deployments of 1 replica each" in md
    doc = with_section("# B\n\n## Other\n\nx\n\n## Reading these numbers\n", results)
    assert doc.index("## Other") < doc.index("## Sync waves") < doc.index("## Reading")
