"""Benchmark 12: the real-world corpus (../shared/corpus) -- render time against each stack's own
tool, and the steady pass of all its apps on one cluster.

Called by ``benchmarks.__main__`` (``python -m benchmarks corpus``). The six apps, their settings
and the repository they are served from are tests/test_corpus.py's (``benchmarks.corpus``).

Render: each app rendered as the agent renders it (``agent.render.renderer.render`` of the app's
spec, charts for the pinned Kubernetes release as ``gitops-agent render`` does; its YAML dump,
``dump_stream``, is not part of it) next to its reference on the same checkout: ``helm template``
with the flags the agent gives it, the pinned ``kustomize build`` CLI (not ``krender``, the
agent's own build), and for plain YAML ``kubectl create --dry-run=client -o json`` of the same
files. kubectl maps every kind through discovery, so it runs against the benchmark's cluster once
every app is applied (discovery cache warm), with ``--validate=false``: its default validation
fetches the kinds' OpenAPI schemas from the server, which the agent's render does not (validation
on, kubectl took 3-5x as long on kube-prometheus). Each side is run once to warm up, then ``reps``
times, the two alternating which goes first; the ratio is agent / reference of the medians
(minimums beside), target at most ``TARGET_RATIO``. The controller manager is paused meanwhile.

Steady pass: one applying pass of every app (``InProcessAgent``, as deployed) on a cluster with
simulated Pods, the passes that finish the syncs whose Helm hooks run (ingress-nginx's admission
Jobs, cert-manager's startupapicheck; not timed), then two passes counted at the server
(``harness.measure``): objects written (the agent's outcomes), write requests the server
counted, and every request against kinds + 5, kinds being the distinct kinds the apps declare.
Two objects are refused by cert-manager's webhook, whose simulated Pods cannot answer
(``corpus.WEBHOOK_BLOCKED``): the agent tries them again each pass and records an Event about
each failure; the requests these cost are counted apart (``refused``), and the target is judged
with and without them.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.dev.process import LocalCluster
from benchmarks import corpus
from benchmarks import harness as h

#: Render time of the agent / its reference, at most.
TARGET_RATIO = 1.2
#: The request target of a steady pass is the number of kinds plus this handful (as the other rows).
HANDFUL = 5
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
#: What the webhook-refused objects cost a pass at the server ("VERB resource" of ``Requests``): the
#: applies the webhook refuses, and the Events the agent records about their failure (no other
#: object fails, so a steady pass records no other Event).
REFUSED_APPLIES = frozenset(f"APPLY {k.kind.lower()}s" for k in corpus.WEBHOOK_BLOCKED)


def refused(resource: str) -> bool:
    """Whether a request ("VERB resource") is one the webhook-refused objects cost a pass."""
    return resource in REFUSED_APPLIES or resource.endswith(" events")


CLUSTER = "corpus"


def reference_name(app: str) -> str:
    if app in corpus.HELM:
        return "helm template"
    if app in corpus.KUSTOMIZE:
        return "kustomize build"
    return "kubectl create --dry-run=client -o json --validate=false"


def source_kind(app: str) -> str:
    return "chart" if app in corpus.HELM else "kustomization" if app in corpus.KUSTOMIZE else "plain YAML"


# -- rows (pure) ---------------------------------------------------------------------------------


def render_row(
    app: str, objects: int, agent: list[float], reference: list[float], *, target: float = TARGET_RATIO
) -> dict[str, Any]:
    """One stack's render row: the agent's and its reference's times, their ratios, the target."""
    a_med, r_med = statistics.median(agent), statistics.median(reference)
    ratio = h.ratio(a_med, r_med)
    return {
        "app": app,
        "path": next(a["path"] for a in corpus.APPS if a["name"] == app),
        "source": source_kind(app),
        "objects": objects,
        "reference": reference_name(app),
        "agent_seconds": {"min": round(min(agent), 4), "median": round(a_med, 4)},
        "reference_seconds": {"min": round(min(reference), 4), "median": round(r_med, 4)},
        "agent_runs": [round(s, 4) for s in agent],
        "reference_runs": [round(s, 4) for s in reference],
        "time_ratio": ratio,
        "min_ratio": h.ratio(min(agent), min(reference)),
        "target": f"time <= {target}x {reference_name(app).split(' --')[0]}",
        "met": ratio is not None and ratio <= target,
    }


def steady_row(metric: str, measured: h.Measured, outcomes: dict[str, int], kinds: int) -> dict[str, Any]:
    """A counted pass's row: objects written, the server's write requests, requests vs kinds + 5."""
    writes = {
        k: n
        for k, n in sorted(measured.requests.by_resource.items())
        if k.split(" ")[0] in WRITE_VERBS and "(dry-run)" not in k
    }
    written = sum(outcomes.get(o, 0) for o in ("created", "configured", "pruned"))
    limit = kinds + HANDFUL
    total = measured.requests.total
    by_resource = measured.requests.by_resource
    refused_requests = sum(n for k, n in by_resource.items() if refused(k))
    return {
        "metric": metric,
        "agent": measured.to_json(),
        "outcomes": outcomes,
        "objects_written": written,
        "write_requests": writes,
        "refused_requests": refused_requests,
        "by_resource": dict(sorted(by_resource.items())),
        "kinds": kinds,
        "target": f"0 objects written, requests <= {limit} (kinds + {HANDFUL})",
        "met": written == 0 and total <= limit,
        # The same, leaving out what the refused objects cost (their applies, Events about them).
        "met_but_refused": written == 0
        and all(refused(k) for k in writes)
        and total - refused_requests <= limit,
    }


def format_render_line(row: dict[str, Any]) -> str:
    a, r = row["agent_seconds"], row["reference_seconds"]
    status = "target met" if row["met"] else "TARGET MISSED"
    return (
        f"render {row['app']:<16} {row['source']:<13} {row['objects']:4d} objects  agent "
        f"{a['median']:.3f}s (min {a['min']:.3f})  |  time x{row['time_ratio']} (min x{row['min_ratio']}) "
        f"{row['reference']} {r['median']:.3f}s (min {r['min']:.3f})  {status}"
    )


def format_steady_line(row: dict[str, Any]) -> str:
    a = row["agent"]
    status = "target met" if row["met"] else "TARGET MISSED"
    return (
        f"{row['metric']:<24} {a['seconds']:.3f}s  objects written {row['objects_written']}, "
        f"write requests {row['write_requests'] or 0}, requests {a['requests']['total']} "
        f"({h.Requests(a['requests']['by_verb']).short()}), {row['refused_requests']} of them for the "
        f"webhook-refused objects, vs kinds + {HANDFUL} = {row['kinds'] + HANDFUL}  {status}"
        + (
            ""
            if row["met"]
            else f" (without the refused objects': {'met' if row['met_but_refused'] else 'MISSED'})"
        )
    )


# -- measuring -----------------------------------------------------------------------------------


def _reference_step(app: str, work: Path, cluster: LocalCluster, kube_version: str) -> Callable[[], object]:
    if app in corpus.PLAIN:
        args = ["create", "--dry-run=client", "-o", "json", "--validate=false"]
        for f in corpus.plain_files(app, work):
            args += ["-f", str(f)]
        return lambda: h.kubectl(cluster, *args, timeout=300)
    argv = corpus.reference_argv(app, work, kube_version)
    return lambda: subprocess.run(argv, capture_output=True, check=True, timeout=300)


def render_rows(
    config_file: Path, work: Path, cluster: LocalCluster, reps: int
) -> tuple[list[dict[str, Any]], int]:
    """Every app's render row, and the distinct kinds all apps declare."""
    from agent.config.load import load_config
    from agent.plan.release import pinned_version
    from agent.reconcile.stages import app_render_spec
    from agent.render.renderer import render

    config = load_config(config_file)
    kube_version = pinned_version()
    rows, kinds = [], set()
    for app in config.apps:
        # As ``gitops-agent render``: no cluster asked, charts for the pinned release.
        spec = replace(app_render_spec(app), kube_version=kube_version)
        agent_step = lambda spec=spec: render(work, spec)  # noqa: E731
        reference_step = _reference_step(app.name, work, cluster, kube_version)
        desired = render(work, spec)  # warm-up (and the objects counted)
        reference_step()
        kinds |= {(o.key.group, o.key.kind) for o in desired.objects}
        agent_s, reference_s = h.alternating(agent_step, reference_step, reps)
        rows.append(render_row(app.name, len(desired.objects), agent_s, reference_s))
        print(format_render_line(rows[-1]), flush=True)
    return rows, len(kinds)


def write_config(path: Path, repo: Path, cache_dir: Path, cluster: LocalCluster) -> Path:
    lines = [
        "[agent]",
        'name = "bench"',
        f'cache_dir = "{cache_dir}"',
        'listen = ""',
        'log_level = "warning"',
        "",
        "[source]",
        f'url = "{repo}"',
        "",
        "[defaults]",
        'pass_deadline = "600s"',
        "",
        "[[clusters]]",
        f'name = "{CLUSTER}"',
        f'kubeconfig = "{cluster.kubeconfig}"',
        *corpus.apps_toml(CLUSTER),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


#: Bound on the passes that finish the first sync of apps whose Helm hooks run (a Job: ~1 s).
SETTLE_SECONDS = 180.0


def _settle(agent: h.InProcessAgent, rev: Any, first: list[Any]) -> list[Any]:
    """Passes after the first until no app's sync waits on a step: every pass's results."""
    out, last = list(first), first
    deadline = time.monotonic() + SETTLE_SECONDS
    while any(res.state.value == "syncing" for res in last) and time.monotonic() < deadline:
        time.sleep(0.5)
        last = agent.fleet.reconcile_all(rev)
        out += last
    return out


def run(root: Path, reps: int = 7) -> dict[str, Any]:
    """Apply the corpus on a fresh cluster, count two passes after it, then time every render."""
    from agent.dev.demo import commit_directory

    h.quiet_logs()
    work = root / "corpus-tree"
    corpus.write_tree(work, corpus.repository_files())
    repo = root / "corpus.git"
    commit_directory(repo, work, "corpus")
    out: dict[str, Any] = {"apps": len(corpus.APPS), "reps": reps}
    with h.ClusterSet(root / "state") as cs:
        (cluster,) = cs.start("bcorpus", pods=True)  # the charts' hook Jobs run on simulated Pods
        cfg = write_config(root / "corpus.toml", repo, root / "cache-corpus", cluster)
        agent = h.InProcessAgent(cfg)
        try:
            rev = agent.source.poll()
            first = h.measure([cluster], lambda: agent.fleet.reconcile_all(rev))
            settled = _settle(agent, rev, first.value)  # the syncs whose hooks run, untimed
            passes = [h.measure([cluster], lambda: agent.fleet.reconcile_all(rev)) for _ in range(2)]
        finally:
            agent.close()
        failed = {
            str(r.key)
            for res in settled
            for r in res.results
            if r.outcome.value == "failed" and r.key not in corpus.WEBHOOK_BLOCKED
        }
        failed |= {f"{res.app}: {res.error}" for res in settled if res.failure is not None}
        if failed:
            raise RuntimeError(f"the corpus's first pass failed objects: {sorted(failed)[:5]}")
        out["first_pass"] = first.to_json()
        h.kubectl(cluster, "api-resources")  # kubectl's discovery cache, warm as a user's would be
        for m in (first, *passes):  # the passes' results, counted: renders are timed without them
            m.value = h.outcome_counts(m.value)
        out["first_pass"]["outcomes"] = first.value
        gc.collect()
        with h.controllers_paused(cluster):
            out["render"], kinds = render_rows(cfg, work, cluster, reps)
    out["kinds"] = kinds
    out["steady"] = [
        steady_row(name, m, m.value, kinds)
        for name, m in zip(("second pass", "third pass"), passes, strict=True)
    ]
    for row in out["steady"]:
        print(format_steady_line(row), flush=True)
    return out
