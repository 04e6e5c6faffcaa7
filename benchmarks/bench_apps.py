"""Benchmark 7: many apps on one cluster, steady state: requests per cluster pass, counted by the server.

Called by ``benchmarks.__main__`` (``python -m benchmarks apps``).

The benchmark workload of ``apps`` x ``per_app`` objects (``workload.py``: 16 kinds, a CRD and its
custom resources included) is cut into ``apps`` consecutive slices, one `[[apps]]` app each
(``workload/app-000`` ...), all on one local cluster served by one ``Fleet``, as deployed, in a
process of its own (``harness.AgentProcess``: its CPU and RSS are the agent's alone). Apps share
the cluster pass's one read: one LIST per kind for every app's objects and one labelled LIST for
every app's ApplySet parent, so a steady pass costs the same requests whether
the objects are one app or a hundred (docs/architecture.md, "Apps"). The target is the one of the
other steady-state rows, per cluster pass: requests ≤ kinds + 5. There is no peer: kubectl has no
apps; the figure is the request count itself, with the pass's wall time, CPU and the agent's RSS
beside it.

``run_tenants`` is its multi-tenant row (docs/tenancy.md): apps acting as namespace-bound
ServiceAccounts, installed with the shipped ``manifests/multi-tenant`` RBAC, the agent running on
its own ServiceAccount's token. Reads are shared by the apps of one account: target
kinds x identities + 5.
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
        # In a process of its own, so that its RSS is the agent's alone (benchmarks/README.md).
        agent = h.AgentProcess(cfg)
        try:
            first = agent.measured_pass([cluster])
            passes = _settle_process(agent, n)
            runs = [agent.measured_pass([cluster]) for _ in range(reps)]
        finally:
            agent.close()
    for m in runs:
        if m.value["outcomes"] != {"unchanged": n} or m.value["results"] != apps or m.value["failed"]:
            raise RuntimeError(f"steady state of {apps} apps: {m.value}")
    out["first_pass"] = {**first.to_json(), "outcomes": first.value["outcomes"]}
    out["settle_passes"] = passes
    row = _steady_row(runs, f"steady state, {apps} apps on one cluster", limit, f"kinds + {HANDFUL}")
    row["rss_mb"] = round(max(m.value["rss_mb"] for m in runs), 1)
    row["peak_rss_mb"] = round(max(m.value["peak_rss_mb"] for m in runs), 1)
    out["rows"] = [row]
    return out


def _settle_process(agent: h.AgentProcess, n: int) -> list[dict[str, Any]]:
    """``_settle`` for an agent in its own process."""
    passes: list[dict[str, Any]] = []
    for i in range(SETTLE_PASSES):
        reply = agent.one_pass()
        passes.append({"pass": i + 1, "outcomes": reply["outcomes"], "failed_apps": len(reply["failed"])})
        if not reply["failed"] and reply["outcomes"] == {"unchanged": n}:
            return passes
    raise RuntimeError(f"{n} objects in apps never settled: {passes}; last failures: {reply['failed'][:3]}")


def _steady_row(runs: list[h.Measured], metric: str, limit: int, bound: str) -> dict[str, Any]:
    """The row of counted steady passes: the median run, every run's time and requests, the target."""
    steady = sorted(runs, key=lambda m: m.seconds)[len(runs) // 2]
    return {
        "metric": metric,
        "agent": steady.to_json(),
        "agent_runs": [round(m.seconds, 3) for m in runs],
        "requests_per_pass": [m.requests.total for m in runs],
        "by_resource": dict(sorted(steady.requests.by_resource.items())),
        # Every pass's own count: the API server's periodic loopback reads (its service IP repair
        # loop LISTs services every 3 min) land in a pass now and then, and only ever add to it.
        "by_resource_per_pass": [dict(sorted(m.requests.by_resource.items())) for m in runs],
        "target": f"requests per cluster pass <= {limit} ({bound})",
        "met": max(m.requests.total for m in runs) <= limit,
    }


def format_line(result: dict[str, Any]) -> str:
    """The console line of the apps row."""
    (row,) = result["rows"]
    a = row["agent"]
    status = "target met" if row["met"] else "TARGET MISSED"
    return (
        f"apps {result['apps']}x{result['objects_per_app']} ({result['kinds']} kinds)  steady pass "
        f"{a['seconds']:.3f}s, requests per pass {row['requests_per_pass']} "
        f"({' '.join(f'{v}={k}' for v, k in a['requests']['by_verb'].items())}) "
        f"cpu {a['cpu']['server']:.2f}+{a['cpu']['client']:.2f}s  agent RSS {row['rss_mb']} MB "
        f"(peak {row['peak_rss_mb']} MB)  {status}"
    )


# -- tenants: apps acting as namespace-bound ServiceAccounts (docs/tenancy.md) -----------------

#: The namespaced kinds a tenant's apps declare (no CRD, nothing cluster-scoped: out of scope).
TENANT_KINDS = (w.configmap, w.secret, w.service_account, w.service, w.deployment, w.cron_job, w.pdb)
VARIANT = Path(__file__).resolve().parent.parent / "manifests" / "multi-tenant"


def tenant_names(tenants: int) -> list[str]:
    return [f"tenant-{t:02d}" for t in range(tenants)]


def write_tenants(tenants: int, apps_per_tenant: int, per_app: int, directory: Path) -> list[tuple[str, str]]:
    """Each tenant's apps, each ``per_app`` objects cycling through ``TENANT_KINDS`` in the tenant's
    namespace: ``(tenant, app)`` per app, in order."""
    out = []
    for tenant in tenant_names(tenants):
        for a in range(apps_per_tenant):
            app = f"{tenant}-app-{a:02d}"
            items = [
                w.Item(
                    i, "10-objects.yaml", TENANT_KINDS[i % len(TENANT_KINDS)](f"{app}-{i:03d}", tenant, "1")
                )
                for i in range(per_app)
            ]
            w.write(items, directory / app)
            out.append((tenant, app))
    return out


def _install_tenants(cluster: Any, tenants: list[str], scratch: Path) -> Path:
    """The shipped multi-tenant RBAC (its tenant file once per tenant), as the cluster's admin;
    the agent's ServiceAccount token, bound by nothing else."""
    import subprocess

    from agent.dev import localcluster
    from agent.render.binaries import tool

    built = subprocess.run(
        [str(tool("kustomize")), "build", str(VARIANT)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    tenant_file = (VARIANT / "tenant-team-a.yaml").read_text()
    text = "\n---\n".join([built, *(tenant_file.replace("team-a", t) for t in tenants)])
    f = scratch / "multi-tenant.yaml"
    f.write_text(text)
    localcluster.kubectl(
        cluster.kubeconfig, "apply", "--server-side", "--field-manager=installer", "-f", str(f)
    )
    return localcluster.token(cluster.name, cluster.state_dir, "gitops-agent/gitops-agent", cluster_role=None)


def run_tenants(
    root: Path, tenants: int = 4, apps_per_tenant: int = 5, per_app: int = 20, reps: int = 3
) -> dict[str, Any]:
    """``tenants`` namespace-bound ServiceAccounts, each acted as by ``apps_per_tenant`` apps: settle,
    then ``reps`` counted steady passes. Apps sharing an account share its reads, so a steady pass
    costs one LIST per kind and identity (in the account's namespace) plus the inventories' one
    LIST: the target is kinds x identities + a handful."""
    if tenants < 1 or apps_per_tenant < 1 or per_app < 1:
        raise ValueError("tenants, apps per tenant and objects per app must be at least 1")
    h.quiet_logs()
    files = root / f"files-tenants-{tenants}x{apps_per_tenant}x{per_app}"
    apps = write_tenants(tenants, apps_per_tenant, per_app, files)
    repo = root / f"repo-tenants-{tenants}.git"
    h.commit_workload(repo, files, f"{tenants} tenants")
    kinds = min(per_app, len(TENANT_KINDS))
    n = len(apps) * per_app
    limit = kinds * tenants + HANDFUL
    out: dict[str, Any] = {
        "tenants": tenants,
        "apps": len(apps),
        "objects_per_app": per_app,
        "objects": n,
        "kinds": kinds,
    }
    with h.ClusterSet(root / "state") as cs:
        (cluster,) = cs.start(f"btenants-{tenants}")
        scratch = root / "tenants-setup"
        scratch.mkdir(exist_ok=True)
        kubeconfig = _install_tenants(cluster, tenant_names(tenants), scratch)
        lines = [
            "[agent]",
            'name = "bench"',
            f'cache_dir = "{root / "cache-tenants"}"',
            'listen = ""',
            'log_level = "warning"',
            "",
            "[source]",
            f'url = "{repo}"',
            "",
            "[defaults]",
            'pass_deadline = "600s"',
            "allow_cluster_scoped = false",
            "",
            "[[clusters]]",
            f'name = "{cluster.name}"',
            f'kubeconfig = "{kubeconfig}"',
        ]
        for tenant, app in apps:
            lines += [
                "",
                "[[apps]]",
                f'name = "{app}"',
                f'cluster = "{cluster.name}"',
                f'path = "workload/{app}"',
                f'service_account = "{tenant}/gitops-tenant"',
                f'allowed_namespaces = ["{tenant}"]',
            ]
        cfg = root / "tenants.toml"
        cfg.write_text("\n".join(lines) + "\n")
        agent = h.InProcessAgent(cfg)
        try:
            rev = agent.source.poll()
            first = h.measure([cluster], lambda: agent.fleet.reconcile_all(rev))
            passes = _settle(agent, n)
            runs = [h.measure([cluster], lambda: agent.fleet.reconcile_all(rev)) for _ in range(reps)]
        finally:
            agent.close()
    for m in runs:
        if h.outcome_counts(m.value) != {"unchanged": n} or len(m.value) != len(apps):
            raise RuntimeError(f"steady state of {len(apps)} tenant apps: {h.outcome_counts(m.value)}")
    out["first_pass"] = {**first.to_json(), "outcomes": h.outcome_counts(first.value)}
    out["settle_passes"] = passes
    metric = f"steady state, {len(apps)} apps of {tenants} ServiceAccounts (impersonated)"
    out["rows"] = [_steady_row(runs, metric, limit, f"kinds x identities + {HANDFUL}")]
    return out


def format_tenants_line(result: dict[str, Any]) -> str:
    (row,) = result["rows"]
    status = "target met" if row["met"] else "TARGET MISSED"
    return (
        f"tenants {result['tenants']} ({result['apps']} apps, {result['kinds']} kinds)  steady pass "
        f"{row['agent']['seconds']:.3f}s, requests per pass {row['requests_per_pass']}  {status}"
    )
