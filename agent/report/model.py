"""The typed model of a diff report, and its versioned JSON form.

``agent.report.diff`` (live) and ``agent.report.diff_offline`` build a ``Report``;
``agent.report`` renders it as markdown, JSON or text and never recomputes
anything. Every value in here is already masked (``agent.report.diff_fields`` masks
Secrets where the diff is made), so no renderer can leak one.

``to_json`` is the documented wire format (``docs/report-schema.json``):
``SCHEMA_VERSION`` changes whenever a field is removed or changes meaning;
adding a field does not.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1

#: Exit codes, as ``kubectl diff``: 0 no differences, 1 differences, 2 an error.
EXIT_SAME = 0
EXIT_DIFFERENT = 1
EXIT_ERROR = 2


class Mode(enum.StrEnum):
    LIVE = "live"  # rendered revision planned against each cluster
    OFFLINE = "offline"  # two revisions' desired states compared, no cluster


class ObjectAction(enum.StrEnum):
    """What the change does to one object.

    Offline, ``create``/``update``/``prune`` mean added to/changed in/removed from the desired state.
    """

    CREATE = "create"
    UPDATE = "update"
    #: Git differs from the cluster only in fields another manager owns and policy yields: nothing is sent.
    CONFLICT = "conflict"
    PRUNE = "prune"
    #: ``gitops-agent.io/prune: disabled``: left in place, no longer tracked.
    ORPHAN = "orphan"
    #: Left Git but a prune guard keeps it (brake, unknown live state, not ours any more...).
    KEEP = "keep"
    #: Not reconciled (``reconcile: disabled``, adopt refused, live state unknown).
    SKIP = "skip"


#: Display and sort order of actions.
ACTION_ORDER = tuple(ObjectAction)


@dataclass(frozen=True)
class RevisionInfo:
    """What was rendered: a Git ref and commit, or a local directory (``sha`` empty)."""

    ref: str
    sha: str = ""

    @property
    def label(self) -> str:
        if self.sha and self.ref and not self.sha.startswith(self.ref):
            return f"{self.sha[:12]} ({self.ref})"
        return self.sha[:12] if self.sha else self.ref


@dataclass(frozen=True)
class FieldChange:
    """One leaf (or atomic value) that changes; ``path`` in ``fields.render_path`` spelling."""

    path: str
    op: str  # "add" | "remove" | "replace"
    before: Any = None
    after: Any = None


@dataclass(frozen=True)
class ConflictLine:
    """A Git-declared field another manager owns, and what the agent does about it."""

    path: str
    manager: str
    operation: str
    subresource: str
    resolution: str  # "force" | "yield"
    desired: Any = None
    live: Any = None


@dataclass(frozen=True)
class ReleasedField:
    """A field we owned that Git no longer declares; ``removed``: the server deletes it."""

    path: str
    removed: bool


@dataclass(frozen=True)
class ObjectReport:
    """One object's entry in a cluster's report."""

    group: str
    kind: str
    namespace: str
    name: str
    api_version: str
    action: ObjectAction
    #: Unified diff of the YAML of only the fields that change (masked); "" when nothing changes.
    diff: str = ""
    fields: tuple[FieldChange, ...] = ()
    conflicts: tuple[ConflictLine, ...] = ()
    released: tuple[ReleasedField, ...] = ()
    #: Where the "after" side comes from: "server" (dry-run apply), "plan", "live" (prunes) or "git".
    basis: str = ""
    source: str = ""
    reason: str = ""
    note: str = ""
    #: The server (or a guard) refused this object: the real apply would fail here.
    error: str | None = None

    @property
    def key(self) -> str:
        gk = f"{self.kind}.{self.group}" if self.group else self.kind
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{gk}/{ns}{self.name}"

    @property
    def is_difference(self) -> bool:
        return self.action is not ObjectAction.SKIP or self.error is not None


@dataclass(frozen=True)
class ClusterReport:
    """One cluster's section; ``error`` set means it could not be planned (objects then empty)."""

    name: str
    objects: tuple[ObjectReport, ...] = ()
    unchanged: int = 0
    error: str | None = None
    #: Why no deletion would happen in this pass (brake, unknown state, empty render, prune = false).
    prune_refused: str | None = None
    notes: tuple[str, ...] = ()

    def count(self, action: ObjectAction) -> int:
        return sum(1 for o in self.objects if o.action is action and o.error is None)

    @property
    def conflicts(self) -> int:
        return sum(len(o.conflicts) for o in self.objects)

    @property
    def errors(self) -> int:
        return sum(1 for o in self.objects if o.error is not None) + (1 if self.error else 0)

    @property
    def has_differences(self) -> bool:
        return any(o.is_difference for o in self.objects)

    def totals(self) -> dict[str, int]:
        return {
            "created": self.count(ObjectAction.CREATE),
            "updated": self.count(ObjectAction.UPDATE),
            "pruned": self.count(ObjectAction.PRUNE),
            "conflicts": self.conflicts,
            "errors": self.errors,
        }


@dataclass(frozen=True)
class Report:
    """A whole report: one section per cluster, in the order the clusters were asked for."""

    mode: Mode
    revision: RevisionInfo
    clusters: tuple[ClusterReport, ...]
    #: Offline mode: the revision compared against.
    base: RevisionInfo | None = None
    field_manager: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(("created", "updated", "pruned", "conflicts", "errors"), 0)
        for c in self.clusters:
            for k, v in c.totals().items():
                out[k] += v
        return out

    @property
    def has_errors(self) -> bool:
        return any(c.errors for c in self.clusters)

    @property
    def has_differences(self) -> bool:
        return any(c.has_differences for c in self.clusters)

    @property
    def exit_code(self) -> int:
        if self.has_errors:
            return EXIT_ERROR
        return EXIT_DIFFERENT if self.has_differences else EXIT_SAME


# -- JSON -----------------------------------------------------------------------------


def _revision_json(r: RevisionInfo | None) -> dict[str, str] | None:
    return None if r is None else {"ref": r.ref, "sha": r.sha}


def _object_json(o: ObjectReport) -> dict[str, Any]:
    return {
        "key": o.key,
        "apiVersion": o.api_version,
        "group": o.group,
        "kind": o.kind,
        "namespace": o.namespace,
        "name": o.name,
        "action": o.action.value,
        "error": o.error,
        "basis": o.basis,
        "source": o.source,
        "reason": o.reason,
        "note": o.note,
        "diff": o.diff,
        "fields": [{"path": f.path, "op": f.op, "before": f.before, "after": f.after} for f in o.fields],
        "conflicts": [
            {
                "path": c.path,
                "manager": c.manager,
                "operation": c.operation,
                "subresource": c.subresource,
                "resolution": c.resolution,
                "desired": c.desired,
                "live": c.live,
            }
            for c in o.conflicts
        ],
        "released": [{"path": r.path, "removed": r.removed} for r in o.released],
    }


def to_json(report: Report) -> dict[str, Any]:
    """The report as the JSON document ``docs/report-schema.json`` describes."""
    return {
        "schemaVersion": SCHEMA_VERSION,
        "mode": report.mode.value,
        "revision": _revision_json(report.revision),
        "base": _revision_json(report.base),
        "fieldManager": report.field_manager,
        "summary": {
            **report.totals(),
            "clusters": len(report.clusters),
            "differences": report.has_differences,
            "exitCode": report.exit_code,
        },
        "notes": list(report.notes),
        "clusters": [
            {
                "name": c.name,
                "error": c.error,
                "pruneRefused": c.prune_refused,
                "notes": list(c.notes),
                "summary": {**c.totals(), "unchanged": c.unchanged},
                "objects": [_object_json(o) for o in c.objects],
            }
            for c in report.clusters
        ],
    }
