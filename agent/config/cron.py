"""Five-field cron schedules, as cron reads them: parse, and find a start near a moment.

``[[windows]] schedule`` (``config.windows``) is read with ``parse_cron``; ``plan.windows`` asks a
schedule for its latest start before a moment and its next start after one, in the window's time
zone. Pure. Why not apscheduler's ``CronTrigger.from_crontab``: in the 3.x series it reads
weekday 0 as Monday (cron: Sunday) and ANDs day of month with day of week where cron ORs them,
so ``0 9 * * 1-5`` would open a window on Saturdays.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
#: The shorthands cron knows (``@reboot`` is no schedule: refused).
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    #: The value of the first name (months count from 1, weekdays from 0).
    first: int = 0


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, _MONTHS, 1),
    # 7 is Sunday too, as in cron.
    _Field("day of week", 0, 7, _DAYS, 0),
)


@dataclass(frozen=True)
class CronSchedule:
    """The minutes a schedule starts at, field by field (weekdays 0-6, Sunday 0)."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    #: Cron's rule: when both day fields are restricted (neither starts with ``*``), a day
    #: matching either is a match; otherwise both must (a ``*`` matches every day).
    either_day: bool

    def day_matches(self, local: datetime) -> bool:
        if local.month not in self.months:
            return False
        dom = local.day in self.days
        dow = (local.isoweekday() % 7) in self.weekdays
        return (dom or dow) if self.either_day else (dom and dow)

    def latest_start(self, now: datetime, zone: tzinfo, *, after: datetime) -> datetime | None:
        """The latest start ``t`` with ``after < t <= now`` (in ``zone``), or None.

        Walks back from ``now`` a day, an hour or a run of minutes at a time, each step taken in
        the zone's wall clock (a 23- or 25-hour day of a DST change is counted as it is)."""
        t = now.astimezone(UTC).replace(second=0, microsecond=0)
        while t > after:
            local = t.astimezone(zone)
            if not self.day_matches(local):
                t = datetime.combine(local.date(), time(), zone).astimezone(UTC) - _MINUTE
            elif local.hour not in self.hours:
                t = local.replace(minute=0).astimezone(UTC) - _MINUTE
            elif local.minute in self.minutes:
                return local
            else:
                earlier = [m for m in self.minutes if m < local.minute]
                t = (
                    t - (local.minute - max(earlier)) * _MINUTE
                    if earlier
                    else t - (local.minute + 1) * _MINUTE
                )
        return None

    def next_start(self, now: datetime, zone: tzinfo, *, before: datetime) -> datetime | None:
        """The earliest start ``t`` with ``now < t < before`` (in ``zone``), or None."""
        t = now.astimezone(UTC).replace(second=0, microsecond=0) + _MINUTE
        while t < before:
            local = t.astimezone(zone)
            if not self.day_matches(local):
                midnight = datetime.combine(local.date() + timedelta(days=1), time(), zone)
                t = max(midnight.astimezone(UTC), t + _MINUTE)
            elif local.hour not in self.hours:
                t = local.replace(minute=0).astimezone(UTC) + 60 * _MINUTE
            elif local.minute in self.minutes:
                return local
            else:
                later = [m for m in self.minutes if m > local.minute]
                t = t + (min(later) - local.minute) * _MINUTE if later else t + (60 - local.minute) * _MINUTE
        return None


@functools.cache
def parse_cron(text: str) -> CronSchedule:
    """``"0 22 * * 1-5"`` → its ``CronSchedule``; raises ``ValueError`` naming the field at fault."""
    expr = _MACROS.get(text.strip().lower(), text)
    parts = expr.split()
    if len(parts) != 5:
        raise ValueError(
            f"a cron schedule has 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(parts)} in {text!r}"
        )
    sets = [_parse_field(p, f) for p, f in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in sets[4])
    either = not parts[2].startswith("*") and not parts[4].startswith("*")
    return CronSchedule(text, sets[0], sets[1], sets[2], sets[3], weekdays, either)


def _parse_field(text: str, f: _Field) -> frozenset[int]:
    out: set[int] = set()
    for item in text.split(","):
        out |= _parse_item(item, f)
    return frozenset(out)


def _parse_item(item: str, f: _Field) -> set[int]:
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or int(step_text) == 0:
            raise ValueError(f"{f.name}: bad step {step_text!r} in {item!r}")
        step = int(step_text)
    if body == "*":
        low, high = f.low, f.high
    elif "-" in body:
        a, _, b = body.partition("-")
        low, high = _value(a, f, item), _value(b, f, item)
        if low > high:
            raise ValueError(f"{f.name}: range {item!r} runs backwards")
    else:
        low = _value(body, f, item)
        high = f.high if slash else low  # "5/15": from 5 to the end, every 15
    return set(range(low, high + 1, step))


def _value(text: str, f: _Field, item: str) -> int:
    if text.isdigit():
        value = int(text)
    elif text.lower() in f.names:
        value = f.names.index(text.lower()) + f.first
    else:
        raise ValueError(f"{f.name}: {text!r} is not a value (in {item!r})")
    if not f.low <= value <= f.high:
        raise ValueError(f"{f.name}: {value} is outside {f.low}-{f.high} (in {item!r})")
    return value
