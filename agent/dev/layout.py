"""Names and places of one local cluster: its components, its files under ``STATE_DIR/NAME``, and
the handles ``agent.dev.localcluster`` returns. Shared by ``process`` (which starts and finds the
processes), ``simulation`` (the simulated kubelets) and ``localcluster`` (the public API).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agent.dev.pki import Pki
from agent.errors import LocalClusterError

ETCD, APISERVER, CONTROLLER_MANAGER = "etcd", "kube-apiserver", "kube-controller-manager"
COMPONENTS = (ETCD, APISERVER, CONTROLLER_MANAGER)
#: The simulated kubelets' components (``agent.dev.simulation``): only in a cluster started with Pods.
SCHEDULER, KWOK = "kube-scheduler", "kwok"
SIMULATION = (SCHEDULER, KWOK)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


@dataclass(frozen=True)
class Ports:
    etcd: int
    apiserver: int


@dataclass(frozen=True)
class Pids:
    etcd: int
    apiserver: int
    controller_manager: int
    #: Set when the cluster runs simulated Pods (``pods=True``).
    scheduler: int | None = None
    kwok: int | None = None


@dataclass(frozen=True)
class LocalCluster:
    """A running local cluster, as ``start`` returns it."""

    name: str
    state_dir: Path
    kubeconfig: Path
    api_url: str
    ca_file: Path
    ports: Ports
    pids: Pids

    @property
    def directory(self) -> Path:
        return self.state_dir / self.name


@dataclass(frozen=True)
class ClusterStatus:
    """What ``status`` found: ``running`` means all its processes are alive (maybe frozen)."""

    name: str
    running: bool
    frozen: bool
    pids: dict[str, int | None]


@dataclass(frozen=True)
class Paths:
    root: Path
    name: str

    @classmethod
    def of(cls, name: str, state_dir: Path) -> Paths:
        if not _NAME.match(name):
            raise LocalClusterError(f"local cluster name {name!r}: use lowercase letters, digits and '-'")
        return cls(Path(state_dir).absolute() / name, name)

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def kcm_kubeconfig(self) -> Path:
        return self.root / "controller-manager.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.root / "scheduler.kubeconfig"

    @property
    def kwok_kubeconfig(self) -> Path:
        return self.root / "kwok.kubeconfig"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok-stages.yaml"

    @property
    def simulated(self) -> Path:
        """Present while NAME runs (or last ran) simulated Pods: a restart brings them back."""
        return self.root / "simulated-pods"

    def components(self) -> tuple[str, ...]:
        """What runs in this cluster: the control plane, and the simulation if it was started with it."""
        return COMPONENTS + SIMULATION if self.simulated.is_file() else COMPONENTS

    @property
    def ports(self) -> Path:
        return self.root / "ports.json"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens"

    @property
    def egress_selector(self) -> Path:
        return self.root / "egress-selector.yaml"

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    def pidfile(self, component: str) -> Path:
        return self.root / f"{component}.pid"

    def log(self, component: str) -> Path:
        return self.root / f"{component}.log"
