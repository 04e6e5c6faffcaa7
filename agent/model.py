"""Typed values passed between pipeline stages.

source → ``Revision``; render → ``DesiredSet`` of ``DesiredObject``; plan →
``Plan`` of ``Change``; apply/prune → ``ApplyResult``; reconcile →
``ClusterResult``. Stages exchange these, never loose dicts. Manifests inside
them are plain JSON-compatible dicts, the one shape Kubernetes speaks.
"""

from __future__ import annotations

import enum
import functools
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True, order=True)
class ObjectKey:
    """Identity of an object in one cluster: group, kind, namespace, name (no version)."""

    group: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, manifest: Manifest) -> ObjectKey:
        group, _ = split_api_version(str(manifest.get("apiVersion", "")))
        meta = manifest.get("metadata") or {}
        return cls(
            group, str(manifest.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", ""))
        )

    @property
    def group_kind(self) -> str:
        """``Deployment.apps`` / ``ConfigMap``: the ApplySet ``contains-group-kinds`` spelling."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def __str__(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.group_kind}/{ns}{self.name}"


@dataclass(frozen=True)
class Provenance:
    """Where a desired object came from: repository-relative file, document index, line."""

    file: str
    document: int = 0
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}#{self.document}"
        return f"{where}:{self.line}" if self.line is not None else where


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


@dataclass(frozen=True, eq=False)
class DesiredSet:
    """A cluster's complete render. Only a render without error produces one."""

    cluster: str
    revision: str
    objects: tuple[DesiredObject, ...]

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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class ApplyResult:
    """One object's result; a failure is a value, never an exception across objects."""

    key: ObjectKey
    outcome: Outcome
    status: int = 0
    message: str = ""
    uid: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is not Outcome.FAILED


class Refusal(enum.StrEnum):
    """Why a pass would not touch its cluster at all: nothing applied, pruned or written there."""

    #: Another config entry reaches the same cluster (same ``kube-system`` namespace UID).
    SHARED_CLUSTER = "shared-cluster"
    #: The cluster's ApplySet parent is claimed by another entry (or another install of the same name).
    CLAIMED = "claimed"


@dataclass
class ClusterResult:
    """One reconcile pass for one cluster."""

    cluster: str
    revision: str = ""
    results: list[ApplyResult] = field(default_factory=list)
    error: str | None = None
    prune_refused: str | None = None
    #: Set when the pass refused to touch the cluster; ``error`` then says why and how to fix it.
    refused: Refusal | None = None
    started: datetime | None = None
    finished: datetime | None = None
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and all(r.ok for r in self.results)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome is outcome)

    @property
    def applied(self) -> int:
        return self.count(Outcome.CREATED) + self.count(Outcome.CONFIGURED)

    @property
    def failed(self) -> int:
        return self.count(Outcome.FAILED)
