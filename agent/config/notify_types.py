"""The notification tables as typed values: ``[[notifications]]`` (``NotificationConfig``, its
``SinkKind`` and ``Severity``), ``[alerts]``, ``[receiver]`` and ``[[receivers]]`` (``HookConfig``).

Part of ``agent.config.types``, which re-exports every name: the one home of their defaults, read
by ``agent.config.notify`` (the loader) and ``agent.notify`` (the sinks and the receiver).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from agent.config.constraints import AT_LEAST_1, LABEL, LISTEN, Bound, Duration, Pattern, accepts, declare

_REASON = Pattern(re.compile(r"^[A-Z][A-Za-z]*$"), "not a reason (CamelCase): {value!r}", optional=False)


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

    name: str = field(metadata=accepts(LABEL))
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
    reasons: tuple[str, ...] = declare((), _REASON)
    #: Seconds one attempt may take (connect and answer).
    timeout: float = declare(10.0, Duration())
    #: Attempts after the first one fails (connection error, timeout, 429, 5xx).
    retries: int = declare(3, Bound(0, 10, message="must be 0 to 10, got {value}"))
    #: Seconds before the first retry; doubles per retry.
    retry_backoff: float = declare(1.0, Duration())
    #: Messages waiting for this sink at most; when full, the oldest is dropped (and counted).
    queue_size: int = declare(100, AT_LEAST_1)
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
    after_failures: int = declare(3, AT_LEAST_1)
    #: ...or once it has failed for this many seconds (0: only the count).
    after: float = declare(0.0, Duration(0.0))
    #: Seconds between reminders while it keeps failing; the last one repeats (empty: none).
    remind: tuple[float, ...] = (300.0, 1800.0, 7200.0)


@dataclass(frozen=True)
class ReceiverSettings:
    """``[receiver]``: the listener Git hosts send push webhooks to (apart from ``[agent] listen``)."""

    #: host:port ("": no receiver).
    listen: str = declare("", Pattern(LISTEN, "must be host:port (or empty to disable), got {value!r}"))
    #: Larger bodies are refused (413) from their ``Content-Length``, before they are read.
    max_body_bytes: int = declare(1_048_576, AT_LEAST_1)
    #: All hooks together: requests per minute, and how many may come at once.
    rate_limit: int = declare(600, AT_LEAST_1)
    burst: int = declare(100, AT_LEAST_1)
    #: Requests handled at once; more are answered 503.
    max_in_flight: int = declare(16, AT_LEAST_1)
    #: Seconds a client may take to send its request.
    read_timeout: float = declare(10.0, Duration())
    #: How long a delivery id is remembered: the same id again is a replay (409).
    replay_window: float = declare(86400.0, Duration(1.0))
    #: Generic hooks: how far ``X-Gitops-Timestamp`` may be from now.
    timestamp_tolerance: float = declare(300.0, Duration(1.0))


@dataclass(frozen=True)
class HookConfig:
    """One ``[[receivers]]`` entry: ``POST /hook/<name>`` from one Git host."""

    name: str = field(metadata=accepts(LABEL))
    kind: HookKind
    secret: SecretRef = field(default_factory=SecretRef)
    #: Also accepted while secrets are rotated.
    previous_secret: SecretRef = field(default_factory=SecretRef)
    #: The sources a push may concern (empty: every source).
    sources: tuple[str, ...] = ()
    #: GitHub: accept ``X-Hub-Signature`` (HMAC-SHA1) when no SHA-256 signature came.
    allow_sha1: bool = False
    #: This hook's requests per minute and burst (over it: 429).
    rate_limit: int = declare(60, AT_LEAST_1)
    burst: int = declare(20, AT_LEAST_1)


ALERT_DEFAULTS: Final = AlertSettings()
RECEIVER_DEFAULTS: Final = ReceiverSettings()
