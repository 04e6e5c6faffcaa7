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
from typing import Any, Protocol

from agent.model import IgnoredFields

SCHEMA_VERSION = 2

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


class Severity(enum.StrEnum):
    #: Counts as an error: the report's exit code is 2.
    ERROR = "error"
    WARNING = "warning"


class FindingKind(enum.StrEnum):
    """What a check of the desired state found, beside the diff (``diff --offline``)."""

    #: An encrypted file is not encrypted to the age recipient of a cluster that applies it:
    #: that cluster could not decrypt it (its app would fail to render).
    NOT_ENCRYPTED_TO = "not-encrypted-to"
    #: Encrypted files, and no ``age_recipients`` configured to check them against.
    NO_RECIPIENTS = "no-recipients"
    #: A Secret whose values are in Git in plaintext.
    PLAINTEXT_SECRET = "plaintext-secret"


@dataclass(frozen=True)
class Finding:
    """One thing a check found about a file of the repository."""

    kind: FindingKind
    severity: Severity
    file: str
    message: str

    def text(self) -> str:
        return f"{self.file}: {self.message}" if self.file else self.message


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
class AppConflictLine:
    """An object two apps of one cluster declare: ``holder`` manages it, ``other`` leaves it alone."""

    holder: str
    holder_file: str
    other: str
    other_file: str

    def text(self) -> str:
        return (
            f"declared by app {self.holder!r} ({self.holder_file}) and app {self.other!r}"
            f" ({self.other_file}); {self.holder!r} manages it, {self.other!r} leaves it alone"
        )


@dataclass(frozen=True)
class ApiLine:
    """What is, or will be, wrong with the object's apiVersion (``model.ApiProblem`` spelling)."""

    problem: str
    message: str
    #: The apiVersion to use instead ("" when none is known).
    replacement: str = ""

    @property
    def blocking(self) -> bool:
        """Not served (there, or after the target release): the object cannot be applied."""
        return self.problem in ("not-served", "removed")


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
    #: Why a ``skip`` (``model.SkipReason`` spelling: ``helm-hook``, ``other-set``...); "" otherwise.
    skip: str = ""
    #: The server (or a guard) refused this object: the real apply would fail here.
    error: str | None = None
    #: Other apps of the cluster declaring this object too (shown in both apps' sections).
    app_conflicts: tuple[AppConflictLine, ...] = ()
    #: Its apiVersion: not served, removed by the target release, deprecated, server warnings.
    api: tuple[ApiLine, ...] = ()
    #: Declared fields the config's ignore rules left alone, per rule: neither sent nor compared.
    ignored: tuple[IgnoredFields, ...] = ()

    @property
    def key(self) -> str:
        gk = f"{self.kind}.{self.group}" if self.group else self.kind
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{gk}/{ns}{self.name}"

    @property
    def blocked(self) -> bool:
        """Its apiVersion is not served (or not by the target release)."""
        return any(a.blocking for a in self.api)

    @property
    def is_difference(self) -> bool:
        return (
            self.action is not ObjectAction.SKIP
            or self.error is not None
            or bool(self.app_conflicts)
            or self.blocked
        )


class _Part(Protocol):
    """An app's or a cluster's part of a report, as its summary row reads it."""

    @property
    def conflicts(self) -> int: ...
    @property
    def yielded(self) -> int: ...
    @property
    def errors(self) -> int: ...
    def count(self, action: ObjectAction) -> int: ...


def _totals(part: _Part) -> dict[str, int]:
    """The summary row of an app's or a cluster's part: one spelling for both."""
    return {
        "created": part.count(ObjectAction.CREATE),
        "updated": part.count(ObjectAction.UPDATE),
        "pruned": part.count(ObjectAction.PRUNE),
        "conflicts": part.conflicts,
        "yielded": part.yielded,
        "errors": part.errors,
    }


@dataclass(frozen=True)
class AppReport:
    """One app's part of a cluster's section; ``error`` set means it could not be planned."""

    name: str
    objects: tuple[ObjectReport, ...] = ()
    unchanged: int = 0
    error: str | None = None
    #: Why no deletion would happen in this pass (brake, unknown state, empty render, prune = false).
    prune_refused: str | None = None
    notes: tuple[str, ...] = ()
    #: What the checks of encrypted files and Secrets found (``diff --offline``).
    findings: tuple[Finding, ...] = ()
    #: Fields the ignore rules left alone over all the app's objects, unchanged ones included.
    ignored: tuple[IgnoredFields, ...] = ()
    #: The steps its sync would run in order (waves, hooks), one line each; empty: one wave, no hook.
    sync: tuple[str, ...] = ()

    def count(self, action: ObjectAction) -> int:
        return sum(1 for o in self.objects if o.action is action and o.error is None)

    @property
    def conflicts(self) -> int:
        """Field conflicts with other managers plus objects another app declares too."""
        return sum(len(o.conflicts) + len(o.app_conflicts) for o in self.objects)

    @property
    def yielded(self) -> int:
        """Field conflicts left to the other manager (docs/safety.md rule 5): part of ``conflicts``."""
        return sum(1 for o in self.objects for c in o.conflicts if c.resolution == "yield")

    @property
    def errors(self) -> int:
        failed = sum(1 for f in self.findings if f.severity is Severity.ERROR)
        return sum(1 for o in self.objects if o.error is not None) + (1 if self.error else 0) + failed

    @property
    def has_differences(self) -> bool:
        return any(o.is_difference for o in self.objects)

    @property
    def blocked(self) -> int:
        """Objects whose apiVersion is not served (or not by the target release)."""
        return sum(1 for o in self.objects if o.blocked)

    def totals(self) -> dict[str, int]:
        return _totals(self)


@dataclass(frozen=True)
class ClusterReport:
    """One cluster's section: its apps' parts in config order (a config without ``[[apps]]``
    has one app named after the cluster). ``error``: the cluster as a whole could not be
    planned (timed out); each app's own failures are on the app."""

    name: str
    apps: tuple[AppReport, ...] = ()
    error: str | None = None

    @classmethod
    def single(cls, name: str, **app: Any) -> ClusterReport:
        """A cluster whose one app is named after it (the implicit app of a ``[[clusters]]`` entry)."""
        return cls(name, (AppReport(name, **app),))

    @property
    def implicit_only(self) -> bool:
        """True when the cluster's only app is the one named after it: shown without app headings."""
        return len(self.apps) <= 1 and all(a.name == self.name for a in self.apps)

    @property
    def objects(self) -> tuple[ObjectReport, ...]:
        return tuple(o for a in self.apps for o in a.objects)

    @property
    def unchanged(self) -> int:
        return sum(a.unchanged for a in self.apps)

    def count(self, action: ObjectAction) -> int:
        return sum(a.count(action) for a in self.apps)

    @property
    def conflicts(self) -> int:
        return sum(a.conflicts for a in self.apps)

    @property
    def yielded(self) -> int:
        return sum(a.yielded for a in self.apps)

    @property
    def errors(self) -> int:
        return sum(a.errors for a in self.apps) + (1 if self.error else 0)

    @property
    def has_differences(self) -> bool:
        return any(a.has_differences for a in self.apps)

    @property
    def blocked(self) -> int:
        return sum(a.blocked for a in self.apps)

    def totals(self) -> dict[str, int]:
        return _totals(self)


@dataclass(frozen=True)
class Report:
    """A whole report: one section per cluster, in the order the clusters were asked for."""

    mode: Mode
    revision: RevisionInfo
    clusters: tuple[ClusterReport, ...]
    #: Offline mode: the revision compared against.
    base: RevisionInfo | None = None
    #: Offline mode: the Kubernetes release checked for removed API versions ("" none).
    kubernetes_version: str = ""
    field_manager: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(("created", "updated", "pruned", "conflicts", "yielded", "errors"), 0)
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
        "skip": o.skip,
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
        "appConflicts": [
            {"holder": c.holder, "holderFile": c.holder_file, "other": c.other, "otherFile": c.other_file}
            for c in o.app_conflicts
        ],
        "api": [{"problem": a.problem, "message": a.message, "replacement": a.replacement} for a in o.api],
        **_ignored_json(o.ignored),
    }


def _app_json(a: AppReport) -> dict[str, Any]:
    return {
        "name": a.name,
        "error": a.error,
        "pruneRefused": a.prune_refused,
        "notes": list(a.notes),
        "findings": [
            {"kind": f.kind.value, "severity": f.severity.value, "file": f.file, "message": f.message}
            for f in a.findings
        ],
        "summary": {**a.totals(), "unchanged": a.unchanged},
        "objects": [_object_json(o) for o in a.objects],
        **_ignored_json(a.ignored),
        **({"sync": list(a.sync)} if a.sync else {}),
    }


def _ignored_json(ignored: tuple[IgnoredFields, ...]) -> dict[str, Any]:
    """``ignored`` only where a rule left fields alone: reports of configs without rules keep their shape."""
    return {"ignored": [{"rule": i.rule, "fields": i.fields} for i in ignored]} if ignored else {}


def to_json(report: Report) -> dict[str, Any]:
    """The report as the JSON document ``docs/report-schema.json`` describes."""
    return {
        "schemaVersion": SCHEMA_VERSION,
        "mode": report.mode.value,
        "revision": _revision_json(report.revision),
        "base": _revision_json(report.base),
        "fieldManager": report.field_manager,
        "kubernetesVersion": report.kubernetes_version,
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
                "summary": {**c.totals(), "unchanged": c.unchanged},
                "apps": [_app_json(a) for a in c.apps],
            }
            for c in report.clusters
        ],
    }
