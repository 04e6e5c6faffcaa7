"""Session-wide fixtures: real local Kubernetes control planes (see ``tests/clusters.py``).

- ``cluster_pool`` (session): clusters ``pool-a`` and ``pool-b``, started once, side by side;
  for tests that only read, or write inside their own namespace.
- ``namespace`` (function): a fresh, uniquely named namespace on ``pool-a``.
- ``pods_cluster`` (session): cluster ``pods``, whose Pods run: kube-scheduler, kwok's simulated
  kubelets on fake Nodes and the workload controllers (``agent.dev.simulation``); started only
  when a test asks for it, so sessions that never do pay nothing. ``pods_namespace`` (function):
  a fresh namespace on it.
- ``fresh_cluster`` (function): a factory of clusters of the test's own, for destructive tests;
  ``fresh_cluster(pods=True)`` runs simulated Pods.
- ``cluster_ctl`` (function): stop / start / restart / freeze / thaw clusters, issue and revoke
  ServiceAccount tokens; undoes freezes and restarts stopped pool clusters afterwards.
- ``e2e`` (function): agents, namespace names and daemons for end-to-end tests
  (``tests/agentkit.py``'s ``E2E``), closed, stopped and deleted after the test, after
  ``cluster_ctl``'s undoing; ``daemons`` starts ``Daemon``s in this process that ``e2e`` stops.
- ``browser`` (function): the session's headless Chromium (``tests/browser.py``), its cookies
  cleared and its window at laptop size for each test.
- ``_collector_restored`` (every test): undoes what ``gitops-agent run`` run in this process
  (``agent.run.heap.tune_collector``) did to the cycle collector, so no later test runs with it.

Missing binaries fail these fixtures with the install hint; they never skip.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config.types import Config
from agent.dev import localcluster
from agent.dev.process import LocalCluster
from agent.run.scheduler import Daemon
from tests import browser as chromium
from tests import clusters, daemonkit
from tests.agentkit import E2E
from tests.clusters import ClusterControl, ClusterPool, TestNamespace

_fresh_names = itertools.count(1)


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    if gc.get_threshold() != threshold:
        gc.set_threshold(*threshold)
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture(scope="session")
def cluster_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clusters")


@pytest.fixture(scope="session")
def cluster_pool(cluster_state_dir: Path) -> Iterator[ClusterPool]:
    clusters.require_control_plane()
    pool = ClusterPool(cluster_state_dir, {})
    try:
        pool.clusters.update(clusters.start_many(clusters.POOL_NAMES, cluster_state_dir))
        yield pool
    finally:
        for name in clusters.POOL_NAMES:
            clusters.delete(name, cluster_state_dir)


@pytest.fixture
def namespace(cluster_pool: ClusterPool, request: pytest.FixtureRequest) -> Iterator[TestNamespace]:
    yield from _namespace_on(cluster_pool[clusters.POOL_NAMES[0]], request.node.name, cluster_pool)


def _namespace_on(
    cluster: LocalCluster, test_name: str, pool: ClusterPool | None = None
) -> Iterator[TestNamespace]:
    name = clusters.namespace_name(test_name)
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, answer = localcluster.api_request(cluster, "POST", "/api/v1/namespaces", body)
    if code != 201:
        pytest.fail(f"creating namespace {name} on {cluster.name}: HTTP {code}: {answer}")
    yield TestNamespace(cluster, name)
    # Not waited for: the namespace controller finishes it in the background. A test that stopped
    # the pool cluster has had it restarted by cluster_ctl; if it is still down, nothing to clean.
    current = pool[cluster.name] if pool is not None else cluster
    with contextlib.suppress(OSError):
        localcluster.api_request(current, "DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="session")
def pods_cluster(cluster_state_dir: Path) -> Iterator[LocalCluster]:
    clusters.require_control_plane(pods=True)
    try:
        yield clusters.start(clusters.PODS_NAME, cluster_state_dir, pods=True)
    finally:
        clusters.delete(clusters.PODS_NAME, cluster_state_dir)


@pytest.fixture
def pods_namespace(pods_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[TestNamespace]:
    yield from _namespace_on(pods_cluster, request.node.name)


@pytest.fixture
def fresh_cluster(cluster_state_dir: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``fresh_cluster()`` starts a new cluster owned by this test; all are deleted after it."""
    clusters.require_control_plane()
    names: list[str] = []

    def make(*, pods: bool = False) -> LocalCluster:
        if pods:
            clusters.require_control_plane(pods=True)
        name = f"fresh-{next(_fresh_names)}"
        names.append(name)
        return clusters.start(name, cluster_state_dir, pods=pods)

    try:
        yield make
    finally:
        for name in names:
            clusters.delete(name, cluster_state_dir)


@pytest.fixture
def e2e(request: pytest.FixtureRequest) -> Iterator[E2E]:
    """Agents and namespaces of an end-to-end test, closed and deleted after it."""
    # The pool only if this test already uses it: a fresh-cluster test must not start the pool.
    pool = request.getfixturevalue("cluster_pool") if "cluster_pool" in request.fixturenames else None
    undo = E2E(pool)
    yield undo
    undo.teardown()


@pytest.fixture
def daemons(e2e: E2E) -> daemonkit.Daemons:
    """``daemons(config, **options)``: ``daemonkit.start_daemon``, stopped (grace 2 s) after the test."""

    def start(config: Config, **options: Any) -> Daemon:
        daemon = daemonkit.start_daemon(config, **options)
        e2e.at_end(lambda: daemonkit.stop_daemon(daemon))
        return daemon

    return start


@pytest.fixture
def cluster_ctl(request: pytest.FixtureRequest) -> Iterator[ClusterControl]:
    # The pool only if this test already uses it: a fresh-cluster test must not start the pool.
    pool = request.getfixturevalue("cluster_pool") if "cluster_pool" in request.fixturenames else None
    if "e2e" in request.fixturenames:
        # Set up first so that it is torn down last: namespaces are deleted (and daemons stopped)
        # once frozen clusters are thawed and stopped ones started again.
        request.getfixturevalue("e2e")
    ctl = ClusterControl(pool)
    yield ctl
    ctl.cleanup()


@pytest.fixture(scope="session")
def _chromium() -> Iterator[Any]:
    driver = chromium.start()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(_chromium: Any) -> Any:
    """The session's headless Chromium, as if new: no cookies, laptop size."""
    _chromium.execute_cdp_cmd("Network.clearBrowserCookies", {})
    _chromium.set_window_size(*chromium.LAPTOP)
    return _chromium
