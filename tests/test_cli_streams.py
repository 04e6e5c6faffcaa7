"""Every command writes only its product to standard output; its logs go to standard error.

``gitops-agent render ... | kubectl apply -f -`` and ``diff --format json >
report.json`` need stdout to be exactly the YAML or JSON, and the tables of
``run --once``, ``sync`` and ``status`` are read by scripts. Each command runs
here as its own process (``python -m agent.cli``, this checkout's code) with
its logs forced (``[agent] log_level = "debug"``, or the group's
``--log-level debug`` for ``diff``, which logs only warnings by default), on a
cluster started by ``local-cluster start``; ``run --once``, ``sync``, ``tree``, ``events`` and ``wait``
with ``-o json`` too. Not covered: ``demo`` (two more
clusters; its output is checked by ``tests/test_cli_local.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
from pathlib import Path

import pygit2
import pytest
import yaml

from tests import clusters
from tests.agentkit import Repo, make_repo, unique, write_config
from tests.daemonkit import configmaps, http, tune, url
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
#: A structlog line: console (``... [info     ] event k=v``) or JSON (``{"event": ...}``).
_CONSOLE_EVENT = re.compile(r"\[(debug|info|warning|error|critical)\s*\]")


def log_events(text: str) -> list[str]:
    events = []
    for line in text.splitlines():
        if _CONSOLE_EVENT.search(line):
            events.append(line)
        elif line.startswith("{") and line.endswith("}"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and "event" in doc:
                events.append(line)
    return events


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """One command as its own process; fails the test if anything it logged reached stdout."""
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert log_events(out.stdout) == [], f"gitops-agent {' '.join(args)}: logs on stdout:\n{out.stdout}"
    return out


def logged(out: subprocess.CompletedProcess[str]) -> bool:
    return bool(log_events(out.stderr))


def table_header(text: str) -> list[str]:
    return text.splitlines()[0].split()[:3]


def test_render_and_offline_diff_print_only_yaml_and_json(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, {"clusters/app/cm.yaml": configmaps("shop", "one")})
    base = str(pygit2.Repository(str(repo.path)).head.target)
    kubeconfig = tmp_path / "app.kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    cfg = tune(write_config(tmp_path, repo, {"app": kubeconfig}), agent_lines='log_level = "debug"')

    out = cli("render", "--config", cfg.file, "--cluster", "app")
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Namespace"]
    assert logged(out)

    head = repo.commit({"clusters/app/cm.yaml": configmaps("shop", "two")})  # fetched (and logged) below
    for config in (["--config", cfg.file], []):
        out = cli(
            "--log-level", "debug", "diff", "--offline", "--repo", str(repo.path),
            "--base", base, "--head", head, "--format", "json", *config,
        )  # fmt: skip
        assert out.returncode == 1, out.stderr
        assert json.loads(out.stdout)["mode"] == "offline"
        assert logged(out)


def test_every_command_on_a_local_cluster_prints_only_its_product(tmp_path: Path) -> None:
    clusters.require_control_plane()
    state = str(tmp_path / "state")
    name = "streams"
    started = cli("local-cluster", "start", "--name", name, "--state-dir", state)
    try:
        assert started.returncode == 0, started.stderr
        kubeconfig = Path(started.stdout.strip())  # the path, nothing else
        assert kubeconfig.is_file()
        token = cli(
            "local-cluster", "token", "--name", name, "--state-dir", state, "--service-account", "ops/robot"
        )
        assert token.returncode == 0, token.stderr
        assert Path(token.stdout.strip()).is_file()
        _agent_commands(tmp_path, kubeconfig)
    finally:
        stopped = cli("local-cluster", "stop", "--name", name, "--state-dir", state)
        from agent.dev import localcluster

        localcluster.delete(name, Path(state))
    assert stopped.returncode == 0 and stopped.stdout == "", stopped.stdout + stopped.stderr


def _agent_commands(tmp_path: Path, kubeconfig: Path) -> None:
    ns = unique("streams")
    repo: Repo = make_repo(tmp_path, {"clusters/app/cm.yaml": configmaps(ns, "one")})
    cfg = tune(
        write_config(tmp_path, repo, {"app": kubeconfig}),
        agent_lines='log_level = "debug"\nshutdown_grace = "2s"',
        defaults={"reconcile_interval": "1h"},
        token=True,  # the daemon's /sync needs it, and `status`/`sync` send it
    )
    config = ["--config", cfg.file]
    at = ["--config", cfg.file, "--cluster", "app"]

    out = cli("run", "--once", *config, "--log-level", "debug")
    assert out.returncode == 0, out.stdout + out.stderr
    assert table_header(out.stdout) == ["CLUSTER", "REVISION", "APPLIED"] and logged(out)
    out = cli("run", "--once", *config, "-o", "json")
    assert out.returncode == 0 and json.loads(out.stdout)["results"][0]["result"] == "ok", out.stderr

    out = cli("tree", *at)
    assert out.returncode == 0 and table_header(out.stdout) == ["NAMESPACE", "NAME", "HEALTH"], out.stderr
    out = cli("tree", *at, "-o", "json")
    assert out.returncode == 0 and json.loads(out.stdout)["app"] == "app", out.stderr

    out = cli("prune", "approve", *at, "--digest", "abc123")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (  # no set is held: an approval ahead of the pass that would hold it
        "approved prune set abc123 for cluster app; no set is held now: a pass deletes it only if its"
        " prune set has exactly this digest\n"
    )

    out = cli("takeover", *at)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("takeover on cluster app by field manager ") and logged(out)

    for command, said in (("suspend", "suspended"), ("resume", "resumed")):
        out = cli(command, *at)
        assert (out.returncode, out.stdout) == (0, f"app: {said}\n"), out.stderr

    out = cli("sync", *at, "--local")
    assert out.returncode == 0, out.stdout + out.stderr
    assert table_header(out.stdout) == ["CLUSTER", "REVISION", "APPLIED"] and logged(out)
    out = cli("sync", *at, "--local", "-o", "json")
    assert out.returncode == 0 and json.loads(out.stdout)["results"][0]["app"] == "app", out.stderr

    repo.commit({"clusters/app/cm.yaml": configmaps(ns, "two")})
    out = cli("--log-level", "debug", "diff", *config, "--format", "json")
    assert out.returncode == 1, out.stdout + out.stderr
    assert json.loads(out.stdout)["mode"] == "live" and logged(out)

    _daemon_commands(tmp_path, cfg.file, url(cfg, "/status"))


def _daemon_commands(tmp_path: Path, config_file: str, status_url: str) -> None:
    """`run` (the daemon) prints nothing at all; `status` and `sync` talk to it."""
    stdout, stderr = tmp_path / "daemon.out", tmp_path / "daemon.err"
    with open(stdout, "w") as o, open(stderr, "w") as e:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", config_file],
            stdout=o,
            stderr=e,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        wait_for("the daemon's first pass", lambda: _cluster_state(status_url) == "ok", 60)
        out = cli("status", "--config", config_file)
        assert out.returncode == 0, out.stderr
        first, header = out.stdout.splitlines()[:2]
        assert first.startswith("agent ") and header.split()[:2] == ["CLUSTER", "STATE"]
        for as_json in (("--json",), ("-o", "json")):
            out = cli("status", "--config", config_file, *as_json)
            assert out.returncode == 0 and json.loads(out.stdout)["clusters"][0]["cluster"] == "app"
        out = cli("sync", "--config", config_file, "--cluster", "app")
        assert out.returncode == 0 and out.stdout.startswith("app: pass requested from the running agent")
        out = cli("wait", "--config", config_file, "--cluster", "app", "--for", "synced")
        assert (
            out.returncode == 0 and out.stdout.startswith("app: synced at ") and out.stdout.count("\n") == 1
        )
        out = cli("wait", "--config", config_file, "--cluster", "app", "--for", "synced", "-o", "json")
        assert out.returncode == 0 and json.loads(out.stdout)["result"] == "reached", out.stderr
        out = wait_for("the daemon's pass recorded", lambda: _listed(config_file), 30)
        assert table_header(out.stdout) == ["LAST", "SEEN", "APP"]
        out = cli("events", "--config", config_file, "--cluster", "app", "-o", "json")
        assert out.returncode == 0 and json.loads(out.stdout)["events"], out.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert stdout.read_text() == ""
    assert log_events(stderr.read_text())


def _listed(config_file: str) -> subprocess.CompletedProcess[str] | None:
    """``events`` once the daemon's record of its pass is saved (``run --once`` keeps none)."""
    out = cli("events", "--config", config_file, "--cluster", "app")
    return out if out.returncode == 0 and "Pass" in out.stdout else None


def _cluster_state(status_url: str) -> str:
    try:
        code, body = http(status_url)
    except (OSError, urllib.error.URLError):
        return ""
    return str(json.loads(body)["clusters"][0]["state"]) if code == 200 else ""
