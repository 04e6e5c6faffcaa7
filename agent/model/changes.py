"""What the plan decides: a ``Plan`` of one ``Change`` per object (``Action``, ``SkipReason``),
and the fields it forces or yields (``FieldConflict``, ``Resolution``).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from typing import Any

from agent.model.desired import Provenance
from agent.model.keys import FieldPath, Manifest, ObjectKey


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
    #: An Argo CD ``Skip``, ``PreDelete`` or ``PostDelete`` hook: a sync never applies it (docs/ordering.md).
    HOOK = "hook"


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
class IgnoredFields:
    """How many declared fields of an object one ignore rule left alone: neither sent nor compared."""

    #: The rule's key path in the config (``ignore[0]``, ``apps[1].ignore[0]``).
    rule: str
    fields: int


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
    #: Fields the config's ignore rules left alone, counted per rule (rules that matched none omitted).
    ignored: tuple[IgnoredFields, ...] = ()

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
