"""Typed values passed between pipeline stages.

source → ``Revision``; render → ``DesiredSet`` of ``DesiredObject``; plan →
``Plan`` of ``Change``; apply/prune → ``ApplyResult``; reconcile →
``ClusterResult``. Stages exchange these, never loose dicts. Manifests inside
them are plain JSON-compatible dicts, the one shape Kubernetes speaks.

Results are typed all the way to their readers: why a pass failed is a
``Failure`` (a ``FailureReason``, the state it leaves, a message for people),
why it pruned nothing a ``PruneRefusal``, what an object's message is about a
``Note``, how far it rolled out a ``Health`` (``HealthState``, and the ``Blocker`` that holds
it up). Metrics, ``/status``, Events and the CLI read these fields; nothing
classifies a message by its text.
"""

from __future__ import annotations

import enum
import functools
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

Manifest = dict[str, Any]
#: A field path in managedFields' own vocabulary: ``("f:spec", "f:containers",
#: 'k:{"name":"app"}', "f:image")``. Elements are ``f:<name>``, ``k:<json>``
#: (keys sorted, compact), ``v:<json>`` or ``i:<n>``.
FieldPath = tuple[str, ...]


def split_api_version(api_version: str) -> tuple[str, str]:
    """``apps/v1`` → (``apps``, ``v1``); ``v1`` → (``""``, ``v1``)."""
    if "/" in api_version:
        group, _, version = api_version.partition("/")
        return group, version
    return "", api_version


#: A Kubernetes release as (major, minor): what the version table, a cluster's
#: ``kubernetes_version`` and ``--kubernetes-version`` compare.
Release = tuple[int, int]
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


def parse_release(text: str) -> Release:
    """``1.25``, ``v1.25`` or ``v1.25.3`` → (1, 25); ``ValueError`` naming the text otherwise."""
    m = _RELEASE.match(text.strip())
    if not m:
        raise ValueError(f"not a Kubernetes release (expected 1.NN, v1.NN or v1.NN.P): {text!r}")
    return int(m.group(1)), int(m.group(2))


def release_text(release: Release) -> str:
    return f"{release[0]}.{release[1]}"


class ObjectKey(NamedTuple):
    """Identity of an object in one cluster: group, kind, namespace, name (no version).

    A tuple, not a dataclass: a pass looks each key up some thirty times (declared, live, memo,
    members), and a tuple hashes and compares in C, a dataclass in a Python call each time.
    """

    group: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, manifest: Manifest) -> ObjectKey:
        group, _ = split_api_version(str(manifest.get("apiVersion", "")))
        meta = manifest.get("metadata") or {}
        return cls.interned(
            group, str(manifest.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", ""))
        )

    @classmethod
    def interned(cls, group: str, kind: str, namespace: str, name: str) -> ObjectKey:
        """A key whose group, kind and namespace are shared with every other key's: a pass holds
        tens of thousands of keys (live, members, verdicts), each with its own copy otherwise."""
        return cls(sys.intern(group), sys.intern(kind), sys.intern(namespace), name)

    @property
    def group_kind(self) -> str:
        """``Deployment.apps`` / ``ConfigMap``: the ApplySet ``contains-group-kinds`` spelling."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def __str__(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.group_kind}/{ns}{self.name}"


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a desired object came from: repository-relative file, document index (from 0), line."""

    file: str
    document: int = 0
    line: int | None = None

    def __str__(self) -> str:
        where = f":{self.line}" if self.line is not None else f" (document {self.document + 1})"
        return self.file + where  # never file#N: users read a line number in it


@dataclass(frozen=True, eq=False)
class DesiredObject:
    """One object Git declares for a cluster, with where it was declared.

    ``manifest`` is never edited once the object exists (``reconcile.prepare`` builds new
    objects from copies), so its key is computed once: a pass looks it up ~10 times per object.
    """

    manifest: Manifest
    provenance: Provenance

    @functools.cached_property
    def key(self) -> ObjectKey:
        return ObjectKey.of(self.manifest)

    @property
    def api_version(self) -> str:
        return str(self.manifest.get("apiVersion", ""))


class DecryptFault(enum.StrEnum):
    """Why an encrypted (SOPS) file did not decrypt: read by tests and reports, never parsed from text."""

    #: The file is encrypted and the app has no decryption keys configured.
    NO_KEYS = "no-keys"
    #: None of the app's age identities opens the file's data key (sops exit 128).
    NO_MATCHING_KEY = "no-matching-key"
    #: The file changed after it was encrypted: its MAC does not match (sops exit 51, 24).
    MAC_MISMATCH = "mac-mismatch"
    #: An encrypted value does not authenticate: it was altered (sops exit 25).
    TAMPERED = "tampered"
    #: Not a file sops can read (no MAC, broken metadata, mixed documents...).
    MALFORMED = "malformed"
    #: Rendered output carries ciphertext that no encrypted file of the repository explains.
    UNRESOLVED = "unresolved"
    #: The pinned sops could not run (missing, timed out, output over the limit).
    TOOL = "tool"
    #: The file names key services other than age (KMS, Vault, PGP...): a render reaches none.
    KEY_SERVICE = "key-service"


@dataclass(frozen=True)
class EncryptedSource:
    """A SOPS-encrypted repository file a render read, and the age recipients it is encrypted to."""

    file: str
    recipients: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class DesiredSet:
    """A cluster's complete render. Only a render without error produces one."""

    cluster: str
    revision: str
    objects: tuple[DesiredObject, ...]
    #: The SOPS-encrypted files the objects came from (``diff --offline`` checks their recipients).
    encrypted: tuple[EncryptedSource, ...] = ()
    #: Rendered without decrypting (``diff --offline``): encrypted values are ciphertext, so
    #: this set is for reports only and ``prepare`` refuses to send it anywhere.
    sealed: bool = False

    @property
    def empty(self) -> bool:
        return not self.objects

    def keys(self) -> set[ObjectKey]:
        return {o.key for o in self.objects}


@dataclass(frozen=True)
class Revision:
    """A commit the source resolved and checked out; ``tree`` is read-only for later stages."""

    sha: str
    ref: str
    tree: Path
    author: str = ""
    date: datetime | None = None
    subject: str = ""

    @property
    def short(self) -> str:
        return self.sha[:12]


class SkipReason(enum.StrEnum):
    """Why the plan leaves an existing object alone (a ``SKIP``): read by the pass, reports and Events."""

    #: ``gitops-agent.io/reconcile: disabled``, live or in Git.
    RECONCILE_DISABLED = "reconcile-disabled"
    #: Not ours and ``adopt`` refuses it (adopt = never, ownerReferences, another manager's apply).
    ADOPT_REFUSED = "adopt-refused"
    #: A member of another ApplySet: another app's of this agent, another agent's, another tool's.
    OTHER_SET = "other-set"
    #: Declared by another app of this cluster too, which keeps it (``ClusterResult.conflicts``).
    OTHER_APP = "other-app"
    #: Its listing failed in this pass: unknown is not absent.
    LIVE_UNKNOWN = "live-unknown"
    #: A Helm hook of delete/rollback phases only: never applied nor a member (``plan.hooks``).
    HELM_HOOK = "helm-hook"


class Action(enum.StrEnum):
    """What the plan decided for one object."""

    CREATE = "create"
    UPDATE = "update"
    NOOP = "noop"
    CONFLICT = "conflict"  # some declared fields are owned by others and policy yields all of them
    PRUNE = "prune"
    SKIP = "skip"  # reconcile disabled, or adopt refused


class Resolution(enum.StrEnum):
    FORCE = "force"
    YIELD = "yield"


@dataclass(frozen=True)
class FieldConflict:
    """A Git-declared path whose live value differs and that another manager owns."""

    path: FieldPath
    manager: str
    operation: str  # "Apply" | "Update"
    subresource: str
    resolution: Resolution
    desired: Any = None
    live: Any = None


@dataclass(frozen=True, slots=True)
class Change:
    """The plan's verdict for one object. Values of Secrets are already masked here."""

    key: ObjectKey
    action: Action
    api_version: str = ""
    #: The body to send (yielded paths removed); ``None`` for noop/prune/skip.
    body: Manifest | None = None
    #: Paths Git declares and we will own after the apply.
    declared: frozenset[FieldPath] = frozenset()
    #: Declared paths whose live value differs (or that are new).
    changed: frozenset[FieldPath] = frozenset()
    #: Paths we owned that Git no longer declares, with whether the server will remove them
    #: (``True``) or keep them because another manager co-owns them (``False``).
    released: tuple[tuple[FieldPath, bool], ...] = ()
    conflicts: tuple[FieldConflict, ...] = ()
    force: bool = False
    resource_version: str | None = None
    uid: str | None = None
    #: JSON-patch style operations (masked) from live to the expected result, for reports.
    operations: tuple[dict[str, Any], ...] = ()
    reason: str = ""
    provenance: Provenance | None = None
    #: Why a ``SKIP`` (``reason`` says it in words).
    skip: SkipReason | None = None

    @property
    def yielded(self) -> tuple[FieldConflict, ...]:
        return tuple(c for c in self.conflicts if c.resolution is Resolution.YIELD)

    @property
    def forced(self) -> tuple[FieldConflict, ...]:
        return tuple(c for c in self.conflicts if c.resolution is Resolution.FORCE)


@dataclass(frozen=True)
class Plan:
    """Every object's ``Change`` for one cluster, in apply order."""

    cluster: str
    revision: str
    changes: tuple[Change, ...]

    def summary(self) -> dict[str, int]:
        counts = Counter(c.action.value for c in self.changes)
        return {a.value: counts.get(a.value, 0) for a in Action}

    @property
    def has_changes(self) -> bool:
        return any(c.action not in (Action.NOOP, Action.SKIP) for c in self.changes)


class Outcome(enum.StrEnum):
    """What happened to one object in a pass."""

    CREATED = "created"
    CONFIGURED = "configured"
    UNCHANGED = "unchanged"
    FAILED = "failed"
    SKIPPED = "skipped"
    PRUNED = "pruned"
    ORPHANED = "orphaned"
    PRUNE_SKIPPED = "prune-skipped"


class Note(enum.StrEnum):
    """What one object's result is about, beyond its ``Outcome``: read by metrics and Events."""

    #: Unchanged because every differing field was yielded to its owner (the ``conflicting`` metric).
    YIELDED = "yielded"
    #: Failed: the change hits a field the server will not change, and the object does not allow
    #: delete and re-create.
    IMMUTABLE = "immutable"
    #: Failed: still conflicting (409) after re-planning from fresh reads.
    CONFLICTS_UNRESOLVED = "conflicts-unresolved"
    #: Failed: the server refused to delete an object that left Git (Event reason ``PruneFailed``).
    DELETE_REFUSED = "delete-refused"
    #: Failed before anything was sent: the cluster does not serve the object's apiVersion/kind.
    API_NOT_SERVED = "api-not-served"
    #: Kept: it left Git but lies outside the app's scope, so this app never deletes it.
    OUT_OF_SCOPE = "out-of-scope"
    #: Kept: deleting it would take with it objects that are not this app's (another app's or
    #: tool's, users'): a CRD's custom resources, a Namespace's content, an owner's dependents.
    HOLDS_FOREIGN = "holds-foreign"
    #: Kept: what it would take with it could not be listed completely (unknown is not absent).
    CASCADE_UNKNOWN = "cascade-unknown"
    #: Kept: an ApplySet parent (an app's inventory) is never pruned by an app.
    INVENTORY_PARENT = "inventory-parent"


class ApiProblem(enum.StrEnum):
    """What an ``ApiFinding`` says about the apiVersion an object is declared with."""

    #: The cluster's discovery does not serve it: the object cannot be applied there.
    NOT_SERVED = "not-served"
    #: A Kubernetes release (a cluster's target, ``--kubernetes-version``) no longer serves it.
    REMOVED = "removed"
    #: Served, but deprecated (the version table, or the CRD's ``deprecated: true``).
    DEPRECATED = "deprecated"
    #: The API server's ``Warning`` header on a dry-run or an apply of the object.
    WARNING = "warning"

    @property
    def blocking(self) -> bool:
        """Whether the object cannot be applied (there, or after the upgrade): a difference in reports."""
        return self in (ApiProblem.NOT_SERVED, ApiProblem.REMOVED)


@dataclass(frozen=True)
class ApiFinding:
    """An object's apiVersion that is, or will be, a problem: ``problem`` for machines, ``message``
    (naming the object's file and what to use instead) for people."""

    key: ObjectKey
    api_version: str
    problem: ApiProblem
    message: str
    #: The apiVersion to use instead ("" when none is known).
    replacement: str = ""
    #: Where Git declares the object (``Provenance`` spelling).
    file: str = ""


@dataclass(frozen=True)
class ApplyResult:
    """One object's result; a failure is a value, never an exception across objects."""

    key: ObjectKey
    outcome: Outcome
    status: int = 0
    message: str = ""
    uid: str | None = None
    note: Note | None = None
    #: Why a ``SKIPPED`` object was left alone.
    skip: SkipReason | None = None
    #: The object holds secret values (a Secret, fields decrypted from Git): a server's message
    #: about it may quote one, so it is never shown (Events and logs say the status only).
    sensitive: bool = False
    #: The API server's ``Warning`` headers on the request (deprecated versions, unknown fields).
    warnings: tuple[str, ...] = ()
    #: Declared fields left to their owners (values of Secrets masked by the plan): the status page
    #: names each one, its owner, the value kept and Git's.
    yielded: tuple[FieldConflict, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome is not Outcome.FAILED


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


@dataclass(frozen=True)
class AppConflict:
    """An object two apps of one cluster declare: ``holder`` manages it, ``other`` never writes it.

    The holder is the app whose ApplySet holds the live object, else the first in config order;
    both apps' results carry the conflict, each naming both apps and both files.
    """

    key: ObjectKey
    holder: str
    holder_file: str
    other: str
    other_file: str

    def __str__(self) -> str:
        return (
            f"{self.key} is declared by app {self.holder!r} ({self.holder_file}) and app "
            f"{self.other!r} ({self.other_file}); {self.holder!r} holds it, {self.other!r} leaves it alone"
        )


@dataclass
class ClusterResult:
    """One reconcile pass for one app of one cluster (``app``: the app's name)."""

    cluster: str
    revision: str = ""
    results: list[ApplyResult] = field(default_factory=list)
    #: Set when the pass failed as a whole (nothing after the failure ran).
    failure: Failure | None = None
    prune_refusal: PruneRefusal | None = None
    started: datetime | None = None
    finished: datetime | None = None
    dry_run: bool = False
    #: The app this pass was for: a `[[clusters]]` entry's own app is named after the entry.
    app: str = ""
    #: The dependencies (`depends_on`) this app waited for: nothing was applied or pruned.
    waiting_on: tuple[str, ...] = ()
    #: Objects this app and another of the cluster both declare (see ``AppConflict``).
    conflicts: list[AppConflict] = field(default_factory=list)
    #: apiVersions found before anything was written (not served, deprecated) and the server's
    #: ``Warning`` headers on the pass's applies, per object.
    api_findings: list[ApiFinding] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        """The failure's message, for readers that print it (never to classify)."""
        return self.failure.message if self.failure else None

    @property
    def prune_refused(self) -> str | None:
        """The prune refusal's message, for readers that print it (never to classify)."""
        return self.prune_refusal.message if self.prune_refusal else None

    @property
    def refused(self) -> Refusal | None:
        """Set when the pass refused to touch the cluster; ``error`` then says why and how to fix it."""
        return self.failure.refusal if self.failure else None

    @property
    def ok(self) -> bool:
        return self.failure is None and all(r.ok for r in self.results)

    @property
    def reason(self) -> FailureReason | None:
        """Why the pass failed (the metric label); ``None`` when it succeeded."""
        if self.failure is not None:
            return self.failure.reason
        return None if self.ok else FailureReason.OBJECTS

    @property
    def state(self) -> PassState:
        """The cluster's state after this pass."""
        if self.failure is not None:
            return self.failure.state
        if not self.ok:
            return PassState.FAILED
        if self.waiting_on:
            return PassState.WAITING
        if self.prune_refusal is not None and self.prune_refusal.reason is PruneReason.SUSPENDED:
            return PassState.SUSPENDED
        return PassState.OK

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome is outcome)

    @property
    def applied(self) -> int:
        return self.count(Outcome.CREATED) + self.count(Outcome.CONFIGURED)

    @property
    def failed(self) -> int:
        return self.count(Outcome.FAILED)

    @property
    def yielded(self) -> int:
        """Objects with a declared field left to its owner (docs/safety.md rule 5): shown, never silent."""
        return sum(1 for r in self.results if r.yielded)


class HealthState(enum.StrEnum):
    """How far an object (or an app) has rolled out: kstatus's names, plus ``Suspended``.

    ``agent.plan.health`` decides it per object; ``worst`` orders it for an app:
    Failed > Unknown > NotFound > Terminating > InProgress > Suspended > Current.
    """

    #: Rolled out: what Git declares is running as declared.
    CURRENT = "Current"
    #: On its way: the controller has not caught up yet (or cannot say why it has not).
    IN_PROGRESS = "InProgress"
    #: Will not get there without a change: a kind rule, ``Stalled=True``, or the wait timed out.
    FAILED = "Failed"
    #: Paused on purpose (a paused Deployment, a suspended Job or CronJob): nothing to wait for.
    SUSPENDED = "Suspended"
    #: Cannot be told: a malformed status, a custom check that did not evaluate.
    UNKNOWN = "Unknown"
    #: Being deleted (``metadata.deletionTimestamp``).
    TERMINATING = "Terminating"
    #: Not in the cluster, though it was applied: the follower's word, never ``assess``'s.
    NOT_FOUND = "NotFound"


class HealthCause(enum.StrEnum):
    """Where a reported ``Health`` comes from: the object's status, or the wait around it."""

    #: The object's own status, as ``assess`` read it.
    OBSERVED = "observed"
    #: Failed, but not yet for ``health_debounce`` seconds: reported InProgress (a flap is no alarm).
    DEBOUNCING = "debouncing"
    #: Still not Current when ``health_timeout`` ran out: reported Failed.
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Blocker:
    """The object that holds a rollout up, and why, in the server's own words.

    ``reason`` is the word the server or controller wrote (``ImagePullBackOff``,
    ``BackoffLimitExceeded``, ``Unschedulable``, a condition's reason); ``message`` its text.
    """

    kind: str
    namespace: str
    name: str
    reason: str
    message: str = ""

    def __str__(self) -> str:
        said = f" ({self.message})" if self.message else ""
        return f"{self.kind} {self.name}: {self.reason}{said}"


@dataclass(frozen=True)
class Health:
    """One object's (or one app's) health: ``state`` and ``reason`` for machines, ``message`` for people.

    ``reason`` is one CamelCase word from the rule that decided (``LessAvailable``,
    ``ProgressDeadlineExceeded``, a condition's reason); ``blocker`` names what holds the
    rollout up when it is known (a Pod of a Deployment, the Job itself).
    """

    state: HealthState
    message: str
    blocker: Blocker | None = None
    reason: str = ""
    cause: HealthCause = HealthCause.OBSERVED

    def describe(self) -> str:
        """One line: ``Failed: Pod web-7d9f-abcde: ImagePullBackOff (Back-off pulling image "nope")``.

        The message comes first, unless it is the blocker's own (an object that blocks itself).
        """
        if self.blocker is None:
            return f"{self.state}: {self.message}"
        if not self.message or self.message == self.blocker.message:
            return f"{self.state}: {self.blocker}"
        return f"{self.state}: {self.message.rstrip('.')}; {self.blocker}"


@dataclass(frozen=True)
class AppHealth:
    """One app's health at one revision, as the wait after its pass last read it.

    Reported beside the pass result, not inside it: a pass ends when its writes are accepted,
    a rollout later ("applied, degraded" is an app whose pass is ``ok`` and health ``Failed``).
    """

    app: str
    revision: str
    health: Health
    #: The wait ended: every object Current, Suspended or (debounced, timed out) Failed.
    done: bool
    objects: int = 0
    current: int = 0
    #: Seconds since the wait on this revision began.
    waited: float = 0.0
    #: Requests this wait has made so far (the cost the benchmarks count).
    reads: int = 0
    #: Each followed object's health as the wait reports it (not in ``to_json``: the status page's).
    by_object: tuple[tuple[ObjectKey, Health], ...] = ()

    @property
    def state(self) -> HealthState:
        return self.health.state

    def to_json(self) -> dict[str, Any]:
        h = self.health
        return {
            "state": h.state.value,
            "reason": h.reason,
            "cause": h.cause.value,
            "message": h.message,
            "blocker": str(h.blocker) if h.blocker else None,
            "revision": self.revision,
            "done": self.done,
            "objects": self.objects,
            "current": self.current,
            "waited": round(self.waited, 1),
            "reads": self.reads,
        }


# -- Names on objects: every label and annotation key the agent reads or writes ---------------
# One home, so the planner, apply, prune, the inventory and the Leases never spell one twice.

#: KEP-3659 ApplySet: membership label on every member; the parent's id label and annotations.
PART_OF = "applyset.kubernetes.io/part-of"
ID_LABEL = "applyset.kubernetes.io/id"
TOOLING = "applyset.kubernetes.io/tooling"
GROUP_KINDS = "applyset.kubernetes.io/contains-group-kinds"
ADDITIONAL_NAMESPACES = "applyset.kubernetes.io/additional-namespaces"
#: On every ApplySet parent and Lease: the agent it belongs to, so one labelled LIST finds all.
AGENT_LABEL = "gitops-agent.io/agent"
#: On a parent: the app is suspended; a mass-deletion approval; the prune set the brake holds
#: (so an approval of any other set is refused at once); the entry that claims it.
SUSPENDED = "gitops-agent.io/suspended"
PRUNE_APPROVAL = "gitops-agent.io/prune-approved-digest"
PRUNE_HELD = "gitops-agent.io/prune-held-digest"
CLAIMED_BY = "gitops-agent.io/claimed-by"
#: On a status page record (a ConfigMap in the management cluster): what it records ("status").
RECORD_LABEL = "gitops-agent.io/record"
#: On a Lease: its role ("cluster" | "replica") and the cluster it is for.
ROLE_LABEL = "gitops-agent.io/lease"
CLUSTER_LABEL = "gitops-agent.io/cluster"
#: Users' annotations on an object: leave it alone; keep it when it leaves Git; "disabled".
RECONCILE = "gitops-agent.io/reconcile"
PRUNE = "gitops-agent.io/prune"
DISABLED = "disabled"
#: Other tools' annotations that keep an object when it leaves Git, honoured like ``PRUNE``:
#: Helm's ``keep`` policy, Argo CD's sync-options (a comma list) with ``Prune=false`` or
#: ``Delete=false``, Flux's ``prune: disabled``.
HELM_RESOURCE_POLICY = "helm.sh/resource-policy"
HELM_KEEP = "keep"
ARGOCD_SYNC_OPTIONS = "argocd.argoproj.io/sync-options"
ARGOCD_NO_PRUNE = ("Prune=false", "Delete=false")
FLUX_PRUNE = "kustomize.toolkit.fluxcd.io/prune"
#: Users' annotations: fields to take over whatever the rules say; fields never to compare.
FORCE_FIELDS = "gitops-agent.io/force-fields"
IGNORE_FIELDS = "gitops-agent.io/ignore-fields"
#: Users' annotation: leave the object out of health ("ignore").
HEALTH = "gitops-agent.io/health"
HEALTH_IGNORE = "ignore"
#: On an object whose values were encrypted in Git (SOPS): a JSON list of the JSON pointers
#: decrypted by the agent, masked in every report, log and page (docs/secrets.md).
DECRYPTED_FIELDS = "gitops-agent.io/decrypted-fields"
#: Users' annotation: delete and re-create the object when an immutable field changes.
RECREATE = "gitops-agent.io/recreate"
#: Helm's hook annotation (comma-separated phases), read to leave delete/rollback hooks out.
HELM_HOOK = "helm.sh/hook"
RECREATE_ON_IMMUTABLE = "on-immutable-change"

#: The group and kind of a CustomResourceDefinition (applied, and waited for, before its resources).
CRD_KEY = ("apiextensions.k8s.io", "CustomResourceDefinition")


def phase_of(key: ObjectKey) -> int:
    """Apply order: Namespaces, CRDs, other cluster-scoped objects, namespaced ones; deletion reverses it."""
    if key.group == "" and key.kind == "Namespace":
        return 0
    if (key.group, key.kind) == CRD_KEY:
        return 1
    return 2 if not key.namespace else 3


def app_page(cluster: str, app: str) -> str:
    """The status page's path of one app: the deep link of logs, notifications and statuses."""
    return f"/ui/clusters/{quote(cluster, safe='')}/apps/{quote(app, safe='')}"
