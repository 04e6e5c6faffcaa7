"""Operating the daemon on real clusters: config reload, suspend/resume/sync/status, Events.

Removing a cluster from the config stops serving it and deletes nothing
there; ``suspend`` survives as an annotation on the ApplySet parent and the
running agent changes nothing while it is set; ``sync`` reaches the running
agent (or runs one pass itself); failed and pruned objects become Events on
the parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli import ops as cli_ops
from agent.config.types import Config
from agent.kube.client import KubeClient
from agent.model import SUSPENDED
from agent.report.events import events_for
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import Daemons, cluster_status, configmaps, http, status, tune, url
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _cm(kubeconfig: Path, ns: str, name: str) -> dict | None:  # type: ignore[type-arg]
    out = kubectl(kubeconfig, "get", "cm", name, "-n", ns, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def _passes(cfg: Config, cluster: str) -> float:
    """Passes of ``cluster`` so far, from ``/metrics``."""
    lines = http(url(cfg, "/metrics"))[1].splitlines()
    want = f'cluster="{cluster}"'
    return sum(
        float(x.rsplit(" ", 1)[1])
        for x in lines
        if x.startswith("gitops_agent_reconcile_total{") and want in x
    )


def test_a_flood_of_forced_syncs_runs_one_pass_per_interval_and_unauthenticated_ones_none(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("flood")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "one")})
    cfg = tune(
        write_config(tmp_path, repo, {"pool-a": a}),
        defaults={"reconcile_interval": "1h"},
        agent_lines='sync_interval = "1h"',
        token=True,
    )
    daemons(cfg)
    wait_for("the first pass", lambda: cluster_status(cfg, "pool-a")["state"] == "ok", 30)
    before = _passes(cfg, "pool-a")
    sync = url(cfg, "/sync?cluster=pool-a")
    unauthenticated = {http(sync, "POST", token="")[0] for _ in range(20)}
    assert unauthenticated == {401}
    codes: list[int] = []
    retry_after: set[int] = set()
    end = time.monotonic() + 3
    while time.monotonic() < end:  # ~3 s of requests: several passes' worth, as fast as they answer
        code, body = http(sync, "POST")
        codes.append(code)
        if code == 429:
            retry_after.add(json.loads(body)["retry_after"])
    assert codes[0] == 202 and set(codes) <= {202, 429} and 429 in codes, codes
    assert retry_after and max(retry_after) <= 3600
    wait_for("the one forced pass", lambda: _passes(cfg, "pool-a") >= before + 1, 30)
    time.sleep(2)  # on purpose: a second forced pass, if one had been let through, runs by now
    assert _passes(cfg, "pool-a") == before + 1
    print(f"\nMEASURED {len(codes)} forced syncs in 3 s: {_passes(cfg, 'pool-a') - before:g} pass(es)")


def test_config_reload_adds_a_cluster_and_removing_one_deletes_nothing_in_it(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    ns = e2e.namespace("reload")
    repo = make_repo(tmp_path, {f"clusters/{n}/app.yaml": configmaps(ns, "hi") for n in ("pool-a", "pool-b")})
    only_a = tune(write_config(tmp_path, repo, {"pool-a": a}))
    daemon = daemons(only_a, reload_interval=0.3)
    wait_for("pool-a ok", lambda: cluster_status(only_a, "pool-a")["state"] == "ok", 30)
    # Same file, pool-b added (the listen port and agent name stay).
    text = Path(only_a.file).read_text()
    text += f'\n[[clusters]]\nname = "pool-b"\nkubeconfig = "{b.kubeconfig}"\npaths = ["clusters/pool-b"]\n'
    Path(only_a.file).write_text(text)
    wait_for(
        "pool-b ok",
        lambda: any(c["cluster"] == "pool-b" and c["state"] == "ok" for c in status(only_a)["clusters"]),
        30,
    )
    assert _cm(b.kubeconfig, ns, "settings") is not None
    # pool-a removed: no longer served, and nothing in it is deleted.
    uid = _cm(a.kubeconfig, ns, "settings")["metadata"]["uid"]  # type: ignore[index]
    start = text.index("[[clusters]]")
    end = text.index("[[clusters]]", start + 1)
    Path(only_a.file).write_text(text[:start] + text[end:])
    wait_for("pool-a gone", lambda: [c["cluster"] for c in status(only_a)["clusters"]] == ["pool-b"], 30)
    assert "pool-a" not in daemon.fleet.status
    assert daemon.scheduler.get_job("cluster:pool-a") is None
    time.sleep(1.0)  # on purpose: a second in which a wrong agent would delete it; nothing to wait for
    assert _cm(a.kubeconfig, ns, "settings")["metadata"]["uid"] == uid  # type: ignore[index]
    metrics = daemon.metrics.render().decode()
    assert 'cluster="pool-a"' not in metrics and 'cluster="pool-b"' in metrics
    # A broken file keeps the running config and says why.
    Path(only_a.file).write_text(Path(only_a.file).read_text() + "\nbogus = 1\n")
    wait_for("config error", lambda: status(only_a)["config_error"], 10)
    assert [c["cluster"] for c in status(only_a)["clusters"]] == ["pool-b"]


def test_suspend_resume_and_sync_work_against_a_running_agent_and_status_prints_the_table(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("ops")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "one")})
    cfg = tune(
        write_config(tmp_path, repo, {"pool-a": a}),
        defaults={"reconcile_interval": "1h"},
        agent_lines='sync_interval = "0s"',  # resume's pass and sync's, back to back
        token=True,
    )
    runner = CliRunner()
    daemon = daemons(cfg)
    wait_for("ok", lambda: cluster_status(cfg, "pool-a")["state"] == "ok", 30)
    out = runner.invoke(cli_ops.suspend, ["--config", cfg.file, "--cluster", "pool-a"])
    assert out.exit_code == 0, out.output
    parent = json.loads(
        kubectl(a.kubeconfig, "get", "cm", cfg.agent.name, "-n", cfg.agent.namespace, "-o", "json")
    )
    assert parent["metadata"]["annotations"][SUSPENDED] == "true"
    sha = repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "two")})
    wait_for("suspended", lambda: cluster_status(cfg, "pool-a")["state"] == "suspended", 30)
    assert cluster_status(cfg, "pool-a")["revision"] == sha
    assert _cm(a.kubeconfig, ns, "settings")["data"]["greeting"] == "one"  # type: ignore[index]

    out = runner.invoke(cli_ops.resume, ["--config", cfg.file, "--cluster", "pool-a"])
    assert out.exit_code == 0, out.output
    wait_for(
        "resumed and applied",
        lambda: (_cm(a.kubeconfig, ns, "settings") or {}).get("data", {}).get("greeting") == "two",
        30,
    )

    out = runner.invoke(cli_ops.sync, ["--config", cfg.file, "--cluster", "pool-a"])
    assert out.exit_code == 0 and "pass requested from the running agent" in out.output, out.output
    out = runner.invoke(cli_ops.sync, ["--config", cfg.file, "--cluster", "nope"])
    assert out.exit_code == 2 and "no cluster named 'nope'" in out.output

    # The requested pass may still be running: wait for the table's own row to say ok again.
    def table() -> list[str] | None:
        out = runner.invoke(cli_ops.status, ["--config", cfg.file])
        assert out.exit_code == 0, out.output
        lines = out.output.splitlines()
        row = next(line for line in lines if line.startswith("pool-a"))
        return lines if " ok " in f" {row} " else None

    lines = wait_for("synced, as the table shows", table, 30)
    assert lines[1].split()[:2] == ["CLUSTER", "STATE"]
    row = next(line for line in lines if line.startswith("pool-a"))
    assert sha[:12] in row
    daemon.stop(grace=2)
    # No agent answers any more: sync runs the pass itself.
    repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "three")})
    out = runner.invoke(cli_ops.sync, ["--config", cfg.file, "--cluster", "pool-a"])
    assert out.exit_code == 0, out.output
    assert "running one pass here" in out.output
    assert _cm(a.kubeconfig, ns, "settings")["data"]["greeting"] == "three"  # type: ignore[index]
    out = runner.invoke(cli_ops.status, ["--config", cfg.file])
    assert out.exit_code == 1 and "no agent answers" in out.output


def test_failed_and_pruned_objects_become_events_on_the_applyset_parent(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("events")
    bad = f"""
apiVersion: v1
kind: Service
metadata:
  name: broken
  namespace: {ns}
spec:
  type: NotAType
  ports: [{{port: 80}}]
"""
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "hi", "keep", "drop")})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "hi", "keep") + "---\n" + bad})
    result = agent.reconcile()["pool-a"]
    assert result.failed == 1
    client = KubeClient.from_config(agent.config.cluster("pool-a"))
    e2e.at_end(client.close)
    evs = list(events_for(client, agent.config.agent.namespace, agent.config.agent.name))
    by_reason = {e["reason"]: e for e in evs}
    assert "ApplyFailed" in by_reason and "Pruned" in by_reason, evs
    assert f"Service/{ns}/broken" in by_reason["ApplyFailed"]["message"]
    assert "NotAType" in by_reason["ApplyFailed"]["message"]
    assert by_reason["ApplyFailed"]["type"] == "Warning"
    assert f"ConfigMap/{ns}/drop" in by_reason["Pruned"]["message"]
    assert by_reason["Pruned"]["involvedObject"]["name"] == agent.config.agent.name
    # The same failure in the next pass of the same revision is counted, not repeated.
    agent.reconcile()
    again = [
        e
        for e in events_for(client, agent.config.agent.namespace, agent.config.agent.name)
        if e["reason"] == "ApplyFailed"
    ]
    assert len(again) == 1 and again[0]["count"] == 2


def test_gitops_agent_run_reloaded_with_another_source_url_polls_and_applies_the_new_repository(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("moved")
    first = make_repo(tmp_path / "first", {"clusters/pool-a/app.yaml": configmaps(ns, "first")})
    second = make_repo(tmp_path / "second", {"clusters/pool-a/app.yaml": configmaps(ns, "second")})
    cfg = tune(write_config(tmp_path, first, {"pool-a": a}), agent_lines='reload_interval = "1s"')
    worktree = Path(__file__).parent.parent
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        # The command itself, as users run it: how it builds the daemon is what is under test.
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", cfg.file],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=worktree,
            env={**os.environ, "PYTHONPATH": str(worktree)},
        )
    try:
        head = _head(first.path)
        wait_for("the first repository applied", lambda: _greeting(a.kubeconfig, ns) == "first", 60)
        assert _poll_status(cfg)["revision"] == head
        text = Path(cfg.file).read_text()
        assert text.count(str(first.path)) == 1
        Path(cfg.file).write_text(text.replace(str(first.path), str(second.path)))
        wait_for("the second repository applied", lambda: _greeting(a.kubeconfig, ns) == "second", 60)
        doc = _poll_status(cfg)
        assert doc["revision"] == _head(second.path) and doc["config_error"] is None
        assert [(s["name"], s["url"], s["revision"]) for s in doc["sources"]] == [
            ("default", str(second.path), _head(second.path))
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, log.read_text()[-3000:]


def test_a_source_that_cannot_be_reached_is_named_in_status_while_the_default_source_converges_the_cluster(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("named")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "hi")})
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    extra = (
        f'\n[[sources]]\nname = "extra"\nurl = "{tmp_path / "missing.git"}"\n'
        '\n[[apps]]\nname = "extra-app"\ncluster = "pool-a"\nsource = "extra"\npath = "x"\n'
    )
    Path(cfg.file).write_text(Path(cfg.file).read_text() + extra)
    cfg = tune(cfg)
    daemon = daemons(cfg, reload_interval=0.3)
    wait_for("pool-a ok", lambda: cluster_status(cfg, "pool-a")["state"] == "ok", 30)
    assert _greeting(a.kubeconfig, ns) == "hi"
    doc = wait_for("the extra source's error", lambda: (d := status(cfg))["sources"][1]["error"] and d, 30)
    default, named = doc["sources"]
    assert default == {
        "name": "default",
        "url": str(repo.path),
        "ref": "branch main",
        "revision": _head(repo.path),
        "error": None,
    }
    assert named["name"] == "extra" and named["revision"] is None
    assert named["error"].startswith(f"source 'extra': {tmp_path / 'missing.git'}: ")
    assert doc["source_error"] == named["error"] and doc["revision"] == _head(repo.path)
    assert http(url(cfg, "/readyz"))[0] == 200  # every source was polled once; one failing is status
    metrics = daemon.metrics.render().decode()
    assert 'gitops_agent_source_failures_total{source="extra"}' in metrics
    assert 'gitops_agent_source_last_success_timestamp_seconds{source="default"}' in metrics
    # The app and its source removed: the source is forgotten, in status and in metrics.
    Path(cfg.file).write_text(Path(cfg.file).read_text().replace(extra, "\n"))
    wait_for("extra gone", lambda: [s["name"] for s in status(cfg)["sources"]] == ["default"], 30)
    assert status(cfg)["source_error"] is None
    assert 'source="extra"' not in daemon.metrics.render().decode()


def _greeting(kubeconfig: Path, ns: str) -> str | None:
    cm = _cm(kubeconfig, ns, "settings")
    return cm["data"]["greeting"] if cm else None


def _head(bare: Path) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(bare), "rev-parse", "main"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _poll_status(cfg: Config) -> dict[str, Any]:
    return dict(wait_for("/status", lambda: _try_status(cfg), 30))


def _try_status(cfg: Config) -> dict[str, Any] | None:
    try:
        return status(cfg)
    except (OSError, AssertionError):
        return None
