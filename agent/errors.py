"""The agent's error tree, drawn once.

::

    AgentError                      base; ``retryable`` says whether a later pass may succeed
    ├── ConfigError                 bad config file: names the key path (``clusters[1].kubeconfig``)
    ├── SourceError                 Git: unreachable, auth, missing ref, bad signature (URL masked)
    │   └── ChartError              a chart repository: down, refused, bad index, no match, tampered
    ├── RenderError                 every problem of one cluster's render, each with file/line
    ├── ClusterError                a cluster as a whole: unreachable, timed out, credentials refused
    │   └── ApiError                one API request answered with an error status (and its Status details),
    │                               or not answered at all (status 0, ``transport`` says why)
    ├── ClusterRefused              the whole cluster left alone: another entry shares its inventory
    ├── ScopeError                  an app declares objects outside its scope: fails like a render
    ├── AccessDenied                an app's preflight: its ServiceAccount is missing or lacks a rule
    └── LocalClusterError           the local control plane (tests, demo, benchmarks) failed to start

Per-object failures and prune refusals are *results* (``model.ApplyResult``,
``model.PruneRefusal``); exceptions are for failures that end a stage for a
whole cluster, and ``failure()`` turns one into the pass's typed
``model.Failure``. What an error *is* comes from its type, the HTTP status and
the server's ``Status`` (reason, details, causes), never from message text.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from agent.model import AccessProblem, DecryptFault, Failure, FailureReason, Refusal, ScopeViolation


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""

    retryable: bool = False
    #: Why a pass that ends with this error failed (the metric label).
    failure_reason: FailureReason = FailureReason.API

    def failure(self) -> Failure:
        """This error as the typed failure of a pass."""
        return Failure(self.failure_reason, str(self))


class AppFailed(AgentError):
    """An app's pass ended before it was planned (render, scope, claim, source), raised as its
    typed failure for callers that act on that one app (``takeover``)."""

    def __init__(self, failure: Failure) -> None:
        self._failure = failure
        self.failure_reason = failure.reason
        super().__init__(failure.message)

    def failure(self) -> Failure:
        return self._failure


class ConfigError(AgentError):
    """The configuration is invalid. ``path`` names the key, e.g. ``clusters[1].kubeconfig``."""

    def __init__(self, path: str, message: str, *, file: str | None = None) -> None:
        self.path = path
        self.message = message
        self.file = file
        where = f"{file}: " if file else ""
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")


class SourceError(AgentError):
    """Git could not deliver the requested revision. ``url`` never contains credentials."""

    def __init__(self, message: str, *, url: str = "", retryable: bool = True) -> None:
        self.url = url
        self.retryable = retryable
        super().__init__(f"{url}: {message}" if url else message)


class ChartProblem(enum.StrEnum):
    """Why a chart could not be fetched from its repository (``ChartError.problem``)."""

    #: A dependency of the chart is neither vendored nor fetchable: no repository, an unknown
    #: repository name, a ``file://`` path leaving the repository, a version its chart does not have.
    DEPENDENCY = "dependency"
    #: No answer: connection refused or timed out, a name that does not resolve, a 5xx.
    UNREACHABLE = "unreachable"
    #: 401 or 403: credentials missing or refused.
    UNAUTHORIZED = "unauthorized"
    #: The repository's certificate or the TLS handshake failed.
    TLS = "tls"
    #: Any other answer that is not the index or the archive (404, too many redirects).
    HTTP = "http"
    #: ``index.yaml`` is too large, does not parse, or lists no such chart.
    INDEX = "index"
    #: No version of the chart matches the constraint.
    NO_MATCH = "no-match"
    #: The archive's digest is not the index's (or the index gives none).
    DIGEST = "digest"
    #: The archive is too large, does not unpack, or holds a path or file type it may not.
    ARCHIVE = "archive"
    #: OCI: the tag's manifest is not a Helm chart's (media types), or does not parse.
    MANIFEST = "manifest"
    #: ``verify = true``: the chart is unsigned, or its signature does not check out (cosign for
    #: OCI; the ``.prov`` file for HTTP(S): missing, not signed by the keyring, another digest).
    SIGNATURE = "signature"


class ChartError(SourceError):
    """A chart could not be fetched: the app fails closed with reason ``chart``, its last good
    chart in force. ``url`` is the repository's, never with credentials."""

    failure_reason = FailureReason.CHART

    def __init__(self, problem: ChartProblem, message: str, *, url: str, constraint: str = "") -> None:
        self.problem = problem
        self.detail = message
        self.constraint = constraint
        wanted = f" (version {constraint!r})" if constraint else ""
        super().__init__(f"{problem}{wanted}: {message}", url=url)


class RenderLimit(enum.StrEnum):
    """Which bound of the render sandbox stopped a tool (typed: the render cache reads it)."""

    #: The child reached ``render_memory`` (its ``RLIMIT_DATA``).
    MEMORY = "memory"


@dataclass(frozen=True)
class RenderProblem:
    """One thing wrong with one file; ``line``/``column`` are 1-based when known."""

    file: str
    message: str
    line: int | None = None
    column: int | None = None
    #: Set when the problem is an encrypted file that did not decrypt.
    fault: DecryptFault | None = None
    #: Set when a render tool was stopped by a bound of the sandbox.
    limit: RenderLimit | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.message}"


class RenderError(AgentError):
    """A cluster's render failed; carries every problem found, not just the first."""

    failure_reason = FailureReason.RENDER

    def __init__(
        self, problems: list[RenderProblem] | tuple[RenderProblem, ...], *, cluster: str = "", app: str = ""
    ) -> None:
        self.problems = tuple(problems)
        self.cluster = cluster
        self.app = app
        if app and app != cluster:
            head = f"render of app {app!r} on cluster {cluster!r} failed"
        else:
            head = f"render of cluster {cluster!r} failed" if cluster else "render failed"
        body = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{head} ({len(self.problems)} problem(s)):\n{body}")


class ClusterError(AgentError):
    """A cluster as a whole could not be worked with in this pass."""

    retryable = True

    def __init__(
        self,
        cluster: str,
        message: str,
        *,
        retryable: bool = True,
        failure_reason: FailureReason = FailureReason.API,
    ) -> None:
        self.cluster = cluster
        self.message = message
        self.retryable = retryable
        self.failure_reason = failure_reason
        super().__init__(f"cluster {cluster!r}: {message}")


#: Cause types of a 422 that reject a field's value (``field.ErrorTypeInvalid``/``Forbidden``).
_VALUE_CAUSES = frozenset({"FieldValueInvalid", "FieldValueForbidden"})
#: The validators' sentence for a field that cannot change, at the start of a cause's detail.
_IMMUTABLE = re.compile(r"\S+ is immutable\b")


class Transport(enum.StrEnum):
    """Why a request got no HTTP answer (``ApiError.status`` 0), from the exception's type."""

    CONNECTION_REFUSED = "connection-refused"
    CONNECT_TIMEOUT = "connect-timeout"
    NO_SUCH_HOST = "no-such-host"
    #: Connected, but no answer within the request timeout.
    READ_TIMEOUT = "read-timeout"
    TLS = "tls"
    #: The connection broke (reset, closed mid-answer) or failed in another way.
    BROKEN = "broken"
    #: An answer came but could not be read (a LIST body that is not JSON).
    MALFORMED = "malformed"


_TRANSPORT_REASONS = {
    Transport.READ_TIMEOUT: FailureReason.TIMEOUT,
    Transport.TLS: FailureReason.TLS,
    Transport.MALFORMED: FailureReason.API,
}


@dataclass(frozen=True)
class StatusCause:
    """One ``Status.details.causes[]`` item: ``type`` (JSON key ``reason``, e.g.
    ``FieldManagerConflict``), the server's spelling of the ``field`` (``.data.k``), ``message``."""

    type: str
    field: str = ""
    message: str = ""

    @property
    def detail(self) -> str:
        """What the validator said, without apimachinery's ``<type>: [<bad value>: ]`` prefix.

        ``FieldValueForbidden`` reads ``Forbidden: <detail>``; ``FieldValueInvalid`` reads
        ``Invalid value: <value>: <detail>``, where the value may itself hold ``: `` and the
        detail (a validator's constant such as ``field is immutable``) ends the message.
        """
        if self.type == "FieldValueForbidden":
            return self.message.removeprefix("Forbidden: ")
        if self.type == "FieldValueInvalid":
            return self.message.rpartition(": ")[2]
        return self.message

    @property
    def immutable(self) -> bool:
        """The server refuses to change this field: an Invalid or Forbidden value whose detail is
        one of the validators' "``<field> is immutable``" sentences (``field is immutable``,
        ``… when `immutable` is set``, ``spec is immutable after creation …``, CEL's
        ``Value is immutable``)."""
        return self.type in _VALUE_CAUSES and _IMMUTABLE.match(self.detail) is not None


@dataclass(frozen=True)
class StatusDetails:
    """``Status.details``: the object the error is about and the structured causes."""

    name: str = ""
    group: str = ""
    kind: str = ""
    uid: str = ""
    causes: tuple[StatusCause, ...] = ()


class ApiError(ClusterError):
    """An API request returned an error status (``status`` 0 means no HTTP answer).

    ``details`` is the server's ``Status.details`` when it answered with a ``Status`` (a proxy's
    error page is not one), ``transport`` why there was no answer: callers classify from these,
    ``status`` and ``reason`` (``is_immutable``, ``is_cluster_level``, ...), never from the
    free-text message.
    """

    def __init__(
        self,
        cluster: str,
        status: int,
        message: str,
        *,
        reason: str = "",
        verb: str = "",
        target: str = "",
        retry_after: float | None = None,
        details: StatusDetails | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.details = details
        self.transport = transport
        self.verb = verb
        self.target = target
        self.retry_after = retry_after
        retryable = status == 0 or status == 429 or status >= 500 or status == 409
        what = f"{verb} {target}: " if verb or target else ""
        super().__init__(
            cluster,
            f"{what}HTTP {status} {reason}: {message}".strip(),
            retryable=retryable,
            failure_reason=_failure_reason(status, transport),
        )
        self.api_message = message

    @property
    def causes(self) -> tuple[StatusCause, ...]:
        return self.details.causes if self.details else ()

    @property
    def is_conflict(self) -> bool:
        """409: the object changed since it was read, or a field manager the server knows conflicts."""
        return self.status == 409

    @property
    def is_denied(self) -> bool:
        """A 403 from the API server itself, about this request: a ``Status`` with reason
        ``Forbidden`` and ``details`` (naming the resource for RBAC, a quota or a terminating
        namespace; empty for a non-resource path). A proxy's or gateway's 403 is no ``Status``."""
        return self.status == 403 and self.reason == "Forbidden" and self.details is not None

    @property
    def is_cluster_level(self) -> bool:
        """Says nothing about the object and everything about the cluster: no answer, the
        credentials refused, or a 403 that is not the server denying this one request."""
        return self.status in (0, 401) or (self.status == 403 and not self.is_denied)

    @property
    def immutable_fields(self) -> tuple[str, ...]:
        """The fields a 422 (reason ``Invalid``) names as unchangeable, from its causes."""
        if self.status != 422 or self.reason != "Invalid":
            return ()
        return tuple(c.field for c in self.causes if c.immutable)

    @property
    def is_immutable(self) -> bool:
        """The change hits a field the server will not change (delete and re-create would)."""
        return bool(self.immutable_fields)


def _failure_reason(status: int, transport: Transport | None) -> FailureReason:
    """What an API error means for the pass it ends: from the status, or the transport for status 0."""
    if status == 0:
        if transport is None:
            return FailureReason.UNREACHABLE
        return _TRANSPORT_REASONS.get(transport, FailureReason.UNREACHABLE)
    if status == 401:
        return FailureReason.UNAUTHORIZED
    if status == 403:
        return FailureReason.FORBIDDEN
    return FailureReason.API


class ClusterRefused(AgentError):
    """A pass must not touch its cluster at all (``reason``); the message says how to fix it.

    Not retryable: it lasts until the configuration (or the other install) changes.
    """

    failure_reason = FailureReason.REFUSED

    def __init__(self, cluster: str, reason: Refusal, message: str) -> None:
        self.cluster = cluster
        self.reason = reason
        super().__init__(message)

    def failure(self) -> Failure:
        return Failure.refused(self.reason, str(self))


class ScopeError(AgentError):
    """An app declares objects outside its allowed scope: nothing is applied or pruned for it.

    Raised before any request is made for the app; every violation is named with its object,
    file and rule (``ScopeViolation``).
    """

    failure_reason = FailureReason.SCOPE

    def __init__(self, violations: tuple[ScopeViolation, ...], *, cluster: str, app: str) -> None:
        self.violations = violations
        self.cluster = cluster
        self.app = app
        head = (
            f"app {app!r} on cluster {cluster!r} declares {len(violations)} object(s) outside its scope;"
            " nothing applied or pruned for it"
        )
        super().__init__(head + ":\n" + "\n".join(f"  {v.message}" for v in violations))

    def failure(self) -> Failure:
        return Failure(self.failure_reason, str(self), scope=self.violations[0].rule)


class AccessDenied(AgentError):
    """An app's preflight failed: its ServiceAccount is missing, not impersonable, or lacks a rule.

    Retryable: RBAC or the account may be fixed before the next pass.
    """

    failure_reason = FailureReason.ACCESS
    retryable = True

    def __init__(self, problem: AccessProblem, message: str) -> None:
        self.problem = problem
        super().__init__(message)

    def failure(self) -> Failure:
        return Failure(self.failure_reason, str(self), access=self.problem)


class LocalClusterError(AgentError):
    """The local control plane could not be installed, started or stopped."""
