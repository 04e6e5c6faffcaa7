"""The README's main job and the local control plane, through the real command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.clusters import kubectl

pytestmark = pytest.mark.cluster


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_demo_applies_apps_a_chart_release_and_a_commit_and_keeps_a_hand_label(tmp_path: Path) -> None:
    out = cli("demo", "--state-dir", str(tmp_path / "demo"))
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    first, second, third = (
        text.split("== first reconcile ==")[1],
        text.split("== second reconcile ==")[1],
        text.split("== third reconcile")[1],
    )
    for where in ("demo-a app infra", "demo-a app web", "demo-b"):
        assert f"{where}: revision" in first
    assert first.count("created    Deployment.apps/demo/web") == 2
    assert second.count("pruned     ConfigMap/demo/legacy-settings") == 2
    assert second.count("created    ConfigMap/demo/feature-flags") == 2
    assert second.count("configured Deployment.apps/demo/web") == 2
    # demo-a holds two apps (web after infra, its dependency), each with its own objects; demo-b
    # is one entry with paths. Nothing applied once Git has not moved, though a label was added.
    rows = [line.split() for line in third.splitlines() if line.startswith("demo-")]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        ("demo-a", "infra", "0", "2"),
        ("demo-a", "web", "0", "3"),
        ("demo-a", "greeter", "0", "1"),
        ("demo-b", "demo-b", "0", "5"),
    ]
    # The third app comes from the chart repository the demo serves: installed at 0.1.0 into its
    # release namespace, then upgraded when 0.2.0 (matching "0.x") is published.
    assert "created    ConfigMap/demo/greeter" in first
    assert "configured ConfigMap/demo/greeter (changed: data.chart" in second
    assert "demo-a app greeter: revision" in second and ", chart greeter@0.2.0 (sha256:" in second
    # The clusters run simulated Pods (kube-scheduler and kwok are built): the new image rolls out.
    assert "Pods are simulated" in text
    for cluster in ("demo-a", "demo-b"):
        assert f'{cluster}: deployment "web" successfully rolled out' in second
    assert "kubectl label deployment web -n demo owner=alice" in second
    assert "✔ owner=alice is still on deployment/web in demo-a after the reconcile" in third
    # Stopped afterwards (no --keep): nothing left running.
    assert "clusters left running" not in text


def test_local_cluster_start_prints_kubeconfig_last_and_restart_keeps_path_and_data(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    try:
        started = cli("local-cluster", "start", "--name", "cli-x", "--state-dir", state)
        assert started.returncode == 0, started.stderr
        kubeconfig = Path(started.stdout.strip().splitlines()[-1])
        assert kubeconfig.is_file()
        kubectl(kubeconfig, "create", "configmap", "marker", "-n", "default", "--from-literal=k=v")
        assert cli("local-cluster", "stop", "--name", "cli-x", "--state-dir", state).returncode == 0
        again = cli("local-cluster", "start", "--name", "cli-x", "--state-dir", state)
        assert Path(again.stdout.strip().splitlines()[-1]) == kubeconfig
        assert "marker" in kubectl(kubeconfig, "get", "configmap", "marker", "-n", "default", "-o", "name")
        # A new cluster runs simulated Pods, a restart as it last ran; the other mode needs a stop.
        assert "node/kwok-node-0" in kubectl(kubeconfig, "get", "nodes", "-o", "name")
        other = cli("local-cluster", "start", "--name", "cli-x", "--state-dir", state, "--no-pods")
        assert other.returncode == 1 and "runs with simulated Pods: stop it first" in other.stderr

        token = cli(
            "local-cluster",
            "token",
            "--name",
            "cli-x",
            "--state-dir",
            state,
            "--service-account",
            "ops/robot",
        )
        assert token.returncode == 0, token.stderr
        token_kc = Path(token.stdout.strip().splitlines()[-1])
        assert "token:" in token_kc.read_text()
        assert "marker" in kubectl(token_kc, "get", "configmap", "marker", "-n", "default", "-o", "name")
        bad = cli(
            "local-cluster", "token", "--name", "cli-x", "--state-dir", state, "--service-account", "nope"
        )
        assert bad.returncode == 2 and "NAMESPACE/NAME" in bad.stderr
    finally:
        cli("local-cluster", "stop", "--name", "cli-x", "--state-dir", state)
        from agent.dev import localcluster

        localcluster.delete("cli-x", Path(state))
