"""What one pass keeps per app and across its apps: ``AppRun`` and ``Shared``.

``ClusterReconciler`` fills them as the pass goes (rendered, parents read, prepared, planned,
applied) and reads them to decide what each app may do; ``narrowed`` is the pure rule of an
app's members after its pass.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.apply.inventory import Inventory, InventoryStore, Member, record_uids
from agent.config.types import AppConfig
from agent.errors import AgentError
from agent.model import (
    ApiFinding,
    ApplyResult,
    ClusterResult,
    DesiredObject,
    DesiredSet,
    Failure,
    ObjectKey,
    Outcome,
    PruneRefusal,
    Revision,
    SyncKind,
    SyncOrder,
    WaveWait,
    WindowHold,
)
from agent.plan import masking
from agent.plan.ordering import sync_order
from agent.plan.planner import PlanOptions
from agent.reconcile.live import LiveState


class Phase(enum.Enum):
    """Where an app's pass stands. It only moves forward (``AppRun.reach``); the ends are final and
    each is set together with what the result says of it (``AppRun.end_*``)."""

    NEW = 0
    #: Its render is known (``desired_set``); an app not due stops here or at ``PREPARED``.
    RENDERED = 1
    #: Its inventory read and claim checked, its objects prepared and inside its scope.
    PREPARED = 2
    #: Verdicts made for its objects; what it may write is decided.
    PLANNED = 3
    #: Its changes sent (or previewed) and its prune done (or held): the pass is over for it.
    DONE = 4
    #: Ends before ``DONE``, each with its own words in the result.
    FAILED = 10
    REFUSED = 11
    SUSPENDED = 12
    WAITING = 13
    #: Planned and reported, nothing written: a change window (``[[windows]]``) is closed.
    WINDOW = 14
    #: Applied up to a sync wave that is not healthy yet: the next pass goes on from there.
    SYNCING = 15

    @property
    def ended(self) -> bool:
        return self.value >= Phase.DONE.value


@dataclass
class AppRun:
    """One app in one pass: what was rendered and read for it, its phase, and its result.

    Fields are filled as the phases pass (``desired_set`` from ``RENDERED``; ``store``,
    ``inventory`` and ``desired`` from ``PREPARED``; ``options`` from ``PLANNED``); ``ready`` hands
    them over as one typed value. The result's failure, refusal and wait are written only by the
    ``end_*`` methods, once, so an app cannot both fail and succeed, nor fail twice.
    """

    app: AppConfig
    result: ClusterResult
    #: Runs in this pass (else only rendered, so that the pass knows what it declares).
    due: bool
    revision: Revision | None
    phase: Phase = Phase.NEW
    desired_set: DesiredSet | None = None
    #: Prepared for the cluster with the app's membership label; ``None``: unknown this pass.
    desired: list[DesiredObject] | None = None
    store: InventoryStore | None = None
    inventory: Inventory | None = None
    options: PlanOptions | None = None
    #: Its members as stored now (after this pass's writes).
    members: dict[ObjectKey, Member] = field(default_factory=dict)
    #: The steps of its sync (``plan.ordering``: waves, hooks), read with its objects prepared.
    order: SyncOrder = field(default_factory=SyncOrder)
    #: Which Helm hooks its sync runs: its first install's or a later revision's.
    kind: SyncKind = SyncKind.UPGRADE
    #: Its hooks (Argo CD's, Helm's) and the objects its sync never applies (``Skip``, delete,
    #: rollback and test hooks): taken out of ``desired``, so none is ever planned, applied or
    #: recorded as a member.
    hooks: dict[ObjectKey, DesiredObject] = field(default_factory=dict)
    #: Declared objects the cluster does not serve: failed before anything is sent.
    unserved: dict[ObjectKey, ApiFinding] = field(default_factory=dict)
    #: What a report says besides the objects (a suspended app previewed all the same).
    notes: list[str] = field(default_factory=list)
    #: The error that ended it (``end_failed``), where there was one.
    cause: AgentError | None = None
    #: The change window closing its writes in this pass (``plan.windows``), if any; ``forced``:
    #: overridden once (``sync --force-window``), so it writes all the same.
    window: WindowHold | None = None

    @property
    def name(self) -> str:
        return self.app.name

    @property
    def identity(self) -> str:
        """Whom its requests act as: its ``service_account``, or "" for the agent's own identity."""
        return self.app.settings.service_account

    @property
    def held(self) -> bool:
        """A change window closes its writes in this pass: nothing applied, pruned or recorded."""
        return self.window is not None and not self.window.forced

    @property
    def refused(self) -> bool:
        return self.phase is Phase.REFUSED

    @property
    def known(self) -> bool:
        """Whether this pass knows what the app declares (rendered, not suspended, not refused)."""
        return self.desired is not None and self.phase not in (Phase.REFUSED, Phase.SUSPENDED)

    @property
    def finished(self) -> bool:
        """Nothing more to do for it in this pass (its result is final)."""
        return self.phase.ended

    @property
    def active(self) -> bool:
        return self.due and self.known and not self.finished

    def reach(self, phase: Phase) -> None:
        """Move forward to ``phase`` (never back, never out of an end)."""
        if self.phase.ended or phase.ended or phase.value < self.phase.value:
            raise RuntimeError(f"app {self.name!r}: {self.phase.name} cannot become {phase.name}")
        self.phase = phase

    def end_failed(self, failure: Failure, cause: AgentError | None = None) -> bool:
        """A due app's failure, unless its pass already ended; whether this ended it.

        ``cause``: the error it was made from, for callers acting on this one app (``takeover``
        raises it as it was)."""
        if not self.due or self.phase.ended:
            return False
        self.result.failure = failure
        self.cause = cause
        self.phase = Phase.FAILED
        return True

    def end_refused(self, failure: Failure, cause: AgentError | None = None) -> bool:
        """Its inventory is another's (or unreadable as ours): nothing of it is known or written."""
        if self.phase.ended:
            return False
        self.phase = Phase.REFUSED
        self.cause = cause
        if self.due:
            self.result.failure = failure
        return self.due

    def end_suspended(self, refusal: PruneRefusal) -> bool:
        if self.phase.ended:
            return False
        self.phase = Phase.SUSPENDED
        if self.due:
            self.result.prune_refusal = refusal
        return self.due

    def end_waiting(self, dependencies: tuple[str, ...]) -> None:
        """Its dependencies have not succeeded at their revisions: nothing applied or pruned."""
        if self.phase.ended:
            raise RuntimeError(f"app {self.name!r} ended {self.phase.name} before waiting")
        self.result.waiting_on = dependencies
        self.phase = Phase.WAITING

    def end_window(self, hold: WindowHold) -> None:
        """Planned, and a change window closes its writes: nothing applied, pruned or recorded."""
        if self.phase.ended:
            raise RuntimeError(f"app {self.name!r} ended {self.phase.name} before its window")
        self.result.window = hold
        self.phase = Phase.WINDOW

    def end_syncing(self, wait: WaveWait) -> None:
        """Applied up to a wave that is not healthy yet: later waves and the prune wait."""
        if self.phase.ended:
            raise RuntimeError(f"app {self.name!r} ended {self.phase.name} before its wave")
        self.result.wave_wait = wait
        self.phase = Phase.SYNCING

    def end_done(self) -> None:
        """Its changes and prune are done (a failure while doing them ended it already)."""
        if not self.phase.ended:
            self.phase = Phase.DONE

    def ready(self) -> Ready:
        """What a planned app's writes need, typed; only once ``PLANNED``."""
        if self.phase is not Phase.PLANNED:
            raise RuntimeError(f"app {self.name!r} is {self.phase.name}, not PLANNED")
        store, inventory, desired, options = self.store, self.inventory, self.desired, self.options
        revision, desired_set = self.revision, self.desired_set
        if (
            store is None
            or inventory is None
            or desired is None
            or options is None
            or revision is None
            or desired_set is None
        ):
            raise RuntimeError(f"app {self.name!r} reached PLANNED without what planning sets")
        return Ready(store, inventory, desired, options, revision, desired_set)

    def split_hooks(self) -> None:
        """Its sync's order for its kind, and its hooks (and what its sync never applies) out of
        its objects: Argo CD's and Helm's, each with its tool's semantics (docs/ordering.md)."""
        assert self.desired is not None
        self.order = sync_order(self.desired, self.kind)
        apart = {o.key for s in (*self.order.steps, *self.order.on_fail) for o in s.objects if o.hook}
        apart |= {x.ordered.key for x in self.order.left_out}
        self.hooks = {o.key: o for o in self.desired if o.key in apart}
        self.desired = [o for o in self.desired if o.key not in apart]

    def secret_values(self) -> set[str]:
        """The values its objects hold secret (Secrets', decrypted ones): masked in every output."""
        return masking.secret_strings(o.manifest for o in self.desired or ())


@dataclass(frozen=True)
class Ready:
    """A planned app's pieces, none of them missing."""

    store: InventoryStore
    inventory: Inventory
    desired: list[DesiredObject]
    options: PlanOptions
    revision: Revision
    desired_set: DesiredSet


@dataclass
class Shared:
    """What the apps of one pass share: who declares what, who holds what, what moved."""

    runs: dict[str, AppRun]
    #: Membership value → (the app holding its members, their parent's name).
    holders: dict[str, tuple[str, str]]
    #: Apps whose declarations this pass knows.
    known: set[str]
    #: What each identity read ("": the agent's own; else an apps' ``service_account``).
    lives: dict[str, LiveState] = field(default_factory=dict)
    #: Parent name → objects another app took over from it in this pass.
    released: dict[str, set[ObjectKey]] = field(default_factory=dict)
    declared: dict[ObjectKey, list[tuple[AppRun, DesiredObject]]] = field(default_factory=dict)
    #: Object → the apps whose inventories record it (as read at the start of the pass).
    recorded: dict[ObjectKey, list[AppRun]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for run in self.runs.values():
            if run.known and run.desired is not None:
                for obj in run.desired:
                    self.declared.setdefault(obj.key, []).append((run, obj))
            for key in run.members:
                self.recorded.setdefault(key, []).append(run)
        self._all_declared = set(self.declared)
        self._sole: dict[str, set[ObjectKey]] = {}
        for key, decl in self.declared.items():
            if len(decl) == 1:
                self._sole.setdefault(decl[0][0].name, set()).add(key)

    def declared_by_others(self, run: AppRun) -> set[ObjectKey]:
        """What an app other than ``run`` declares in this pass (never ``run``'s to delete).

        Every declared key less those ``run`` alone declares, both counted once per pass: asking
        each key, for each app, who declares it was a quarter of a 100-app pass.
        """
        return self._all_declared - self._sole.get(run.name, set())

    def live_for(self, run: AppRun) -> LiveState:
        """What ``run``'s identity read in this pass: its apps' listings, completeness and errors."""
        return self.lives[run.identity]

    def release(self, parent: str, key: ObjectKey) -> None:
        """``key`` leaves ``parent``'s inventory when the pass settles (another app holds it now)."""
        with self._lock:  # called from the listing threads too
            self.released.setdefault(parent, set()).add(key)

    def release_stale(self, key: ObjectKey, holder: AppRun) -> None:
        """``holder``'s set holds ``key`` live: any other app still recording it lets it go."""
        for run in self.recorded.get(key, ()):
            if run is not holder and run.store is not None:
                self.release(run.store.name, key)


def narrowed(
    current: Mapping[ObjectKey, Member],
    desired: Iterable[ObjectKey],
    live: LiveState,
    results: list[ApplyResult],
    released: set[ObjectKey],
) -> dict[ObjectKey, Member]:
    """Members after an app's pass: desired plus what could not be removed; UIDs recorded.

    ``released``: what the prune decision found gone or taken out of the set by hand
    (membership label removed); neither is ours to track any more.
    """
    wanted = set(desired)
    done = {r.key for r in results if r.outcome in (Outcome.PRUNED, Outcome.ORPHANED)}
    gone = released | {
        k for k in current if k not in wanted and not live.found(k) and live.complete.get((k.group, k.kind))
    }
    members = {k: m for k, m in current.items() if k not in done and k not in gone}
    for k in sorted(wanted):
        members.setdefault(k, Member(k))
    uids = dict(live.uids)
    uids.update(
        {r.key: r.uid for r in results if r.uid and r.outcome in (Outcome.CREATED, Outcome.CONFIGURED)}
    )
    return {m.key: m for m in record_uids(members.values(), uids)}
