"""What to send, decided from what happened and what was sent before: edge-triggered, pure.

``notifier.Notifier`` feeds it one cluster's persisted ``ClusterState`` and an observation (a pass
result, a health reading, the clock) and persists the state it returns before it sends anything.

Alerts, per (cluster, app, condition):

- ``reconcile``: the app's pass failed (a pass fenced by a Lease or a shutdown says nothing).
  Fires after ``after_failures`` consecutive failed passes, or once it has failed for ``after``
  seconds, whichever comes first.
- ``prune``: the mass-deletion brake held the app's deletions back; fires at once (the brake is
  a deliberate stop, waiting for a person).
- ``health``: the app's wait ended Failed (already debounced and bounded by ``health_timeout``);
  fires at once.
- ``drift``: an app with ``drift = "report"`` has drift its pass left in the cluster; fires at
  once, is never reminded of (it is a state, not a failure: ``/status`` and the metric show it
  while it lasts), and resolves when a pass finds none (corrected, undone, or a new revision).

A firing condition is reminded of after ``remind[0]``, then ``remind[1]``, ... seconds (the last
one repeating), and sends one resolved message when it recovers. Nothing is sent twice: the state
says what was sent, and it is saved before sending.

Commit statuses, per (cluster, app, revision): ``pending`` when a pass starts on a revision not
yet reported, ``success`` or ``failure`` once its pass is done (for an app with ``wait``: once its
rollout is Current or Failed); each state at most once per revision.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agent.config.types import AlertSettings, Severity
from agent.model import (
    AppHealth,
    ClusterResult,
    FailureReason,
    HealthState,
    PruneReason,
    app_page,
    drifted_objects,
)


class Condition(enum.StrEnum):
    """What an alert is about."""

    RECONCILE = "reconcile"
    PRUNE = "prune"
    HEALTH = "health"
    DRIFT = "drift"


class NoticeKind(enum.StrEnum):
    FIRING = "firing"
    REMINDER = "reminder"
    RESOLVED = "resolved"


#: Condition → (reason while failing, reason when resolved): the ``reason`` of Flux's event shape.
REASONS = {
    Condition.RECONCILE: ("ReconcileFailed", "ReconcileSucceeded"),
    Condition.PRUNE: ("PruneBlocked", "PruneResumed"),
    Condition.HEALTH: ("HealthFailed", "HealthCurrent"),
    Condition.DRIFT: ("DriftDetected", "DriftResolved"),
}


class CommitState(enum.StrEnum):
    """A commit status, in GitHub's words (GitLab's ``failed`` is ``failure`` here)."""

    PENDING = "pending"
    SUCCESS = "success"
    FAILURE = "failure"


class Step(enum.StrEnum):
    """What happened to an app at a revision, as far as its commit status goes."""

    STARTED = "started"
    #: The pass succeeded and the app does not wait for its rollout.
    APPLIED = "applied"
    #: The pass succeeded and the app waits for its rollout (the status stays pending).
    APPLIED_WAITING = "applied-waiting"
    FAILED = "failed"
    ROLLED_OUT = "rolled-out"
    ROLLOUT_FAILED = "rollout-failed"


@dataclass(frozen=True)
class Observation:
    """One reading of one condition of one app: ``bad`` or not, and what it says."""

    cluster: str
    app: str
    condition: Condition
    bad: bool
    revision: str
    message: str = ""
    #: The machine reason beneath (``unreachable``, ``brake``, a health reason).
    cause: str = ""


@dataclass(frozen=True)
class Notice:
    """An alert message to send: Flux's event fields plus where it belongs."""

    cluster: str
    app: str
    condition: Condition
    kind: NoticeKind
    severity: Severity
    reason: str
    message: str
    revision: str
    #: Unix time it was decided.
    at: float
    failures: int = 0
    #: Unix time the condition started failing.
    since: float = 0.0
    cause: str = ""


@dataclass(frozen=True)
class StatusUpdate:
    """A commit status to send for one app of one cluster."""

    cluster: str
    app: str
    revision: str
    state: CommitState
    description: str
    at: float


@dataclass(frozen=True)
class Alert:
    """One failing condition's persisted state (an absent one is healthy)."""

    failures: int = 0
    since: float = 0.0
    #: Unix time of the first alert (None: failing, not announced yet).
    fired_at: float | None = None
    reminders: int = 0
    next_at: float | None = None
    message: str = ""
    revision: str = ""
    cause: str = ""


@dataclass(frozen=True)
class Sent:
    """The last commit status sent for an app."""

    revision: str
    state: CommitState


@dataclass(frozen=True)
class ClusterState:
    """Everything sent (or counted) for one cluster's apps; JSON in the store."""

    alerts: dict[tuple[str, Condition], Alert] = field(default_factory=dict)
    statuses: dict[str, Sent] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "alerts": [
                {"app": app, "condition": c.value, **asdict(a)} for (app, c), a in sorted(self.alerts.items())
            ],
            "statuses": {
                app: {"revision": s.revision, "state": s.state.value} for app, s in self.statuses.items()
            },
        }

    @classmethod
    def from_json(cls, doc: Any) -> ClusterState:
        """The state a store held; what it cannot read is dropped (at worst a repeated message)."""
        if not isinstance(doc, dict):
            return cls()
        alerts: dict[tuple[str, Condition], Alert] = {}
        for item in doc.get("alerts") or ():
            try:
                key = (str(item["app"]), Condition(item["condition"]))
                alerts[key] = Alert(**{k: v for k, v in item.items() if k not in ("app", "condition")})
            except (KeyError, TypeError, ValueError):
                continue
        statuses: dict[str, Sent] = {}
        for app, s in (doc.get("statuses") or {}).items():
            try:
                statuses[str(app)] = Sent(str(s["revision"]), CommitState(s["state"]))
            except (KeyError, TypeError, ValueError):
                continue
        return cls(alerts, statuses)

    def next_due(self) -> float | None:
        """The soonest reminder (or a time-based first alert, see ``remind``) this state has."""
        times = [a.next_at for a in self.alerts.values() if a.next_at is not None]
        return min(times) if times else None


def _reminder_delay(settings: AlertSettings, sent: int) -> float | None:
    if not settings.remind:
        return None
    return settings.remind[min(sent, len(settings.remind) - 1)]


def _fire(
    obs_key: tuple[str, str, Condition], a: Alert, now: float, settings: AlertSettings
) -> tuple[Alert, Notice]:
    cluster, app, condition = obs_key
    delay = None if condition is Condition.DRIFT else _reminder_delay(settings, 0)
    fired = replace(a, fired_at=now, reminders=0, next_at=None if delay is None else now + delay)
    return fired, _notice(cluster, app, condition, NoticeKind.FIRING, fired, now)


def _notice(cluster: str, app: str, condition: Condition, kind: NoticeKind, a: Alert, now: float) -> Notice:
    failing, resolved = REASONS[condition]
    return Notice(
        cluster=cluster,
        app=app,
        condition=condition,
        kind=kind,
        severity=Severity.INFO if kind is NoticeKind.RESOLVED else Severity.ERROR,
        reason=resolved if kind is NoticeKind.RESOLVED else failing,
        message=a.message,
        revision=a.revision,
        at=now,
        failures=a.failures,
        since=a.since,
        cause=a.cause,
    )


def _threshold(condition: Condition, a: Alert, now: float, settings: AlertSettings) -> bool:
    """Whether a failing condition not yet announced is due its first alert."""
    if condition is not Condition.RECONCILE:
        return True
    if a.failures >= settings.after_failures:
        return True
    return settings.after > 0 and now - a.since >= settings.after


def observe(
    state: ClusterState, obs: Observation, now: float, settings: AlertSettings
) -> tuple[ClusterState, list[Notice]]:
    """``state`` after ``obs``, and what to send for it."""
    key = (obs.app, obs.condition)
    a = state.alerts.get(key)
    alerts = dict(state.alerts)
    out: list[Notice] = []
    if not obs.bad:
        if a is None:
            return state, []
        del alerts[key]
        if a.fired_at is not None:
            resolved = replace(a, message=obs.message or "recovered", revision=obs.revision or a.revision)
            out.append(_notice(obs.cluster, obs.app, obs.condition, NoticeKind.RESOLVED, resolved, now))
        return replace(state, alerts=alerts), out
    a = a or Alert(since=now)
    a = replace(a, failures=a.failures + 1, message=obs.message, revision=obs.revision, cause=obs.cause)
    if a.fired_at is None:
        if _threshold(obs.condition, a, now, settings):
            a, notice = _fire((obs.cluster, obs.app, obs.condition), a, now, settings)
            out.append(notice)
        elif obs.condition is Condition.RECONCILE and settings.after > 0:
            a = replace(a, next_at=a.since + settings.after)  # the time-based first alert
    alerts[key] = a
    return replace(state, alerts=alerts), out


def remind(
    state: ClusterState, cluster: str, now: float, settings: AlertSettings
) -> tuple[ClusterState, list[Notice]]:
    """Reminders due at ``now`` (and first alerts whose ``after`` ran out), with the state after them."""
    alerts = dict(state.alerts)
    out: list[Notice] = []
    for (app, condition), a in state.alerts.items():
        if a.next_at is None or a.next_at > now:
            continue
        if a.fired_at is None:
            if _threshold(condition, a, now, settings):
                alerts[(app, condition)], notice = _fire((cluster, app, condition), a, now, settings)
                out.append(notice)
            continue
        sent = a.reminders + 1
        delay = _reminder_delay(settings, sent)
        after = replace(a, reminders=sent, next_at=None if delay is None else now + delay)
        alerts[(app, condition)] = after
        out.append(_notice(cluster, app, condition, NoticeKind.REMINDER, after, now))
    if not out and alerts == state.alerts:
        return state, []
    return replace(state, alerts=alerts), out


_TARGET = {
    Step.STARTED: CommitState.PENDING,
    Step.APPLIED_WAITING: CommitState.PENDING,
    Step.APPLIED: CommitState.SUCCESS,
    Step.FAILED: CommitState.FAILURE,
    Step.ROLLED_OUT: CommitState.SUCCESS,
    Step.ROLLOUT_FAILED: CommitState.FAILURE,
}


def status_step(
    state: ClusterState, cluster: str, app: str, revision: str, step: Step, description: str, now: float
) -> tuple[ClusterState, list[StatusUpdate]]:
    """The commit status a step calls for, unless it was sent already. ``pending`` only for a
    revision not reported yet: a later pass of the same revision (drift correction) never turns a
    ``success`` back into ``pending``."""
    if not revision:
        return state, []
    target = _TARGET[step]
    sent = state.statuses.get(app)
    if (
        sent is not None
        and sent.revision == revision
        and (sent.state is target or target is CommitState.PENDING)
    ):
        return state, []
    statuses = {**state.statuses, app: Sent(revision, target)}
    return replace(state, statuses=statuses), [
        StatusUpdate(cluster, app, revision, target, description[:140], now)
    ]


# -- observations from the agent's typed results ----------------------------------------------


def pass_observations(result: ClusterResult) -> list[Observation]:
    """What one app's pass says about its conditions. A fenced pass (Lease lost, shutting down)
    says nothing; the brake is known only from a pass that got to its deletions."""
    if result.dry_run or result.reason is FailureReason.FENCED:
        return []
    app = result.app or result.cluster
    out = [
        Observation(
            result.cluster,
            app,
            Condition.RECONCILE,
            not result.ok,
            result.revision,
            _text(result.error or _objects_failed(result)) if not result.ok else "reconciled",
            result.reason.value if result.reason else "",
        )
    ]
    if result.failure is None:
        brake = result.prune_refusal is not None and result.prune_refusal.reason is PruneReason.BRAKE
        message = result.prune_refused or "" if brake else "deletions resumed"
        out.append(
            Observation(result.cluster, app, Condition.PRUNE, brake, result.revision, _text(message), "brake")
        )
        out.append(drift_observation(result))
    return out


def drift_observation(result: ClusterResult) -> Observation:
    """Whether the pass left drift (``drift = "report"``), naming each field, who and when."""
    app = result.app or result.cluster
    left = result.drift_reported
    if not left:
        corrected = drifted_objects(result.drift)
        message = (
            f"drift corrected by revision {result.revision[:12]} on {corrected} object(s)"
            if corrected
            else "no drift left"
        )
        return Observation(result.cluster, app, Condition.DRIFT, False, result.revision, message, "drift")
    lines = [d.describe() for d in left[:10]]
    if len(left) > 10:
        lines.append(f"and {len(left) - 10} more")
    objects = drifted_objects(left)
    head = f"drift on {objects} object(s), reported and not corrected (drift = report):"
    return Observation(
        result.cluster, app, Condition.DRIFT, True, result.revision, _text("\n".join([head, *lines])), "drift"
    )


def health_observation(cluster: str, health: AppHealth) -> Observation | None:
    """An ended wait's verdict (None while it goes on, or for a state that decides nothing)."""
    if not health.done or health.state not in (
        HealthState.FAILED,
        HealthState.CURRENT,
        HealthState.SUSPENDED,
    ):
        return None
    bad = health.state is HealthState.FAILED
    return Observation(
        cluster,
        health.app,
        Condition.HEALTH,
        bad,
        health.revision,
        health.health.describe()[:1000],
        health.health.reason or health.state.value,
    )


def _objects_failed(result: ClusterResult) -> str:
    return f"{result.failed} object(s) failed"


def _text(text: str, limit: int = 2000) -> str:
    """A failure's message as sent: all of it (a render error's first line names no file), bounded."""
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str, limit: int = 140) -> str:
    """A message squeezed into one line of at most ``limit`` characters (a commit status's
    description): its lines joined, spaces collapsed."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def app_link(public_url: str, cluster: str, app: str) -> str:
    """Where people see an app on the agent's own pages ("" without ``public_url``)."""
    if not public_url:
        return ""
    return f"{public_url.rstrip('/')}{app_page(cluster, app)}"


def context(agent: str, cluster: str, app: str) -> str:
    """A commit status's context (GitLab: its ``name``): one per (cluster, app)."""
    return f"{agent}/{cluster}/{app}"
