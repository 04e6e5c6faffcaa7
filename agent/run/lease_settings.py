"""Lease settings: whether replicas shard clusters with Leases, and with which timings.

Built once from ``[agent]`` (``lease_settings``) and handed to ``lease.LeaseManager``;
kept apart from the manager because the decision (``leases = "auto"``, in a Pod or
not) and its validation are pure configuration, not coordination.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
from dataclasses import dataclass

from agent.config.types import AGENT_DEFAULTS, Config, Leases
from agent.errors import ConfigError
from agent.kube.client import KubeClient

SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class LeaseSettings:
    """How replicas share clusters; built by ``lease_settings`` from ``[agent]``."""

    enabled: bool = False
    #: Namespace of the Leases in the management cluster.
    namespace: str = AGENT_DEFAULTS.namespace
    #: This replica's holder identity (unique per process).
    identity: str = AGENT_DEFAULTS.replica_id
    #: Seconds after its last renewal a Lease may be taken over (whole seconds: the API's unit).
    duration: int = math.ceil(AGENT_DEFAULTS.lease_duration)
    #: Seconds after the start of its last successful renewal a holder stops writing.
    renew_deadline: float = AGENT_DEFAULTS.renew_deadline
    #: Seconds between rounds (acquire, renew, observe).
    retry_period: float = AGENT_DEFAULTS.retry_period
    kubeconfig: str = AGENT_DEFAULTS.management_kubeconfig
    context: str = AGENT_DEFAULTS.management_context
    in_cluster: bool = False

    def validate(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.duration:
            raise ConfigError(
                "agent.renew_deadline",
                "need 0 < retry_period < renew_deadline < lease_duration "
                f"(got {self.retry_period:g}s, {self.renew_deadline:g}s, {self.duration}s)",
            )


def default_identity() -> str:
    """``POD_NAME`` (set by the Deployment) or host name, plus a per-process suffix."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}-{os.getpid()}-{secrets.token_hex(3)}"


def running_in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(SA_NAMESPACE)


def lease_settings(config: Config) -> LeaseSettings:
    """Settings from ``[agent]`` keys (``leases``, ``management_kubeconfig``, ...), defaults if absent.

    ``leases = "auto"`` (default) turns Leases on when a management kubeconfig is configured or the
    agent runs in a Pod; ``"on"`` requires one of those; ``"off"`` is for a single agent outside
    any cluster (never with two replicas).
    """
    a = config.agent
    mode = a.leases
    kubeconfig = a.management_kubeconfig
    in_cluster = not kubeconfig and running_in_cluster()
    enabled = mode == Leases.ON or (mode == Leases.AUTO and (bool(kubeconfig) or in_cluster))
    if enabled and not kubeconfig and not in_cluster:
        raise ConfigError("agent.leases", "on, but no management_kubeconfig and not running in a Pod")
    namespace = a.lease_namespace
    if not namespace and in_cluster:
        with open(SA_NAMESPACE) as f:
            namespace = f.read().strip()
    s = LeaseSettings(
        enabled=enabled,
        namespace=namespace or a.namespace,
        identity=a.replica_id or default_identity(),
        duration=math.ceil(a.lease_duration),
        renew_deadline=a.renew_deadline,
        retry_period=a.retry_period,
        kubeconfig=kubeconfig,
        context=a.management_context,
        in_cluster=in_cluster,
    )
    s.validate()
    return s


def management_client(s: LeaseSettings) -> KubeClient:
    # Short timeouts: a renewal that takes longer than the renew deadline is worthless anyway.
    t = max(1.0, s.renew_deadline / 3)
    return KubeClient.connect(
        "management",
        kubeconfig=s.kubeconfig or None,
        context=s.context or None,
        in_cluster=s.in_cluster,
        connect_timeout=t,
        request_timeout=t,
        pool_size=4,
    )
