"""Helpers behind the cluster fixtures of ``tests/conftest.py``: real local control planes.

``tests/conftest.py`` builds its fixtures from these; test modules use the
types (``ClusterControl``, ``TestNamespace``) and, rarely, ``kubectl``.

Every cluster a test process starts is recorded here, and stopped at interpreter
exit or on SIGTERM too, so a crashed or killed-by-CI session does not leave
apiservers behind (SIGKILL of pytest itself is the one case nobody can clean up).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from agent.dev import localcluster
from agent.dev.process import LocalCluster
from agent.errors import LocalClusterError
from agent.render import binaries as tools

POOL_NAMES = ("pool-a", "pool-b")
#: The session's cluster with simulated Pods (kube-scheduler and kwok), started when a test asks.
PODS_NAME = "pods"

_started: set[tuple[str, Path]] = set()
_started_lock = threading.Lock()


def require_control_plane(*, pods: bool = False) -> None:
    """Fail (never skip) the requesting test when the pinned binaries are missing."""
    simulation = localcluster.SIMULATION if pods else ()
    try:
        for binary in (*localcluster.COMPONENTS, *simulation, "kubectl"):
            tools.tool(binary)
    except LocalClusterError as e:
        pytest.fail(f"local control plane unavailable: {e}", pytrace=False)


def start(name: str, state_dir: Path, *, pods: bool | None = None, **options: Any) -> LocalCluster:
    """``localcluster.start``, recorded so that the process cleans it up whatever happens."""
    _install_cleanup()
    with _started_lock:
        _started.add((name, state_dir))
    return localcluster.start(name, state_dir, pods=pods, **options)


def start_many(names: tuple[str, ...], state_dir: Path) -> dict[str, LocalCluster]:
    """Start several clusters side by side (each start mostly waits on its apiserver)."""
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = {name: pool.submit(start, name, state_dir) for name in names}
        return {name: future.result() for name, future in futures.items()}


def delete(name: str, state_dir: Path) -> None:
    """Stop and remove a cluster's data (its logs stay in the state dir for post-mortems)."""
    localcluster.delete(name, state_dir)
    with _started_lock:
        _started.discard((name, state_dir))


def stop_all_started() -> None:
    with _started_lock:
        started = sorted(_started)
    for name, state_dir in started:
        with contextlib.suppress(Exception):  # cleanup of one must never prevent the others'
            localcluster.delete(name, state_dir)


_cleanup_installed = False


def _install_cleanup() -> None:
    global _cleanup_installed
    if _cleanup_installed:
        return
    _cleanup_installed = True
    atexit.register(stop_all_started)
    # CI kills a stuck job with SIGTERM, whose default action skips atexit.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL,
        None,
    ):
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    stop_all_started()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class ClusterPool:
    """The session's long-lived clusters; tests only read, or write inside their own namespace."""

    state_dir: Path
    clusters: dict[str, LocalCluster]

    def __getitem__(self, name: str) -> LocalCluster:
        return self.clusters[name]

    @property
    def all(self) -> tuple[LocalCluster, ...]:
        return tuple(self.clusters.values())

    def close(self) -> None:
        for name in self.clusters:
            delete(name, self.state_dir)


@dataclass(frozen=True)
class TestNamespace:
    """A uniquely named namespace on a pool cluster, deleted after the test."""

    __test__ = False  # not a test class, despite its name

    cluster: LocalCluster
    name: str


def namespace_name(test_name: str) -> str:
    """A valid, unique namespace name that says which test made it."""
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{secrets.token_hex(3)}"


class ClusterControl:
    """Stop, start, freeze, thaw clusters and hand out or revoke ServiceAccount credentials.

    After the test, ``cleanup`` thaws what was frozen and restarts pool clusters that were
    stopped, so one test's outage never leaks into the next.
    """

    def __init__(self, pool: ClusterPool | None) -> None:
        self._pool = pool
        self._touched: dict[tuple[str, Path], LocalCluster] = {}

    def stop(self, cluster: LocalCluster) -> None:
        self._touch(cluster)
        localcluster.stop(cluster.name, cluster.state_dir)

    def start(self, cluster: LocalCluster) -> LocalCluster:
        """Start a stopped cluster again (same data, same kubeconfig path); returns its new handle."""
        self._touch(cluster)
        started = start(cluster.name, cluster.state_dir)
        if self._pool is not None and self._pool.clusters.get(cluster.name) is not None:
            self._pool.clusters[cluster.name] = started
        return started

    def restart(self, cluster: LocalCluster) -> LocalCluster:
        self.stop(cluster)
        return self.start(cluster)

    def freeze(self, cluster: LocalCluster) -> None:
        self._touch(cluster)
        localcluster.freeze(cluster.name, cluster.state_dir)

    def thaw(self, cluster: LocalCluster) -> None:
        localcluster.thaw(cluster.name, cluster.state_dir)

    @contextlib.contextmanager
    def frozen(self, cluster: LocalCluster) -> Iterator[None]:
        self.freeze(cluster)
        try:
            yield
        finally:
            self.thaw(cluster)

    def token(
        self, cluster: LocalCluster, service_account: str, *, cluster_role: str | None = "cluster-admin"
    ) -> Path:
        return localcluster.token(cluster.name, cluster.state_dir, service_account, cluster_role=cluster_role)

    def revoke(self, cluster: LocalCluster, service_account: str) -> None:
        localcluster.revoke(cluster.name, cluster.state_dir, service_account)

    def cleanup(self) -> None:
        for (name, state_dir), cluster in self._touched.items():
            state = localcluster.status(name, state_dir)
            if state.frozen:
                localcluster.thaw(name, state_dir)
            pool = self._pool
            in_pool = pool is not None and pool.state_dir == state_dir and name in pool.clusters
            if in_pool and not state.running:
                self.start(cluster)

    def _touch(self, cluster: LocalCluster) -> None:
        self._touched.setdefault((cluster.name, cluster.state_dir), cluster)


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> str:
    """The pinned kubectl's stdout (raises ``LocalClusterError`` with its stderr on failure)."""
    return localcluster.kubectl(kubeconfig, *args, check=check).stdout


def scale_as_hpa(kubeconfig: Path, ns: str, replicas: int) -> None:
    """What an HPA does: write spec.replicas through /scale as kube-controller-manager."""
    kubectl(
        kubeconfig,
        "patch",
        "deployment",
        "web",
        "-n",
        ns,
        "--subresource=scale",
        "--type=merge",
        "--field-manager=kube-controller-manager",
        "-p",
        json.dumps({"spec": {"replicas": replicas}}),
    )
