"""Local clusters whose Pods run: kube-scheduler and kwok's simulated kubelets on fake Nodes.

How such a cluster starts, is found again, restarts and stops, and fails when a binary is
missing; what the simulated Pods do is tested through the health rules in
``tests/test_health_simulated.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.dev import localcluster, simulation
from agent.dev.process import LocalCluster
from agent.errors import LocalClusterError
from agent.render import binaries as tools
from benchmarks import harness
from tests import clusters
from tests.clusters import ClusterControl, kubectl
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def test_a_cluster_with_pods_is_found_again_restarts_with_them_and_stops_every_process(
    fresh_cluster: Callable[..., LocalCluster], cluster_ctl: ClusterControl
) -> None:
    cluster = fresh_cluster(pods=True)
    assert cluster.pids.scheduler is not None and cluster.pids.kwok is not None
    assert localcluster.start(cluster.name, cluster.state_dir) == cluster  # found again, as it runs
    with pytest.raises(LocalClusterError, match="runs with simulated Pods: stop it first"):
        localcluster.start(cluster.name, cluster.state_dir, pods=False)
    state = localcluster.status(cluster.name, cluster.state_dir)
    assert state.running and set(state.pids) == {*localcluster.COMPONENTS, *localcluster.SIMULATION}

    cluster_ctl.stop(cluster)
    assert set(localcluster.status(cluster.name, cluster.state_dir).pids.values()) == {None}
    for pid in (cluster.pids.scheduler, cluster.pids.kwok):
        assert not _alive(pid)

    restarted = cluster_ctl.start(cluster)  # as it last ran: with Pods
    assert restarted.pids.kwok is not None and restarted.pids.kwok != cluster.pids.kwok
    nodes = kubectl(restarted.kubeconfig, "get", "nodes", "-o", "name").split()
    assert nodes == [f"node/{n}" for n in simulation.NODES]


def test_a_cluster_started_without_pods_runs_no_scheduler_nor_kwok(
    fresh_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = fresh_cluster()
    assert cluster.pids.scheduler is None and cluster.pids.kwok is None
    assert set(localcluster.status(cluster.name, cluster.state_dir).pids) == set(localcluster.COMPONENTS)


def test_the_failing_image_pattern_is_chosen_at_start(tmp_path: Path) -> None:
    cluster = clusters.start("failpattern", tmp_path, pods=True, fail_image=r"/broken-")
    try:
        for name, image in (("broken", "registry.example/broken-app:1"), ("fine", "nginx:fail")):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}}
            pod["spec"] = {"containers": [{"name": "main", "image": image}]}
            code, answer = localcluster.api_request(cluster, "POST", "/api/v1/namespaces/default/pods", pod)
            assert code == 201, answer

        def phase_and_wait(name: str) -> tuple[str, str] | None:
            """(phase, the container's waiting reason) once kwok wrote the container's status."""
            _, pod = localcluster.api_request(cluster, "GET", f"/api/v1/namespaces/default/pods/{name}")
            statuses = pod["status"].get("containerStatuses")
            if not statuses:
                return None
            return pod["status"]["phase"], statuses[0]["state"].get("waiting", {}).get("reason", "")

        assert wait_for("broken's status", lambda: phase_and_wait("broken"), 60) == (
            "Pending",
            "ImagePullBackOff",
        )
        assert wait_for("fine's status", lambda: phase_and_wait("fine"), 60) == ("Running", "")
    finally:
        clusters.delete("failpattern", tmp_path)


def test_the_stages_test_container_images_against_the_failing_image_pattern() -> None:
    by_name = {s["metadata"]["name"]: s for s in simulation.stages(r"/broken-")}
    keys = [e["jq"]["key"] for e in by_name["pod-image-pull-backoff"]["spec"]["selector"]["matchExpressions"]]
    assert '.spec.containers.[].image | test("/broken-")' in keys
    assert set(by_name) == {
        "node-ready",
        "pod-delete",
        "pod-ready",
        "pod-job-fails",
        "pod-image-pull-backoff",
        "pod-job-completes",
    }


def _alive(pid: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_missing_scheduler_or_kwok_fails_the_start_with_pods_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A control plane without the simulation's binaries still starts without Pods; asked for Pods,
    it fails before starting anything, naming the script that builds the missing one."""
    bins = tmp_path / "bins"
    bins.mkdir()
    for component in (*localcluster.COMPONENTS, "kubectl"):
        (bins / component).symlink_to(tools.tool(component))
    monkeypatch.setenv("GITOPS_AGENT_BIN_DIR", str(bins))
    monkeypatch.setenv("GITOPS_AGENT_CACHE", str(tmp_path / "cache"))
    tools.cache_clear()
    try:
        with pytest.raises(
            LocalClusterError, match=r"kube-scheduler not found: run scripts/install-control-plane"
        ):
            localcluster.start("nopods", tmp_path / "state", pods=True)
        (bins / "kube-scheduler").write_text("#!/bin/sh\n")  # found: only kwok is missing now
        (bins / "kube-scheduler").chmod(0o755)
        with pytest.raises(LocalClusterError, match=r"kwok not found: run scripts/install-go-tools kwok"):
            localcluster.start("nopods", tmp_path / "state", pods=True)
        with pytest.raises(pytest.fail.Exception, match="local control plane unavailable"):
            clusters.require_control_plane(pods=True)
    finally:
        monkeypatch.undo()
        tools.cache_clear()
    assert not (tmp_path / "state" / "nopods").exists()


def test_the_benchmarks_pause_the_scheduler_and_kwok_with_the_controller_manager(
    pods_cluster: LocalCluster,
) -> None:
    """Requests are counted with the controllers stopped: a simulated cluster's kubelets are too."""
    pids = (pods_cluster.pids.controller_manager, pods_cluster.pids.scheduler, pods_cluster.pids.kwok)
    with harness.controllers_paused(pods_cluster):
        assert [_state(pid) for pid in pids] == ["T", "T", "T"]
    wait_for("the controllers to run again", lambda: all(_state(pid) != "T" for pid in pids), 10)


def _state(pid: int | None) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
