"""The agent's configuration as typed values: the one home of every default and enum.

Everything that reads settings (the loader, option dataclasses of the stages,
the daemon, the CLI's choices) takes its defaults and spellings from here, so
that two copies of a default cannot drift apart; ``config.example.toml`` and
docs/configuration.md are tested against these types (tests/test_docs.py), and
the stages' option dataclasses against these defaults (tests/test_config_defaults.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from agent.config.health_checks import HealthCheck, Wait
from agent.errors import ConfigError


class Adopt(StrEnum):
    """Whether a pass takes over an existing object that is not ours (``adopt``)."""

    NEVER = "never"
    #: Only an object with no part-of label, no ownerReferences and no other manager's Apply entry.
    IF_UNOWNED = "if-unowned"
    ALWAYS = "always"


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


def choices(kind: type[StrEnum]) -> list[str]:
    """The spellings a setting accepts: for the loader's checks and the CLI's ``click.Choice``."""
    return [m.value for m in kind]


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
    name: str = "gitops-agent"
    #: Namespace that holds the ApplySet parents (one per cluster, in that cluster).
    namespace: str = "gitops-agent"
    #: Where Git clones, checkouts and render caches live.
    cache_dir: str = "~/.cache/gitops-agent/work"
    log_format: LogFormat = LogFormat.CONSOLE
    log_level: LogLevel = LogLevel.INFO
    #: host:port of the health/metrics/status HTTP server of `run` (empty disables it).
    listen: str = "127.0.0.1:8080"
    #: File holding the status page's token: required to read the page on any address but
    #: loopback (without one the page is off there; the probes and /metrics stay open).
    ui_token_file: str = ""
    #: Kubernetes Leases shard clusters across replicas: "auto" (on in a Pod or with a
    #: management kubeconfig), "on" or "off".
    leases: Leases = Leases.AUTO
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
    #: Per-app backoff after failures: base doubles per consecutive failure, up to cap.
    backoff_base: float = 10.0
    backoff_cap: float = 600.0
    #: How often the config file is checked for changes (0 disables reloading).
    reload_interval: float = 5.0
    #: Where people reach this agent's HTTP server (``https://gitops.example.com``): the links in
    #: notifications and commit statuses, and the status page's deep links ("": no links).
    public_url: str = ""
    #: Host names both listeners answer to, besides IP literals, ``localhost`` and the host of
    #: ``public_url``; a request naming any other ``Host`` is refused (421: DNS rebinding).
    allowed_hosts: tuple[str, ...] = ()
    #: Both listeners: seconds a client has, in total, to send a request's headers (from the
    #: connection's opening or its previous answer), and then its body; past either the
    #: connection is closed (the receiver's body deadline is ``[receiver] read_timeout``).
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    #: Both listeners: open connections at most (more wait to be accepted), and worker threads.
    max_connections: int = 100
    http_threads: int = 4
    #: ``POST /sync``: seconds between two forced passes of one app (sooner: 429).
    sync_interval: float = 10.0


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
        return f"branch {self.branch or DEFAULT_BRANCH}"


@dataclass(frozen=True)
class HelmSettings:
    chart: str = ""
    release_name: str = ""
    namespace: str = ""
    values_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decryption:
    """Where an app's age identities come from, for SOPS-encrypted manifests (docs/secrets.md).

    A `decryption` table replaces the one it inherits as a whole (`[defaults]` → cluster →
    app), so an app given its own keys never gets its cluster's as well.
    """

    #: A file of age identities (`AGE-SECRET-KEY-1…`, one a line), on the agent's machine.
    age_key_file: str = ""
    #: An environment variable holding age identities.
    age_key_env: str = ""
    #: A Secret in the cluster the app goes to, whose keys ending in `.agekey` hold identities.
    secret_name: str = ""
    #: Its namespace ("": `[agent] namespace`).
    secret_namespace: str = ""
    #: Public keys (`age1…`) every encrypted file of the app must be encrypted to
    #: (checked by `diff --offline`, which has no private key).
    age_recipients: tuple[str, ...] = ()

    @property
    def has_keys(self) -> bool:
        """Some source of identities is configured."""
        return bool(self.age_key_file or self.age_key_env or self.secret_name)


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
    adopt: Adopt = Adopt.IF_UNOWNED
    default_namespace: str = "default"
    propagation_policy: PropagationPolicy = PropagationPolicy.BACKGROUND
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    pass_deadline: float = 300.0
    concurrency: int = 8
    exclude: tuple[str, ...] = ()
    render_timeout: float = 60.0
    #: Bytes of memory (``RLIMIT_DATA``) each kustomize/helm/sops child of a render may use.
    render_memory: int = DEFAULT_RENDER_MEMORY
    #: Follow health after apply: every applied object (``true``), those listed, or none.
    wait: Wait = field(default_factory=Wait)
    #: Seconds a wait may last: what is still not Current then is Failed (naming why).
    health_timeout: float = 300.0
    #: Seconds a Failed health must hold before it counts (shorter flaps read InProgress).
    health_debounce: float = 30.0
    #: SOPS decryption keys (the `decryption` table).
    decryption: Decryption = Decryption()
    #: The Kubernetes release the cluster is to be upgraded to ("1.36"; "": none): objects using
    #: versions it removes are reported; renders without a cluster render charts for it.
    kubernetes_version: str = ""
    #: "namespace/name" of the ServiceAccount every request for the app is made as (impersonated);
    #: "" for the agent's own identity.
    service_account: str = ""
    #: Globs of the namespaces the app's namespaced objects may be in.
    allowed_namespaces: tuple[str, ...] = ("*",)
    #: Globs of the kinds the app may declare, spelled ``Kind`` or ``Kind.group`` (``Deployment.apps``).
    allowed_kinds: tuple[str, ...] = ("*",)
    #: Whether the app may declare cluster-scoped objects (Namespaces, ClusterRoles, CRDs, ...).
    allow_cluster_scoped: bool = True
    #: ``${NAME}`` substitution (``substitutes``): ``None`` (unset) on where vars reach the app.
    substitute: bool | None = None
    #: Create the app's target namespace if missing (as the app, inside allowed_namespaces, never pruned).
    create_namespace: bool = False


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    #: The entry's own `path`/`paths` (its implicit app's); () when only `[[apps]]` serve it.
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
        "render_timeout",
        "render_memory",
        "exclude",
        "wait",
        "health_timeout",
        "health_debounce",
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

    name: str
    config: SourceConfig


@dataclass(frozen=True)
class AppConfig:
    """One app on one cluster: the unit of inventory, render failure, brake and suspension.

    An `[[apps]]` entry with ``clusters = [...]`` is one AppConfig per cluster. A
    `[[clusters]]` entry with `path`/`paths` is also an app (``implicit``), named after the
    entry, whose inventory is the cluster's pre-apps ApplySet parent, so upgrading changes
    nothing on the cluster.
    """

    name: str
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
    renamed_from: str = ""


def implicit_app(
    cluster: ClusterConfig, rules: tuple[ConflictRule, ...], checks: tuple[HealthCheck, ...] = ()
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
    )


class SinkKind(StrEnum):
    """Where a ``[[notifications]]`` entry sends (``kind``)."""

    #: Any HTTP endpoint: Flux's event JSON, signed Flux's way (``X-Signature``).
    WEBHOOK = "webhook"
    #: A Slack incoming webhook.
    SLACK = "slack"
    #: GitHub commit statuses (``POST /repos/{owner}/{repo}/statuses/{sha}``).
    GITHUB = "github"
    #: GitLab commit statuses (``POST /api/v4/projects/{id}/statuses/{sha}``).
    GITLAB = "gitlab"


#: Sinks that receive commit statuses; the others receive alerts.
STATUS_SINKS: Final = frozenset({SinkKind.GITHUB, SinkKind.GITLAB})


class Severity(StrEnum):
    """An alert's severity (Flux's two): ``error`` while failing, ``info`` when resolved."""

    INFO = "info"
    ERROR = "error"


class HookKind(StrEnum):
    """Which Git host's webhook a ``[[receivers]]`` entry verifies (``kind``)."""

    #: ``X-Hub-Signature-256`` (HMAC-SHA256 of the body), ``X-GitHub-Delivery``, ``X-GitHub-Event``.
    GITHUB = "github"
    #: ``X-Gitlab-Token`` (compared in constant time), ``X-Gitlab-Event-UUID``, ``X-Gitlab-Event``.
    GITLAB = "gitlab"
    #: ``X-Gitops-Signature`` (HMAC-SHA256 of timestamp and body), ``X-Gitops-Timestamp``,
    #: ``X-Gitops-Delivery``: the same scheme the webhook sink signs with.
    GENERIC = "generic"


@dataclass(frozen=True)
class SecretRef:
    """A secret named by the config: read from a file or an environment variable, never written there.

    ``value`` is the only thing that does not belong in the config; readers load it
    (``agent.notify.secrets``) and mask it wherever text leaves the agent.
    """

    file: str = ""
    env: str = ""
    #: A value that is not secret (a ``url`` written in the config), still masked when shown.
    value: str = ""

    def __bool__(self) -> bool:
        return bool(self.file or self.env or self.value)

    @property
    def where(self) -> str:
        """Where it comes from, for error messages (never the value)."""
        if self.file:
            return f"file {self.file}"
        if self.env:
            return f"environment variable {self.env}"
        return "the config"


@dataclass(frozen=True)
class NotificationConfig:
    """One ``[[notifications]]`` entry: a sink and the filter of what it is sent."""

    name: str
    kind: SinkKind
    #: The address (webhook, Slack: a Slack webhook URL carries its token, so it is a secret).
    url: SecretRef = field(default_factory=SecretRef)
    #: GitHub/GitLab API token.
    token: SecretRef = field(default_factory=SecretRef)
    #: Webhook: the HMAC key of ``X-Signature`` (none: unsigned).
    secret: SecretRef = field(default_factory=SecretRef)
    #: GitHub/GitLab API root ("": ``https://api.github.com``, ``https://gitlab.com``).
    api_url: str = ""
    #: GitHub ``owner/repo``, GitLab project path or id ("": from the app's source URL).
    repository: str = ""
    #: Globs of the clusters and apps it hears about.
    clusters: tuple[str, ...] = ("*",)
    apps: tuple[str, ...] = ("*",)
    #: The least severity sent: ``info`` (alerts and their resolution) or ``error`` (alerts only).
    severity: Severity = Severity.INFO
    #: Only these reasons (``ReconcileFailed``, ``HealthFailed``, ...); empty: every reason.
    reasons: tuple[str, ...] = ()
    #: Seconds one attempt may take (connect and answer).
    timeout: float = 10.0
    #: Attempts after the first one fails (connection error, timeout, 429, 5xx).
    retries: int = 3
    #: Seconds before the first retry; doubles per retry.
    retry_backoff: float = 1.0
    #: Messages waiting for this sink at most; when full, the oldest is dropped (and counted).
    queue_size: int = 100
    #: Webhook: also sign timestamp and body (``X-Gitops-Timestamp``, ``X-Gitops-Signature``),
    #: for receivers that refuse replays.
    timestamped: bool = False

    def wants(self, cluster: str, app: str) -> bool:
        return any(fnmatch.fnmatchcase(cluster, g) for g in self.clusters) and any(
            fnmatch.fnmatchcase(app, g) for g in self.apps
        )


@dataclass(frozen=True)
class AlertSettings:
    """``[alerts]``: when a failing condition is announced, reminded of, and resolved."""

    #: A failing pass alerts after this many consecutive failed passes of the app...
    after_failures: int = 3
    #: ...or once it has failed for this many seconds (0: only the count).
    after: float = 0.0
    #: Seconds between reminders while it keeps failing; the last one repeats (empty: none).
    remind: tuple[float, ...] = (300.0, 1800.0, 7200.0)


@dataclass(frozen=True)
class ReceiverSettings:
    """``[receiver]``: the listener Git hosts send push webhooks to (apart from ``[agent] listen``)."""

    #: host:port ("": no receiver).
    listen: str = ""
    #: Larger bodies are refused (413) from their ``Content-Length``, before they are read.
    max_body_bytes: int = 1_048_576
    #: All hooks together: requests per minute, and how many may come at once.
    rate_limit: int = 600
    burst: int = 100
    #: Requests handled at once; more are answered 503.
    max_in_flight: int = 16
    #: Seconds a client may take to send its request.
    read_timeout: float = 10.0
    #: How long a delivery id is remembered: the same id again is a replay (409).
    replay_window: float = 86400.0
    #: Generic hooks: how far ``X-Gitops-Timestamp`` may be from now.
    timestamp_tolerance: float = 300.0


@dataclass(frozen=True)
class HookConfig:
    """One ``[[receivers]]`` entry: ``POST /hook/<name>`` from one Git host."""

    name: str
    kind: HookKind
    secret: SecretRef = field(default_factory=SecretRef)
    #: Also accepted while secrets are rotated.
    previous_secret: SecretRef = field(default_factory=SecretRef)
    #: The sources a push may concern (empty: every source).
    sources: tuple[str, ...] = ()
    #: GitHub: accept ``X-Hub-Signature`` (HMAC-SHA1) when no SHA-256 signature came.
    allow_sha1: bool = False
    #: This hook's requests per minute and burst (over it: 429).
    rate_limit: int = 60
    burst: int = 20


ALERT_DEFAULTS: Final = AlertSettings()
RECEIVER_DEFAULTS: Final = ReceiverSettings()


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
