"""The agent's configuration as typed values: the one home of every default and enum.

Everything that reads settings (the loader, option dataclasses of the stages,
the daemon, the CLI's choices) takes its defaults and spellings from here, so
that two copies of a default cannot drift apart; ``config.example.toml`` and
docs/configuration.md are tested against these types (tests/test_docs.py), and
the stages' option dataclasses against these defaults (tests/test_config_defaults.py).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from agent.config.constraints import (
    AT_LEAST_0,
    AT_LEAST_1,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    EITHER,
    LABEL,
    LISTEN,
    NAMESPACE,
    VAR_NAME,
    Bound,
    Choice,
    Duration,
    Parsed,
    Pattern,
    Size,
    accepts,
    declare,
)
from agent.config.constraints import choices as choices
from agent.config.health_checks import HealthCheck, Wait
from agent.config.helm_types import HelmRepository as HelmRepository
from agent.config.helm_types import HelmSettings as HelmSettings
from agent.config.ignore_rules import IgnoreRule
from agent.config.notify_types import ALERT_DEFAULTS as ALERT_DEFAULTS
from agent.config.notify_types import RECEIVER_DEFAULTS as RECEIVER_DEFAULTS
from agent.config.notify_types import STATUS_SINKS as STATUS_SINKS
from agent.config.notify_types import AlertSettings as AlertSettings
from agent.config.notify_types import HookConfig as HookConfig
from agent.config.notify_types import HookKind as HookKind
from agent.config.notify_types import NotificationConfig as NotificationConfig
from agent.config.notify_types import ReceiverSettings as ReceiverSettings
from agent.config.notify_types import SecretRef as SecretRef
from agent.config.notify_types import Severity as Severity
from agent.config.notify_types import SinkKind as SinkKind
from agent.config.windows import ChangeWindow as ChangeWindow
from agent.config.windows import WindowKind as WindowKind
from agent.errors import ConfigError
from agent.model import parse_release


class Adopt(StrEnum):
    """Whether a pass takes over an existing object that is not ours (``adopt``)."""

    NEVER = "never"
    #: Only an object with no part-of label, no ownerReferences and no other manager's Apply entry.
    IF_UNOWNED = "if-unowned"
    ALWAYS = "always"


class DriftMode(StrEnum):
    """What a pass does with drift while the app's revision stays the one it applied (``drift``)."""

    #: Git wins: drift is overwritten by the next pass (and a deleted object re-created).
    CORRECT = "correct"
    #: Drift is reported (who changed what, when) and left; a new revision is applied whole.
    REPORT = "report"


class PropagationPolicy(StrEnum):
    """How the server deletes a pruned object's dependents (``propagation_policy``)."""

    BACKGROUND = "background"
    FOREGROUND = "foreground"
    ORPHAN = "orphan"


class Leases(StrEnum):
    """Whether replicas shard clusters with Leases (``[agent] leases``)."""

    #: On in a Pod or with a management kubeconfig.
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class LogFormat(StrEnum):
    CONSOLE = "console"
    JSON = "json"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


#: Shapes the loader checks strings against (the shared ones are ``constraints``').
_SERVICE_ACCOUNT = re.compile(
    r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)$"
)
_AGE_RECIPIENT = re.compile(r"^age1[02-9ac-hj-np-z]{58}$")
_GLOB = Pattern(re.compile(r"\s*\S"), "must not be empty", optional=False)


#: The branch followed when ``[source]`` names no branch, tag or commit.
DEFAULT_BRANCH: Final = "main"
#: ``render_memory``: 512 MiB per render child, so one child and the agent fit a 768Mi Pod.
DEFAULT_RENDER_MEMORY: Final = 512 << 20
#: The least ``render_memory`` accepted: a Go tool needs some to start at all.
MIN_RENDER_MEMORY: Final = 64 << 20

# Tunables no config key sets, kept beside the rest: the stages' option dataclasses use them.
#: Seconds to wait for a CRD applied in a pass to become Established.
CRD_WAIT: Final = 60.0
#: Seconds a cluster's discovery is trusted before it is read again (CRDs applied by a pass, and
#: kinds it does not know, refresh it at once).
DISCOVERY_TTL: Final = 600.0
#: Re-plans of one object after a 409 before it is reported failed.
CONFLICT_RETRIES: Final = 3
#: Seconds between the daemon's scheduler ticks, the heartbeat ``/healthz`` watches.
SCHEDULER_TICK: Final = 1.0
#: Fraction of a cluster's interval (and of a backoff delay) added at random.
SCHEDULE_JITTER: Final = 0.1
#: Seconds between health reads while an app's wait goes on: the first soon after the pass,
#: doubling while nothing changes, up to the second (a debounce or timeout ending comes sooner).
HEALTH_POLL_MIN: Final = 1.0
HEALTH_POLL_MAX: Final = 10.0
#: The status page's records (docs/status-page.md): per app, the passes and Events kept, the objects
#: of its last pass shown, and the characters of one message kept.
HISTORY_PASSES: Final = 50
HISTORY_EVENTS: Final = 100
RECORD_OBJECTS: Final = 500
RECORD_MESSAGE: Final = 500
#: Seconds between the status page's reloads in a browser, and how long a replica reuses the
#: records of the clusters other replicas hold (read from the management cluster).
PAGE_REFRESH: Final = 15.0
SHARED_RECORDS_TTL: Final = 3.0


@dataclass(frozen=True)
class AgentSettings:
    #: Field manager and ApplySet parent name; one inventory per (name, cluster).
    name: str = declare(
        "gitops-agent", Pattern(DNS_LABEL, "must be a DNS label, got {value!r}", optional=False)
    )
    #: Namespace that holds the ApplySet parents (one per cluster, in that cluster).
    namespace: str = declare("gitops-agent", Pattern(DNS_LABEL, NAMESPACE.message, optional=False))
    #: Where Git clones, checkouts and render caches live.
    cache_dir: str = "~/.cache/gitops-agent/work"
    log_format: LogFormat = declare(LogFormat.CONSOLE, Choice(EITHER))
    log_level: LogLevel = declare(LogLevel.INFO, Choice(EITHER, fold_case=True))
    #: host:port of the health/metrics/status HTTP server of `run` (empty disables it).
    listen: str = declare(
        "127.0.0.1:8080", Pattern(LISTEN, "must be host:port (or empty to disable), got {value!r}")
    )
    #: File holding the status page's token: required to read the page on any address but
    #: loopback (without one the page is off there; the probes and /metrics stay open).
    ui_token_file: str = ""
    #: Kubernetes Leases shard clusters across replicas: "auto" (on in a Pod or with a
    #: management kubeconfig), "on" or "off".
    leases: Leases = declare(Leases.AUTO, Choice(EITHER))
    #: The cluster that holds the Leases ("" in a Pod: the cluster the Pod runs in).
    management_kubeconfig: str = ""
    management_context: str = ""
    #: Namespace of the Leases ("": the Pod's namespace, else `namespace`).
    lease_namespace: str = declare("", NAMESPACE)
    #: This replica's Lease holder identity ("": $POD_NAME or host name, pid and a random suffix).
    replica_id: str = ""
    lease_duration: float = declare(15.0, Duration(1.0))
    renew_deadline: float = declare(10.0, Duration())
    retry_period: float = declare(2.0, Duration())
    #: On SIGTERM: how long running passes may finish before they are abandoned.
    shutdown_grace: float = declare(30.0, Duration(0.0))
    #: /healthz fails when the scheduler has not ticked for this long.
    stuck_after: float = declare(120.0, Duration(1.0))
    #: Per-app backoff after failures: base doubles per consecutive failure, up to cap.
    backoff_base: float = declare(10.0, Duration())
    backoff_cap: float = declare(600.0, Duration())
    #: How often the config file is checked for changes (0 disables reloading).
    reload_interval: float = declare(5.0, Duration(0.0))
    #: Where people reach this agent's HTTP server (``https://gitops.example.com``): the links in
    #: notifications and commit statuses, and the status page's deep links ("": no links).
    public_url: str = ""
    #: Host names both listeners answer to, besides IP literals, ``localhost`` and the host of
    #: ``public_url``; a request naming any other ``Host`` is refused (421: DNS rebinding).
    allowed_hosts: tuple[str, ...] = ()
    #: Both listeners: seconds a client has, in total, to send a request's headers (from the
    #: connection's opening or its previous answer), and then its body; past either the
    #: connection is closed (the receiver's body deadline is ``[receiver] read_timeout``).
    header_timeout: float = declare(10.0, Duration(0.1))
    body_timeout: float = declare(10.0, Duration(0.1))
    #: Both listeners: open connections at most (more wait to be accepted), and worker threads.
    max_connections: int = declare(100, AT_LEAST_1)
    http_threads: int = declare(4, AT_LEAST_1)
    #: ``POST /sync``: seconds between two forced passes of one app (sooner: 429).
    sync_interval: float = declare(10.0, Duration(0.0))


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
    commit: str = declare(
        "", Pattern(re.compile(r"[0-9a-f]{7,40}\Z"), "must be a hexadecimal commit SHA, got {value!r}")
    )
    poll_interval: float = declare(60.0, Duration(1.0))
    timeout: float = declare(60.0, Duration())
    shallow: bool = False
    #: Checkouts kept besides the current one (garbage collection).
    keep_checkouts: int = declare(3, AT_LEAST_1)
    auth: SourceAuth = field(default_factory=SourceAuth)
    verify: SourceVerify = field(default_factory=SourceVerify)

    @property
    def ref(self) -> str:
        """Human spelling of what is followed: ``branch main``, ``tag v1``, ``commit abc``."""
        if self.commit:
            return f"commit {self.commit}"
        if self.tag:
            return f"tag {self.tag}"
        return f"branch {self.branch or DEFAULT_BRANCH}"


@dataclass(frozen=True)
class Decryption:
    """Where an app's age identities come from, for SOPS-encrypted manifests (docs/secrets.md).

    A `decryption` table replaces the one it inherits as a whole (`[defaults]` → cluster →
    app), so an app given its own keys never gets its cluster's as well.
    """

    #: A file of age identities (`AGE-SECRET-KEY-1…`, one a line), on the agent's machine.
    age_key_file: str = ""
    #: An environment variable holding age identities.
    age_key_env: str = declare("", Pattern(VAR_NAME, "not an environment variable name: {value!r}"))
    #: A Secret in the cluster the app goes to, whose keys ending in `.agekey` hold identities.
    secret_name: str = declare("", Pattern(DNS_SUBDOMAIN, "not a valid Secret name: {value!r}"))
    #: Its namespace ("": `[agent] namespace`).
    secret_namespace: str = declare("", NAMESPACE)
    #: Public keys (`age1…`) every encrypted file of the app must be encrypted to
    #: (checked by `diff --offline`, which has no private key).
    age_recipients: tuple[str, ...] = declare(
        (),
        Pattern(
            _AGE_RECIPIENT, "not an age public key (age1 and 58 bech32 characters): {value!r}", optional=False
        ),
    )

    @property
    def has_keys(self) -> bool:
        """Some source of identities is configured."""
        return bool(self.age_key_file or self.age_key_env or self.secret_name)


@dataclass(frozen=True)
class ClusterSettings:
    """Everything a `[defaults]` table may set and a `[[clusters]]` entry may override."""

    field_manager: str = ""  # empty: the agent name
    reconcile_interval: float = declare(300.0, Duration())
    prune: bool = True
    allow_empty: bool = False
    max_prune_fraction: float = declare(
        0.5, Bound(0, 1, open_low=True, message="must be in (0, 1], got {value}")
    )
    brake_min_inventory: int = declare(10, AT_LEAST_0)
    max_prune: int | None = declare(None, AT_LEAST_0)
    adopt: Adopt = Adopt.IF_UNOWNED
    default_namespace: str = declare("default", Pattern(DNS_LABEL, NAMESPACE.message, optional=False))
    propagation_policy: PropagationPolicy = PropagationPolicy.BACKGROUND
    connect_timeout: float = declare(5.0, Duration())
    request_timeout: float = declare(30.0, Duration())
    pass_deadline: float = declare(300.0, Duration())
    concurrency: int = declare(8, AT_LEAST_1)
    exclude: tuple[str, ...] = ()
    render_timeout: float = declare(60.0, Duration())
    #: Bytes of memory (``RLIMIT_DATA``) each kustomize/helm/sops child of a render may use.
    render_memory: int = declare(DEFAULT_RENDER_MEMORY, Size(MIN_RENDER_MEMORY))
    #: Follow health after apply: every applied object (``true``), those listed, or none.
    wait: Wait = field(default_factory=Wait)
    #: Seconds a wait may last: what is still not Current then is Failed (naming why).
    health_timeout: float = declare(300.0, Duration())
    #: Seconds a Failed health must hold before it counts (shorter flaps read InProgress).
    health_debounce: float = declare(30.0, Duration(0.0))
    #: Seconds one sync wave may take to become healthy before the app fails, naming what it
    #: waited for (docs/ordering.md); later waves and the prune are not done then.
    wave_timeout: float = declare(300.0, Duration())
    #: SOPS decryption keys (the `decryption` table).
    decryption: Decryption = Decryption()
    #: The Kubernetes release the cluster is to be upgraded to ("1.36"; "": none): objects using
    #: versions it removes are reported; renders without a cluster render charts for it.
    kubernetes_version: str = declare("", Parsed(parse_release))
    #: "namespace/name" of the ServiceAccount every request for the app is made as (impersonated);
    #: "" for the agent's own identity.
    service_account: str = declare(
        "", Pattern(_SERVICE_ACCOUNT, 'must be "namespace/name" of a ServiceAccount, got {value!r}')
    )
    #: Globs of the namespaces the app's namespaced objects may be in.
    allowed_namespaces: tuple[str, ...] = declare(("*",), _GLOB)
    #: Globs of the kinds the app may declare, spelled ``Kind`` or ``Kind.group`` (``Deployment.apps``).
    allowed_kinds: tuple[str, ...] = declare(("*",), _GLOB)
    #: Whether the app may declare cluster-scoped objects (Namespaces, ClusterRoles, CRDs, ...).
    allow_cluster_scoped: bool = True
    #: ``${NAME}`` substitution (``substitutes``): ``None`` (unset) on where vars reach the app.
    substitute: bool | None = None
    #: Create the app's target namespace if missing (as the app, inside allowed_namespaces, never pruned).
    create_namespace: bool = False
    #: Drift of Git-declared fields: corrected each pass, or reported and left until a new revision.
    drift: DriftMode = DriftMode.CORRECT


@dataclass(frozen=True)
class ClusterConfig:
    name: str = field(metadata=accepts(LABEL))
    #: The entry's own `path`/`paths` (its implicit app's); () when only `[[apps]]` serve it.
    paths: tuple[str, ...]
    settings: ClusterSettings
    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False
    vars: dict[str, str] = field(default_factory=dict)
    helm: HelmSettings | None = None

    @property
    def has_app(self) -> bool:
        """The entry is an app of its own: `path`/`paths`, or a chart from a repository."""
        return bool(self.paths or (self.helm and self.helm.repository))


@dataclass(frozen=True)
class ConflictRule:
    """``(manager glob, operation, subresource) → force | yield``; first match wins."""

    manager: str
    action: str = field(
        metadata=accepts(
            Pattern(re.compile(r"(force|yield)\Z"), "must be force or yield, got {value!r}", optional=False)
        )
    )
    operation: str = declare(
        "*",
        Pattern(
            re.compile(r"(\*|Apply|Update)\Z"), "must be Apply, Update or *, got {value!r}", optional=False
        ),
    )
    subresource: str = "*"

    def matches(self, manager: str, operation: str, subresource: str) -> bool:
        return (
            fnmatch.fnmatchcase(manager, self.manager)
            and self.operation in ("*", operation)
            and (self.subresource == "*" or self.subresource == subresource)
        )


#: The defaults of docs/safety.md rule 5: a hand `kubectl scale` is drift like any hand edit
#: (first, before the `scale` yield); yield to autoscalers writing through `scale` (an HPA, and
#: KEDA through its HPA, write as kube-controller-manager) and to the controller manager; take
#: over from kubectl and restore tools.
DEFAULT_CONFLICT_RULES: tuple[ConflictRule, ...] = (
    ConflictRule(manager="kubectl*", subresource="scale", action="force"),
    ConflictRule(manager="*", subresource="scale", action="yield"),
    ConflictRule(manager="kube-controller-manager", action="yield"),
    ConflictRule(manager="kubectl", action="force"),
    ConflictRule(manager="kubectl-*", action="force"),
    ConflictRule(manager="before-first-apply", action="force"),
    ConflictRule(manager="velero*", action="force"),
)

#: The source of implicit apps, and of `[[apps]]` that name none: `[source]`, or the
#: `[[sources]]` entry of this name.
DEFAULT_SOURCE = "default"

#: `[defaults]` keys an `[[apps]]` entry may override. The others (field manager, connection
#: timeouts, pass deadline, concurrency) belong to the cluster, shared by all its apps.
APP_SETTING_KEYS = frozenset(
    {
        "prune",
        "allow_empty",
        "max_prune_fraction",
        "brake_min_inventory",
        "max_prune",
        "adopt",
        "reconcile_interval",
        "propagation_policy",
        "default_namespace",
        "create_namespace",
        "drift",
        "render_timeout",
        "render_memory",
        "exclude",
        "wait",
        "health_timeout",
        "health_debounce",
        "wave_timeout",
        "decryption",
        "service_account",
        "allowed_namespaces",
        "allowed_kinds",
        "allow_cluster_scoped",
        "substitute",
    }
)


def substitutes(setting: bool | None, variables: Mapping[str, str]) -> bool:
    """Whether an app's manifests get ``${NAME}`` substituted: ``substitute`` when set, else
    whether any variable reaches the app (its own or its cluster's). So a config that has vars
    keeps every ``${X}`` substituted (none is ever applied literally), and one without vars
    reads Grafana dashboards' and shell scripts' ``${...}`` as written, as kubectl does."""
    return bool(variables) if setting is None else setting


@dataclass(frozen=True)
class NamedSource:
    """A `[[sources]]` entry; `[source]` is the one named `default`."""

    name: str = field(metadata=accepts(LABEL))
    config: SourceConfig


@dataclass(frozen=True)
class AppConfig:
    """One app on one cluster: the unit of inventory, render failure, brake and suspension.

    An `[[apps]]` entry with ``clusters = [...]`` is one AppConfig per cluster. A
    `[[clusters]]` entry with `path`/`paths` is also an app (``implicit``), named after the
    entry, whose inventory is the cluster's pre-apps ApplySet parent, so upgrading changes
    nothing on the cluster.
    """

    name: str = field(metadata=accepts(LABEL))
    cluster: str
    paths: tuple[str, ...]
    #: Merged defaults → cluster → app (an app overrides only ``APP_SETTING_KEYS``).
    settings: ClusterSettings
    #: The app's own `[[apps.conflict_rules]]`, else the global list.
    conflict_rules: tuple[ConflictRule, ...] = DEFAULT_CONFLICT_RULES
    #: The app's own `[[apps.health_checks]]`, else the global `[[health_checks]]`.
    health_checks: tuple[HealthCheck, ...] = ()
    source: str = DEFAULT_SOURCE
    #: The app's variables merged over the cluster's.
    vars: dict[str, str] = field(default_factory=dict)
    helm: HelmSettings | None = None
    #: Apps on the same cluster that must have succeeded at the current revision first.
    depends_on: tuple[str, ...] = ()
    suspend: bool = False
    implicit: bool = False
    #: The app's previous name on this cluster, whose objects it takes over without re-creating.
    renamed_from: str = declare("", Pattern(DNS_LABEL, "must be a DNS label (an app's name), got {value!r}"))
    #: The app's own `[[apps.ignore]]`, else the global `[[ignore]]`.
    ignore: tuple[IgnoreRule, ...] = ()


def implicit_app(
    cluster: ClusterConfig,
    rules: tuple[ConflictRule, ...],
    checks: tuple[HealthCheck, ...] = (),
    ignore: tuple[IgnoreRule, ...] = (),
) -> AppConfig:
    """The app a `[[clusters]]` entry with `path`/`paths` is: exactly what the entry was before apps."""
    return AppConfig(
        name=cluster.name,
        cluster=cluster.name,
        paths=cluster.paths,
        settings=cluster.settings,
        conflict_rules=rules,
        health_checks=checks,
        vars=cluster.vars,
        helm=cluster.helm,
        implicit=True,
        ignore=ignore,
    )


#: The defaults as values, for whatever takes a setting's default without a config at hand
#: (option dataclasses: ``concurrency: int = CLUSTER_DEFAULTS.concurrency``).
AGENT_DEFAULTS: Final = AgentSettings()
CLUSTER_DEFAULTS: Final = ClusterSettings()


@dataclass(frozen=True)
class Config:
    agent: AgentSettings
    #: The source named `default`. A config without one (only other `[[sources]]`) has no
    #: implicit app, so no cluster has `paths`; this then holds the first source, for callers
    #: that do not know apps yet. App-aware code reads ``source_named(app.source)``.
    source: SourceConfig
    clusters: tuple[ClusterConfig, ...]
    conflict_rules: tuple[ConflictRule, ...] = DEFAULT_CONFLICT_RULES
    #: The global `[[health_checks]]`: every app's that sets none of its own.
    health_checks: tuple[HealthCheck, ...] = ()
    file: str = ""
    #: Every source by name, `default` first when there is one, then in config order.
    sources: tuple[NamedSource, ...] = ()
    #: Every (app, cluster): the implicit apps of `[[clusters]]` entries in their order, then
    #: `[[apps]]` entries in theirs, each expanded over its clusters in the order listed.
    apps: tuple[AppConfig, ...] = ()
    #: `[[notifications]]`, `[alerts]`, `[receiver]` and `[[receivers]]` (docs/notifications.md).
    notifications: tuple[NotificationConfig, ...] = ()
    alerts: AlertSettings = ALERT_DEFAULTS
    receiver: ReceiverSettings = RECEIVER_DEFAULTS
    receivers: tuple[HookConfig, ...] = ()
    #: `[[windows]]`: when the agent may write to which apps (docs/operations.md, change windows).
    windows: tuple[ChangeWindow, ...] = ()
    #: The global `[[ignore]]`: every app's that sets none of its own.
    ignore: tuple[IgnoreRule, ...] = ()
    #: `[[helm_repositories]]`: credentials and trust for chart repositories, by URL prefix.
    helm_repositories: tuple[HelmRepository, ...] = ()

    def cluster(self, name: str) -> ClusterConfig:
        for c in self.clusters:
            if c.name == name:
                return c
        raise ConfigError(
            "clusters", f"no cluster named {name!r} (have: {', '.join(c.name for c in self.clusters)})"
        )

    def field_manager(self, cluster: ClusterConfig) -> str:
        return cluster.settings.field_manager or self.agent.name

    def apps_of(self, cluster: str) -> tuple[AppConfig, ...]:
        """The apps on one cluster, in config order (the implicit app first)."""
        return tuple(a for a in self.apps if a.cluster == cluster)

    def app(self, cluster: str, name: str) -> AppConfig:
        """One app, as named beside ``--cluster`` by ``--app``; ConfigError naming the known ones."""
        apps = self.apps_of(self.cluster(cluster).name)
        for a in apps:
            if a.name == name:
                return a
        raise ConfigError(
            "apps",
            f"no app named {name!r} on cluster {cluster!r} (have: {', '.join(a.name for a in apps)})",
        )

    def source_named(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s.config
        raise ConfigError(
            "sources", f"no source named {name!r} (have: {', '.join(s.name for s in self.sources)})"
        )
