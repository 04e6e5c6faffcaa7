"""What ``gitops-agent events`` lists for an app: its Kubernetes Events and its recent passes,
newest first, as one typed timeline.

Pure: ``agent.cli.events`` reads the Events on the app's ApplySet parent (``report.events``
writes them) and the app's record (``run.record_store``, the status page's history) and hands
them here. Kubernetes keeps Events only for the API server's ``--event-ttl`` (an hour by
default); the record keeps the last ``HISTORY_EVENTS`` of them, so an Event the cluster has
forgotten still shows, once: a record entry that a live Event already says is left out.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent.report.events import split_message
from agent.ui.records import AppRecord, EventEntry, PassEntry

#: Characters of a message that make two tellings of one Event the same (the record clips its copy).
_SAME = 80


class EntryKind(enum.StrEnum):
    EVENT = "Event"
    PASS = "Pass"


@dataclass(frozen=True)
class Entry:
    """One line of the timeline."""

    at: datetime | None
    app: str
    kind: EntryKind
    #: ``Normal``/``Warning`` (a pass that did not end ``ok`` is a Warning).
    type: str
    #: The Event's reason, or the pass's state (``ok``, ``failed``...).
    reason: str
    revision: str
    message: str
    #: How often Kubernetes counted the Event (1 for a pass).
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "at": stamp(self.at),
            "app": self.app,
            "kind": self.kind.value,
            "type": self.type,
            "reason": self.reason,
            "revision": self.revision,
            "message": self.message,
            "count": self.count,
        }


def stamp(t: datetime | None) -> str:
    """``2026-01-02T03:04:05Z``: Events' own spelling, for passes too."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t else ""


def _time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def from_event(app: str, event: Mapping[str, Any]) -> Entry:
    """A Kubernetes Event on the app's parent (``events.v1`` times first, then ``core/v1``'s)."""
    at = (
        _time(event.get("lastTimestamp"))
        or _time(event.get("eventTime"))
        or _time(event.get("firstTimestamp"))
    )
    revision, message = split_message(str(event.get("message") or ""))
    return Entry(
        at=at,
        app=app,
        kind=EntryKind.EVENT,
        type=str(event.get("type") or "Normal"),
        reason=str(event.get("reason") or ""),
        revision=revision,
        message=message,
        count=int(event.get("count") or 1),
    )


def from_recorded_event(app: str, e: EventEntry) -> Entry:
    return Entry(_time(e.at), app, EntryKind.EVENT, e.severity, e.reason, e.revision[:12], e.message)


def from_pass(app: str, p: PassEntry) -> Entry:
    said = [f"applied {p.applied}", f"pruned {p.pruned}", f"failed {p.failed}"]
    took = f" in {p.seconds:g} s" if p.seconds is not None else ""
    why = (p.error or (f"prune refused: {p.refused}" if p.refused else "")).splitlines()
    message = ", ".join(said) + took + (f": {why[0]}" if why else "")
    severity = "Normal" if p.state == "ok" else "Warning"
    return Entry(_time(p.at), app, EntryKind.PASS, severity, p.state, p.revision[:12], message)


def _same(e: Entry) -> tuple[str, str, str]:
    return (e.reason, e.revision, e.message[:_SAME].rstrip("…"))


def timeline(
    events: Mapping[str, Iterable[Mapping[str, Any]]], records: Mapping[str, AppRecord | None]
) -> list[Entry]:
    """Every app's Events (live, then those only its record still holds) and passes, newest first."""
    out: list[Entry] = []
    for app, items in events.items():
        out.extend(from_event(app, e) for e in items)
    live = {(e.app, *_same(e)) for e in out}
    for app, record in records.items():
        if record is None:
            continue
        for kept in record.events:
            entry = from_recorded_event(app, kept)
            if (app, *_same(entry)) not in live:
                out.append(entry)
        out.extend(from_pass(app, p) for p in record.history)
    oldest = datetime.min.replace(tzinfo=UTC)
    return sorted(out, key=lambda e: e.at or oldest, reverse=True)
