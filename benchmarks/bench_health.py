"""Benchmark 8: what following rollouts costs: requests per app per step of a wait, counted by the server.

Called by ``benchmarks.__main__`` (``python -m benchmarks health``).

``apps`` apps, each in a namespace of its own with ``deployments`` Deployments, a Service and a
ConfigMap, all with ``wait = true``, on one local cluster served by one in-process ``Fleet``.
The local control plane runs no Deployment controller, so after the pass every Deployment stays
InProgress: each step of a wait then reads the app's kinds (one labelled LIST each) and, for the
namespace of its waiting Deployments, their ReplicaSets and Pods (one LIST each). The
benchmark counts one step of every app while they wait, then writes every Deployment's status as
the controller would (rolled out) and counts the step that finds them Current, after which the
waits have ended and cost nothing. The peer is what a script would run to check the same
Deployments: ``kubectl wait --for=condition=Available deployment --all -n <namespace>`` per app.

Over a wait, steps come ``HEALTH_POLL_MIN`` seconds after the pass and twice as far apart
each time nothing changes, up to ``HEALTH_POLL_MAX``: ``steps_in`` gives how many a wait of a
given length takes, from the same constants the follower uses.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agent.config.types import HEALTH_POLL_MAX, HEALTH_POLL_MIN
from benchmarks import harness as h


def steps_in(seconds: float, first: float = HEALTH_POLL_MIN, cap: float = HEALTH_POLL_MAX) -> int:
    """Steps of a wait of ``seconds`` in which nothing changes (the first one right after the pass)."""
    n, t, beat = 1, 0.0, first
    while t + beat <= seconds:
        t += beat
        n += 1
        beat = min(beat * 2, cap)
    return n


def _files(apps: int, deployments: int, root: Path, tag: str) -> list[str]:
    names = [f"app-{i:03d}" for i in range(apps)]
    for name in names:
        ns = f"{tag}-{name}"
        docs = [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"]
        docs.append(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: {ns}\n")
        docs.append(
            f"apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: {ns}\n"
            "spec:\n  selector: {app: web}\n  ports: [{port: 80}]\n"
        )
        for d in range(deployments):
            docs.append(
                f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web-{d}\n  namespace: {ns}\n"
                f"spec:\n  replicas: 2\n  selector: {{matchLabels: {{app: web-{d}}}}}\n"
                f"  template:\n    metadata: {{labels: {{app: web-{d}}}}}\n"
                "    spec: {containers: [{name: main, image: nginx:1.27}]}\n"
            )
        (root / name).mkdir(parents=True)
        (root / name / "all.yaml").write_text("---\n".join(docs))
    return names


def _roll_out(cluster: Any, ns: str, deployments: int) -> None:
    """What the Deployment controller writes once a rollout is done (through the status subresource)."""
    from agent.dev import localcluster

    for d in range(deployments):
        path = f"/apis/apps/v1/namespaces/{ns}/deployments/web-{d}"
        code, live = localcluster.api_request(cluster, "GET", path)
        if code != 200 or not isinstance(live, dict):
            raise RuntimeError(f"GET {path}: HTTP {code}")
        status = {
            "observedGeneration": live["metadata"]["generation"],
            "replicas": 2,
            "updatedReplicas": 2,
            "readyReplicas": 2,
            "availableReplicas": 2,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            ],
        }
        code, _ = localcluster.api_request(cluster, "PUT", f"{path}/status", {**live, "status": status})
        if code != 200:
            raise RuntimeError(f"PUT {path}/status: HTTP {code}")


def run(root: Path, apps: int = 20, deployments: int = 5, reps: int = 3) -> dict[str, Any]:
    """One cluster, ``apps`` waiting apps: one step counted while waiting, one when rolled out."""
    if apps < 1 or deployments < 1:
        raise ValueError("apps and deployments per app must be at least 1")
    h.quiet_logs()
    tag = f"bh{int(time.time()) % 100000}"
    files = root / f"files-health-{apps}x{deployments}"
    names = _files(apps, deployments, files, tag)
    repo = root / f"repo-health-{apps}.git"
    h.commit_workload(repo, files, f"{apps} apps x {deployments} Deployments")
    out: dict[str, Any] = {"apps": apps, "deployments_per_app": deployments, "kinds": 4}
    with h.ClusterSet(root / "state") as cs:
        (cluster,) = cs.start(f"bhealth-{apps}")
        defaults = 'wait = true\nhealth_timeout = "30m"\nhealth_debounce = "30s"'
        cfg = h.write_config(
            root / f"health-{apps}.toml",
            repo,
            root / f"cache-health-{apps}",
            [cluster],
            apps=names,
            defaults=defaults,
        )
        agent = h.InProcessAgent(cfg)
        try:
            agent.reconcile()
            reconciler = agent.fleet.reconcilers[cluster.name]

            def step() -> list[Any]:
                now = time.monotonic()
                for f in reconciler.follows.follows.values():
                    f.due = now  # every app's step is due: the benchmark counts one each
                return agent.fleet.health.step(cluster.name, now)

            waiting = [h.measure([cluster], step) for _ in range(reps)]
            peer = [
                h.measure(
                    [cluster],
                    lambda: [
                        h.kubectl(
                            cluster,
                            "wait",
                            "--for=condition=Available",
                            "deployment",
                            "--all",
                            "-n",
                            f"{tag}-{n}",
                            "--timeout=1ms",
                            ok=(0, 1),
                        )
                        for n in names
                    ],
                    client="children",
                )
                for _ in range(reps)
            ]
            for n in names:
                _roll_out(cluster, f"{tag}-{n}", deployments)
            current = h.measure([cluster], step)
            after = h.measure([cluster], step)
        finally:
            agent.close()
    states = {x.state.value for x in waiting[0].value}
    if states != {"InProgress"} or len(waiting[0].value) != apps:
        raise RuntimeError(f"waiting step read {states} for {len(waiting[0].value)} apps")
    if {x.state.value for x in current.value} != {"Current"}:
        raise RuntimeError(f"rolled-out step read {sorted({x.state.value for x in current.value})}")
    median = sorted(waiting, key=lambda m: m.seconds)[len(waiting) // 2]
    kube = sorted(peer, key=lambda m: m.seconds)[len(peer) // 2]
    per_app = median.requests.total / apps
    out["rows"] = [
        {
            "metric": "one step, every app waiting",
            "agent": median.to_json(),
            "peer": kube.to_json(),
            "peer_name": "kubectl wait --for=condition=Available deployment --all -n NS, per app",
            "requests_per_app": round(per_app, 2),
            "by_resource": dict(sorted(median.requests.by_resource.items())),
        },
        {
            "metric": "one step, every app rolled out (the wait ends)",
            "agent": current.to_json(),
            "requests_per_app": round(current.requests.total / apps, 2),
            "by_resource": dict(sorted(current.requests.by_resource.items())),
        },
        {"metric": "a step after every wait ended", "agent": after.to_json(), "requests_per_app": 0.0},
    ]
    out["steps"] = {"1 min": steps_in(60), "5 min": steps_in(300), "30 min": steps_in(1800)}
    out["requests_per_app_in_5_min_waiting"] = round(per_app * steps_in(300), 1)
    return out


def format_line(result: dict[str, Any]) -> str:
    waiting, current, after = result["rows"]
    return (
        f"health {result['apps']} apps x {result['deployments_per_app']} Deployments: a waiting step "
        f"{waiting['requests_per_app']} requests per app ({waiting['agent']['seconds']:.3f}s for all; "
        f"kubectl wait {waiting['peer']['requests']['total'] / result['apps']:.1f} per app, "
        f"{waiting['peer']['seconds']:.3f}s), rolled-out step {current['requests_per_app']} per app, "
        f"after {after['agent']['requests']['total']} requests; steps in 5 min: {result['steps']['5 min']}"
    )
