"""One reconcile pass for one cluster: every due app, from one shared read of live state.

``ClusterReconciler`` runs the one pipeline (``reconcile.pipeline``: render each app alone, read
every app's inventory parent and the live state of all their objects, decide per object which
app manages it and what it would send, and each app's prune) and then, per app in dependency
order, writes: confirms its updates with the server, widens its inventory, applies, prunes
behind the app's own brake and narrows its inventory. It keeps what a pass needs from the last
(each app's no-op memo, last success, the waits it follows). A render error fails that app
only: nothing applied or pruned for it. A `[[clusters]]` entry's own
app is one app among them: there is one code path.

The scheduler runs one per cluster; the CLI's ``run --once`` and ``diff`` call it directly.
Every failure ends as a ``ClusterResult`` (one per app) with a typed ``Failure``, never as an
exception that could reach another cluster.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

import structlog

from agent.apply import ssa as apply_stage
from agent.apply.inventory import Inventory
from agent.config.types import ClusterConfig, Config, DriftMode
from agent.errors import (
    AgentError,
    ApiError,
    ClusterError,
    ClusterRefused,
)
from agent.kube.client import KubeClient
from agent.model import (
    APPLIED_REVISION,
    Action,
    AppHealth,
    ApplyResult,
    Change,
    ClusterResult,
    Failure,
    HealthState,
    Note,
    ObjectKey,
    Outcome,
    PassState,
    Revision,
)
from agent.plan import drift as drift_plan
from agent.plan import masking
from agent.plan.windows import is_open
from agent.reconcile.appruns import AppRun, Shared, narrowed
from agent.reconcile.apps import (
    Revisions,
    combined,
    revisions_of,
    with_dependencies,
)
from agent.reconcile.confirm import confirm_plan
from agent.reconcile.follow import Follows
from agent.reconcile.hook_runs import HookRuns
from agent.reconcile.pipeline import AppPlan, PassPlan
from agent.reconcile.stages import ClientFactory, SameCluster, app_render_spec, render_spec
from agent.reconcile.waves import Waves
from agent.reconcile.writes import AppWrites
from agent.render.renderer import RenderCache

__all__ = ["ClientFactory", "ClusterReconciler", "SameCluster", "app_render_spec", "render_spec"]

log = structlog.get_logger("gitops_agent.reconcile")


def _created(run: AppRun) -> set[ObjectKey]:
    """The members the app created or adopted once (their UID recorded): gone now, deleted by hand."""
    return {k for k, m in run.members.items() if m.uid}


class ClusterReconciler(AppWrites):
    """Reconciles one cluster's apps; owns that cluster's client and caches."""

    def __init__(
        self,
        config: Config,
        cluster: ClusterConfig,
        *,
        client_factory: ClientFactory = KubeClient.from_config,
        render_cache: RenderCache | None = None,
        same_cluster: SameCluster | None = None,
    ) -> None:
        super().__init__(
            config,
            cluster,
            client_factory=client_factory,
            render_cache=render_cache,
            same_cluster=same_cluster,
        )
        #: App → the revision of its last successful pass (``depends_on`` reads it).
        self.succeeded: dict[str, str] = {}
        #: The waits of apps with ``wait`` set, stepped by ``step_health``.
        self.follows = Follows()
        #: App → the revision whose wait ended Current (``depends_on`` reads it for an app that waits).
        self.healthy: dict[str, str] = {}
        #: The sync steps apps wait on across passes (``reconcile.waves``), and their syncs with
        #: hooks under way (``reconcile.hook_runs``).
        self.waves = Waves()
        self.hook_runs = HookRuns()

    # -- the pass ---------------------------------------------------------------

    def reconcile(self, revision: Revision | Revisions, *, dry_run: bool = False) -> ClusterResult:
        """Every app of the cluster; their results combined (one app: its own result)."""
        return combined(self.cluster.name, self.reconcile_apps(revision, dry_run=dry_run))

    def new_runs(
        self, revision: Revision | Revisions, apps: Iterable[str] | None = None, *, dry_run: bool = False
    ) -> dict[str, AppRun]:
        """One ``AppRun`` per app of the cluster: ``apps`` (every app when None) and the
        dependencies they need first are due; the others are rendered only."""
        revisions = revisions_of(self.config, revision)
        wanted = [a.name for a in self.apps] if apps is None else list(apps)
        due = with_dependencies(self.apps, wanted, self.succeeded, revisions)
        started = datetime.now(UTC)
        runs: dict[str, AppRun] = {}
        for a in self.apps:
            rev = revisions.get(a.source)
            result = ClusterResult(
                self.cluster.name, rev.sha if rev else "", started=started, dry_run=dry_run, app=a.name
            )
            runs[a.name] = AppRun(a, result, a.name in due, rev)
        return runs

    def reconcile_apps(
        self,
        revision: Revision | Revisions,
        *,
        dry_run: bool = False,
        apps: Iterable[str] | None = None,
        force_window: Collection[str] = (),
    ) -> list[ClusterResult]:
        """One pass over ``apps`` (every app when None) and the dependencies they need first.

        ``revision``: each source's revision (a single ``Revision``: the config's one source).
        ``force_window``: apps whose closed change window this pass overrides (``sync
        --force-window``). One result per app that ran, in config order.
        """
        runs = self.new_runs(revision, apps, dry_run=dry_run)
        if not dry_run:  # a dry run writes nothing: no window to hold it
            self._windows(runs, force_window)
        bound = log.bind(cluster=self.cluster.name)
        try:
            self._pass(runs, dry_run=dry_run)
        except ClusterRefused as e:
            self._fail(runs, e.failure())
            bound.error("cluster refused; nothing applied, pruned or written", error=str(e))
        except AgentError as e:
            self._fail(runs, e.failure())
            bound.error("reconcile failed", error=str(e))
        out = []
        for run in runs.values():
            if not run.due:
                continue
            run.result.finished = datetime.now(UTC)
            if not dry_run:
                self._remember(run)
            out.append(run.result)
        return out

    def _windows(self, runs: Mapping[str, AppRun], forced: Collection[str]) -> None:
        """Each due app's change window now (``plan.windows``); an override is recorded in its
        result at once, so the pass that used it says so whatever it then did."""
        if not self.config.windows:
            return
        now = datetime.now(UTC)
        for run in runs.values():
            if not run.due:
                continue
            hold = is_open(self.config.windows, self.cluster.name, run.name, now).hold
            if hold is not None and run.name in forced:
                hold = replace(
                    hold, forced=True, message=f"{hold.message} (overridden once: sync --force-window)"
                )
                run.result.window = hold
                log.warning(
                    "change window overridden once",
                    cluster=self.cluster.name,
                    app=run.name,
                    window=hold.window,
                )
            run.window = hold

    def _fail(self, runs: Mapping[str, AppRun], failure: Failure) -> None:
        for run in runs.values():
            run.end_failed(failure)

    def _remember(self, run: AppRun) -> None:
        state = run.result.state
        if state is PassState.OK:
            self.succeeded[run.name] = run.result.revision
        elif state not in (PassState.WAITING, PassState.SUSPENDED, PassState.WINDOW):
            self.succeeded.pop(run.name, None)

    def _pass(self, runs: dict[str, AppRun], *, dry_run: bool) -> None:
        planned = self.plan_pass(runs, dry_run=dry_run)
        if planned is None:
            return
        for run in planned.order:
            if run.active:
                self._run_app(run, planned, dry_run=dry_run)
        if not dry_run:
            self._settle(runs, planned.renamed, planned.shared)

    def _run_app(self, run: AppRun, planned: PassPlan, *, dry_run: bool) -> None:
        """Plan, widen, apply, prune, narrow: one app; an error of this app fails this app only."""
        waiting = self._waiting(run, planned.runs)
        if waiting:
            run.end_waiting(waiting)
            log.info("waiting on dependencies; nothing applied or pruned", app=run.name, dependencies=waiting)
            return
        if run.held:
            self._hold(run, planned)
            return
        try:
            self._write(self.plan_app(run, planned, dry_run=dry_run), planned.shared, dry_run=dry_run)
        except AgentError as e:
            if isinstance(e, ClusterError) and (not isinstance(e, ApiError) or e.is_cluster_level):
                raise  # the cluster as a whole: every app after this one fails the same way
            failure = e.failure()
            run.end_failed(replace(failure, message=masking.scrub(failure.message, run.secret_values())))
            log.error(
                "app failed", app=run.name, error=run.result.failure.message if run.result.failure else ""
            )
        run.end_done()
        if not dry_run:
            self._begin_wait(run)

    def _hold(self, run: AppRun, planned: PassPlan) -> None:
        """A change window closes the app's writes: planned all the same (its result says what
        waits for the window), nothing applied, pruned or recorded; its rollout's wait goes on."""
        assert run.window is not None
        ap = self.plan_app(run, planned, dry_run=True)
        for c in ap.conflicts:
            if c not in run.result.conflicts:
                run.result.conflicts.append(c)
        changes = sum(1 for c in ap.plan.changes if c.action in (Action.CREATE, Action.UPDATE))
        prunes = len(ap.decision.delete) + len(ap.decision.orphan)
        waits = f"; waiting for it: {changes} to create or update, {prunes} to prune"
        run.end_window(
            replace(run.window, changes=changes, prunes=prunes, message=run.window.message + waits)
        )
        log.info("change window closed; nothing applied or pruned", app=run.name, window=run.window.window)

    def _begin_wait(self, run: AppRun) -> None:
        """After an app's successful pass, follow its rollout (``wait``); else forget any follow.
        An app whose sync waits on a wave has not applied everything yet: nothing to follow."""
        syncing = run.result.wave_wait is not None
        if (
            not run.app.settings.wait
            or not run.result.ok
            or syncing
            or run.store is None
            or run.revision is None
        ):
            self.follows.drop(run.name)
            return
        self.follows.begin(run.app, run.revision.sha, run.store.id, run.result.results, time.monotonic())

    def step_health(self, now: float | None = None) -> list[AppHealth]:
        """One read of every wait that is due; what each app's health is now."""
        now = time.monotonic() if now is None else now
        out = []
        for follow in self.follows.pending(now):
            try:
                client = self.client.impersonating(follow.service_account)
                lists = self._namespaced_lists.setdefault(follow.service_account, set())
                health = self.follows.step(client, follow, now, lists)
            except AgentError as e:  # unreachable now: the wait goes on, read again later
                self.follows.postpone(follow, now)
                log.warning("health not read", cluster=self.cluster.name, app=follow.app, error=str(e))
                continue
            if health.done and health.state is HealthState.CURRENT:
                self.healthy[health.app] = health.revision
            elif health.state is not HealthState.CURRENT:
                self.healthy.pop(health.app, None)
            out.append(health)
        return out

    def next_health_step(self) -> float | None:
        """When ``step_health`` has something to read next (``time.monotonic``); None: no wait."""
        return self.follows.next_step(time.monotonic())

    def _waiting(self, run: AppRun, runs: Mapping[str, AppRun]) -> tuple[str, ...]:
        """The dependencies whose last pass at their current revision did not succeed."""
        out = []
        for name in run.app.depends_on:
            dep = runs.get(name)
            if dep is None:
                continue
            if dep.due:
                ok = dep.finished and dep.result.state is PassState.OK
            else:
                ok = dep.revision is not None and self.succeeded.get(name) == dep.revision.sha
            if ok and dep.app.settings.wait:  # applied is not enough: rolled out at that revision
                ok = dep.revision is not None and self.healthy.get(name) == dep.revision.sha
            if not ok:
                out.append(name)
        return tuple(out)

    # -- one app's writes -----------------------------------------------------------------

    def _write(self, ap: AppPlan, shared: Shared, *, dry_run: bool) -> None:
        """Check access, confirm, widen, apply, prune, narrow: in that order (docs/safety.md)."""
        run, result = ap.run, ap.run.result
        for c in ap.conflicts:
            if c not in result.conflicts:
                result.conflicts.append(c)
        if run.identity:  # before anything is written for the app: nothing half-applied
            unread = [k for k in {*ap.by_key, *run.members} if not ap.live.listed(k)]
            self.preflight(run.app, ap.plan.changes, ap.decision, unread)
        apply_opts = apply_stage.ApplyOptions(
            field_manager=self.field_manager, dry_run=dry_run, concurrency=self.cluster.settings.concurrency
        )
        client = self.client_for(run.app)
        the_plan = confirm_plan(client, ap.plan, ap.verdicts, self.memo(run.name), apply_opts, whole=ap.whole)
        changes = self._hold_drift(ap, the_plan.changes)
        if not dry_run:
            # create_namespace: before anything is applied (found in this pass's read: nothing asked)
            self.create_namespace(run.app, ap.by_key, None if run.identity else ap.live)
        through = self._sync(ap, changes, client, apply_opts, shared)  # widened before its objects
        self._corrected_drift(ap, changes)
        if not through:
            return  # a wave waits or failed: later waves, the prune and narrowing wait (widened stays)
        self._prune(ap, client, dry_run=dry_run)
        if not dry_run:
            # A hook is no member: one recorded before hooks ran is let go (never deleted as one).
            gone = ap.decision.gone | set(ap.hooks)
            members = narrowed(run.members, ap.mine, ap.live, result.results, gone)
            if members != run.members:
                ap.ready.store.write(members.values())
            run.members = members
            self._applied(ap)

    def _applied(self, ap: AppPlan) -> None:
        """Record on the parent the revision a successful pass of a ``drift = "report"`` app
        applied, when it changed: after a restart, drift is still told from a new revision."""
        run, inventory = ap.run, ap.run.inventory or ap.ready.inventory
        if run.app.settings.drift is not DriftMode.REPORT or not run.result.ok or run.revision is None:
            return
        if inventory.exists and inventory.applied_revision != run.revision.sha:
            ap.ready.store.set_annotation(APPLIED_REVISION, run.revision.sha)

    def _hold_drift(self, ap: AppPlan, changes: tuple[Change, ...]) -> tuple[Change, ...]:
        """``drift = "report"`` at the revision last applied: drift reported, nothing sent for it."""
        run = ap.run
        if run.app.settings.drift is not DriftMode.REPORT or run.revision is None:
            return changes
        inventory = run.inventory or ap.ready.inventory
        if run.revision.sha not in (self.succeeded.get(run.name), inventory.applied_revision):
            return changes  # a new revision (or none applied yet): applied whole
        held = drift_plan.hold(changes, {v.obj.key: v.drift for v in ap.verdicts}, _created(run))
        run.result.drift.extend(held.drift)
        run.result.results.extend(
            ApplyResult(k, Outcome.UNCHANGED, message=drift_plan.held_message(ds), note=Note.DRIFT)
            for k, ds in held.held.items()
        )
        if held.held:
            log.info("drift reported, not corrected (drift = report)", app=run.name, objects=len(held.held))
        return held.changes

    def _corrected_drift(self, ap: AppPlan, changes: tuple[Change, ...]) -> None:
        """At a new revision of a ``drift = "report"`` app: the drift its apply overwrote."""
        run = ap.run
        if run.app.settings.drift is not DriftMode.REPORT:
            return
        applied = {r.key for r in run.result.results if r.outcome in (Outcome.CREATED, Outcome.CONFIGURED)}
        evidence = {v.obj.key: v.drift for v in ap.verdicts}
        run.result.drift.extend(drift_plan.corrected(changes, evidence, _created(run), applied))

    def _settle(
        self, runs: Mapping[str, AppRun], old: Mapping[str, tuple[str, Inventory]], shared: Shared
    ) -> None:
        """Drop from each giving app's inventory what another app took over in this pass (handover,
        rename) — only now, after the taker recorded and applied it (invariant 10) — and delete a
        renamed app's parent once nothing is left in it."""
        released = shared.released
        for run in runs.values():
            gone = released.get(run.store.name, set()) if run.store else set()
            if not gone or run.store is None or run.inventory is None or run.refused or run.held:
                continue
            left = {k: m for k, m in run.members.items() if k not in gone}
            if left != run.members:
                run.store.write(left.values())
                run.members = left
        for name, (successor, inv) in old.items():
            if not runs[successor].known or runs[successor].held:
                continue
            left = {k: m for k, m in inv.members.items() if k not in released.get(name, set())}
            store = self.store_for(name)
            if not left:
                store.delete(inv)
                log.info("renamed app's parent deleted: every member moved", parent=name, app=successor)
            elif left != inv.members:
                store.write(left.values())
