"""What a pass did: one ``ApplyResult`` per object (``Outcome``, ``Note``), the apiVersions it
found wanting (``ApiFinding``), conflicts between apps (``AppConflict``), and the whole pass's
``ClusterResult``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

from agent.model.changes import FieldConflict, IgnoredFields, SkipReason
from agent.model.drift import Drift, DriftFate
from agent.model.failures import Failure, FailureReason, PassState, PruneReason, PruneRefusal, Refusal
from agent.model.keys import ObjectKey
from agent.model.ordering import WaveWait
from agent.model.windows import WindowHold


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
    #: Unchanged: its drift is reported, not corrected (``drift = "report"``; ``ClusterResult.drift``).
    DRIFT = "drift"
    #: Created: a hook of the app's sync (never a member; its health is the sync's, not the rollout's).
    HOOK = "hook"


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
    #: Declared fields the config's ignore rules left alone, counted per rule.
    ignored: tuple[IgnoredFields, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome is not Outcome.FAILED


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


@dataclass(frozen=True)
class Pin:
    """An app held at an earlier commit by ``gitops-agent rollback`` (annotations on its ApplySet
    parent): the pass renders ``revision`` instead of its source's until the source moves past
    ``bad`` (to a commit other than both) or the pin is cleared."""

    revision: str
    bad: str
    #: When it was set (ISO 8601; "" when unknown).
    at: str = ""

    def to_json(self) -> dict[str, str]:
        return {"revision": self.revision, "bad": self.bad, "at": self.at}


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
    #: Drift found in this pass (``model.drift``): reported and left, or corrected by a new revision.
    drift: list[Drift] = field(default_factory=list)
    #: A change window held its writes (state ``window``), or was overridden once (``forced``).
    window: WindowHold | None = None
    #: The rollback pin this pass rendered (``revision`` is then the pinned commit), if any.
    pin: Pin | None = None
    #: The source's revision the app follows, when a pin made ``revision`` another ("": the same).
    followed: str = ""
    #: The pin this pass cleared because its source moved past the bad revision, in words.
    pin_cleared: str = ""
    #: The version of the chart the app renders (its Chart.yaml at ``revision``); "": none or unknown.
    chart: str = ""
    #: A sync wave applied and not healthy yet (state ``syncing``): what the next pass goes on with.
    wave_wait: WaveWait | None = None

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
        if self.wave_wait is not None:
            return PassState.SYNCING
        if self.prune_refusal is not None and self.prune_refusal.reason is PruneReason.SUSPENDED:
            return PassState.SUSPENDED
        if self.window is not None and not self.window.forced:
            return PassState.WINDOW
        return PassState.OK

    @property
    def recheck(self) -> float | None:
        """Seconds after this pass when its app's waiting wave is looked at again (None: none waits)."""
        return self.wave_wait.recheck if self.wave_wait is not None else None

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome is outcome)

    @property
    def applied(self) -> int:
        return self.count(Outcome.CREATED) + self.count(Outcome.CONFIGURED)

    @property
    def failed(self) -> int:
        return self.count(Outcome.FAILED)

    @property
    def drift_reported(self) -> list[Drift]:
        """The drift left in the cluster after this pass (reported, not corrected)."""
        return [d for d in self.drift if d.fate is DriftFate.REPORTED]

    @property
    def yielded(self) -> int:
        """Objects with a declared field left to its owner (docs/safety.md rule 5): shown, never silent."""
        return sum(1 for r in self.results if r.yielded)
