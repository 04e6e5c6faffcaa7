"""A real local control plane: etcd + kube-apiserver + kube-controller-manager on loopback.

With ``pods=True`` kube-scheduler and kwok run beside them (``agent.dev.simulation``): fake Nodes
whose simulated kubelets make Pods run, Jobs complete, and images tagged ``:fail`` fail.

The test fixtures (``tests/conftest.py``), ``gitops-agent local-cluster`` and
``gitops-agent demo`` call this module; the agent itself never does. Each
cluster lives under ``STATE_DIR/NAME``::

    pki/                      CA, serving and client certificates, ServiceAccount signing keys
    admin.kubeconfig          system:masters client certificate; this path never changes for NAME
    controller-manager.kubeconfig
    scheduler.kubeconfig, kwok.kubeconfig, kwok-stages.yaml, simulated-pods   (pods=True only)
    tokens/NS.SA.kubeconfig   ServiceAccount bearer tokens (revocable, subject to RBAC)
    etcd-data -> /dev/shm/... etcd's data on tmpfs when the machine has one
    ports.json, *.pid, *.log  what is running where, and what it said

Processes run in their own sessions (a Ctrl-C in the caller's terminal does
not reach them) and are found again through their pid files, so ``stop`` works
from any process. Starting a stopped NAME reuses its certificates and etcd
data: a restart, not a new cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.dev.layout import (
    APISERVER,
    COMPONENTS,
    CONTROLLER_MANAGER,
    ETCD,
    KWOK,
    SCHEDULER,
    SIMULATION,
    ClusterStatus,
    LocalCluster,
    Paths,
    Pids,
    Ports,
)
from agent.dev.pki import (
    delete_service_account,
    ensure_pki,
    https,
    service_account_token,
    split_service_account,
    write_private,
)
from agent.dev.process import (
    CONTROLLERS,
    SERVICE_ACCOUNT_ISSUER,
    TOKEN_LIFETIME_SECONDS,
    PortTaken,
    choose_ports,
    endpoint_of,
    ensure_etcd_data,
    find_running,
    is_frozen,
    launch,
    live_pid,
    locked,
    read_ports,
    require_running,
    respawn,
    signal_components,
    stop_components,
    wait_ready,
    write_token_kubeconfig,
)
from agent.dev.simulation import FAIL_IMAGE
from agent.errors import LocalClusterError
from agent.render import binaries as tools

__all__ = [
    "APISERVER",
    "COMPONENTS",
    "CONTROLLERS",
    "CONTROLLER_MANAGER",
    "ETCD",
    "KWOK",
    "SCHEDULER",
    "SERVICE_ACCOUNT_ISSUER",
    "SIMULATION",
    "ClusterStatus",
    "LocalCluster",
    "Pids",
    "Ports",
    "api_request",
    "delete",
    "freeze",
    "is_running",
    "kubectl",
    "ran_before",
    "restart_component",
    "revoke",
    "start",
    "status",
    "stop",
    "thaw",
    "token",
]


# ---------------------------------------------------------------- public API


def start(
    name: str,
    state_dir: Path,
    *,
    timeout: float = 60.0,
    pods: bool | None = None,
    fail_image: str = FAIL_IMAGE,
) -> LocalCluster:
    """Start cluster NAME (or return it if it already runs) and wait until it is ready.

    ``pods``: run the simulated kubelets (kube-scheduler, kwok and the workload controllers) too;
    None: as NAME last ran (a new cluster: without). A running NAME is returned as it runs when
    ``pods`` is None; asking it for the other mode is an error (stop it first). ``fail_image``: a
    regular expression; a container image it matches fails (``agent.dev.simulation``).
    Raises ``LocalClusterError`` with the tail of the failing component's log.
    """
    paths = Paths.of(name, state_dir)
    if pods is None:
        pods = paths.simulated.is_file()
    binaries = {c: tools.tool(c) for c in (COMPONENTS + SIMULATION if pods else COMPONENTS)}
    paths.root.mkdir(parents=True, exist_ok=True)
    with locked(paths):
        running = find_running(paths)
        if running is not None:
            if (running.pids.kwok is not None) != pods:
                mode = "with" if running.pids.kwok is not None else "without"
                raise LocalClusterError(f"local cluster {name!r} runs {mode} simulated Pods: stop it first")
            if not is_frozen(paths):
                wait_ready(paths, running.ports, (ETCD, APISERVER), time.monotonic() + timeout, {})
            return running
        stop_components(paths)  # leftovers of a half-dead cluster, so the start below is clean
        ensure_pki(paths.pki.directory, cluster_name=name)
        ensure_etcd_data(paths)
        previous = read_ports(paths)
        try:
            return launch(paths, binaries, choose_ports(previous), timeout, pods=pods, fail_image=fail_image)
        except PortTaken:
            # Another process took a port between our check and the bind: once more, on fresh ports.
            return launch(paths, binaries, choose_ports(None), timeout, pods=pods, fail_image=fail_image)


def ran_before(name: str, state_dir: Path) -> bool:
    """Whether NAME has started before in ``state_dir`` (it has ports there, running or not)."""
    return Paths.of(name, state_dir).ports.is_file()


def restart_component(name: str, state_dir: Path, component: str, *, timeout: float = 60.0) -> None:
    """Start ``component`` (etcd or kube-apiserver) of NAME again after it died alone; waits until ready.

    For the chaos runner: the other components keep running, so this is a crash and a restart
    of one process, not of the cluster.
    """
    binaries = {c: tools.tool(c) for c in COMPONENTS}
    paths = Paths.of(name, state_dir)
    with locked(paths):
        respawn(paths, binaries, component, timeout)


def stop(name: str, state_dir: Path, *, timeout: float = 15.0) -> None:
    """Stop NAME's processes (thawing them first, SIGKILL after ``timeout``); deletes nothing."""
    paths = Paths.of(name, state_dir)
    if not paths.root.is_dir():
        return
    with locked(paths):
        stop_components(paths, timeout)


def delete(name: str, state_dir: Path) -> None:
    """Stop NAME and remove its data, certificates and kubeconfigs; ``*.log`` files stay for post-mortems."""
    paths = Paths.of(name, state_dir)
    if not paths.root.is_dir():
        return
    stop(name, state_dir)
    if paths.etcd_data.is_symlink():
        shutil.rmtree(os.readlink(paths.etcd_data), ignore_errors=True)
    for entry in paths.root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.suffix != ".log":
            entry.unlink(missing_ok=True)


def freeze(name: str, state_dir: Path, *, timeout: float = 10.0) -> None:
    """SIGSTOP the apiserver and etcd: connections hang as with a cluster that stopped answering.

    The controller manager (and the scheduler and kwok of simulated Pods) keep running: their
    requests hang too, as a client's would.

    Returns once the kernel shows them stopped: a signal is delivered to every thread of a process
    in its own time, and a busy machine took longer than the caller's next look (``status``)."""
    paths = Paths.of(name, state_dir)
    signal_components(paths, (APISERVER, ETCD), signal.SIGSTOP)
    _until(lambda: is_frozen(paths), timeout, f"local cluster {name!r} did not stop within {timeout:g}s")


def thaw(name: str, state_dir: Path, *, timeout: float = 10.0) -> None:
    """Undo ``freeze``; returns once the kernel shows them running again."""
    paths = Paths.of(name, state_dir)
    signal_components(paths, (ETCD, APISERVER), signal.SIGCONT)
    _until(
        lambda: not is_frozen(paths), timeout, f"local cluster {name!r} did not resume within {timeout:g}s"
    )


def _until(done: Callable[[], bool], timeout: float, why: str) -> None:
    """Poll the process table (no event tells a stop) until ``done``, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise LocalClusterError(why)
        time.sleep(0.005)


def status(name: str, state_dir: Path) -> ClusterStatus:
    paths = Paths.of(name, state_dir)
    pids = {c: live_pid(paths, c) for c in paths.components()}
    running = all(p is not None for p in pids.values())
    return ClusterStatus(name, running, running and is_frozen(paths), pids)


def is_running(name: str, state_dir: Path) -> bool:
    return status(name, state_dir).running


def token(
    name: str,
    state_dir: Path,
    service_account: str = "default/gitops-agent",
    *,
    cluster_role: str | None = "cluster-admin",
) -> Path:
    """Path of a kubeconfig authenticating as ServiceAccount ``NS/NAME`` with a bound token.

    Creates the namespace, the ServiceAccount and (unless ``cluster_role`` is None) a
    ClusterRoleBinding to ``cluster_role``. The path is stable for (cluster, service account);
    calling again issues a fresh token into the same file.
    """
    paths = Paths.of(name, state_dir)
    ns, sa = split_service_account(service_account)
    endpoint = endpoint_of(paths, require_running(paths))
    bearer = service_account_token(
        endpoint, ns, sa, cluster_role=cluster_role, lifetime_seconds=TOKEN_LIFETIME_SECONDS
    )
    paths.tokens.mkdir(exist_ok=True)
    write_private(paths.tokens / f"{ns}.{sa}.token", bearer.encode())
    return write_token_kubeconfig(paths, endpoint.port, ns, sa)


def revoke(name: str, state_dir: Path, service_account: str, *, timeout: float = 30.0) -> None:
    """Delete the ServiceAccount, so its tokens fail with 401; waits until the apiserver says so.

    The apiserver caches successful token authentications for ~10 s, hence the wait.
    """
    paths = Paths.of(name, state_dir)
    ns, sa = split_service_account(service_account)
    token_file = paths.tokens / f"{ns}.{sa}.token"
    bearer = token_file.read_text() if token_file.is_file() else None
    delete_service_account(endpoint_of(paths, require_running(paths)), ns, sa, bearer, timeout=timeout)


def api_request(
    cluster: LocalCluster, method: str, path: str, body: Any = None, *, timeout: float = 10.0
) -> tuple[int, Any]:
    """One request as the cluster admin: (HTTP status, decoded JSON body or text). For tests and the demo.

    Raises ``OSError`` (``TimeoutError`` included) when the apiserver does not answer.
    """
    endpoint = endpoint_of(Paths.of(cluster.name, cluster.state_dir), cluster.ports)
    return https(endpoint, method, path, body, timeout=timeout)


def kubectl(
    kubeconfig: Path, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run the pinned kubectl against ``kubeconfig`` (never the one on PATH)."""
    # A discovery cache per kubeconfig directory: a loopback port reused by a later cluster must
    # not be served another cluster's cached discovery from ~/.kube/cache.
    argv = [
        str(tools.tool("kubectl")),
        f"--kubeconfig={kubeconfig}",
        f"--cache-dir={kubeconfig.parent / '.kube-cache'}",
        *args,
    ]
    out = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise LocalClusterError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out
