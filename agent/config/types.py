"""The agent's configuration as typed values: the one home of every default and enum.

Everything that reads settings (the loader, option dataclasses of the stages,
the daemon) takes its defaults from here; ``config.example.toml`` and
docs/configuration.md are tested against these types.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from agent.errors import ConfigError

ADOPT_MODES = ("never", "if-unowned", "always")
PROPAGATION_POLICIES = ("background", "foreground", "orphan")


@dataclass(frozen=True)
class AgentSettings:
    #: Field manager and ApplySet parent name; one inventory per (name, cluster).
    name: str = "gitops-agent"
    #: Namespace that holds the ApplySet parents (one per cluster, in that cluster).
    namespace: str = "gitops-agent"
    #: Where Git clones, checkouts and render caches live.
    cache_dir: str = "~/.cache/gitops-agent/work"
    #: "console" or "json".
    log_format: str = "console"
    log_level: str = "info"
    #: host:port of the health/metrics/status HTTP server of `run` (empty disables it).
    listen: str = "127.0.0.1:8080"
    #: Kubernetes Leases shard clusters across replicas: "auto" (on in a Pod or with a
    #: management kubeconfig), "on" or "off".
    leases: str = "auto"
    #: The cluster that holds the Leases ("" in a Pod: the cluster the Pod runs in).
    management_kubeconfig: str = ""
    management_context: str = ""
    #: Namespace of the Leases ("": the Pod's namespace, else `namespace`).
    lease_namespace: str = ""
    #: This replica's Lease holder identity ("": $POD_NAME or host name, pid and a random suffix).
    replica_id: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: On SIGTERM: how long running passes may finish before they are abandoned.
    shutdown_grace: float = 30.0
    #: /healthz fails when the scheduler has not ticked for this long.
    stuck_after: float = 120.0
    #: Per-cluster backoff after failures: base doubles per consecutive failure, up to cap.
    backoff_base: float = 10.0
    backoff_cap: float = 600.0
    #: How often the config file is checked for changes (0 disables reloading).
    reload_interval: float = 5.0


@dataclass(frozen=True)
class SourceAuth:
    username: str = ""
    password_file: str = ""
    password_env: str = ""
    token_file: str = ""
    token_env: str = ""
    ssh_private_key_file: str = ""
    ssh_known_hosts_file: str = ""


@dataclass(frozen=True)
class SourceVerify:
    """Commit signature verification (off unless a file is given)."""

    allowed_signers_file: str = ""
    gpg_keyring_file: str = ""


@dataclass(frozen=True)
class SourceConfig:
    url: str
    branch: str = ""
    tag: str = ""
    commit: str = ""
    poll_interval: float = 60.0
    timeout: float = 60.0
    shallow: bool = False
    #: Checkouts kept besides the current one (garbage collection).
    keep_checkouts: int = 3
    auth: SourceAuth = field(default_factory=SourceAuth)
    verify: SourceVerify = field(default_factory=SourceVerify)

    @property
    def ref(self) -> str:
        """Human spelling of what is followed: ``branch main``, ``tag v1``, ``commit abc``."""
        if self.commit:
            return f"commit {self.commit}"
        if self.tag:
            return f"tag {self.tag}"
        return f"branch {self.branch or 'main'}"


@dataclass(frozen=True)
class HelmSettings:
    chart: str = ""
    release_name: str = ""
    namespace: str = ""
    values_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSettings:
    """Everything a `[defaults]` table may set and a `[[clusters]]` entry may override."""

    field_manager: str = ""  # empty: the agent name
    reconcile_interval: float = 300.0
    prune: bool = True
    allow_empty: bool = False
    max_prune_fraction: float = 0.5
    brake_min_inventory: int = 10
    max_prune: int | None = None
    adopt: str = "if-unowned"
    default_namespace: str = "default"
    propagation_policy: str = "background"
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    pass_deadline: float = 300.0
    concurrency: int = 8
    exclude: tuple[str, ...] = ()
    render_timeout: float = 60.0


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    paths: tuple[str, ...]
    settings: ClusterSettings
    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False
    vars: dict[str, str] = field(default_factory=dict)
    helm: HelmSettings | None = None


@dataclass(frozen=True)
class ConflictRule:
    """``(manager glob, operation, subresource) → force | yield``; first match wins."""

    manager: str
    action: str
    operation: str = "*"
    subresource: str = "*"

    def matches(self, manager: str, operation: str, subresource: str) -> bool:
        return (
            fnmatch.fnmatchcase(manager, self.manager)
            and self.operation in ("*", operation)
            and (self.subresource == "*" or self.subresource == subresource)
        )


#: The defaults of docs/safety.md rule 5: yield to whatever writes through `scale` and to the
#: controller manager; take over from kubectl and restore tools.
DEFAULT_CONFLICT_RULES: tuple[ConflictRule, ...] = (
    ConflictRule(manager="*", subresource="scale", action="yield"),
    ConflictRule(manager="kube-controller-manager", action="yield"),
    ConflictRule(manager="kubectl", action="force"),
    ConflictRule(manager="kubectl-*", action="force"),
    ConflictRule(manager="before-first-apply", action="force"),
    ConflictRule(manager="velero*", action="force"),
)


@dataclass(frozen=True)
class Config:
    agent: AgentSettings
    source: SourceConfig
    clusters: tuple[ClusterConfig, ...]
    conflict_rules: tuple[ConflictRule, ...] = DEFAULT_CONFLICT_RULES
    file: str = ""

    def cluster(self, name: str) -> ClusterConfig:
        for c in self.clusters:
            if c.name == name:
                return c
        raise ConfigError(
            "clusters", f"no cluster named {name!r} (have: {', '.join(c.name for c in self.clusters)})"
        )

    def field_manager(self, cluster: ClusterConfig) -> str:
        return cluster.settings.field_manager or self.agent.name
