"""Sync waves in the pass: whether the wave just applied is healthy enough for the next.

An app whose objects are in more than one sync wave (``plan.ordering.sync_order``) is applied
wave by wave; after each wave but the last, ``Waves.look`` reads that wave's objects once (one
labelled LIST per kind, ``health_read``) and feeds a ``Tracker`` kept across passes for the
app's revision and wave, so a Failed must hold ``health_debounce`` before it counts and the
wave has ``wave_timeout`` from the first pass that applied it. Three answers:

- ``READY``: every object Current or Suspended: the pass goes on with the next wave;
- ``WAITING``: not yet: the app's pass ends ``syncing`` with a ``WaveWait`` naming the wave
  and the object it waits for, and when to look again (``WAVE_POLL_FIRST`` after the wave's first
  look, doubling while nothing changes up to 10 s, 1 s after a change, never later than a
  debounce or the timeout ends); the scheduler runs the app again
  then, and that pass goes on at the first wave not through, so a rollout never holds the
  cluster's job nor another app's pass;
- ``FAILED``: an object Failed (debounced) or the timeout passed: the app fails, naming it;
  later waves and the prune are not done.

A wave found healthy at a revision is not read again at that revision while a pass changes
nothing in it: a synced app's later passes cost what they cost before waves.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Final

from agent.config.health_checks import HealthCheck
from agent.config.types import HEALTH_POLL_MAX, HEALTH_POLL_MIN, AppConfig
from agent.kube.client import KubeClient
from agent.model import HOOK_OF, Failure, FailureReason, Health, HealthState, ObjectKey, Step, WaveWait
from agent.plan.health_tracker import Tracker
from agent.reconcile.health_read import read

#: A hook Job deleted by its ``ttlSecondsAfterFinished`` once it finished (Helm watches it finish;
#: a pass reads too late to see it): taken as done.
_DONE = Health(HealthState.CURRENT, "deleted after it finished (ttlSecondsAfterFinished)", reason="Finished")
#: Healthy enough for the next wave.
_THROUGH = frozenset({HealthState.CURRENT, HealthState.SUSPENDED})
#: Seconds to the second look at a wave: a short rollout (ConfigMaps, Deployments whose Pods start
#: at once) is through well within a second, and a first re-look at 1 s cost such an app most of a
#: second per wave (``python -m benchmarks waves``). Doubling from here reaches 1 s in 4 looks, so
#: a long rollout costs at most 4 passes more; a change seen later starts again at 1 s.
WAVE_POLL_FIRST: Final = 0.1


class Gate(enum.StrEnum):
    """What a look at a wave decides for the rest of the app's sync."""

    READY = "ready"
    WAITING = "waiting"
    FAILED = "failed"


@dataclass(frozen=True)
class Look:
    gate: Gate
    wait: WaveWait | None = None
    #: ``FAILED``: the object that failed (its key in the cluster) and its health.
    failed: ObjectKey | None = None
    health: Health | None = None
    requests: int = 0

    def failure(self, at: WaveAt, reason: FailureReason = FailureReason.WAVE, name: str = "") -> Failure:
        """The app's failure for a ``FAILED`` look (``name``: how to call the object that failed)."""
        what = f"{name or self.failed}: {self.health.describe() if self.health else 'failed'}"
        return Failure(
            reason,
            f"{at.step.label} ({at.index} of {at.steps}) did not become healthy: {what}; "
            "later waves and the prune were not done",
        )


@dataclass
class _Track:
    """One app's wait on one step of its sync at one revision, across passes."""

    revision: str
    step: tuple[str, int]
    tracker: Tracker
    beat: float = HEALTH_POLL_MIN
    last: tuple[HealthState, int] | None = None


@dataclass(frozen=True)
class WaveAt:
    """Which wave of which sync a look is about."""

    app: AppConfig
    revision: str
    #: The app's ApplySet id: its objects' membership label value.
    membership: str
    step: Step
    index: int
    steps: int


@dataclass
class Waves:
    """The waves each app of one cluster waits on (kept by its reconciler across passes)."""

    _tracks: dict[str, _Track] = field(default_factory=dict)
    #: App → (revision, the steps (stage, wave) found healthy at it).
    _through: dict[str, tuple[str, set[tuple[str, int]]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def through(self, app: str, revision: str, step: Step) -> bool:
        """Whether ``step`` was found healthy at ``revision`` already."""
        seen = self._through.get(app)
        return seen is not None and seen[0] == revision and (step.stage.value, step.wave) in seen[1]

    def forget(self, app: str) -> None:
        with self._lock:
            self._tracks.pop(app, None)
            self._through.pop(app, None)

    def look(
        self,
        client: KubeClient,
        at: WaveAt,
        keys: Sequence[ObjectKey],
        now: float,
        *,
        hooks: Sequence[ObjectKey] = (),
        checks: Sequence[HealthCheck] = (),
        namespaced: set[tuple[str, str]] | None = None,
        gone_when_done: Set[ObjectKey] = frozenset(),
    ) -> Look:
        """Read ``keys`` (the wave's objects the app applied) and ``hooks`` (its hook objects, by
        their names in the cluster) once; what the wait makes of them. ``gone_when_done``: hooks
        deleted once they finished (a Job's ``ttlSecondsAfterFinished``): not found is through."""
        name, settings = at.app.name, at.app.settings
        step = (at.step.stage.value, at.step.wave)
        with self._lock:
            track = self._tracks.get(name)
            if track is None or (track.revision, track.step) != (at.revision, step):
                tracker = Tracker(
                    started=now,
                    timeout=settings.wave_timeout,
                    debounce=settings.health_debounce,
                    keys=[*keys, *hooks],
                )
                track = self._tracks[name] = _Track(at.revision, step, tracker)
        reading = read(client, at.membership, keys, checks=checks, namespaced=namespaced)
        if hooks:
            selector = f"{HOOK_OF}={at.membership}"
            of_hooks = read(
                client, at.membership, hooks, checks=checks, namespaced=namespaced, selector=selector
            )
            for key in gone_when_done:
                if of_hooks.healths.get(key, _DONE).state is HealthState.NOT_FOUND:
                    of_hooks.healths[key] = _DONE
            reading.healths.update(of_hooks.healths)
            reading.excluded |= of_hooks.excluded
            reading.requests += of_hooks.requests
        tracker = track.tracker
        for key in reading.excluded:
            tracker.forget(key)
        for key, seen in reading.healths.items():
            tracker.observe(key, seen, now)
        report = tracker.report(now)
        failed = sorted(k for k, h in report.items() if h.state is HealthState.FAILED)
        if failed:
            self.forget(name)
            return Look(Gate.FAILED, failed=failed[0], health=report[failed[0]], requests=reading.requests)
        pending = sorted(k for k, h in report.items() if h.state not in _THROUGH)
        if not pending:
            with self._lock:
                self._tracks.pop(name, None)
                revision, steps = self._through.get(name, (at.revision, set()))
                self._through[name] = (at.revision, (steps if revision == at.revision else set()) | {step})
            return Look(Gate.READY, requests=reading.requests)
        return Look(Gate.WAITING, wait=self._wait(track, at, report, pending, now), requests=reading.requests)

    @staticmethod
    def _wait(
        track: _Track, at: WaveAt, report: dict[ObjectKey, Health], pending: list[ObjectKey], now: float
    ) -> WaveWait:
        tracker = track.tracker
        mark = (tracker.summary(now).state, sum(1 for h in report.values() if h.state in _THROUGH))
        if track.last is None:
            track.beat = WAVE_POLL_FIRST
        else:
            track.beat = HEALTH_POLL_MIN if mark != track.last else min(track.beat * 2, HEALTH_POLL_MAX)
        track.last = mark
        change = tracker.next_change(now)
        recheck = min(track.beat, change - now) if change is not None else track.beat
        blocker = pending[0]
        return WaveWait(
            at.step.label,
            at.step.wave,
            at.index,
            at.steps,
            blocker,
            report[blocker],
            now - tracker.started,
            tracker.timeout,
            max(recheck, 0.0),
        )


def applied_keys(step: Step, outcomes: Set[ObjectKey]) -> list[ObjectKey]:
    """The objects of ``step`` the app holds in the cluster as Git says (what its wave waits for)."""
    return [o.key for o in step.objects if o.hook is None and o.key in outcomes]


__all__ = ["Gate", "Look", "WaveAt", "Waves", "applied_keys"]
