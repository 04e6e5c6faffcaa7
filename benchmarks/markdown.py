"""The Markdown report of one benchmark run (``docs/benchmarks.md`` is the latest of these).

Called by ``benchmarks.__main__`` with the results dictionary it also writes as JSON; again from
a saved JSON file with ``python -m benchmarks.markdown RESULTS.json [OUT.md]``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def _req(r: dict[str, Any]) -> str:
    verbs = ", ".join(f"{v} {n}" for v, n in sorted(r["by_verb"].items(), key=lambda x: -x[1]))
    return f"{r['total']} ({verbs})" if verbs else "0"


def _met(row: dict[str, Any], key: str = "met") -> str:
    if key not in row:
        return ""
    return "met" if row[key] else "**missed**"


def _cpu(side: dict[str, Any], what: str) -> str:
    return f"{side['cpu'][what]:.2f} s" if "cpu" in side else "—"  # results written before CPU was measured


def spread(row: dict[str, Any], key: str, prefix: str = "") -> str:
    """A ratio over repetitions: median, min and max (en dash), count: ``x2.31 (1.90-2.80, 3 reps)``.

    Rows without repetitions (and results written before them) show the plain value.
    """
    value, span = row.get(key), row.get(f"{key}_range")
    if value is None:
        return "—"
    if not span:
        return f"{prefix}{value}"
    return f"{prefix}{value:.2f} ({span[0]:.2f}\N{EN DASH}{span[1]:.2f}, {row['apply_reps']} reps)"


def bound_line(n: int, row: dict[str, Any]) -> str:
    """One sentence on the initial apply's CPU bound (console and Markdown)."""
    a, p, b = row["agent"], row["peer"], row["cpu_bound_seconds"]
    medians = f" (medians of {row['apply_reps']} repetitions)" if "apply_reps" in row else ""
    return (
        f"{n} objects, initial apply on {row['cores']} cores{medians}: "
        f"the agent used {a['cpu']['server']:.2f} s "
        f"of apiserver+etcd CPU and {a['cpu']['client']:.2f} s of client CPU, so its wall time cannot go "
        f"below {b['agent']:.2f} s (measured {a['seconds']:.2f} s); kubectl took {p['seconds']:.2f} s "
        f"(bound {b['peer']:.2f} s: {p['cpu']['server']:.2f} s server, {p['cpu']['client']:.2f} s client). "
        f"At its bound the agent's throughput would be x{row['bound_throughput_ratio']} kubectl's "
        f"(measured {spread(row, 'throughput_ratio', 'x')}); with both tools at their bounds, "
        f"x{row['bounds_ratio']}."
        + (
            f" Flux's engine took {row['flux']['seconds']:.2f} s (bound {b['flux']:.2f} s: "
            f"{row['flux']['cpu']['server']:.2f} s server, {row['flux']['cpu']['client']:.2f} s client)."
            if "flux" in b
            else ""
        )
    )


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Run `python -m benchmarks {results['command']}` on "
        f"{results['started'][:19].replace('T', ' ')} UTC, "
        f"{results['seconds']} s in all. Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gb']} GB, "
        f"Python {m['python']}, kubectl {m['kubectl']}, "
        + (f"Flux engine {m['flux_engine']}, " if "flux_engine" in m else "")
        + f"{m['git']}.",
        "",
        "Ratios are agent ÷ peer measured in the same run (below 1: the agent is faster or cheaper). "
        "Requests are counted by the API server (`apiserver_request_total` from `/metrics`, "
        "controller manager paused, `leases` and health checks excluded); see `benchmarks/README.md`.",
        "",
    ]
    lines += _targets(results)
    if "kube" in results:
        kube = results["kube"]
        lines += [
            "## Apply, steady state, 1% change, prune (agent in-process `Fleet`, warm; kubectl pinned; "
            "Flux's engine)",
            "",
        ]
        with_flux = any("flux" in row for size in kube for row in size["rows"])
        if with_flux:
            since = kube[0].get("flux_target_from")
            lines += [
                "*Flux* is Flux's own apply engine, `fluxcd/pkg/ssa` driven as kustomize-controller "
                "drives it (`benchmarks/fluxssa`, one long-lived process per cluster): "
                "`ApplyAllStaged` (a GET and a server-side dry-run per object, an apply of what "
                "drifted) and garbage collection of the previous inventory with `DeleteAll`. "
                "Its time ratio is agent ÷ Flux"
                + (f"; the targets against it are judged from {since:,} objects on" if since else "")
                + ". The prune of 10% has no kubectl peer (`benchmarks/README.md` says why).",
                "",
            ]
        if "concurrency" in kube[0]:
            idle = ", ".join(f"{s['idle_server_cpu_5s']:.2f} s" for s in kube)
            flux_cpu = ", Flux's engine's process (`/proc/PID/stat`)" if with_flux else ""
            lines += [
                f"Agent concurrency per cluster: {kube[0]['concurrency']}. CPU columns: user + system "
                "seconds during the step; *server* is the measured cluster's kube-apiserver + etcd "
                "(`/proc/PID/stat`), *client* the agent's process (in-process), kubectl's processes "
                f"(`getrusage`){flux_cpu}. The servers' CPU over 5 idle seconds, per size: {idle}.",
                "",
            ]
        initial = [(size["objects"], row) for size in kube for row in size["rows"] if "reps" in row]
        if initial:
            fresh = (
                "a fresh trio of clusters started together, the tools' order reversed every time "
                "(kubectl, the agent, Flux; then Flux, the agent, kubectl; ...) so that each pair "
                "alternates"
                if with_flux
                else "a fresh pair of clusters started together, the two tools' order alternating "
                "(kubectl first, then the agent first, ...)"
            )
            lines += [
                f"The initial apply is measured {initial[0][1]['apply_reps']} times per size, each time on "
                f"{fresh}: its row gives the median of the per-repetition ratios "
                "with their range, and in the other columns each figure's median. Every repetition is "
                "listed below the table.",
                "",
            ]
        lines += [
            "| step | objects (kinds) | time ratio | agent time | agent server CPU | agent client CPU "
            "| agent requests | peer | peer time | peer server CPU | peer client CPU | peer requests "
            "| target | Flux time ratio | Flux time | Flux server CPU | Flux client CPU | Flux requests "
            "| Flux target |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for size in kube:
            for row in size["rows"]:
                a = row["agent"]
                lines.append(
                    f"| {row['metric']} | {size['objects']} ({size['kinds']}) | {spread(row, 'time_ratio')} "
                    f"| {a['seconds']:.3f} s | {_cpu(a, 'server')} | {_cpu(a, 'client')} "
                    f"| {_req(a['requests'])} | {_peer_cells(row)} | {_flux_cells(row)} |"
                )
        lines.append("")
        if initial:
            lines += _repetitions(initial)
        bounds = [
            bound_line(size["objects"], row)
            for size in kube
            for row in size["rows"]
            if "cpu_bound_seconds" in row
        ]
        if bounds:
            lines += [
                "### CPU bound of the initial apply",
                "",
                "Server and client share this machine's cores, so no tool's wall time can go below "
                "(server CPU + client CPU) ÷ cores.",
                "",
                *(f"- {b}" for b in bounds),
                "",
            ]
    if "memory" in results:
        mem = results["memory"]
        lines += [
            "## Memory (`python -m agent.cli run --once`, 3 clusters, peak RSS of the process)",
            "",
            f"Baseline (the same interpreter importing the agent): {mem['baseline_import_mb']} MB. "
            f"Target: ≤ {mem['target_mb']:g} MB at 10,000 objects per cluster.",
            "",
            "| objects per cluster | peak RSS | x baseline | x target | apply pass (RSS, time) "
            "| steady pass (RSS, time) | target |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in mem["rows"]:
            ap, st = row["apply"], row["steady"]
            lines.append(
                f"| {row['objects_per_cluster']} | {row['peak_mb']} MB | {row['ratio_to_baseline']} "
                f"| {row['ratio_to_target']} | {ap['peak_mb']} MB, {ap['seconds']} s "
                f"| {st['peak_mb']} MB, {st['seconds']} s | {_met(row)} |"
            )
        lines.append("")
    if "git" in results:
        g = results["git"]
        lines += [
            f"## Git ({g['commits']} commits, {g['files']} files; `GitSource.poll` vs git)",
            "",
            f"Served by {g.get('transport', 'a local path')}.",
            "",
            "| step | time ratio | agent (median) | peer | peer (median) | target |",
            "|---|---|---|---|---|---|",
        ]
        for row in g["rows"]:
            target = f"{row['target']}: {_met(row)}" if "target" in row else ""
            lines.append(
                f"| {row['metric']} | {row['time_ratio']} | {row['agent_seconds']:.4f} s "
                f"| {row['peer_name']} | {row['peer_seconds']:.4f} s | {target} |"
            )
        if "worker_starts" in g:
            starts = ", ".join(f"{t} {n}" for t, n in g["worker_starts"].items())
            lines += ["", f"Git worker processes started per source over all its polls: {starts}."]
        lines.append("")
    if "isolation" in results:
        iso = results["isolation"]
        lines += [
            f"## Isolation (3 clusters x {iso['objects_per_cluster']} objects, one frozen with SIGSTOP;"
            " apps of one cluster, one failing)",
            "",
            "| figure | ratio | frozen or failing | baseline | target |",
            "|---|---|---|---|---|",
        ]
        for row in iso["rows"]:
            lines.append(
                f"| {row['metric']} | {row['time_ratio']} | {row['agent_seconds']:.3f} s "
                f"| {row['peer_seconds']:.3f} s ({row['peer_name']}) | {row['target']}: {_met(row)} |"
            )
        lines.append("")
    if "apps" in results:
        lines += _apps(results["apps"])
    if "tenants" in results:
        lines += tenants_section(results["tenants"])
    if "health" in results:
        lines += _health(results["health"])
    if "page" in results:
        lines += _page(results["page"])
    if "notify" in results:
        lines += _notify(results["notify"])
    if "capacity" in results:
        lines += capacity_section(results["capacity"])
    if "corpus" in results:
        lines += corpus_section(results)
    if "charts" in results:
        lines += charts_section(results)
    if "waves" in results:
        lines += waves_section(results)
    lines += [
        "## Reading these numbers",
        "",
        "- Memory sizes are objects *per cluster*: the 10k row holds 30k objects (3 clusters).",
        "- The agent's initial apply and 1%-change pass include rendering the commit (YAML parsed by "
        "libyaml, see the profiling notes).",
        "- The diff report is cold (fresh reconcilers: discovery, OpenAPI, every object planned), "
        "as `gitops-agent diff` runs; the reconcile rows are warm, as the daemon runs.",
        '- What was profiled, fixed (before/after) and proposed: `benchmarks/README.md`, "Profiling notes".',
        "",
    ]
    return "\n".join(lines)


def _peer_cells(row: dict[str, Any]) -> str:
    """The kubectl peer's cells of a step's row (name to target), dashes where it has none."""
    p = row.get("peer")
    if p is None:
        return " | ".join(["—"] * 6)
    target = f"{row['target']}: {_met(row)}" if "target" in row else ""
    if "throughput_ratio_range" in row:
        target += f" — throughput {spread(row, 'throughput_ratio', 'x')}"
    return (
        f"{row['peer_name']} | {p['seconds']:.3f} s | {_cpu(p, 'server')} | {_cpu(p, 'client')} "
        f"| {_req(p['requests'])} | {target}"
    )


def _flux_cells(row: dict[str, Any]) -> str:
    """Flux's engine's cells of a step's row (time ratio to target), empty where it has none."""
    f = row.get("flux")
    if f is None:
        return " | ".join([""] * 6)
    target = f"{row['flux_target']}: {_met(row, 'flux_met')}" if "flux_target" in row else ""
    if "flux_throughput_ratio_range" in row:
        throughput = f"throughput {spread(row, 'flux_throughput_ratio', 'x')}"
        target = f"{target} — {throughput}" if target else throughput
    return (
        f"{spread(row, 'flux_time_ratio')} | {f['seconds']:.3f} s | {_cpu(f, 'server')} "
        f"| {_cpu(f, 'client')} | {_req(f['requests'])} | {target}"
    )


def _repetitions(initial: list[tuple[int, dict[str, Any]]]) -> list[str]:
    """Each repetition of the initial apply: its order, every tool's wall time and CPU (server + client)."""
    lines = [
        "### Initial apply, every repetition",
        "",
        "| objects | repetition | order | throughput ratio | agent time | agent CPU server + client "
        "| kubectl time | kubectl CPU server + client | throughput ratio to Flux | Flux time "
        "| Flux CPU server + client |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, row in initial:
        for rep in row["reps"]:
            a, p, f = rep["agent"], rep["peer"], rep.get("flux")
            flux = (
                f"x{rep['flux_throughput_ratio']} | {f['seconds']:.3f} s "
                f"| {f['cpu']['server']:.2f} + {f['cpu']['client']:.2f} s"
                if f
                else " | "
            )
            lines.append(
                f"| {n} | {rep['rep']} | {', '.join(rep['order'])} | x{rep['throughput_ratio']} "
                f"| {a['seconds']:.3f} s | {a['cpu']['server']:.2f} + {a['cpu']['client']:.2f} s "
                f"| {p['seconds']:.3f} s | {p['cpu']['server']:.2f} + {p['cpu']['client']:.2f} s | {flux} |"
            )
    return [*lines, ""]


def _apps(apps: dict[str, Any]) -> list[str]:
    """Benchmark 7: many apps on one cluster, a steady pass's requests by resource."""
    (row,) = apps["rows"]
    a, first = row["agent"], apps["first_pass"]
    by_resource = ", ".join(f"{k} {v}" for k, v in row["by_resource"].items())
    return [
        f"## Apps ({apps['apps']} apps x {apps['objects_per_app']} objects on one cluster, steady state)",
        "",
        "One `Fleet` in a process of its own, one `[[apps]]` app per slice of the workload, each with "
        "its own inventory. Every app is reconciled in each cluster pass, from one shared read.",
        "",
        "| step | objects (kinds) | time | server CPU | client CPU | requests | target |",
        "|---|---|---|---|---|---|---|",
        f"| first pass (creates) | {apps['objects']} ({apps['kinds']}) | {first['seconds']:.3f} s "
        f"| {_cpu(first, 'server')} | {_cpu(first, 'client')} | {_req(first['requests'])} | |",
        f"| {row['metric']} | {apps['objects']} ({apps['kinds']}) | {a['seconds']:.3f} s "
        f"| {_cpu(a, 'server')} | {_cpu(a, 'client')} | {_req(a['requests'])} "
        f"| {row['target']}: {_met(row)} |",
        "",
        f"Requests per steady pass, each run: {row['requests_per_pass']}; by resource (median run): "
        f"{by_resource}."
        + (
            f" The agent's RSS after a steady pass: {row['rss_mb']} MB (its peak: {row['peak_rss_mb']} MB)."
            if "rss_mb" in row
            else ""
        ),
        "",
    ]


def tenants_section(tenants: dict[str, Any]) -> list[str]:
    """Benchmark 7, multi-tenant row: apps acting as namespace-bound ServiceAccounts."""
    (row,) = tenants["rows"]
    a = row["agent"]
    by_resource = ", ".join(f"{k} {v}" for k, v in row["by_resource"].items())
    return [
        f"## Tenants ({tenants['apps']} apps of {tenants['tenants']} ServiceAccounts, steady state)",
        "",
        "The shipped `manifests/multi-tenant` RBAC, the agent on its own ServiceAccount's token; each "
        "app acts as its tenant's namespace-bound account (impersonated), and the apps of one account "
        "share its reads ([tenancy](tenancy.md)).",
        "",
        "| step | objects (kinds) | time | server CPU | client CPU | requests | target |",
        "|---|---|---|---|---|---|---|",
        f"| {row['metric']} | {tenants['objects']} ({tenants['kinds']}) | {a['seconds']:.3f} s "
        f"| {_cpu(a, 'server')} | {_cpu(a, 'client')} | {_req(a['requests'])} "
        f"| {row['target']}: {_met(row)} |",
        "",
        f"Requests per steady pass, each run: {row['requests_per_pass']}; by resource (median run): "
        f"{by_resource}."
        + (
            f" The agent's RSS after a steady pass: {row['rss_mb']} MB (its peak: {row['peak_rss_mb']} MB)."
            if "rss_mb" in row
            else ""
        ),
        "",
    ]


def _health(health: dict[str, Any]) -> list[str]:
    """Benchmark 8: what a wait on rollouts costs, per app and step."""
    waiting, current, after = health["rows"]
    apps = health["apps"]
    w, p = waiting["agent"], waiting["peer"]
    steps = health["steps"]
    return [
        f"## Health ({apps} apps x {health['deployments_per_app']} Deployments waiting on one cluster)",
        "",
        "Each app (`wait = true`) holds a Namespace, a ConfigMap, a Service and its Deployments, "
        "which stay InProgress (no Deployment controller runs) until the benchmark writes their "
        "status as the controller would. One step of every app's wait, counted at the server:",
        "",
        "| step | time (all apps) | server CPU | client CPU | requests | per app |",
        "|---|---|---|---|---|---|",
        f"| {waiting['metric']} | {w['seconds']:.3f} s | {_cpu(w, 'server')} | {_cpu(w, 'client')} "
        f"| {_req(w['requests'])} | {waiting['requests_per_app']} |",
        f"| peer: {waiting['peer_name']} | {p['seconds']:.3f} s | {_cpu(p, 'server')} | {_cpu(p, 'client')} "
        f"| {_req(p['requests'])} | {p['requests']['total'] / apps:.2f} |",
        f"| {current['metric']} | {current['agent']['seconds']:.3f} s | {_cpu(current['agent'], 'server')} "
        f"| {_cpu(current['agent'], 'client')} | {_req(current['agent']['requests'])} "
        f"| {current['requests_per_app']} |",
        f"| {after['metric']} | {after['agent']['seconds']:.3f} s | | "
        f"| {_req(after['agent']['requests'])} | 0 |",
        "",
        f"Steps of a wait in which nothing changes: {steps['1 min']} in the first minute, "
        f"{steps['5 min']} in 5 minutes, {steps['30 min']} in 30 (1 s after the pass, doubling to 10 s); "
        f"a 5-minute wait on a waiting app costs about {health['requests_per_app_in_5_min_waiting']} "
        "requests. By resource (waiting step): "
        + ", ".join(f"{k} {v}" for k, v in waiting["by_resource"].items())
        + ".",
        "",
    ]


def _page(page: dict[str, Any]) -> list[str]:
    """Benchmark 9: the status page's server time for a large fleet."""
    lines = [
        f"## Status page ({page['clusters']} clusters x {page['apps_per_cluster']} apps, "
        f"{page['objects_per_app']} objects and {page['passes']} passes each)",
        "",
        f"Server time of one answer (`StatusPage.handle`: views, Jinja2, encoding; no network), "
        f"median and p95 of {page['reps']}; target for the grid: {page['target_ms']:g} ms "
        f"({'met' if page['grid_met'] else 'NOT met'}).",
        "",
        "| page | median | p95 | HTML |",
        "|---|---|---|---|",
    ]
    for row in page["rows"]:
        lines.append(
            f"| `{row['path']}` | {row['median_ms']} ms | {row['p95_ms']} ms "
            f"| {row['bytes'] / 1024:.0f} KiB |"
        )
    return [*lines, ""]


def _notify(notify: dict[str, Any]) -> list[str]:
    """Benchmark 10: push-to-pass latency, and what a hanging sink costs a pass."""
    lines = [
        f"## Notifications and the webhook receiver ({notify['objects']} objects on one cluster)",
        "",
        "| figure | ratio | agent | peer | target |",
        "|---|---|---|---|---|",
    ]
    for row in notify["rows"]:
        lines.append(
            f"| {row['metric']} | {row['time_ratio']} | {row['agent_seconds']:.3f} s "
            f"| {row['peer_seconds']:.3f} s ({row['peer_name']}) "
            f"| {row['target'] + ': ' + _met(row) if 'target' in row else ''} |"
        )
    return [*lines, ""]


def capacity_section(cap: dict[str, Any]) -> list[str]:
    """Benchmark 11: per-cluster cost of a steady pass at several fleet sizes, and the model."""
    m = cap["model"]
    lines = [
        f"## Capacity ({cap['objects_per_cluster']} objects in {cap['apps_per_cluster']} apps per cluster, "
        "steady state)",
        "",
        "The agent in a child process of its own serving every cluster of the fleet (real local "
        "clusters), one `Fleet` pass of all of them at once; CPU, RSS and connections read from "
        "`/proc` of that process, requests counted by the API servers. Medians of the counted passes "
        "(RSS: the largest).",
        "",
        "| clusters | pass time | agent CPU per pass | per cluster | RSS after pass | peak RSS "
        "| connections to API servers | requests per pass | per cluster |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cap["rows"]:
        lines.append(
            f"| {r['clusters']} | {r['pass_seconds']:.3f} s | {r['agent_cpu']:.3f} s "
            f"| {r['agent_cpu_per_cluster']:.4f} s | {r['rss_mb']} MB | {r['peak_rss_mb']} MB "
            f"| {r['connections']} ({r['connections_per_cluster']} per cluster) | {r['requests_per_pass']} "
            f"| {r['requests_per_cluster']} |"
        )
    lines += [
        "",
        f"Model: peak RSS {m['base_mb']} MB + {m['per_cluster_mb']} MB per cluster; "
        f"{m['cpu_per_cluster_pass']:.4f} CPU seconds per cluster pass. Clusters one replica with "
        "1 CPU and 1 GiB serves:",
        "",
        "| reconcile_interval | clusters | CPU allows | memory allows | bound by |",
        "|---|---|---|---|---|",
    ]
    for lim in m["limits"]:
        lines.append(
            f"| {lim['interval_s']:g} s | {lim['clusters']} | {lim['by_cpu']} | {lim['by_memory']} "
            f"| {lim['bound']} |"
        )
    lines += ["", "Assumptions:", "", *(f"- {a}" for a in m["assumptions"]), ""]
    return lines


CORPUS_HEADING = "## Real-world corpus"


def corpus_section(results: dict[str, Any]) -> list[str]:
    """Benchmark 12: render time per corpus app against its own tool, and the steady pass."""
    c, m = results["corpus"], results["machine"]
    first = c["first_pass"]
    lines = [
        f"{CORPUS_HEADING} (`../shared/corpus`, {c['apps']} apps on one cluster)",
        "",
        f"Run `python -m benchmarks corpus --corpus-reps {c['reps']}` on "
        f"{results['started'][:19].replace('T', ' ')} UTC ({m['nproc']} CPUs, Python {m['python']}, "
        f"kubectl {m['kubectl']}): the stacks of tests/test_corpus.py with its settings "
        "(`benchmarks/corpus.py`). Render: the agent's `render` of each app (its YAML dump excluded; "
        "charts for the pinned release, as `gitops-agent render`) and the reference on the same "
        f"checkout, each warmed up once, then {c['reps']} runs alternating which goes first; "
        "ratio of the medians (of the minimums beside). kubectl runs against the benchmark's cluster "
        "(it maps kinds through discovery) with `--validate=false`: its default validation fetches "
        "OpenAPI schemas from the server, which the agent's render does not "
        "(`benchmarks/bench_corpus.py`).",
        "",
        "| app | source | objects | agent (median, min) | reference | reference (median, min) "
        "| ratio (of minimums) | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in c["render"]:
        a, ref = r["agent_seconds"], r["reference_seconds"]
        lines.append(
            f"| {r['app']} (`{r['path']}`) | {r['source']} | {r['objects']} "
            f"| {a['median']:.3f} s, {a['min']:.3f} s | `{r['reference']}` "
            f"| {ref['median']:.3f} s, {ref['min']:.3f} s | x{r['time_ratio']} (x{r['min_ratio']}) "
            f"| {r['target']}: {_met(r)} |"
        )
    lines += [
        "",
        "A chart's or a kustomization's render is its tool's run plus reading the tool's whole "
        "output as objects, which the tool itself only prints: krender reads it as Kubernetes does "
        "(go-yaml v2) and hands it over as JSON (`agent/render/tooljson.py`; for helm through a "
        "pipe, krender started with helm); what is left over the tool's run is mostly that reading "
        "of large output once the tool has printed it (CRDs: cert-manager's 1 MB takes krender "
        "~15 ms on two idle cores). The agent runs its Go tools with `GOGC=400` and `GOMEMLIMIT` at "
        "4/5 of the render's memory bound (a tool run is a short batch; `agent/render/process.py`), "
        "which takes 3.5% off `helm template`'s own time for cert-manager's chart and ~15% off "
        "kustomize's build for otel; the references run as a user runs them "
        "(`benchmarks/README.md`, profiling notes).",
        "",
        f"Steady state: after one applying pass ({first['seconds']:.3f} s, {_req(first['requests'])}), "
        f"two passes counted at the server; kinds = {c['kinds']} distinct kinds the apps declare. "
        "Two objects are refused by cert-manager's webhook, which has no Pod to answer on this "
        "cluster (otel's Certificate and Issuer, named in tests/test_corpus.py); the agent tries "
        "them again every pass and records an Event about each failure: the requests these cost "
        "(their applies; GET, POST and PATCH of events) are counted apart. The second pass "
        "confirms with a server-side dry-run the changes its plan saw in objects the server "
        "defaulted (`APPLY(dry-run)`) and remembers them as no-ops; from the third on, a pass "
        "sends none.",
        "",
        "| pass | time | objects written | write requests | requests | of them for the refused objects "
        "| target | target without the refused objects' requests |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in c["steady"]:
        a = r["agent"]
        writes = ", ".join(f"{k} {n}" for k, n in r["write_requests"].items()) or "0"
        lines.append(
            f"| {r['metric']} | {a['seconds']:.3f} s | {r['objects_written']} "
            f"| {writes} | {_req(a['requests'])} | {r['refused_requests']} | {r['target']}: {_met(r)} "
            f"| {_met(r, 'met_but_refused')} |"
        )
    by_resource = ", ".join(f"{k} {n}" for k, n in c["steady"][-1]["by_resource"].items())
    return [*lines, "", f"Requests of the {c['steady'][-1]['metric']} by resource: {by_resource}.", ""]


CHARTS_HEADING = "## Charts from a repository"


def charts_section(results: dict[str, Any]) -> list[str]:
    """Benchmark 13: a poll of an unchanged chart repository, and a repository chart's render."""
    c, m = results["charts"], results["machine"]
    lines = [
        f"{CHARTS_HEADING} ({', '.join(c['charts'])}, from `../shared/corpus`)",
        "",
        f"Run `python -m benchmarks charts --charts-reps {c['reps']}` on "
        f"{results['started'][:19].replace('T', ' ')} UTC ({m['nproc']} CPUs, Python {m['python']}): the "
        "corpus charts packaged with the pinned `helm package` into a chart repository on loopback "
        "(as the demo serves one). Poll: the agent's fetch stage fetches them once, then polls the "
        "unchanged repository; requests counted by the repository's server (an OCI registry: "
        "CNCF distribution, from its access log). Render: the fetched "
        "chart as the agent renders a repository chart (its YAML dump excluded) against `helm template` "
        f"of the same unpacked chart with the same flags, each warmed up once, then {c['reps']} runs "
        "alternating which goes first; ratio of the medians (of the minimums beside) "
        "(`benchmarks/bench_charts.py`).",
        "",
        "| poll | requests per poll | archives downloaded again | target |",
        "|---|---|---|---|",
    ]
    for r in c["poll"]:
        lines.append(
            f"| {r['metric']} | {r['requests_per_poll']} | {r['downloads']} | {r['target']}: {_met(r)} |"
        )
    lines += [
        "",
        "| chart | objects | agent (median, min) | helm template (median, min) "
        "| ratio (of minimums) | target |",
        "|---|---|---|---|---|---|",
    ]
    for r in c["render"]:
        a, ref = r["agent_seconds"], r["helm_seconds"]
        lines.append(
            f"| {r['chart']} | {r['objects']} | {a['median']:.3f} s, {a['min']:.3f} s "
            f"| {ref['median']:.3f} s, {ref['min']:.3f} s | x{r['time_ratio']} (x{r['min_ratio']}) "
            f"| {r['target']}: {_met(r)} |"
        )
    return [*lines, ""]


WAVES_HEADING = "## Sync waves"


def waves_section(results: dict[str, Any]) -> list[str]:
    """Benchmark 14: an app's waves through the agent against the sum of the waves' own health times."""
    w, m = results["waves"], results["machine"]
    r = w["row"]
    a, p = r["agent_seconds"], r["peer_seconds"]
    per_wave = w["objects"] // w["waves"]
    passes = sorted(len(x["passes"]) for x in w["agent_runs"])
    last = sorted(x["last_pass_end"] for x in w["agent_runs"])
    first = statistics.median(x["passes"][0]["recheck"] or 0 for x in w["agent_runs"])
    applies = [s for x in w["peer_runs"] for s in x["apply_seconds"]]
    rollouts = [s for x in w["peer_runs"] for s in x["wait_seconds"]]
    lines = [
        f"{WAVES_HEADING} ({w['waves']} waves x {per_wave} objects, {w['deployments_per_wave']} "
        "Deployments of 1 replica each, on one cluster with simulated Pods)",
        "",
        f"Run `python -m benchmarks waves --waves {w['waves']} --waves-objects {w['objects']} "
        f"--waves-reps {w['reps']}` on {results['started'][:19].replace('T', ' ')} UTC "
        f"({m['nproc']} CPUs, Python {m['python']}); kube-scheduler and kwok run Pods, a Deployment "
        "is Available a fraction of a second after it is created. Agent: the app (sync waves "
        f"0..{w['waves'] - 1}) driven as `run --once` drives it ({w['driver']}: each `syncing` pass "
        "run again when it said to look again, as the daemon's scheduler does), from the first "
        "pass's start to its last wave's Deployments all Current. Peer: each wave alone, applied by "
        "the agent as an app of its own, to its Deployments all Current; the sum over the waves. "
        f"Health read on both sides the same way: one labelled LIST every {w['poll_seconds'] * 1000:.0f} ms, "
        "the agent's "
        f"health rules. {w['reps']} repetitions alternating which side goes first, fresh namespaces each; "
        "medians (`benchmarks/bench_waves.py`).",
        "",
        "| figure | median | min | all |",
        "|---|---|---|---|",
        f"| agent: first pass to last wave healthy | {a['median']:.2f} s | {a['min']:.2f} s | {a['all']} |",
        f"| the waves alone, summed | {p['median']:.2f} s | {p['min']:.2f} s | {p['all']} |",
        "",
        f"Overhead {r['overhead']:+.0%} ({r['target']}: {_met(r)}). The agent ran "
        f"{passes[len(passes) // 2]} passes (median), the first looking again {first} s after the "
        f"first wave's apply; its last pass ended at {last[len(last) // 2]:.2f} s (median). "
        "Each wave alone: applied in "
        f"{statistics.median(applies):.2f} s, healthy {statistics.median(rollouts):.2f} s later (medians).",
        "",
    ]
    return lines


def with_section(document: str, results: dict[str, Any]) -> str:
    """``document`` (docs/benchmarks.md) with the section of ``results`` (corpus, charts or
    waves) replaced, or added before "Reading these numbers"; everything else kept as it is."""
    heading, make = (
        (WAVES_HEADING, waves_section)
        if "waves" in results
        else (CHARTS_HEADING, charts_section)
        if "charts" in results
        else (CORPUS_HEADING, corpus_section)
    )
    section = "\n".join(make(results))
    start = document.find(f"\n{heading}")
    if start < 0:
        start = end = document.find("\n## Reading these numbers")
        if start < 0:
            start = end = len(document)
    else:
        end = document.find("\n## ", start + 1)
        end = len(document) if end < 0 else end
    return f"{document[:start]}\n{section}{document[end:]}"


def _targets(results: dict[str, Any]) -> list[str]:
    """One line per target with a verdict, largest size first (the figures are in the tables)."""
    out = ["## Where the targets stand", ""]
    for size in reversed(results.get("kube", [])):
        for row in size["rows"]:
            if "met" in row:
                out.append(
                    f"- {row['metric']}, {size['objects']} objects: {_met(row)} — {row['target']}; "
                    f"time x{row['time_ratio']}, agent {row['agent']['requests']['total']} requests"
                    + (
                        f", throughput {spread(row, 'throughput_ratio', 'x')}"
                        if "throughput_ratio" in row
                        else ""
                    )
                )
            if "flux_met" in row:
                out.append(
                    f"- {row['metric']} against Flux's engine, {size['objects']} objects: "
                    f"{_met(row, 'flux_met')} — {row['flux_target']}; time x{row['flux_time_ratio']}, "
                    f"agent {row['agent']['requests']['total']} requests, Flux's engine "
                    f"{row['flux']['requests']['total']}"
                    + (
                        f", throughput {spread(row, 'flux_throughput_ratio', 'x')}"
                        if "flux_throughput_ratio" in row
                        else ""
                    )
                )
    memory = results.get("memory", {})
    for row in memory.get("rows", []):
        out.append(
            f"- peak RSS, {row['objects_per_cluster']} objects x 3 clusters: {_met(row)} — "
            f"{row['peak_mb']} MB (≤ {memory['target_mb']:g} MB)"
        )
    for row in (r for r in results.get("git", {}).get("rows", []) if "met" in r):
        out.append(f"- {row['metric']}: {_met(row)} — x{row['time_ratio']} ({row['target']})")
    rows = [*results.get("isolation", {}).get("rows", []), *results.get("notify", {}).get("rows", [])]
    for row in (r for r in rows if "met" in r):
        out.append(f"- {row['metric']}: {_met(row)} — x{row['time_ratio']} ({row['target']})")
    for row in [*results.get("apps", {}).get("rows", []), *results.get("tenants", {}).get("rows", [])]:
        out.append(
            f"- {row['metric']}: {_met(row)} — {row['target']}; "
            f"{max(row['requests_per_pass'])} requests at most"
        )
    return [*out, ""] if len(out) > 2 else []


if __name__ == "__main__":
    text = render(json.loads(Path(sys.argv[1]).read_text()))
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(text)
    else:
        sys.stdout.write(text)
