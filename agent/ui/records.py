"""What the status page keeps of each app: its state since when, its last pass's objects, its
recent passes and Events, as one typed, bounded, JSON-serialisable ``AppRecord``.

Pure. ``run.statuspage`` feeds it each pass's ``ClusterResult`` (``after_pass``) and each
reading of a wait (``after_health``), and persists a record only when ``encode`` of it changed:
a steady pass (same revision and state, nothing applied, pruned or failed anew) leaves the record
as it was, so a steady fleet writes nothing. The page renders records, never results.

Secret-safe by construction, whatever later renders it (docs/safety.md rule 11): the object
row of a Secret, or of an object holding values decrypted from Git, carries no message but its
HTTP status, its Events go through ``events.message_for``,
and the values of a yielded secret field are masked again here (the plan masked them already).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from agent.config.types import (
    HISTORY_EVENTS,
    HISTORY_PASSES,
    RECORD_MESSAGE,
    RECORD_OBJECTS,
)
from agent.model import (
    AppHealth,
    ApplyResult,
    ClusterResult,
    Drift,
    DriftKind,
    FieldConflict,
    Outcome,
    PassState,
    WaveWait,
)
from agent.plan.fields import render_path
from agent.plan.masking import MASK, is_secret_path
from agent.report import events

#: Bumped when the stored shape changes; a record of another version is ignored, not misread.
RECORD_VERSION = 1

#: Object rows first in this order on the app page: what needs a look comes first.
_ORDER = {
    Outcome.FAILED: 0,
    Outcome.PRUNE_SKIPPED: 2,
    Outcome.CREATED: 3,
    Outcome.CONFIGURED: 3,
    Outcome.PRUNED: 4,
    Outcome.ORPHANED: 4,
    Outcome.SKIPPED: 5,
    Outcome.UNCHANGED: 6,
}


def clip(text: str, limit: int = RECORD_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _iso(t: datetime | None) -> str:
    return t.isoformat() if t else ""


def _value(v: object) -> str:
    return clip(json.dumps(v, sort_keys=True, ensure_ascii=False), 200)


@dataclass(frozen=True)
class Yield:
    """A declared field left to its owner: ``spec.replicas owned by kube-controller-manager (scale),
    kept 5, Git says 3``."""

    path: str
    manager: str
    #: ``scale``, ``status``... when the owner wrote through a subresource, else its operation.
    via: str
    kept: str
    git: str

    def __str__(self) -> str:
        return f"{self.path} owned by {self.manager} ({self.via}), kept {self.kept}, Git says {self.git}"

    @classmethod
    def of(cls, c: FieldConflict, *, secret: bool) -> Yield:
        masked = secret and is_secret_path(c.path)
        return cls(
            path=render_path(c.path),
            manager=c.manager,
            via=c.subresource or c.operation,
            kept=MASK if masked else _value(c.live),
            git=MASK if masked else _value(c.desired),
        )


@dataclass(frozen=True)
class DriftRow:
    """A drifted field (``drift = "report"``) as the page shows it: field, Git's and live's value,
    who changed it and when (values masked by the plan, again here for a Secret's fields)."""

    key: str
    path: str
    git: str
    live: str
    #: ``kubectl-edit (Update)``, or what is known of the writer.
    who: str
    #: The server's ``managedFields`` time of that write.
    when: str
    #: ``reported`` (left as it is) or ``corrected`` (by a new revision's apply).
    fate: str

    def __str__(self) -> str:
        if not self.path:
            return f"deleted in the cluster, {self.fate}"
        return f"{self.path}: Git says {self.git}, live {self.live}, {self.fate}"

    @classmethod
    def of(cls, d: Drift) -> DriftRow:
        masked = d.key.kind == "Secret" and d.path.startswith(("data", "stringData"))
        deleted = d.kind is DriftKind.DELETED
        who = f"{d.manager} ({d.operation})" if d.manager else ""
        return cls(
            key=str(d.key),
            path=d.path,
            git="" if deleted else MASK if masked else _value(d.git),
            live="" if deleted else MASK if masked else _value(d.live),
            who=who or ("unknown" if not deleted else "not recorded"),
            when=d.time,
            fate=d.fate.value,
        )


@dataclass(frozen=True)
class ObjectRow:
    """One object of the app's last pass: its outcome and why, its health, what it yielded."""

    key: str
    kind: str
    namespace: str
    name: str
    outcome: str
    #: ``yielded``, ``immutable``... (``Note``), or why it was skipped (``SkipReason``).
    note: str = ""
    message: str = ""
    health: str = ""
    health_reason: str = ""
    health_message: str = ""
    yields: tuple[Yield, ...] = ()

    @classmethod
    def of(cls, r: ApplyResult) -> ObjectRow:
        # A Secret, or an object holding values decrypted from Git (``sensitive``).
        secret = (r.key.kind == "Secret" and r.key.group == "") or r.sensitive
        if secret:
            # A server's validation message may quote a value: its status code only.
            message = f"HTTP {r.status}" if r.outcome is Outcome.FAILED else ""
        elif r.outcome is Outcome.FAILED and r.status:
            message = f"HTTP {r.status}: {r.message}"
        else:
            message = r.message
        note = r.note.value if r.note else (r.skip.value if r.skip else "")
        return cls(
            key=str(r.key),
            kind=r.key.kind,
            namespace=r.key.namespace,
            name=r.key.name,
            outcome=r.outcome.value,
            note=note,
            message=clip(message),
            yields=tuple(Yield.of(c, secret=secret) for c in r.yielded),
        )


@dataclass(frozen=True)
class PassEntry:
    """One pass in the history: when, at which revision, how it ended, what it changed."""

    at: str
    revision: str
    subject: str
    state: str
    seconds: float | None
    applied: int = 0
    pruned: int = 0
    failed: int = 0
    #: Why nothing was pruned, or why the cluster was not touched at all.
    refused: str = ""
    error: str = ""
    #: A change window held its writes, or was overridden once (``sync --force-window``).
    window: str = ""
    #: What made the pass run (``run.triggers``: ``new revision``, ``interval``, ``manual sync``...).
    trigger: str = ""
    #: The chart's version (its Chart.yaml at ``revision``) where the app renders one chart.
    chart: str = ""
    #: The source's revision when a rollback pin made the pass render ``revision`` instead.
    pinned_from: str = ""
    #: A rollback pin the pass cleared (its source moved past the bad revision), in words.
    note: str = ""

    def same_outcome(self, other: PassEntry) -> bool:
        """The same revision, state and messages: a repeat that history does not keep twice."""
        return (self.revision, self.state, self.failed, self.refused, self.error, self.window) == (
            other.revision,
            other.state,
            other.failed,
            other.refused,
            other.error,
            other.window,
        )


@dataclass(frozen=True)
class EventEntry:
    """What a Kubernetes Event on the app's parent says (object failed, pruned; a wait ended)."""

    at: str
    severity: str
    reason: str
    message: str
    revision: str
    #: The object it is about (``Kind/ns/name``), or ``health``.
    subject: str = ""


@dataclass(frozen=True)
class HealthSummary:
    """The app's rollout as its wait last read it (without the per-step counters)."""

    state: str
    reason: str
    message: str
    done: bool
    current: int
    objects: int


@dataclass(frozen=True)
class WaveSummary:
    """The step of its sync an app waits on (state ``syncing``): ``wave 1 (2 of 3)``, the object
    it waits for and that object's health. Without the seconds waited: a wave that only waits
    longer leaves the record as it was (no write every look)."""

    step: str
    index: int
    steps: int
    #: ``Kind.group/ns/name`` of the first object of the step not healthy ("" when none is named).
    blocker: str
    health: str
    #: Seconds the step may take (``wave_timeout``).
    timeout: float

    @property
    def label(self) -> str:
        return f"{self.step} ({self.index} of {self.steps})"

    def __str__(self) -> str:
        what = f"{self.blocker}: {self.health}" if self.blocker and self.health else "its objects"
        return f"{self.label}, waiting for {what}"

    @classmethod
    def of(cls, w: WaveWait) -> WaveSummary:
        return cls(
            step=w.step,
            index=w.index,
            steps=w.steps,
            blocker=str(w.blocker) if w.blocker else "",
            health=clip(w.health.describe()) if w.health else "",
            timeout=w.timeout,
        )


@dataclass(frozen=True)
class AppRecord:
    """One app of one cluster, as the page shows it; persisted only when it changed."""

    cluster: str
    app: str
    state: str = PassState.PENDING.value
    #: When the app entered ``state`` (the first pass that left it there).
    since: str = ""
    revision: str = ""
    subject: str = ""
    synced_revision: str = ""
    synced_at: str = ""
    error: str = ""
    prune_refused: str = ""
    waiting_on: tuple[str, ...] = ()
    #: Objects this app and another both declare, in words.
    conflicts: tuple[str, ...] = ()
    health: HealthSummary | None = None
    #: Outcome → count over every object of the last pass that ran (not only those listed).
    counts: tuple[tuple[str, int], ...] = ()
    objects: tuple[ObjectRow, ...] = ()
    #: Objects of the last pass not listed in ``objects`` (beyond ``RECORD_OBJECTS``).
    objects_left_out: int = 0
    #: Newest last, at most ``HISTORY_PASSES`` / ``HISTORY_EVENTS``.
    history: tuple[PassEntry, ...] = ()
    events: tuple[EventEntry, ...] = field(default_factory=tuple)
    #: Drift of the last pass that ran (``drift = "report"``): left, or corrected by a new revision.
    drift: tuple[DriftRow, ...] = ()
    #: What the last pass's change window said (held, or overridden once); "" when none did.
    window: str = ""
    #: The rollback pin in force (``gitops-agent rollback``): the pinned and the bad revision.
    pin_revision: str = ""
    pin_bad: str = ""
    #: The step of its sync the last pass ended waiting on (state ``syncing``), if any.
    wave: WaveSummary | None = None

    @property
    def suspended(self) -> bool:
        return self.state == PassState.SUSPENDED.value

    @property
    def problem(self) -> str:
        """What went wrong last, in one place: the pass's error, else its first failed object."""
        if self.error:
            return self.error
        failed = [o for o in self.objects if o.outcome == Outcome.FAILED.value]
        if not failed:
            return ""
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        return f"{failed[0].key}: {failed[0].message}{more}"

    @property
    def yields(self) -> list[tuple[ObjectRow, Yield]]:
        return [(o, y) for o in self.objects for y in o.yields]

    def to_json(self) -> dict[str, Any]:
        return {"version": RECORD_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> AppRecord | None:
        """The record ``to_json`` wrote; None for another version or a shape this code cannot read."""
        if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
            return None
        try:
            health = doc.get("health")
            return cls(
                cluster=str(doc["cluster"]),
                app=str(doc["app"]),
                state=str(doc["state"]),
                since=str(doc["since"]),
                revision=str(doc["revision"]),
                subject=str(doc["subject"]),
                synced_revision=str(doc["synced_revision"]),
                synced_at=str(doc["synced_at"]),
                error=str(doc["error"]),
                prune_refused=str(doc["prune_refused"]),
                waiting_on=tuple(doc["waiting_on"]),
                conflicts=tuple(doc["conflicts"]),
                health=HealthSummary(**health) if health else None,
                counts=tuple((str(o), int(n)) for o, n in doc["counts"]),
                objects=tuple(
                    ObjectRow(**{**o, "yields": tuple(Yield(**y) for y in o["yields"])})
                    for o in doc["objects"]
                ),
                objects_left_out=int(doc["objects_left_out"]),
                history=tuple(PassEntry(**h) for h in doc["history"]),
                events=tuple(EventEntry(**e) for e in doc["events"]),
                drift=tuple(DriftRow(**d) for d in doc.get("drift") or ()),
                window=str(doc.get("window", "")),
                pin_revision=str(doc.get("pin_revision", "")),
                pin_bad=str(doc.get("pin_bad", "")),
                wave=WaveSummary(**doc["wave"]) if doc.get("wave") else None,
            )
        except (KeyError, TypeError, ValueError):
            return None


def encode(record: AppRecord) -> str:
    """The record as stored: canonical JSON, so equal records are equal text (no write)."""
    return json.dumps(record.to_json(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def record_id(cluster: str, app: str) -> str:
    """A stable name-safe id of (cluster, app): file and ConfigMap names."""
    return hashlib.sha256(f"{cluster}\0{app}".encode()).hexdigest()[:16]


def _rows(results: list[ApplyResult]) -> tuple[tuple[ObjectRow, ...], int]:
    ordered = sorted(results, key=lambda r: (_ORDER.get(r.outcome, 9), not r.yielded, str(r.key)))
    return tuple(ObjectRow.of(r) for r in ordered[:RECORD_OBJECTS]), max(0, len(ordered) - RECORD_OBJECTS)


def _with_health(rows: tuple[ObjectRow, ...], health: AppHealth) -> tuple[ObjectRow, ...]:
    by_key = {str(k): h for k, h in health.by_object}
    out = []
    for row in rows:
        h = by_key.get(row.key)
        if h is None:
            out.append(row)
        else:
            secret = row.kind == "Secret"
            out.append(
                replace(
                    row,
                    health=h.state.value,
                    health_reason=h.reason,
                    health_message="" if secret else clip(h.describe()),
                )
            )
    return tuple(out)


def _keep_last(items: tuple[Any, ...], limit: int) -> tuple[Any, ...]:
    return items[-limit:] if len(items) > limit else items


def after_pass(
    previous: AppRecord | None,
    result: ClusterResult,
    *,
    subject: str,
    now: datetime,
    trigger: str = "",
) -> AppRecord:
    """The record after one pass of the app: state (and since when), objects, history, Events.

    A pass that ran nothing (a cluster that could not be read, a dependency waited for) keeps the
    previous objects: what the agent owns there did not change because it could not look.
    """
    prev = previous or AppRecord(result.cluster, result.app or result.cluster)
    state = result.state.value
    at = _iso(result.finished or now)
    objects, left_out, counts = prev.objects, prev.objects_left_out, prev.counts
    if result.results:
        objects, left_out = _rows(result.results)
        counts = tuple((o.value, n) for o in Outcome if (n := result.count(o)))
    refused = result.prune_refused or ""
    entry = PassEntry(
        at=at,
        revision=result.revision,
        subject=clip(subject, 200),
        state=state,
        seconds=round((result.finished - result.started).total_seconds(), 3)
        if result.started and result.finished
        else None,
        applied=result.applied,
        pruned=result.count(Outcome.PRUNED),
        failed=result.failed,
        refused=clip(refused),
        error=clip(result.error or ""),
        window=clip(result.window.message) if result.window else "",
        trigger=trigger,
        chart=clip(result.chart, 80),
        pinned_from=result.followed if result.pin else "",
        note=clip(result.pin_cleared),
    )
    history = prev.history
    changed_something = entry.applied or entry.pruned or result.count(Outcome.ORPHANED)
    if not history or changed_something or entry.note or not entry.same_outcome(history[-1]):
        history = _keep_last((*history, entry), HISTORY_PASSES)
    new_events = list(prev.events)
    seen = {(e.subject, e.reason, e.revision) for e in new_events}
    for r in events.reportable(result):
        severity, reason = events.reason_for(r)
        if (str(r.key), reason, result.revision) in seen:
            continue  # as Kubernetes Events: a repeat at the same revision is not a new one
        new_events.append(
            EventEntry(at, severity, reason, clip(events.message_for(r)), result.revision, str(r.key))
        )
    for d in result.drift_reported:
        if (str(d.key), "DriftDetected", result.revision) not in seen:
            seen.add((str(d.key), "DriftDetected", result.revision))
            new_events.append(
                EventEntry(
                    at, "Warning", "DriftDetected", clip(str(DriftRow.of(d))), result.revision, str(d.key)
                )
            )
    synced = state == PassState.OK.value
    drift = prev.drift
    if result.results:
        drift = tuple(DriftRow.of(d) for d in result.drift[:RECORD_OBJECTS])
    pin = _pin_fields(prev, result)
    return replace(
        prev,
        state=state,
        since=prev.since if prev.state == state and prev.since else at,
        revision=result.revision or prev.revision,
        subject=clip(subject, 200) if result.revision else prev.subject,
        synced_revision=result.revision if synced else prev.synced_revision,
        synced_at=at if synced and prev.synced_revision != result.revision else prev.synced_at,
        error=clip(result.error or ""),
        prune_refused=clip(refused),
        waiting_on=tuple(result.waiting_on),
        conflicts=tuple(clip(str(c)) for c in result.conflicts),
        objects=objects,
        objects_left_out=left_out,
        counts=counts,
        history=history,
        events=_keep_last(tuple(new_events), HISTORY_EVENTS),
        drift=drift,
        window=entry.window,
        pin_revision=pin[0],
        pin_bad=pin[1],
        wave=WaveSummary.of(result.wave_wait) if result.wave_wait else None,
    )


def _pin_fields(prev: AppRecord, result: ClusterResult) -> tuple[str, str]:
    """The pin (revision, bad) as this pass read it; a pass that failed keeps the last known."""
    if result.pin is not None:
        return result.pin.revision, result.pin.bad
    if result.pin_cleared or result.ok:
        return "", ""
    return prev.pin_revision, prev.pin_bad


def after_health(previous: AppRecord, health: AppHealth, *, now: datetime) -> AppRecord:
    """The record after a reading of the app's wait: its health, each object's, and an Event
    when the wait ended (``HealthFailed`` naming the blocker, ``HealthCurrent``)."""
    h = health.health
    summary = HealthSummary(
        state=h.state.value,
        reason=h.reason,
        message=clip(h.describe()),
        done=health.done,
        current=health.current,
        objects=health.objects,
    )
    evs = previous.events
    ended = health.done and not (previous.health and previous.health.done and previous.health == summary)
    if ended and h.state.value in ("Current", "Failed"):
        reason = "HealthCurrent" if h.state.value == "Current" else "HealthFailed"
        severity = "Normal" if reason == "HealthCurrent" else "Warning"
        if not any(
            e.subject == "health" and e.reason == reason and e.revision == health.revision for e in evs
        ):
            evs = _keep_last(
                (*evs, EventEntry(_iso(now), severity, reason, summary.message, health.revision, "health")),
                HISTORY_EVENTS,
            )
    return replace(previous, health=summary, objects=_with_health(previous.objects, health), events=evs)
