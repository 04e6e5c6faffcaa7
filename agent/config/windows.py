"""``[[windows]]``: change windows, when the agent may write to which apps.

Called by ``load``. Each entry is a ``ChangeWindow``: a cron ``schedule`` (``config.cron``) in
its ``time_zone``, open for ``duration`` from each start, ``kind`` allow or deny, for the
``apps`` and ``clusters`` its globs match. What the keys accept is declared on the fields; a
schedule cron cannot read or a time zone the system's database does not know is a
``ConfigError`` naming the key. ``plan.windows`` decides what they mean for an app now.
"""

from __future__ import annotations

import fnmatch
import re
import zoneinfo
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agent.config.constraints import Choice, Duration, Parsed, Pattern, accepts, declare
from agent.config.cron import CronSchedule, parse_cron
from agent.config.tomlreader import TableReader
from agent.errors import ConfigError

_GLOB = Pattern(re.compile(r"\s*\S"), "must not be empty", optional=False)
_NAME = Pattern(
    re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"),
    "must be a DNS label (lowercase letters, digits, '-'), got {value!r}",
)


def parse_zone(name: str) -> zoneinfo.ZoneInfo:
    """An IANA time zone (``Europe/Berlin``); ``ValueError`` when the system does not know it."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name, e.g. Europe/Berlin or UTC)") from None


class WindowKind(StrEnum):
    """What an open window means for the apps it matches."""

    #: Writes happen only inside an open allow window (when any allow window matches the app).
    ALLOW = "allow"
    #: No writes while it is open, whatever allow window is open too.
    DENY = "deny"


@dataclass(frozen=True)
class ChangeWindow:
    """One ``[[windows]]`` entry."""

    #: Cron, five fields (``"0 22 * * 1-5"``), read in ``time_zone``.
    schedule: str = field(metadata=accepts(Parsed(parse_cron)))
    #: How long the window stays open from each start (seconds).
    duration: float = field(metadata=accepts(Duration(60.0)))
    kind: WindowKind = field(metadata=accepts(Choice()))
    #: Names the window in results and on the status page; "" reads ``windows[N]``.
    name: str = declare("", _NAME)
    #: Globs of the app names it applies to.
    apps: tuple[str, ...] = declare(("*",), _GLOB)
    #: Globs of the cluster names it applies to.
    clusters: tuple[str, ...] = declare(("*",), _GLOB)
    time_zone: str = declare("UTC", Parsed(parse_zone))
    #: Its place in ``[[windows]]`` (for the name it is shown by when it has none).
    index: int = 0

    @property
    def label(self) -> str:
        return self.name or f"windows[{self.index}]"

    @property
    def cron(self) -> CronSchedule:
        return parse_cron(self.schedule)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.time_zone)

    def applies(self, cluster: str, app: str) -> bool:
        return any(fnmatch.fnmatchcase(cluster, g) for g in self.clusters) and any(
            fnmatch.fnmatchcase(app, g) for g in self.apps
        )


def windows(raw: list[Any], path: str, file: str) -> tuple[ChangeWindow, ...]:
    """The entries of the array at ``path``, in order; names unique."""
    out = tuple(_window(TableReader(t, f"{path}[{i}]", file), i) for i, t in enumerate(raw))
    seen: dict[str, int] = {}
    for w in out:
        if w.name and w.name in seen:
            raise ConfigError(
                f"{path}[{w.index}].name", f"{w.name!r} names {path}[{seen[w.name]}] already", file=file
            )
        seen[w.name] = w.index
    return out


def _window(r: TableReader, index: int) -> ChangeWindow:
    window = ChangeWindow(
        schedule=r.setting(ChangeWindow, "schedule", required=True),
        duration=_required_duration(r),
        kind=r.setting(ChangeWindow, "kind", required=True),
        name=r.setting(ChangeWindow, "name", ""),
        apps=r.setting(ChangeWindow, "apps", ("*",)),
        clusters=r.setting(ChangeWindow, "clusters", ("*",)),
        time_zone=r.setting(ChangeWindow, "time_zone", "UTC"),
        index=index,
    )
    r.finish()
    for key in ("schedule", "time_zone"):
        if not getattr(window, key).strip():
            raise r.error(key, "must not be empty")
    return window


def _required_duration(r: TableReader) -> float:
    if "duration" not in r.table:
        r.used.add("duration")
        raise r.error("duration", "required key is missing")
    value: float = r.setting(ChangeWindow, "duration", 0.0)
    return value
