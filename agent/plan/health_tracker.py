"""Health over time during one wait: a flap is not a failure, a wait ends, and says why.

Pure: the follower (after apply) feeds ``Tracker.observe(key, assess(obj), now)`` with the
health it read and the time it read it, and asks ``report(now)`` / ``done(now)``; no clock
inside. Rules: a Failed must hold ``debounce`` seconds before it counts (until then it reads
InProgress, "failing for 4s: ..."); whatever is not Current, Suspended or Failed when
``timeout`` seconds have passed since the wait began is Failed, naming what it was still
waiting for (``HealthCause.TIMEOUT``); the wait is done when every object is one of those three.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from agent.model import Health, HealthCause, HealthState, ObjectKey
from agent.plan.health import summarize

#: States a wait stops at (Failed only once debounced, or timed out).
TERMINAL = frozenset({HealthState.CURRENT, HealthState.SUSPENDED, HealthState.FAILED})
NOT_READ = Health(HealthState.UNKNOWN, "not read yet", reason="NotRead")


@dataclass
class _Seen:
    health: Health
    #: When the current run of Failed observations began (None: the last one was not Failed).
    failing_since: float | None = None


def _secs(seconds: float) -> str:
    return f"{round(seconds, 1):g}s"


class Tracker:
    """One wait over some objects: started at ``started``, given up at ``started + timeout``."""

    def __init__(
        self, *, started: float, timeout: float, debounce: float, keys: Iterable[ObjectKey] = ()
    ) -> None:
        self.started = started
        self.timeout = timeout
        self.debounce = debounce
        self._seen: dict[ObjectKey, _Seen] = {k: _Seen(NOT_READ) for k in keys}

    @property
    def deadline(self) -> float:
        return self.started + self.timeout

    def observe(self, key: ObjectKey, health: Health, now: float) -> Health:
        """Record what ``key`` looked like at ``now``; returns what it reads as now."""
        seen = self._seen.get(key)
        since = None
        if health.state is HealthState.FAILED:
            since = seen.failing_since if seen is not None and seen.failing_since is not None else now
        self._seen[key] = _Seen(health, since)
        return self.reported(key, now)

    def forget(self, key: ObjectKey) -> None:
        """Stop waiting for ``key`` (annotated out of health since the wait began)."""
        self._seen.pop(key, None)

    def reported(self, key: ObjectKey, now: float) -> Health:
        """``key``'s health as the wait counts it at ``now`` (debounced, timed out)."""
        seen = self._seen[key]
        health = seen.health
        timed_out = now >= self.deadline
        if health.state is HealthState.FAILED:
            held = now - (seen.failing_since if seen.failing_since is not None else now)
            if held >= self.debounce:
                return health
            if timed_out:
                return replace(
                    health,
                    message=f"failing for {_secs(held)} when the wait ended after {_secs(self.timeout)}: "
                    f"{health.message}",
                    cause=HealthCause.TIMEOUT,
                )
            return replace(
                health,
                state=HealthState.IN_PROGRESS,
                message=f"failing for {_secs(held)}: {health.message}",
                cause=HealthCause.DEBOUNCING,
            )
        if health.state in TERMINAL or not timed_out:
            return health
        return replace(
            health,
            state=HealthState.FAILED,
            message=f"still {health.state} after {_secs(self.timeout)}: {health.message}",
            cause=HealthCause.TIMEOUT,
        )

    def report(self, now: float) -> dict[ObjectKey, Health]:
        return {k: self.reported(k, now) for k in self._seen}

    def pending(self, now: float) -> list[ObjectKey]:
        """The objects the wait still waits for, in key order."""
        return sorted(k for k in self._seen if self.reported(k, now).state not in TERMINAL)

    def done(self, now: float) -> bool:
        """Every object is Current, Suspended or (debounced or timed out) Failed."""
        return not self.pending(now)

    def summary(self, now: float) -> Health:
        """The app's health at ``now`` (``health.summarize`` of the report)."""
        return summarize(self.report(now))

    def next_change(self, now: float) -> float | None:
        """When a report changes without a new observation (a debounce ends, the deadline): None if never.

        A follower waits on its watch until then, rather than polling on a fixed beat.
        """
        times = [
            s.failing_since + self.debounce
            for s in self._seen.values()
            if s.failing_since is not None and s.failing_since + self.debounce > now
        ]
        if now < self.deadline and not self.done(now):
            times.append(self.deadline)
        return min(times, default=None)
