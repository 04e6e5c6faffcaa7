"""Processes, ports, files and waits behind ``agent.dev.localcluster``'s public functions.

Split from ``localcluster`` so each module has one job: this one knows how the
three components are started, found again through pid files, signalled and
stopped, and what lives where under ``STATE_DIR/NAME``; ``localcluster`` is the
API that tests, the CLI and the demo call.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent.dev import simulation
from agent.dev.layout import (
    APISERVER,
    COMPONENTS,
    CONTROLLER_MANAGER,
    ETCD,
    KWOK,
    SCHEDULER,
    SIMULATION,
    LocalCluster,
    Paths,
    Pids,
    Ports,
)
from agent.dev.pki import Endpoint, b64, https, write_kubeconfig, write_private
from agent.errors import LocalClusterError

# Fixed, port-independent issuer: tokens issued before a restart on another port stay valid.
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# What tests rely on: namespace deletion finishes, ownerReferences cascade, every namespace
# gets its `default` ServiceAccount and `kube-root-ca.crt`, legacy token Secrets get filled.
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    # Without it the built-in admin/edit/view ClusterRoles have no rules at all.
    "clusterrole-aggregation-controller",
)
TOKEN_LIFETIME_SECONDS = 10 * 365 * 24 * 3600
# Small on purpose: a runaway test meets "database space exceeded" instead of filling /dev/shm.
_ETCD_QUOTA_BYTES = 256 * 1024 * 1024
# A Popen object must outlive its child or Python warns (ResourceWarning) when it is collected;
# keeping them also lets us reap our own children, which would otherwise linger as zombies.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


# ---------------------------------------------------------------- starting


class PortTaken(LocalClusterError):
    pass


def launch(
    paths: Paths,
    binaries: dict[str, Path],
    ports: Ports,
    timeout: float,
    *,
    pods: bool,
    fail_image: str = simulation.FAIL_IMAGE,
) -> LocalCluster:
    """Start the control plane on ``ports``, and with ``pods`` the simulated kubelets beside it."""
    deadline = time.monotonic() + timeout
    _write_json(paths.ports, {"etcd": ports.etcd, "apiserver": ports.apiserver})
    _write_kubeconfigs(paths, ports)
    if pods:
        paths.simulated.touch()
    else:
        paths.simulated.unlink(missing_ok=True)
    offsets = {c: _size(paths.log(c)) for c in COMPONENTS + SIMULATION}
    # The apiserver retries etcd until it answers, so both start at once.
    _spawn(paths, ETCD, _etcd_args(paths, binaries[ETCD], ports))
    _spawn(paths, APISERVER, _apiserver_args(paths, binaries[APISERVER], ports))
    try:
        wait_ready(paths, ports, (ETCD, APISERVER), deadline, offsets)
        # After readiness: the controller manager gives up if the apiserver is not healthy soon enough.
        kcm = _controller_manager_args(paths, binaries[CONTROLLER_MANAGER], pods=pods)
        _spawn(paths, CONTROLLER_MANAGER, kcm)
        if pods:
            _start_simulation(paths, binaries, ports, deadline, offsets, fail_image)
        _wait_controllers(paths, ports, deadline, offsets)
    except LocalClusterError as e:
        stop_components(paths)
        if any("address already in use" in _tail(paths.log(c), offsets[c]) for c in COMPONENTS):
            raise PortTaken(str(e)) from e
        raise
    running = find_running(paths)
    if running is None:
        raise LocalClusterError(f"{paths.name}: a component exited after startup:\n{_tails(paths, offsets)}")
    return running


def _start_simulation(
    paths: Paths,
    binaries: dict[str, Path],
    ports: Ports,
    deadline: float,
    offsets: dict[str, int],
    fail_image: str,
) -> None:
    endpoint = endpoint_of(paths, ports)
    try:
        simulation.prepare(paths, endpoint, fail_image=fail_image)
    except OSError as e:  # the apiserver was ready a moment ago: it died, or hangs
        raise LocalClusterError(f"{paths.name}: preparing the simulated Pods: {e}") from e
    for component, argv in simulation.arguments(paths, binaries).items():
        _spawn(paths, component, argv)
    ready = "kwok to report its Nodes Ready"
    _wait_for(
        paths, COMPONENTS + SIMULATION, deadline, offsets, ready, lambda: simulation.nodes_ready(endpoint)
    )


def respawn(paths: Paths, binaries: dict[str, Path], component: str, timeout: float) -> None:
    """Start one component again (etcd or the apiserver, killed alone) on the cluster's own ports.

    The others keep running, as in a real control plane where one process crashed and its
    supervisor brought it back: the apiserver reconnects to etcd by itself.
    """
    ports = read_ports(paths)
    if ports is None:
        raise LocalClusterError(f"local cluster {paths.name!r} has no ports.json in {paths.root.parent}")
    if live_pid(paths, component) is not None:
        raise LocalClusterError(f"local cluster {paths.name!r}: {component} is still running")
    args = {ETCD: _etcd_args, APISERVER: _apiserver_args}.get(component)
    if args is None:
        raise LocalClusterError(f"respawn: {component!r} is not one of {ETCD}, {APISERVER}")
    offsets = {c: _size(paths.log(c)) for c in COMPONENTS}
    _spawn(paths, component, args(paths, binaries[component], ports))
    wait_ready(paths, ports, (ETCD, APISERVER), time.monotonic() + timeout, offsets)


def _etcd_args(paths: Paths, binary: Path, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd}"
    return [
        str(binary),
        f"--data-dir={paths.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        # Port 0: a single member never talks to peers, and a fixed 2380 would clash between clusters.
        "--listen-peer-urls=http://127.0.0.1:0",
        # Test data on tmpfs: durability buys nothing and fsync costs seconds per test.
        "--unsafe-no-fsync",
        f"--quota-backend-bytes={_ETCD_QUOTA_BYTES}",
        "--log-level=warn",
    ]


#: The API server's own traffic into "the cluster" (admission webhooks, aggregated APIs such as
#: metrics-server's, pod logs and proxies) goes through a Unix socket nobody listens on: it fails
#: at once, on this machine. Without it a webhook's or an APIService's Service would be dialled
#: at its ClusterIP (--service-cluster-ip-range), an address off this machine, whenever a stack
#: with one is applied (cert-manager's webhook, prometheus-adapter's APIService).
_NO_CLUSTER_EGRESS = """apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: {socket}
"""


def _no_cluster_egress(paths: Paths) -> Path:
    paths.egress_selector.write_text(_NO_CLUSTER_EGRESS.format(socket=paths.root / "no-egress.sock"))
    return paths.egress_selector


def _apiserver_args(paths: Paths, binary: Path, ports: Ports) -> list[str]:
    pki = paths.pki
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={pki.directory}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--authorization-mode=RBAC",
        "--service-cluster-ip-range=10.0.0.0/24",
        f"--egress-selector-config-file={_no_cluster_egress(paths)}",
        "--allow-privileged=true",
        # As envtest: with no kubelet, pods never run, and ServiceAccount would reject pods created in
        # a namespace before the controller manager has made its `default` ServiceAccount.
        # TaintNodesByCondition taints a new Node not-ready until the node lifecycle controller sees
        # it Ready; that controller is off (it would mark kwok's heartbeat-less Nodes NotReady).
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        # The default reconciler rejects a loopback address for the `kubernetes` Service and logs it every
        # 10 s; nothing here runs in-cluster, so no endpoints are needed.
        "--endpoint-reconciler-type=none",
        "--profiling=" + os.environ.get("GITOPS_AGENT_APISERVER_PROFILING", "false"),
    ]


def _controller_manager_args(paths: Paths, binary: Path, *, pods: bool) -> list[str]:
    controllers = CONTROLLERS + simulation.CONTROLLERS if pods else CONTROLLERS
    return [
        str(binary),
        f"--kubeconfig={paths.kcm_kubeconfig}",
        f"--controllers={','.join(controllers)}",
        "--use-service-account-credentials=false",
        f"--service-account-private-key-file={paths.pki.sa_key}",
        f"--root-ca-file={paths.pki.ca_cert}",
        "--secure-port=0",  # nothing scrapes it, and it would need one more free port
        "--leader-elect=false",  # one instance per cluster: electing would only delay the start
        "--kube-api-qps=100",
        "--kube-api-burst=200",
    ]


def wait_ready(
    paths: Paths, ports: Ports, watch: tuple[str, ...], deadline: float, offsets: dict[str, int]
) -> None:
    _wait_for(
        paths,
        watch,
        deadline,
        offsets,
        "kube-apiserver to be ready",
        lambda: https(endpoint_of(paths, ports), "GET", "/readyz", timeout=2.0)[0] == 200,
    )


def _wait_controllers(paths: Paths, ports: Ports, deadline: float, offsets: dict[str, int]) -> None:
    # The serviceaccount controller creating default/default proves the controllers are running.
    probe = "/api/v1/namespaces/default/serviceaccounts/default"
    _wait_for(
        paths,
        paths.components(),
        deadline,
        offsets,
        "the controllers to start",
        lambda: https(endpoint_of(paths, ports), "GET", probe)[0] == 200,
    )


def _wait_for(
    paths: Paths,
    watch: tuple[str, ...],
    deadline: float,
    offsets: dict[str, int],
    what: str,
    done: Callable[[], bool],
) -> None:
    while True:
        _check_alive(paths, watch, offsets)
        with contextlib.suppress(OSError):
            if done():
                return
        if time.monotonic() > deadline:
            raise LocalClusterError(f"{paths.name}: timed out waiting for {what}\n{_tails(paths, offsets)}")
        time.sleep(0.1)


def _check_alive(paths: Paths, components: tuple[str, ...], offsets: dict[str, int]) -> None:
    for component in components:
        if live_pid(paths, component) is None:
            tail = _tail(paths.log(component), offsets.get(component, 0))
            raise LocalClusterError(
                f"{paths.name}: {component} exited during startup; log {paths.log(component)} ends:\n{tail}"
            )


def ensure_etcd_data(paths: Paths) -> None:
    link = paths.etcd_data
    if link.is_symlink():
        # The tmpfs target is gone after a reboot: the cluster then restarts empty, with the same PKI.
        Path(os.readlink(link)).mkdir(mode=0o700, parents=True, exist_ok=True)
        return
    if link.is_dir():
        return
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        digest = hashlib.sha256(str(paths.root.resolve()).encode()).hexdigest()[:16]
        target = shm / f"gitops-agent-etcd-{paths.name}-{digest}"
        target.mkdir(mode=0o700, exist_ok=True)
        link.symlink_to(target)
    else:
        link.mkdir(mode=0o700)


def choose_ports(previous: Ports | None) -> Ports:
    # The same ports as last time keep the kubeconfig's contents (not just its path) unchanged.
    if previous is not None and _port_free(previous.etcd) and _port_free(previous.apiserver):
        return previous
    return Ports(etcd=free_port(), apiserver=free_port())


def free_port() -> int:
    """A port nothing listens on now on loopback (the kernel's choice; taken again at once by its user)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # As the Go servers do, so a port whose old connections linger in TIME_WAIT counts as free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# ---------------------------------------------------------------- processes


def _spawn(paths: Paths, component: str, argv: list[str]) -> None:
    with open(paths.log(component), "ab") as log:
        log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {component}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=paths.root,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    paths.pidfile(component).write_text(f"{proc.pid}\n")


def live_pid(paths: Paths, component: str) -> int | None:
    """The component's pid if that process is alive and really is this cluster's component."""
    try:
        pid = int(paths.pidfile(component).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    child = _CHILDREN.get(pid)
    if child is not None:
        # Our own child: trust poll(), which also reaps it. Its cmdline may still be ours (fork before exec).
        if child.poll() is None:
            return pid
        del _CHILDREN[pid]
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    # A pid file can outlive its process (reboot, SIGKILL) and the pid be reused by another program.
    if str(paths.root).encode() not in cmdline or state in ("Z", "X"):
        return None
    return pid


def is_frozen(paths: Paths) -> bool:
    for component in (APISERVER, ETCD):
        pid = live_pid(paths, component)
        if pid is not None and _proc_state(pid) in ("T", "t"):
            return True
    return False


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "X"


def find_running(paths: Paths) -> LocalCluster | None:
    pids = {c: live_pid(paths, c) for c in paths.components()}
    ports = read_ports(paths)
    if ports is None or any(p is None for p in pids.values()):
        return None
    etcd, apiserver, kcm = (pids[c] or 0 for c in COMPONENTS)
    return LocalCluster(
        name=paths.name,
        state_dir=paths.root.parent,
        kubeconfig=paths.kubeconfig,
        api_url=f"https://127.0.0.1:{ports.apiserver}",
        ca_file=paths.pki.ca_cert,
        ports=ports,
        pids=Pids(etcd, apiserver, kcm, pids.get(SCHEDULER), pids.get(KWOK)),
    )


def require_running(paths: Paths) -> Ports:
    if find_running(paths) is None:
        raise LocalClusterError(f"local cluster {paths.name!r} is not running (in {paths.root.parent})")
    ports = read_ports(paths)
    assert ports is not None  # find_running checked it
    return ports


def signal_components(paths: Paths, components: tuple[str, ...], sig: signal.Signals) -> None:
    for component in components:
        pid = live_pid(paths, component)
        if pid is None:
            raise LocalClusterError(f"local cluster {paths.name!r}: {component} is not running")
        os.kill(pid, sig)


def stop_components(paths: Paths, timeout: float = 15.0) -> None:
    """Stop every component that runs, whether or not this start of NAME asked for it."""
    for component in COMPONENTS + SIMULATION:
        if (pid := live_pid(paths, component)) is not None:
            os.kill(pid, signal.SIGCONT)  # a stopped process would never act on SIGTERM
    # Clients first, so etcd is not the one to vanish under a live apiserver.
    _terminate(paths, (*SIMULATION, CONTROLLER_MANAGER, APISERVER), timeout)
    _terminate(paths, (ETCD,), timeout)
    for component in COMPONENTS + SIMULATION:
        paths.pidfile(component).unlink(missing_ok=True)


def _terminate(paths: Paths, components: tuple[str, ...], timeout: float) -> None:
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        alive = [c for c in components if live_pid(paths, c) is not None]
        for component in alive:
            pid = live_pid(paths, component)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while any(live_pid(paths, c) is not None for c in alive):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        else:
            return
    still = [c for c in components if live_pid(paths, c) is not None]
    raise LocalClusterError(f"local cluster {paths.name!r}: {', '.join(still)} survived SIGKILL")


@contextlib.contextmanager
def locked(paths: Paths) -> Iterator[None]:
    # Two processes starting or stopping the same NAME at once would race on ports and pid files.
    with open(paths.root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# ---------------------------------------------------------------- files


def read_ports(paths: Paths) -> Ports | None:
    try:
        data = json.loads(paths.ports.read_text())
        return Ports(etcd=int(data["etcd"]), apiserver=int(data["apiserver"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _write_kubeconfigs(paths: Paths, ports: Ports) -> None:
    pki = paths.pki
    server = f"https://127.0.0.1:{ports.apiserver}"
    write_kubeconfig(
        paths.kubeconfig,
        paths.name,
        server,
        pki.ca_cert,
        "admin",
        {"client-certificate-data": b64(pki.admin_cert), "client-key-data": b64(pki.admin_key)},
    )
    write_kubeconfig(
        paths.kcm_kubeconfig,
        paths.name,
        server,
        pki.ca_cert,
        "kube-controller-manager",
        {
            "client-certificate": str(pki.controller_manager_cert),
            "client-key": str(pki.controller_manager_key),
        },
    )
    # Token kubeconfigs are rewritten too, so they follow the apiserver to a new port.
    for token_file in sorted(paths.tokens.glob("*.token")) if paths.tokens.is_dir() else []:
        ns, _, sa = token_file.stem.partition(".")
        write_token_kubeconfig(paths, ports.apiserver, ns, sa)


def write_token_kubeconfig(paths: Paths, port: int, ns: str, sa: str) -> Path:
    path = paths.tokens / f"{ns}.{sa}.kubeconfig"
    bearer = (paths.tokens / f"{ns}.{sa}.token").read_text()
    server = f"https://127.0.0.1:{port}"
    write_kubeconfig(
        path, paths.name, server, paths.pki.ca_cert, f"system:serviceaccount:{ns}:{sa}", {"token": bearer}
    )
    return path


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_private(path, json.dumps(data).encode())


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _tail(path: Path, offset: int, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _tails(paths: Paths, offsets: dict[str, int]) -> str:
    return "\n".join(
        f"--- {paths.log(c)}:\n{_tail(paths.log(c), offsets.get(c, 0))}"
        for c in COMPONENTS + SIMULATION
        if paths.log(c).exists()
    )


def endpoint_of(paths: Paths, ports: Ports) -> Endpoint:
    return Endpoint(paths.name, ports.apiserver, paths.pki)
