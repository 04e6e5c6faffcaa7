"""One reconcile pass for one cluster: every due app, from one shared read of live state.

``ClusterReconciler`` sequences the stages (``ClusterStages``) for the cluster's apps and keeps
what a pass needs from the last (each app's no-op memo and last success); what it decides about
apps is pure (``reconcile.apps``). A pass renders each app alone (a render error fails that app
only: nothing applied or pruned for it), reads every app's inventory parent with one labelled
LIST and the live state of all their objects with one LIST per kind, then, per app in
dependency order, plans with the app's own membership label and settings, applies, prunes
behind the app's own brake and narrows the app's own inventory. A `[[clusters]]` entry's own
app is one app among them: there is one code path.

The scheduler runs one per cluster; the CLI's ``run --once`` and ``diff`` call it directly.
Every failure ends as a ``ClusterResult`` (one per app) with a typed ``Failure``, never as an
exception that could reach another cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

import structlog

from agent.apply import prune as prune_stage
from agent.apply import ssa as apply_stage
from agent.apply.inventory import Inventory, load_parents, parent_name, widen
from agent.config.types import ClusterConfig, Config
from agent.errors import (
    AgentError,
    ApiError,
    ClusterError,
    ClusterRefused,
    RenderError,
    ScopeError,
    StatusCause,
)
from agent.kube.client import KubeClient
from agent.model import (
    PART_OF,
    PRUNE_HELD,
    Action,
    ApiFinding,
    ApiProblem,
    AppConflict,
    AppHealth,
    ApplyResult,
    Change,
    ClusterResult,
    DesiredObject,
    Failure,
    FailureReason,
    HealthState,
    Manifest,
    Note,
    ObjectKey,
    Outcome,
    PassState,
    PruneReason,
    PruneRefusal,
    Revision,
    SkipReason,
)
from agent.plan import masking
from agent.plan.causes import replan_after_conflict
from agent.plan.planner import request_body
from agent.reconcile.appruns import AppRun, Shared, narrowed
from agent.reconcile.apps import (
    Declared,
    Revisions,
    assign,
    combined,
    dependency_order,
    revisions_of,
    with_dependencies,
)
from agent.reconcile.confirm import confirm_plan
from agent.reconcile.follow import Follows
from agent.reconcile.live import GroupKind
from agent.reconcile.stages import ClientFactory, ClusterStages, SameCluster, app_render_spec, render_spec
from agent.reconcile.verdicts import NoopMemo, Verdict
from agent.render.renderer import RenderCache

__all__ = ["ClientFactory", "ClusterReconciler", "SameCluster", "app_render_spec", "render_spec"]

log = structlog.get_logger("gitops_agent.reconcile")


class ClusterReconciler(ClusterStages):
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
        self._memos: dict[str, NoopMemo] = {}
        #: App → the revision of its last successful pass (``depends_on`` reads it).
        self.succeeded: dict[str, str] = {}
        #: The waits of apps with ``wait`` set, stepped by ``step_health``.
        self.follows = Follows()
        #: App → the revision whose wait ended Current (``depends_on`` reads it for an app that waits).
        self.healthy: dict[str, str] = {}

    # -- the pass ---------------------------------------------------------------

    def reconcile(self, revision: Revision | Revisions, *, dry_run: bool = False) -> ClusterResult:
        """Every app of the cluster; their results combined (one app: its own result)."""
        return combined(self.cluster.name, self.reconcile_apps(revision, dry_run=dry_run))

    def reconcile_apps(
        self, revision: Revision | Revisions, *, dry_run: bool = False, apps: Iterable[str] | None = None
    ) -> list[ClusterResult]:
        """One pass over ``apps`` (every app when None) and the dependencies they need first.

        ``revision``: each source's revision (a single ``Revision``: the config's one source).
        One result per app that ran, in config order.
        """
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

    def _fail(self, runs: Mapping[str, AppRun], failure: Failure) -> None:
        for run in runs.values():
            if run.due and not run.finished:
                run.result.failure = failure
                run.finished = True

    def _remember(self, run: AppRun) -> None:
        state = run.result.state
        if state is PassState.OK:
            self.succeeded[run.name] = run.result.revision
        elif state not in (PassState.WAITING, PassState.SUSPENDED):
            self.succeeded.pop(run.name, None)

    def _pass(self, runs: dict[str, AppRun], *, dry_run: bool) -> None:
        for run in runs.values():
            self._render(run)
        if not any(r.due and r.desired_set is not None for r in runs.values()):
            return  # every due app failed to render: no request at all (invariant 2)
        self.check_identity()  # before anything is written, by this entry or (racing) another
        old = self._read_parents(runs, dry_run=dry_run)
        for run in runs.values():
            self._prepare(run)
        everything = [o for r in runs.values() if r.desired for o in r.desired]
        for run in runs.values():
            if run.desired is not None and run.due:
                run.unserved, notes = self.check_apis(run.desired, also=everything)
                run.result.api_findings.extend([*run.unserved.values(), *notes])
                for f in run.unserved.values():
                    log.error("apiVersion not served; nothing sent for it", app=run.name, error=f.message)
        order = [runs[a.name] for a in dependency_order(self.apps)]
        if not any(r.active for r in order):
            return
        holders, known = self._holders(runs, old)
        for run in runs.values():
            if run.known:
                assert run.store is not None
                mine = run.store.id
                run.options = self.plan_options(
                    mine,
                    detail=False,
                    app=run.app,
                    handover_from=frozenset(i for i, (a, _) in holders.items() if a in known and i != mine),
                    protected=frozenset(i for i, (a, _) in holders.items() if a not in known and i != mine),
                )
                self._memo(run.name).reset(run.options, self._schema_generation)
        shared = Shared(runs, holders, known)
        verdicts = self._read_and_plan(shared)
        for run in order:
            if run.active:
                self._run_app(run, shared, verdicts.get(run.name, []), dry_run=dry_run)
        if not dry_run:
            self._settle(runs, old, shared)

    def _render(self, run: AppRun) -> None:
        """Render one app alone; a due app's render error is its failure, nobody else's."""
        if run.revision is None:
            if run.due:
                message = (
                    f"source {run.app.source!r} has delivered no revision yet; nothing applied or pruned"
                )
                run.result.failure = Failure(FailureReason.SOURCE, message)
                run.finished = True
            return
        try:
            run.desired_set = self.render_app(run.app, run.revision)
        except RenderError as e:
            if run.due:
                e = RenderError(e.problems, cluster=self.cluster.name, app=run.name)  # name the app
                run.result.failure = e.failure()
                run.finished = True
                log.error(
                    "render failed; nothing applied or pruned",
                    cluster=self.cluster.name,
                    app=run.name,
                    error=str(e),
                )

    def _read_parents(self, runs: dict[str, AppRun], *, dry_run: bool) -> dict[str, tuple[str, Inventory]]:
        """Every app's parent with one labelled LIST; claims checked; suspension read.

        Returns the parents of apps renamed away (``renamed_from``): parent name → (successor, parent).
        """
        agent = self.config.agent.name
        olds: dict[str, str] = {}
        for a in self.apps:
            if a.renamed_from:
                olds[parent_name(agent, a.renamed_from, implicit=False)] = a.name
                if a.renamed_from == self.cluster.name:  # the cluster entry's own app, renamed
                    olds[agent] = a.name
        own = [self.parent_of(a.name) for a in self.apps]
        names = own + [n for n in olds if n not in own]
        legacy = [agent]  # written before parents were labelled: found by name
        parents = load_parents(self.client, self.config.agent.namespace, agent, names, unlabelled=legacy)
        for run in runs.values():
            run.store = self.store_for(self.parent_of(run.name))
            inventory = parents[run.store.name]
            try:
                run.store.check_claim(inventory)
                if not dry_run and inventory.exists and run.due and run.desired_set is not None:
                    inventory = run.store.claim(inventory)  # a parent written before claims: now ours
            except ClusterRefused as e:
                run.refused = True
                if run.due and not run.finished:
                    run.result.failure = e.failure()
                    run.finished = True
                    log.error("app refused; nothing applied, pruned or written", app=run.name, error=str(e))
                continue
            run.inventory = inventory
            run.members = dict(inventory.members)
            if inventory.suspended or run.app.suspend:
                run.suspended = True
                if run.due and not run.finished:
                    where = "suspend = true" if run.app.suspend else "annotation on its ApplySet parent"
                    why = f"app {run.name!r} suspended ({where})"
                    run.result.prune_refusal = PruneRefusal(PruneReason.SUSPENDED, why)
                    run.finished = True
        out: dict[str, tuple[str, Inventory]] = {}
        for name, successor in olds.items():
            inv = parents[name]
            if inv.exists and name not in own and inv.claimed_by in ("", self.cluster.name):
                out[name] = (successor, inv)
        return out

    def _prepare(self, run: AppRun) -> None:
        if run.desired_set is None or run.refused or run.store is None:
            return
        try:
            run.desired = self.prepare(
                run.desired_set, run.store.id, default_namespace=run.app.settings.default_namespace
            )
            self._check_scope(run)
            if run.desired is not None:
                self.load_schema(run.desired)
        except RenderError as e:
            run.desired = None
            if run.due and not run.finished:
                run.result.failure = e.failure()
                run.finished = True

    def _check_scope(self, run: AppRun) -> None:
        """An app declaring objects outside its scope fails closed, before any request for it.

        Only what lies inside its scope stays declared in this pass, so an object declared
        outside it never shields (nor hands over) another app's object.
        """
        if run.desired is None:
            return
        violations = self.scope_violations(run.app, run.desired)
        if not violations:
            return
        outside = {v.key for v in violations}
        run.desired = [o for o in run.desired if o.key not in outside]
        if run.due and not run.finished:
            e = ScopeError(violations, cluster=self.cluster.name, app=run.name)
            run.result.failure = e.failure()
            run.finished = True
            log.error("app outside its scope; nothing applied or pruned", app=run.name, error=str(e))

    def _holders(
        self, runs: Mapping[str, AppRun], old: Mapping[str, tuple[str, Inventory]]
    ) -> tuple[dict[str, tuple[str, str]], set[str]]:
        """Membership value → (the app that holds its members, the parent they are recorded in);
        and the apps whose declarations this pass knows."""
        holders: dict[str, tuple[str, str]] = {}
        for run in runs.values():
            if run.store is not None:
                holders[run.store.id] = (run.name, run.store.name)
        for name, (successor, inv) in old.items():
            holders[inv.id] = (successor, name)
        return holders, {r.name for r in runs.values() if r.known}

    def _memo(self, app: str) -> NoopMemo:
        return self._memos.setdefault(app, NoopMemo())

    def _read_and_plan(self, shared: Shared) -> dict[str, list[Verdict]]:
        """Per identity (the apps acting as one ServiceAccount, or as the agent), one LIST per kind
        for its active apps' objects and members; each object planned for the app that manages
        it, on the listing threads as items are decoded, in the read of the first active app
        declaring it (so once, however many identities read it)."""
        runs = shared.runs
        declared_by = shared.declared
        groups: dict[str, list[AppRun]] = {}
        for run in runs.values():
            if run.active:
                groups.setdefault(run.identity, []).append(run)
        reader: dict[ObjectKey, str] = {}
        for key, decl in declared_by.items():
            first = next((r for r, _ in decl if r.active), None)
            if first is not None:
                reader[key] = first.identity
        everything = [o for r in runs.values() if r.known and r.desired for o in r.desired]
        verdicts: list[Verdict] = []
        for identity, group in groups.items():
            # Its apps' own objects too where another identity plans them: each app's prune and
            # inventory rest on what its own identity read.
            keys = {k for k, who in reader.items() if who == identity}
            for run in group:
                keys |= set(run.members)
                keys |= {o.key for o in run.desired or ()}

            def plan_chunk(
                gk: GroupKind, objects: dict[ObjectKey, Manifest | None], identity: str = identity
            ) -> list[Verdict]:
                return self._decide(shared, [k for k in objects if reader.get(k) == identity], objects)

            # Of the live objects only prune candidates are kept whole (members no app declares):
            # holding every listed object of the cluster until the plan was done was most of a pass's memory.
            live = self.read_live(
                keys, everything, inspect=plan_chunk, keep=lambda k: k not in declared_by, app=group[0].app
            )
            shared.lives[identity] = live
            planned = [v for chunk in live.inspected.values() for v in chunk]
            live.inspected.clear()
            # Not planned on a listing thread: kinds a CRD of this commit adds (nothing live yet:
            # create), and objects whose listing failed, which the planner skips (live state unknown)
            # instead of mistaking them for absent.
            seen = {v.obj.key for v in planned}
            rest = [k for k in keys if reader.get(k) == identity and k not in seen]
            known: dict[ObjectKey, Manifest | None] = {k: None for k in rest if live.listed(k)}
            for v in self._decide(shared, rest, known):
                planned.append(replace(v, change=live.explain(v.change)))
            verdicts.extend(planned)
        out: dict[str, list[Verdict]] = {}
        for v in verdicts:
            out.setdefault(v.app, []).append(v)
        return out

    def _decide(
        self, shared: Shared, keys: list[ObjectKey], live: Mapping[ObjectKey, Manifest | None]
    ) -> list[Verdict]:
        """Verdicts for ``keys`` for every active app declaring them: planned for the app that
        manages each (``apps.assign``), a SKIP naming the holder for the others."""
        out: list[Verdict] = []
        todo: dict[str, list[DesiredObject]] = {}
        extra: dict[ObjectKey, tuple[str, tuple[AppConflict, ...]]] = {}
        for key in keys:
            decl = shared.declared.get(key) or []
            if not any(r.active for r, _ in decl):
                continue
            obj_live = live.get(key)
            part_of = ((obj_live or {}).get("metadata") or {}).get("labels", {}).get(PART_OF)
            holder = shared.holders.get(part_of) if part_of else None
            if len(decl) == 1 and (holder is None or holder[0] == decl[0][0].name):
                # The common case, as ``assign`` decides it (its sole declarer manages it), without
                # building its arguments: most of a steady pass is this line for every object.
                owner, obj = decl[0]
                if holder is not None:
                    shared.release_stale(key, owner)
                if owner.active:
                    todo.setdefault(owner.name, []).append(obj)
                    assert owner.store is not None
                    if holder is not None and holder[1] != owner.store.name:
                        extra[key] = (holder[1], ())
                continue
            a = assign(
                key,
                [Declared(r.name, o.provenance.file) for r, o in decl],
                holder[0] if holder else None,
                shared.known,
            )
            for run, obj in decl:
                if not run.active or run.name == a.owner:
                    continue
                skip = SkipReason.OTHER_APP if a.owner is not None else SkipReason.OTHER_SET
                change = Change(
                    key, Action.SKIP, obj.api_version, reason=a.reason, provenance=obj.provenance, skip=skip
                )
                out.append(Verdict(run.name, obj, change, None, conflicts=a.conflicts, passed=True))
            if a.owner is None:
                continue
            owner = shared.runs[a.owner]
            if holder is not None and holder[0] == a.owner:
                # Held by its owner already: a stale record of it elsewhere (a pass cut short
                # between a handover's apply and its settling) is dropped when this pass settles.
                shared.release_stale(key, owner)
            if not owner.active:
                continue
            obj = next(o for r, o in decl if r is owner)
            todo.setdefault(owner.name, []).append(obj)
            assert owner.store is not None
            giver = holder[1] if holder and holder[1] != owner.store.name else ""
            if giver or a.conflicts:
                extra[key] = (giver, a.conflicts)
        for name, objs in todo.items():
            run = shared.runs[name]
            assert run.options is not None and run.revision is not None
            planned = self._memo(name).verdicts(
                name, self.cluster.name, run.revision.sha, objs, live, run.options
            )
            for v in planned:
                if v.obj.key in extra:
                    giver, conflicts = extra[v.obj.key]
                    v = replace(v, taken_from=giver, conflicts=conflicts)
                out.append(v)
        return out

    def _run_app(self, run: AppRun, shared: Shared, verdicts: list[Verdict], *, dry_run: bool) -> None:
        """Plan, widen, apply, prune, narrow: one app; an error of this app fails this app only."""
        waiting = self._waiting(run, shared.runs)
        if waiting:
            run.result.waiting_on = waiting
            run.finished = True
            log.info("waiting on dependencies; nothing applied or pruned", app=run.name, dependencies=waiting)
            return
        try:
            self._apply_and_prune(run, shared, verdicts, dry_run=dry_run)
        except AgentError as e:
            if isinstance(e, ClusterError) and (not isinstance(e, ApiError) or e.is_cluster_level):
                raise  # the cluster as a whole: every app after this one fails the same way
            failure = e.failure()
            run.result.failure = replace(failure, message=masking.scrub(failure.message, run.secret_values()))
            log.error("app failed", app=run.name, error=run.result.failure.message)
        run.finished = True
        if not dry_run:
            self._begin_wait(run)

    def _begin_wait(self, run: AppRun) -> None:
        """After an app's successful pass, follow its rollout (``wait``); else forget any follow."""
        if not run.app.settings.wait or not run.result.ok or run.store is None or run.revision is None:
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

    def _apply_and_prune(
        self, run: AppRun, shared: Shared, verdicts: list[Verdict], *, dry_run: bool
    ) -> None:
        assert run.desired is not None and run.store is not None and run.inventory is not None
        assert run.options is not None and run.revision is not None and run.desired_set is not None
        store, inventory, options, result = run.store, run.inventory, run.options, run.result
        client, live = self.client_for(run.app), shared.live_for(run)
        the_plan = self._memo(run.name).remember(self.cluster.name, run.revision.sha, run.desired, verdicts)
        by_key = {o.key: o for o in run.desired}
        # Left to another app, or a Helm delete/rollback hook: never a member of this app.
        not_mine = {v.obj.key for v in verdicts if v.passed or v.change.skip is SkipReason.HELM_HOOK}
        mine = {k: o for k, o in by_key.items() if k not in not_mine}
        taken = {v.obj.key: v.taken_from for v in verdicts if v.taken_from}
        for v in verdicts:
            for c in v.conflicts:
                if c not in result.conflicts:
                    result.conflicts.append(c)
        # What another app declares is never this app's to delete, declared here or not.
        others = shared.declared_by_others(run)
        prune_options = self.prune_options(store.id, dry_run, run.app)
        # An app whose render failed declares something unknown: what leaves this app may be there.
        unknown = sorted(r.name for r in shared.runs.values() if r is not run and r.desired_set is None)
        # Decided before applying (pure, on what was read): the preflight needs the prune set.
        decision = prune_stage.decide(
            inventory,
            set(by_key) | others,
            live.objects,
            live.complete,
            prune_options,
            render_empty=run.desired_set.empty,
            unknown_apps=unknown,
        )
        if run.identity:  # before anything is written for the app: nothing half-applied
            unread = [k for k in {*by_key, *run.members} if not live.listed(k)]
            self.preflight(run.app, the_plan.changes, decision, unread)
        apply_opts = apply_stage.ApplyOptions(
            field_manager=self.field_manager, dry_run=dry_run, concurrency=self.cluster.settings.concurrency
        )
        the_plan = confirm_plan(client, the_plan, verdicts, self._memo(run.name), apply_opts)
        if not dry_run:
            self.create_namespace(run.app, by_key)  # create_namespace: before anything is applied
            wider = widen(inventory, mine)
            if len(wider) != len(inventory.members):
                if not inventory.exists:  # created with the claim alone, so a racing entry loses
                    inventory = run.inventory = store.claim(inventory)
                store.write(wider)  # widen before applying (docs/safety.md rule 10)
                run.members = {m.key: m for m in wider}

        def replan(key: ObjectKey, fresh: Manifest | None, causes: tuple[StatusCause, ...]) -> Change:
            return replan_after_conflict(by_key[key], fresh, options, causes)

        def body_for(change: Change) -> Manifest | None:
            return request_body(change, by_key[change.key])

        # What the cluster does not serve fails here, before any request (the rest goes on).
        blocked = {k for k in run.unserved if k in mine}
        sendable = [c for c in the_plan.changes if c.key not in blocked or c.action is Action.SKIP]
        applied = apply_stage.apply_changes(client, sendable, apply_opts, replan, body_for)
        # A server's message may quote a value: masked in every result, never shown for the object.
        secret, values = {k for k, o in by_key.items() if masking.masks_of(o.manifest)}, run.secret_values()
        applied = [masking.scrub_result(r, values, sensitive=r.key in secret) for r in applied]
        result.results.extend(
            ApplyResult(
                k, Outcome.FAILED, status=404, message=run.unserved[k].message, note=Note.API_NOT_SERVED
            )
            for k in sorted(blocked)
        )
        result.results.extend(applied)
        for r in applied:
            if r.warnings:
                obj = by_key[r.key]
                result.api_findings.extend(
                    ApiFinding(r.key, obj.api_version, ApiProblem.WARNING, w, file=str(obj.provenance))
                    for w in r.warnings
                )
        for r in applied:
            if r.key in taken and r.outcome in (Outcome.CREATED, Outcome.CONFIGURED):
                shared.release(taken[r.key], r.key)
        if decision.refusal:
            refusal = decision.refusal
            if live.errors:
                refusal = replace(refusal, message=f"{refusal.message} [{'; '.join(live.errors)}]")
            result.prune_refusal = refusal
        held = decision.digest if decision.refusal and decision.refusal.reason is PruneReason.BRAKE else ""
        if not dry_run and inventory.exists and held != inventory.held_digest:
            store.set_annotation(PRUNE_HELD, held or None)  # written when it changes, never each pass
        pruned = prune_stage.execute(client, decision, prune_options)
        result.results.extend(masking.scrub_result(r, values, sensitive=False) for r in pruned)
        if not dry_run:
            members = narrowed(run.members, mine, live, result.results, decision.gone)
            if members != run.members:
                store.write(members.values())
            run.members = members

    def _settle(
        self, runs: Mapping[str, AppRun], old: Mapping[str, tuple[str, Inventory]], shared: Shared
    ) -> None:
        """Drop from each giving app's inventory what another app took over in this pass (handover,
        rename) — only now, after the taker recorded and applied it (invariant 10) — and delete a
        renamed app's parent once nothing is left in it."""
        released = shared.released
        for run in runs.values():
            gone = released.get(run.store.name, set()) if run.store else set()
            if not gone or run.store is None or run.inventory is None or run.refused:
                continue
            left = {k: m for k, m in run.members.items() if k not in gone}
            if left != run.members:
                run.store.write(left.values())
                run.members = left
        for name, (successor, inv) in old.items():
            if not runs[successor].known:
                continue
            left = {k: m for k, m in inv.members.items() if k not in released.get(name, set())}
            store = self.store_for(name)
            if not left:
                store.delete(inv)
                log.info("renamed app's parent deleted: every member moved", parent=name, app=successor)
            elif left != inv.members:
                store.write(left.values())
