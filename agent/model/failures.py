"""Why a pass failed or held back as a whole: ``Failure`` (``FailureReason``, ``PassState``,
``Refusal``, ``ScopeRule``, ``AccessProblem``) and ``PruneRefusal`` (``PruneReason``).

Decided where the failure is known, never parsed from a message; metrics, ``/status``, Events
and the CLI read these fields.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.model.keys import ObjectKey


class Refusal(enum.StrEnum):
    """Why a pass would not touch its cluster at all: nothing applied, pruned or written there."""

    #: Another config entry reaches the same cluster (same ``kube-system`` namespace UID).
    SHARED_CLUSTER = "shared-cluster"
    #: The cluster's ApplySet parent is claimed by another entry (or another install of the same name).
    CLAIMED = "claimed"


class FailureReason(enum.StrEnum):
    """Why a pass failed: the ``reason`` label of ``gitops_agent_reconcile_errors_total``.

    Decided where the failure is known (the error's type, the server's status), never from its
    message; docs/operations.md explains each.
    """

    #: No answer at all: connection refused or timed out, a name that does not resolve.
    UNREACHABLE = "unreachable"
    #: Connected, but the answer did not come in time (a request's timeout, the pass's deadline).
    TIMEOUT = "timeout"
    #: 401, even after the credentials were read again.
    UNAUTHORIZED = "unauthorized"
    #: 403 for the cluster as a whole.
    FORBIDDEN = "forbidden"
    #: The server's certificate or the TLS handshake failed.
    TLS = "tls"
    #: The kubeconfig (or its exec plugin) gave no usable credentials.
    CREDENTIALS = "credentials"
    #: The commit does not render for this app (docs/safety.md rule 2).
    RENDER = "render"
    #: The app's source has delivered no revision (never polled, or every poll failed).
    SOURCE = "source"
    #: The app's chart could not be fetched from its repository (``errors.ChartProblem`` says why).
    CHART = "chart"
    #: This replica may not write there (Lease lost, pass abandoned, shutting down).
    FENCED = "fenced"
    #: The pass would not touch the cluster: see ``Refusal``.
    REFUSED = "refused"
    #: The app declares an object outside its allowed scope: see ``ScopeRule`` (fails like a render).
    SCOPE = "scope"
    #: The preflight found the app's identity missing or short of a permission: see ``AccessProblem``.
    ACCESS = "access"
    #: The pass ran, but some objects failed (each one alone, docs/safety.md rule 6).
    OBJECTS = "objects"
    #: Any other API error that ended the pass.
    API = "api"
    #: A sync wave failed or did not become healthy within ``wave_timeout``: later waves and the
    #: prune were not done (docs/ordering.md).
    WAVE = "wave"
    #: A hook failed (or did not finish within ``wave_timeout``); a ``PreSync`` one before anything
    #: else of the app was written (docs/ordering.md).
    HOOK = "hook"
    #: A bug in the agent.
    INTERNAL = "internal"


class PassState(enum.StrEnum):
    """A cluster's state in ``/status`` (and ``gitops-agent status``)."""

    PENDING = "pending"  # no pass yet
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    #: The pass outlived its deadline and was abandoned (a slow request inside a pass is ``failed``).
    TIMED_OUT = "timed-out"
    SUSPENDED = "suspended"  # the operator's annotation on the ApplySet parent, or `suspend = true`
    #: A dependency (`depends_on`) has not succeeded at its current revision: nothing done, no failure.
    WAITING = "waiting"
    REFUSED = "refused"
    STANDBY = "standby"  # another replica holds the cluster's Lease
    #: A change window (``[[windows]]``) closed its writes: planned and reported, nothing written.
    WINDOW = "window"
    #: A sync wave is applied and not healthy yet: later waves and the prune wait for the next
    #: pass, which comes soon (``ClusterResult.wave_wait`` names the wave and what it waits for).
    SYNCING = "syncing"


@dataclass(frozen=True)
class Failure:
    """Why a pass failed as a whole: ``reason`` and ``state`` for machines, ``message`` for people."""

    reason: FailureReason
    message: str
    #: ``failed``; ``timed-out`` for a pass abandoned at its deadline; ``refused``.
    state: PassState = PassState.FAILED
    #: Which refusal, for state ``refused``.
    refusal: Refusal | None = None
    #: Which scope rule an object broke, for reason ``scope``.
    scope: ScopeRule | None = None
    #: What the preflight found, for reason ``access``.
    access: AccessProblem | None = None

    @classmethod
    def refused(cls, refusal: Refusal, message: str) -> Failure:
        return cls(FailureReason.REFUSED, message, PassState.REFUSED, refusal)


class ScopeRule(enum.StrEnum):
    """Which rule of an app's scope an object it declares (or would prune) breaks."""

    #: Its namespace matches none of ``allowed_namespaces``.
    NAMESPACE = "namespace"
    #: Its kind matches none of ``allowed_kinds``.
    KIND = "kind"
    #: It is cluster-scoped and ``allow_cluster_scoped`` is false.
    CLUSTER_SCOPED = "cluster-scoped"
    #: It is in the agent's own namespace (inventories, approvals, suspension, Leases, Events),
    #: which an app acting as its own ServiceAccount never writes, whatever its scope says.
    AGENT_NAMESPACE = "agent-namespace"
    #: It is an ApplySet parent of the agent (``<agent>`` or ``<agent>.<app>`` in the agent's
    #: namespace): an app's inventory, which no app ever declares, writes or prunes, scoped or not.
    INVENTORY_PARENT = "inventory-parent"


@dataclass(frozen=True)
class ScopeViolation:
    """One object outside an app's scope: ``rule`` for machines, ``message`` naming object and rule."""

    key: ObjectKey
    rule: ScopeRule
    message: str


class AccessProblem(enum.StrEnum):
    """What the preflight of an app acting as a ServiceAccount found (before anything is written)."""

    #: The ServiceAccount does not exist (every request as it would be a bare 403).
    MISSING_ACCOUNT = "missing-account"
    #: The agent itself may not impersonate the ServiceAccount.
    IMPERSONATION_DENIED = "impersonation-denied"
    #: The ServiceAccount lacks a (verb, resource, namespace) the app's apply or prune set needs.
    RULE_MISSING = "rule-missing"


class PruneReason(enum.StrEnum):
    """Why a pass deleted nothing that left Git, though it may have succeeded otherwise."""

    #: Suspended by the operator (annotation on the ApplySet parent): the pass changed nothing.
    SUSPENDED = "suspended"
    #: A listing failed or was incomplete: unknown is not absent (docs/safety.md rule 1).
    UNKNOWN_STATE = "unknown-state"
    #: Another app of the cluster did not render in this pass: what leaves this app may have
    #: moved there (a handover), so its declarations are unknown and unknown is not absent.
    OTHER_APP_UNKNOWN = "other-app-unknown"
    #: The render is empty and ``allow_empty`` is false (docs/safety.md rule 2).
    EMPTY_RENDER = "empty-render"
    #: ``prune = false`` for this cluster.
    DISABLED = "disabled"
    #: The mass-deletion brake, until this exact set is approved (docs/safety.md rule 3).
    BRAKE = "brake"


@dataclass(frozen=True)
class PruneRefusal:
    """A refusal of every deletion in one pass: ``reason`` for machines, ``message`` in users' words."""

    reason: PruneReason
    message: str
