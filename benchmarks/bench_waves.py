"""Benchmark 14: what sync waves add to a rollout -- an app's waves one after the other through the
agent, against the sum of the same waves' own health times.

Called by ``benchmarks.__main__`` (``python -m benchmarks waves``). One local cluster whose Pods run
(``localcluster.start(..., pods=True)``: kube-scheduler and kwok; a Deployment of one replica is
Available about a second after it is created; neither is paused here, the rollouts need them).

The app: ``waves`` sync waves (``argocd.argoproj.io/sync-wave`` 0..waves-1) of ``objects / waves``
objects each, in a namespace created beforehand (untimed): ``deployments`` Deployments of one
replica per wave, the rest ConfigMaps and headless Services (the local service IP range is
small); ``wait = true``, so the app is done when its last wave is healthy.

Agent: the driver of ``gitops-agent run --once`` in process (``Fleet.run_apps`` of the app, then
``Fleet.health.settle``: the app's passes re-run when each ``syncing`` pass says to look again,
then the rollout wait of the last wave), warm (a one-object app ran first). The daemon's scheduler
re-wakes a ``syncing`` app at the same ``recheck`` (``agent.run.due``); ``run --once`` waits it
exactly, so it is the lower bound of the two. Timed from the first pass's start to ``settle``
returning with the app's health Current.

Peer: the same waves' objects in a namespace of their own, each wave alone:
``kubectl apply --server-side`` of its file, then ``kubectl wait --for=condition=Available
deployment -l wave=N`` (a watch: it returns as the last Deployment turns Available); the time from
the apply's start to the wait's end, summed over the waves. Overhead = agent / peer - 1, target
at most ``TARGET_OVERHEAD``. Repetitions alternate which side goes first, each on fresh
namespaces, deleted (and waited for) after the repetition; medians reported.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import harness as h

#: The agent's time over the waves' own, at most this much more.
TARGET_OVERHEAD = 0.10
WAVE = "argocd.argoproj.io/sync-wave"
#: Seconds between two reads of a wave's Deployments while timing its health (both sides).
POLL = 0.05


def wave_objects(ns: str, wave: int, per_wave: int, deployments: int, *, annotate: bool) -> str:
    """One wave's objects as YAML: ``deployments`` Deployments (1 replica), then ConfigMaps and
    Services in turn up to ``per_wave``; each labelled ``wave: "N"``."""
    meta = f"  namespace: {ns}\n  labels: {{wave: '{wave}'}}\n"
    if annotate:
        meta += f"  annotations: {{{WAVE}: '{wave}'}}\n"
    docs = []
    for d in range(min(deployments, per_wave)):
        name = f"w{wave}-web-{d}"
        docs.append(
            f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n{meta}"
            f"spec:\n  replicas: 1\n  selector: {{matchLabels: {{app: {name}}}}}\n"
            f"  template:\n    metadata: {{labels: {{app: {name}}}}}\n"
            "    spec: {containers: [{name: main, image: nginx:1.27}]}\n"
        )
    for i in range(per_wave - len(docs)):
        name = f"w{wave}-item-{i}"
        if i % 2:
            docs.append(
                f"apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n{meta}"
                f"spec:\n  clusterIP: None\n  selector: {{app: {name}}}\n  ports: [{{port: 80}}]\n"
            )
        else:
            docs.append(
                f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n{meta}data: {{i: '{i}'}}\n"
            )
    return "---\n".join(docs)


def healthy_at(cluster: Any, ns: str, wave: int, count: int, *, timeout: float = 300.0) -> float:
    """``time.perf_counter`` when the wave's ``count`` Deployments are first all Current by the
    agent's own rules (``agent.plan.health.assess``): one labelled LIST every ``POLL`` seconds."""
    from agent.dev import localcluster
    from agent.model import HealthState
    from agent.plan.health import assess

    path = f"/apis/apps/v1/namespaces/{ns}/deployments?labelSelector=wave%3D{wave}"
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        seen = time.perf_counter()
        code, body = localcluster.api_request(cluster, "GET", path)
        if code != 200 or not isinstance(body, dict):
            raise RuntimeError(f"GET {path}: HTTP {code}")
        # A list's items carry no apiVersion and kind: the rule of Deployments needs them.
        items = [{**o, "apiVersion": "apps/v1", "kind": "Deployment"} for o in body.get("items") or []]
        if len(items) == count and all(assess(o).state is HealthState.CURRENT for o in items):
            return seen
        time.sleep(POLL)
    raise RuntimeError(f"wave {wave} of {ns}: not healthy after {timeout:.0f} s")


def _agent_run(
    agent: h.InProcessAgent, cluster: Any, app: str, revision: Any, last: tuple[str, int, int]
) -> dict[str, Any]:
    """The app's sync as ``run --once`` drives it, to its last wave healthy; its passes (start,
    end, state, recheck)."""
    fleet = agent.fleet
    passes: list[dict[str, Any]] = []
    run_apps = fleet.run_apps
    t0 = time.perf_counter()

    def traced(*args: Any, **kwargs: Any) -> list[Any]:
        start = time.perf_counter() - t0
        results: list[Any] = run_apps(*args, **kwargs)
        for r in results:
            passes.append(
                {
                    "start": round(start, 3),
                    "end": round(time.perf_counter() - t0, 3),
                    "state": r.state.value,
                    "recheck": r.recheck,
                }
            )
        return results

    setattr(fleet, "run_apps", traced)  # noqa: B010 -- records the passes the driver runs
    try:
        results = fleet.run_apps(cluster.name, revision, apps=[app])
        results = fleet.health.settle(revision, results, threading.Event())
    finally:
        delattr(fleet, "run_apps")
    _check(results, app)
    seconds = healthy_at(cluster, *last) - t0
    return {"seconds": seconds, "passes": passes, "last_pass_end": passes[-1]["end"]}


def _check(results: list[Any], app: str) -> None:
    (result,) = [r for r in results if r.app == app]
    if not result.ok:
        failed = [f"{x.key}: {x.message}" for x in result.results if x.outcome.value == "failed"]
        raise RuntimeError(f"app {app}: {result.state.value} {result.error} {failed[:3]}")


def _peer_run(
    agent: h.InProcessAgent, cluster: Any, ns: str, apps: list[str], revision: Any, count: int
) -> dict[str, Any]:
    """Each wave alone: the agent applies it (an app of its own: one wave, no health read), then
    until its Deployments are healthy."""
    applies, waits = [], []
    for wave, app in enumerate(apps):
        t0 = time.perf_counter()
        _check(agent.fleet.run_apps(cluster.name, revision, apps=[app]), app)
        t1 = time.perf_counter()
        waits.append(healthy_at(cluster, ns, wave, count) - t1)
        applies.append(t1 - t0)
    return {
        "seconds": sum(applies) + sum(waits),
        "apply_seconds": [round(s, 3) for s in applies],
        "wait_seconds": [round(s, 3) for s in waits],
    }


def row(agent: list[float], peer: list[float]) -> dict[str, Any]:
    """The verdict: the median agent time over the median sum of the waves' own times."""
    a, p = statistics.median(agent), statistics.median(peer)
    overhead = round(a / p - 1, 3) if p else None
    return {
        "agent_seconds": {
            "min": round(min(agent), 3),
            "median": round(a, 3),
            "all": [round(x, 3) for x in agent],
        },
        "peer_seconds": {
            "min": round(min(peer), 3),
            "median": round(p, 3),
            "all": [round(x, 3) for x in peer],
        },
        "overhead": overhead,
        "target": f"overhead <= {TARGET_OVERHEAD:.0%}",
        "met": overhead is not None and overhead <= TARGET_OVERHEAD,
    }


def run(
    root: Path, waves: int = 5, objects: int = 200, deployments: int = 8, reps: int = 5
) -> dict[str, Any]:
    """One pods cluster; ``reps`` alternating repetitions of the agent's waved app and the peer."""
    if waves < 1 or objects < waves or reps < 1:
        raise ValueError("at least one wave, one object per wave and one repetition")
    h.quiet_logs()
    per_wave, count = objects // waves, min(deployments, objects // waves)
    tag = f"bw{int(time.time()) % 100000}"
    items = root / "files-waves"
    apps = [f"a{r}" for r in range(reps)]
    peers = {r: [f"p{r}w{w}" for w in range(waves)] for r in range(reps)}
    (items / "warm").mkdir(parents=True)
    (items / "warm" / "all.yaml").write_text(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: warm\n  namespace: {tag}-warm\n"
    )
    for r, app in enumerate(apps):
        (items / app).mkdir()
        for w in range(waves):
            text = wave_objects(f"{tag}-{app}", w, per_wave, deployments, annotate=True)
            (items / app / f"wave-{w}.yaml").write_text(text)
            (items / peers[r][w]).mkdir()
            text = wave_objects(f"{tag}-p{r}", w, per_wave, deployments, annotate=False)
            (items / peers[r][w] / "all.yaml").write_text(text)
    repo = root / "repo-waves.git"
    h.commit_workload(repo, items, f"{reps} apps of {waves} waves x {per_wave} objects, and each wave alone")
    agent_runs: list[dict[str, Any]] = []
    peer_runs: list[dict[str, Any]] = []
    names = ["warm", *apps, *(p for r in range(reps) for p in peers[r])]
    with h.ClusterSet(root / "state") as cs:
        (cluster,) = cs.start("bwaves", pods=True)
        for ns in ["warm", *apps, *(f"p{r}" for r in range(reps))]:
            h.kubectl(cluster, "create", "namespace", f"{tag}-{ns}")
        cfg = h.write_config(root / "waves.toml", repo, root / "cache-waves", [cluster], apps=names)
        agent = h.InProcessAgent(cfg)
        try:
            revision = agent.source.poll()
            # Discovery and OpenAPI read once, as a warm daemon has them.
            _check(agent.fleet.run_apps(cluster.name, revision, apps=["warm"]), "warm")
            for r, app in enumerate(apps):
                for side in ("agent", "peer") if r % 2 == 0 else ("peer", "agent"):
                    if side == "agent":
                        last = (f"{tag}-{app}", waves - 1, count)
                        agent_runs.append(_agent_run(agent, cluster, app, revision, last))
                    else:
                        peer_runs.append(_peer_run(agent, cluster, f"{tag}-p{r}", peers[r], revision, count))
                # A simulated node holds 110 Pods: the repetition's namespaces go, and the
                # cluster is quiet again, before the next one.
                h.kubectl(cluster, "delete", "namespace", f"{tag}-{app}", f"{tag}-p{r}", "--timeout=300s")
        finally:
            agent.close()
    verdict = row([x["seconds"] for x in agent_runs], [x["seconds"] for x in peer_runs])
    return {
        "waves": waves,
        "objects": per_wave * waves,
        "deployments_per_wave": count,
        "reps": reps,
        "driver": "`Fleet.run_apps`, then `Fleet.health.settle`",
        "poll_seconds": POLL,
        "row": verdict,
        "agent_runs": agent_runs,
        "peer_runs": peer_runs,
    }


def format_line(result: dict[str, Any]) -> str:
    r = result["row"]
    a, p = r["agent_seconds"], r["peer_seconds"]
    passes = statistics.median(len(x["passes"]) for x in result["agent_runs"])
    status = "target met" if r["met"] else "TARGET MISSED"
    per_wave = result["objects"] // result["waves"]
    return (
        f"waves {result['waves']} x {per_wave} objects: agent {a['median']:.2f}s (min {a['min']:.2f}, "
        f"{passes:g} passes) vs the waves alone {p['median']:.2f}s (min {p['min']:.2f}): "
        f"overhead {r['overhead']:+.0%}  {status}"
    )
