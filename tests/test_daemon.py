"""Agent processes on real clusters: two replicas with Leases, and SIGTERM in the middle of a pass.

Two processes share two clusters through Leases in a management cluster: no
cluster is ever written by both (their JSON logs give every pass's start and
end); one is killed and the other has its cluster within lease duration +
retry period. SIGTERM during a pass: the process exits within its grace
period and every object it applied is in the inventory (crash-safe: docs/safety.md rule 10).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from agent.apply.inventory import applyset_id
from agent.config.load import load_config
from agent.dev import localcluster
from agent.model import PART_OF, Outcome
from tests.agentkit import E2E, make_repo, tracked, write_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import configmaps, free_port, status, tune
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
DURATION, RENEW, RETRY = 3, 2.0, 0.5

#: The agent as `gitops-agent run` wires it, with explicit lease settings (the [agent] lease keys
#: are the lead's to add to the config loader) and a short grace period.
SCRIPT = f"""
import sys
from agent import logs
from agent.config.load import load_config
from agent.run.fleet import Fleet
from agent.run.lease_settings import LeaseSettings
from agent.run.scheduler import Daemon, DaemonOptions
from agent.source.sources import SourceSet
config, identity, lease_ns, mgmt, grace = sys.argv[1:6]
cfg = load_config(config)
logs.configure("json", "info")
leases = LeaseSettings(enabled=lease_ns != "-", namespace=lease_ns, identity=identity, duration={DURATION},
                       renew_deadline={RENEW!r}, retry_period={RETRY!r}, kubeconfig=mgmt)
Daemon(cfg, SourceSet.from_config(cfg), Fleet,
       DaemonOptions(leases=leases, grace=float(grace), tick=0.2)).run_forever()
"""


def _spawn(
    tmp_path: Path, config: str, identity: str, lease_ns: str = "-", mgmt: str = "-", grace: float = 5.0
) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / f"{identity}.log"
    script = tmp_path / "agent_main.py"
    script.write_text(SCRIPT)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), config, identity, lease_ns, mgmt, str(grace)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parent.parent,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        )
    return proc, log


def _passes(log: Path, end: float) -> dict[str, list[tuple[float, float]]]:
    """cluster → [(start, end)] of every pass in one process's JSON log (unfinished: ``end``)."""
    open_: dict[str, float] = {}
    out: dict[str, list[tuple[float, float]]] = {}
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        t = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
        if rec.get("event") == "pass started":
            open_[rec["cluster"]] = t
        elif rec.get("event") == "pass finished" and rec["cluster"] in open_:
            out.setdefault(rec["cluster"], []).append((open_.pop(rec["cluster"]), t))
    for c, t in open_.items():
        out.setdefault(c, []).append((t, end))
    return out


def _holder(cluster_api: localcluster.LocalCluster, ns: str, name: str) -> str:
    code, body = localcluster.api_request(
        cluster_api, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"
    )
    return str(body["spec"].get("holderIdentity") or "") if code == 200 else ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_each_cluster_alone_two_replicas_with_leases_never_write_one_cluster_at_once_and_take_over(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    ns, lease_ns = e2e.namespace("ha"), e2e.namespace("leases")
    kubectl(a.kubeconfig, "create", "namespace", lease_ns)
    targets = {"pool-a": a, "pool-b": b}

    def commit(greeting: str) -> str:
        return repo.commit({f"clusters/{n}/app.yaml": configmaps(ns, greeting) for n in targets})

    repo = make_repo(tmp_path, {f"clusters/{n}/app.yaml": configmaps(ns, "v0") for n in targets})
    cfg1 = tune(write_config(tmp_path, repo, targets), defaults={"reconcile_interval": "2s"})
    text = Path(cfg1.file).read_text()
    cfg2_file = Path(cfg1.file).with_name("second.toml")
    cfg2_file.write_text(text.replace(cfg1.agent.listen, f"127.0.0.1:{free_port()}"))
    cfg2 = load_config(cfg2_file)
    procs = {
        "one": _spawn(tmp_path, cfg1.file, "one", lease_ns, str(a.kubeconfig)),
        "two": _spawn(tmp_path, str(cfg2_file), "two", lease_ns, str(a.kubeconfig)),
    }
    for proc, _ in procs.values():
        e2e.at_end(lambda proc=proc: _stop(proc))
    urls = {"one": cfg1, "two": cfg2}
    overlaps: list[str] = []

    def held(who: str) -> set[str]:
        try:
            return set(status(urls[who])["leases"]["held"])
        except (OSError, AssertionError):
            return set()

    def split() -> bool:
        h1, h2 = held("one"), held("two")
        overlaps.extend(sorted(h1 & h2))
        return h1 | h2 == set(targets) and len(h1) == len(h2) == 1

    wait_for("the clusters split between the replicas", split, 60)
    for i in range(1, 4):  # new revisions: every pass writes
        sha = commit(f"v{i}")
        wait_for(
            f"v{i} applied",
            lambda sha=sha: all(
                any(
                    c["cluster"] == n and c["last_success_revision"] == sha
                    for w in urls
                    for c in status(urls[w])["clusters"]
                    if n in held(w)
                )
                for n in targets
            ),
            30,
        )
        split()
    assert not overlaps, overlaps
    victim_cluster = sorted(held("one"))[0]
    agent_name = cfg1.agent.name
    procs["one"][0].kill()
    killed = time.time()
    wait_for(
        "takeover",
        lambda: _holder(a, lease_ns, f"{agent_name}-c-{victim_cluster}") == "two",
        DURATION + RETRY + 5,
        interval=0.05,
    )
    took = time.time() - killed
    print(
        f"\nMEASURED replica two took {victim_cluster} over {took:.2f}s after replica one was killed "
        f"(lease duration + retry period = {DURATION + RETRY:g}s)"
    )
    assert took <= DURATION + RETRY + 0.5
    sha = commit("after")
    for n, c in targets.items():
        wait_for(
            f"{n} at {sha[:8]}",
            lambda c=c: (
                json.loads(kubectl(c.kubeconfig, "get", "cm", "settings", "-n", ns, "-o", "json"))["data"][
                    "greeting"
                ]
                == "after"
            ),
            30,
        )
    # Rolling update: SIGTERM hands the Leases back at once.
    procs["two"][0].send_signal(signal.SIGTERM)
    assert procs["two"][0].wait(15) == 0
    for n in targets:
        assert _holder(a, lease_ns, f"{agent_name}-c-{n}") == ""
    end = time.time()
    one, two = _passes(procs["one"][1], killed), _passes(procs["two"][1], end)
    for n in targets:
        for s1, e1 in one.get(n, []):
            for s2, e2 in two.get(n, []):
                assert e1 <= s2 or e2 <= s1, f"{n} written by both: one {s1}-{e1}, two {s2}-{e2}"
    assert one and two


def test_crash_safe_sigterm_in_the_middle_of_a_pass_exits_within_grace_and_leaves_no_object_untracked(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("term")
    n = 600
    repo = make_repo(
        tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "hi", *(f"cm-{i}" for i in range(n)))}
    )
    cfg = tune(write_config(tmp_path, repo, {"pool-a": a}), defaults={"concurrency": 1})
    grace = 0.3
    proc, log = _spawn(tmp_path, cfg.file, "solo", grace=grace)
    e2e.at_end(lambda: _stop(proc))
    parent = f"/api/v1/namespaces/{cfg.agent.namespace}/configmaps/{cfg.agent.name}"
    wait_for("inventory widened", lambda: localcluster.api_request(a, "GET", parent)[0] == 200, 60, 0.05)
    selector = f"{PART_OF}={applyset_id(cfg.agent.name, cfg.agent.namespace)}"
    ours = f"/api/v1/namespaces/{ns}/configmaps?labelSelector={selector}"
    wait_for(
        "the pass to apply some objects",
        lambda: localcluster.api_request(a, "GET", f"{ours}&limit=1")[1].get("items"),
        60,
        0.05,
    )
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    assert proc.wait(grace + 10) == 0, log.read_text()[-3000:]
    exited = time.monotonic() - sent
    _, body = localcluster.api_request(a, "GET", ours)
    applied = {i["metadata"]["name"] for i in body["items"]}
    members = {k.name for k in tracked(cfg) if k.kind == "ConfigMap" and k.namespace == ns}
    print(
        f"\nMEASURED SIGTERM mid-pass: exited after {exited:.2f}s (grace {grace}s), "
        f"{len(applied)}/{n} applied, all {len(members)} desired tracked"
    )
    assert 0 < len(applied) < n, "the pass was not cut short; nothing to check"
    assert applied <= members, sorted(applied - members)[:5]
    assert "abandoning passes still running" in log.read_text()
    # The next agent finishes the job: creates the rest, prunes nothing.
    r = e2e.agent(cfg).reconcile()["pool-a"]
    assert r.ok and r.count(Outcome.PRUNED) == 0 and r.count(Outcome.CREATED) == n - len(applied)
