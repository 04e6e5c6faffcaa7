"""Whether an app may be written now, by the change windows (``[[windows]]``) that match it.

Pure (``now`` is passed in). The pass asks ``is_open`` for each due app before it writes
(``reconcile.reconciler``); ``/status`` and the status page show ``window_states``. The rules:
a deny window that is open closes writes, whatever else is open (a deny window always wins);
when any allow window matches the app, writes happen only while one of them is open; an app
no window matches is always open. A window is open from each start of its schedule (in its time
zone) for ``duration``: the start included, the end not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.config.windows import ChangeWindow, WindowKind
from agent.model import WindowHold, WindowReason

#: How far ahead a closed window's next start is looked for (a yearly schedule still has one).
HORIZON = timedelta(days=366)


@dataclass(frozen=True)
class WindowState:
    """One window that matches an app, as it stands at ``now``."""

    window: ChangeWindow
    #: The start of the occurrence open now (the latest one, when occurrences overlap); None: closed.
    since: datetime | None
    #: When a closed window next opens (None: not within ``HORIZON``).
    next_start: datetime | None

    @property
    def open(self) -> bool:
        return self.since is not None

    @property
    def until(self) -> datetime | None:
        """When the occurrence open now ends: ``duration`` of real time later (a DST change in
        between moves the wall clock, not the end), shown in the window's zone."""
        if self.since is None:
            return None
        return (self.since.astimezone(UTC) + timedelta(seconds=self.window.duration)).astimezone(
            self.since.tzinfo
        )

    def to_json(self) -> dict[str, Any]:
        w = self.window
        return {
            "name": w.label,
            "kind": w.kind.value,
            "schedule": w.schedule,
            "duration": w.duration,
            "time_zone": w.time_zone,
            "open": self.open,
            "until": _iso(self.until),
            "next_start": _iso(self.next_start),
        }


@dataclass(frozen=True)
class WindowVerdict:
    """Whether writes are open for one app now, and why not (``hold``)."""

    states: tuple[WindowState, ...]
    hold: WindowHold | None = None

    @property
    def writes(self) -> bool:
        return self.hold is None

    def to_json(self) -> dict[str, Any]:
        """``/status``'s keys of an app: its windows, and what blocks its writes now (None: nothing)."""
        return {
            "windows": [s.to_json() for s in self.states],
            "writes_blocked": self.hold.message if self.hold else None,
        }


def window_state(window: ChangeWindow, now: datetime) -> WindowState:
    cron, zone = window.cron, window.zone
    since = cron.latest_start(now, zone, after=now - timedelta(seconds=window.duration))
    upcoming = None if since else cron.next_start(now, zone, before=now + HORIZON)
    return WindowState(window, since, upcoming)


def window_states(
    windows: Iterable[ChangeWindow], cluster: str, app: str, now: datetime
) -> list[WindowState]:
    """The windows that match ``app`` on ``cluster``, in config order, as they stand at ``now``."""
    return [window_state(w, now) for w in windows if w.applies(cluster, app)]


def is_open(windows: Iterable[ChangeWindow], cluster: str, app: str, now: datetime) -> WindowVerdict:
    """Whether ``app`` on ``cluster`` may be written at ``now`` (aware), and which window says not."""
    states = tuple(window_states(windows, cluster, app, now))
    deny = next((s for s in states if s.window.kind is WindowKind.DENY and s.open), None)
    if deny is not None:
        message = (
            f"deny window {deny.window.label!r} ({_spell(deny.window)}) is open until "
            f"{_iso(deny.until)}: nothing applied or pruned"
        )
        return WindowVerdict(states, WindowHold(WindowReason.DENY, deny.window.label, message))
    allows = [s for s in states if s.window.kind is WindowKind.ALLOW]
    if not allows or any(s.open for s in allows):
        return WindowVerdict(states)
    soonest = min(allows, key=lambda s: (s.next_start is None, s.next_start or now))
    names = ", ".join(repr(s.window.label) for s in allows)
    when = (
        f"; {soonest.window.label!r} opens at {_iso(soonest.next_start)}"
        if soonest.next_start
        else f"; none opens within {HORIZON.days} days"
    )
    message = f"outside every allow window ({names}){when}: nothing applied or pruned"
    return WindowVerdict(states, WindowHold(WindowReason.OUTSIDE_ALLOW, soonest.window.label, message))


def _spell(w: ChangeWindow) -> str:
    return f"{w.schedule} for {_duration(w.duration)}, {w.time_zone}"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    text = "".join(f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (mins, "m")) if n)
    return text or f"{seconds:g}s"


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None
