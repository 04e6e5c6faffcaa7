"""How far a rollout got: ``Health`` (``HealthState``, ``HealthCause``, the ``Blocker`` holding
it up) per object, and ``AppHealth`` per app and revision.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from agent.model.keys import ObjectKey


class HealthState(enum.StrEnum):
    """How far an object (or an app) has rolled out: kstatus's names, plus ``Suspended``.

    ``agent.plan.health`` decides it per object; ``worst`` orders it for an app:
    Failed > Unknown > NotFound > Terminating > InProgress > Suspended > Current.
    """

    #: Rolled out: what Git declares is running as declared.
    CURRENT = "Current"
    #: On its way: the controller has not caught up yet (or cannot say why it has not).
    IN_PROGRESS = "InProgress"
    #: Will not get there without a change: a kind rule, ``Stalled=True``, or the wait timed out.
    FAILED = "Failed"
    #: Paused on purpose (a paused Deployment, a suspended Job or CronJob): nothing to wait for.
    SUSPENDED = "Suspended"
    #: Cannot be told: a malformed status, a custom check that did not evaluate.
    UNKNOWN = "Unknown"
    #: Being deleted (``metadata.deletionTimestamp``).
    TERMINATING = "Terminating"
    #: Not in the cluster, though it was applied: the follower's word, never ``assess``'s.
    NOT_FOUND = "NotFound"


class HealthCause(enum.StrEnum):
    """Where a reported ``Health`` comes from: the object's status, or the wait around it."""

    #: The object's own status, as ``assess`` read it.
    OBSERVED = "observed"
    #: Failed, but not yet for ``health_debounce`` seconds: reported InProgress (a flap is no alarm).
    DEBOUNCING = "debouncing"
    #: Still not Current when ``health_timeout`` ran out: reported Failed.
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Blocker:
    """The object that holds a rollout up, and why, in the server's own words.

    ``reason`` is the word the server or controller wrote (``ImagePullBackOff``,
    ``BackoffLimitExceeded``, ``Unschedulable``, a condition's reason); ``message`` its text.
    """

    kind: str
    namespace: str
    name: str
    reason: str
    message: str = ""

    def __str__(self) -> str:
        said = f" ({self.message})" if self.message else ""
        return f"{self.kind} {self.name}: {self.reason}{said}"


@dataclass(frozen=True)
class Health:
    """One object's (or one app's) health: ``state`` and ``reason`` for machines, ``message`` for people.

    ``reason`` is one CamelCase word from the rule that decided (``LessAvailable``,
    ``ProgressDeadlineExceeded``, a condition's reason); ``blocker`` names what holds the
    rollout up when it is known (a Pod of a Deployment, the Job itself).
    """

    state: HealthState
    message: str
    blocker: Blocker | None = None
    reason: str = ""
    cause: HealthCause = HealthCause.OBSERVED

    def describe(self) -> str:
        """One line: ``Failed: Pod web-7d9f-abcde: ImagePullBackOff (Back-off pulling image "nope")``.

        The message comes first, unless it is the blocker's own (an object that blocks itself).
        """
        if self.blocker is None:
            return f"{self.state}: {self.message}"
        if not self.message or self.message == self.blocker.message:
            return f"{self.state}: {self.blocker}"
        return f"{self.state}: {self.message.rstrip('.')}; {self.blocker}"


@dataclass(frozen=True)
class AppHealth:
    """One app's health at one revision, as the wait after its pass last read it.

    Reported beside the pass result, not inside it: a pass ends when its writes are accepted,
    a rollout later ("applied, degraded" is an app whose pass is ``ok`` and health ``Failed``).
    """

    app: str
    revision: str
    health: Health
    #: The wait ended: every object Current, Suspended or (debounced, timed out) Failed.
    done: bool
    objects: int = 0
    current: int = 0
    #: Seconds since the wait on this revision began.
    waited: float = 0.0
    #: Requests this wait has made so far (the cost the benchmarks count).
    reads: int = 0
    #: Each followed object's health as the wait reports it (not in ``to_json``: the status page's).
    by_object: tuple[tuple[ObjectKey, Health], ...] = ()

    @property
    def state(self) -> HealthState:
        return self.health.state

    def to_json(self) -> dict[str, Any]:
        h = self.health
        return {
            "state": h.state.value,
            "reason": h.reason,
            "cause": h.cause.value,
            "message": h.message,
            "blocker": str(h.blocker) if h.blocker else None,
            "revision": self.revision,
            "done": self.done,
            "objects": self.objects,
            "current": self.current,
            "waited": round(self.waited, 1),
            "reads": self.reads,
        }
