"""What happens to requests that arrive while a cluster's pass or a source's poll runs: pure.

A cluster's job runs one pass at a time (``max_instances=1``). A wake asked for while it runs
(a new revision, a ``sync``, a dependency rolled out) cannot move the running job, so it waits
for the job's end; of several, the earliest wins (``JobState.request``). A forced pass (every
app, not only the due ones) and apps a dependency's rollout unblocked are kept until the next
pass takes them (``begin``). A source pushed to (``receiver``) polls once at a time, and any
number of pushes during a poll add up to one more (``PollState``). ``scheduler.Daemon`` keeps
one state per cluster and per source under its lock and acts on the answers (APScheduler jobs,
threads); nothing here reads a clock or starts anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

__all__ = ["JobState", "PollState", "Request"]


@dataclass(frozen=True)
class Request:
    """A wake of a cluster's job asked for: when, and why (``/status`` shows it)."""

    when: datetime
    why: str


@dataclass(frozen=True)
class JobState:
    """One cluster's job, between the scheduler's wakes and its passes."""

    #: A pass of the job is running.
    running: bool = False
    #: The earliest wake asked for while it ran: applied when the job returns.
    queued: Request | None = None
    #: The next pass runs every app (a ``sync``, a config reload, a Lease acquired).
    forced: bool = False
    #: Apps whose dependency rolled out since their pass: due at the next pass.
    woken: frozenset[str] = frozenset()
    #: Why the next pass is forced (``manual sync``, ``config reloaded``, ``lease acquired``).
    forced_by: str = ""

    def request(self, request: Request) -> tuple[JobState, Request | None]:
        """A wake asked for: returned to act on now while the job is idle; while it runs, kept
        for its end unless an earlier one is kept already."""
        if not self.running:
            return self, request
        if self.queued is None or request.when < self.queued.when:
            return replace(self, queued=request), None
        return self, None

    def begin(self) -> tuple[JobState, bool, frozenset[str]]:
        """A pass starts: it takes the forced flag and the woken apps (whether it runs every app,
        which apps a rollout unblocked)."""
        began = replace(self, running=True, forced=False, woken=frozenset(), forced_by="")
        return began, self.forced, self.woken

    def end(self) -> tuple[JobState, Request | None]:
        """The job returned (a pass ran or not): the wake that waited for it, to act on now."""
        return replace(self, running=False, queued=None), self.queued

    def force(self, why: str = "") -> JobState:
        return replace(self, forced=True, forced_by=self.forced_by or why)

    def wake(self, apps: Iterable[str]) -> JobState:
        return replace(self, woken=self.woken | frozenset(apps))


@dataclass(frozen=True)
class PollState:
    """One source's polls asked for by pushes."""

    #: A poller for the source runs (a thread that polls while polls are asked for).
    running: bool = False
    #: A poll asked for and not started yet.
    dirty: bool = False

    def push(self) -> tuple[PollState, bool]:
        """A push asks for a poll: whether to start a poller (none runs yet)."""
        return PollState(running=True, dirty=True), not self.running

    def next(self, *, stopping: bool) -> tuple[PollState, bool]:
        """The poller asks whether to poll (again): yes while one was asked for since its last
        start; otherwise, or when the agent stops, the poller ends."""
        if not self.dirty or stopping:
            return replace(self, running=False), False
        return replace(self, dirty=False), True
