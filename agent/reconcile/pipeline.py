"""The one pipeline: render → read → plan → decide, for every app of one cluster.

``ClusterPipeline.plan_pass`` takes a pass's apps (``AppRun``: the due ones and the others,
which are rendered so that the pass knows what they declare), renders each alone, reads every
app's inventory parent and the live state of all their objects, and decides, per object, which
app manages it and what that app would send; ``plan_app`` then makes one app's ``AppPlan``:
its plan (the no-op memo's verdicts), what it may prune (``prune.decide``, pure) and what it
takes over from another app. The callers differ only in what they do with the result:

- the pass (``ClusterReconciler``) confirms the updates with a server-side dry-run, writes,
  prunes and narrows the inventory;
- the live diff report (``report.diff``) previews the same changes and prunes with dry-runs;
- ``takeover`` moves the fields of the objects the app manages from leftover managers to ours.

So a report never says what the pass would not do: an object moving from one app to another
is, in both, updated by its new app and never deleted by the old one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import structlog

from agent.apply import prune as prune_stage
from agent.apply.inventory import Inventory, load_parents, parent_name
from agent.config.types import DriftMode
from agent.errors import AgentError, ClusterRefused, RenderError, ScopeError
from agent.kube.client import KubeClient
from agent.model import (
    PART_OF,
    ROLLBACK_AT,
    ROLLBACK_FROM,
    ROLLBACK_TO,
    Action,
    AppConflict,
    ApplyResult,
    Change,
    ClusterResult,
    DesiredObject,
    Failure,
    FailureReason,
    Manifest,
    ObjectKey,
    Pin,
    Plan,
    PruneReason,
    PruneRefusal,
    Revision,
    SkipReason,
    SyncKind,
    SyncOrder,
)
from agent.plan.ordering import live_wave
from agent.plan.planner import expected_object, request_body, whole_body
from agent.reconcile import namespaces, pins
from agent.reconcile.appruns import AppRun, Phase, Ready, Shared
from agent.reconcile.apps import Assignment, Declared, assign, dependency_order
from agent.reconcile.charts import chart_key, chart_refusal
from agent.reconcile.live import GroupKind, LiveState
from agent.reconcile.stages import ClusterStages
from agent.reconcile.verdicts import NoopMemo, Verdict
from agent.render.chart_meta import chart_version
from agent.source.git import GitSource
from agent.source.pinned import revision_at

log = structlog.get_logger("gitops_agent.reconcile")


@dataclass(frozen=True)
class PassPlan:
    """What one pass decided for all its apps, before anything is written."""

    runs: dict[str, AppRun]
    shared: Shared
    verdicts: dict[str, list[Verdict]]
    #: Parents of apps renamed away: parent name → (successor, parent).
    renamed: dict[str, tuple[str, Inventory]] = field(default_factory=dict)

    @property
    def order(self) -> list[AppRun]:
        """The apps in the order their writes go: dependencies first."""
        return [self.runs[a.name] for a in dependency_order([r.app for r in self.runs.values()])]


@dataclass(frozen=True)
class AppPlan:
    """One app's plan on one cluster: what it would send, prune and take from another app."""

    run: AppRun
    ready: Ready
    verdicts: list[Verdict]
    plan: Plan
    decision: prune_stage.PruneDecision
    prune_options: prune_stage.PruneOptions
    live: LiveState
    #: Its declared objects by key.
    by_key: dict[ObjectKey, DesiredObject]
    #: What it manages (declared, not left to another app, not a Helm delete/rollback hook).
    mine: dict[ObjectKey, DesiredObject]
    #: Object → the parent it is taken from (handover, rename).
    taken: dict[ObjectKey, str]
    conflicts: tuple[AppConflict, ...]
    #: The steps of its sync (waves, hooks); one wave and no hook: applied at once, as ever.
    order: SyncOrder = field(default_factory=SyncOrder)
    #: Its hooks and the objects its sync never applies (never members, never planned).
    hooks: dict[ObjectKey, DesiredObject] = field(default_factory=dict)

    def body(self, change: Change) -> Manifest | None:
        """The request an apply of ``change`` sends (secrets unmasked)."""
        return request_body(change, self.by_key[change.key])

    def whole(self, obj: DesiredObject) -> Manifest:
        """Git's whole body for ``obj``, as a forced apply sends it (``confirm`` checks conflicts)."""
        return whole_body(obj, self.ready.options, self.live.objects.get(obj.key))

    def prune(self, client: KubeClient) -> list[ApplyResult]:
        """Carry out the prune decision (a dry run's deletes are previews: ``prune_options``), the
        latest sync wave first."""
        waves = {c.key: live_wave(m) for c in self.decision.delete if (m := self.live.objects.get(c.key))}
        return prune_stage.execute(client, self.decision, self.prune_options, waves=waves)

    def expected(self, change: Change, live: Manifest | None) -> Manifest | None:
        """What the object would be after applying ``change`` over ``live``, as the plan sees it."""
        return expected_object(self.by_key[change.key], live, self.ready.options)


def owner_of(
    key: ObjectKey, declared: Sequence[tuple[str, str]], holder: str | None, apps: Iterable[str]
) -> Assignment:
    """Which of the apps declaring ``key`` (name, file) manages it, as the pass decides: for
    reports that plan each app alone (the offline diff)."""
    return assign(key, [Declared(name, file) for name, file in declared], holder, set(apps))


class ClusterPipeline(ClusterStages):
    """The stages of one cluster, sequenced for a pass's apps (see the module docstring)."""

    def plan_pass(
        self, runs: dict[str, AppRun], *, dry_run: bool, keep_live: bool = False, preview: bool = False
    ) -> PassPlan | None:
        """Render, read and decide for ``runs``; None when no due app is left to act.

        ``dry_run``: claim nothing. ``keep_live``: keep every live object read (reports show
        them; the pass keeps only prune candidates). ``preview``: plan a due suspended app all
        the same, with a note (a report says what resuming it would do).
        """
        for run in runs.values():
            self._render(run)
        if not any(r.due and r.desired_set is not None for r in runs.values()):
            return None  # every due app failed to render: no request at all (invariant 2)
        self.check_identity()  # before anything is written, by this entry or (racing) another
        renamed = self._read_parents(runs, dry_run=dry_run, preview=preview)
        self._follow_pins(runs, dry_run=dry_run, preview=preview)
        for run in runs.values():
            self._prepare(run)
        self._check_apis(runs)
        if not any(r.active for r in runs.values()):
            return None
        holders, known = self._holders(runs, renamed)
        self._set_options(runs, holders, known)
        shared = Shared(runs, holders, known)
        verdicts = self._read_and_plan(shared, keep_live=keep_live)
        return PassPlan(runs, shared, verdicts, renamed)

    def plan_app(self, run: AppRun, planned: PassPlan, *, dry_run: bool) -> AppPlan:
        """``run``'s plan, prune decision and handovers, from what the pass read (pure)."""
        ready, shared = run.ready(), planned.shared
        verdicts = planned.verdicts.get(run.name, [])
        memo = self.memo(run.name)
        the_plan = memo.remember(self.cluster.name, ready.revision.sha, ready.desired, verdicts)
        by_key = {o.key: o for o in ready.desired}
        # Left to another app, or a Helm delete/rollback hook: never a member of this app.
        not_mine = {v.obj.key for v in verdicts if v.passed or v.change.skip is SkipReason.HELM_HOOK}
        conflicts: list[AppConflict] = []
        for v in verdicts:
            conflicts.extend(c for c in v.conflicts if c not in conflicts)
        prune_options = self.prune_options(ready.store.id, dry_run, run.app)
        # An app whose render failed declares something unknown: what leaves this app may be there.
        unknown = sorted(r.name for r in shared.runs.values() if r is not run and r.desired_set is None)
        live = shared.live_for(run)
        decision = prune_stage.decide(
            ready.inventory,
            # What another app declares is never this app's to delete, declared here or not; nor
            # is a hook (one applied as a member before hooks ran is let go, never deleted).
            set(by_key) | shared.declared_by_others(run) | set(run.hooks),
            live.objects,
            live.complete,
            prune_options,
            render_empty=ready.desired_set.empty,
            unknown_apps=unknown,
        )
        return AppPlan(
            run,
            ready,
            verdicts,
            the_plan,
            decision,
            prune_options,
            live,
            by_key,
            {k: o for k, o in by_key.items() if k not in not_mine},
            {v.obj.key: v.taken_from for v in verdicts if v.taken_from},
            tuple(conflicts),
            run.order,
            run.hooks,
        )

    def memo(self, app: str) -> NoopMemo:
        """The app's no-op memo: kept across passes, forgotten when its options change."""
        return self._memos.setdefault(app, NoopMemo())

    # -- render, read, prepare ----------------------------------------------------------

    def _render(self, run: AppRun) -> None:
        """Render one app alone; a due app's render error is its failure, nobody else's."""
        if run.revision is None:
            message = f"source {run.app.source!r} has delivered no revision yet; nothing applied or pruned"
            run.end_failed(Failure(FailureReason.SOURCE, message))
            return
        if (refused := chart_refusal(run.app, run.revision)) is not None:
            run.result.chart = refused[1]
            run.end_failed(Failure(FailureReason.CHART, refused[0]))
            log.error("chart not fetched", cluster=self.cluster.name, app=run.name, error=refused[0])
            return
        try:
            upgrade = self._sync_kinds.get(run.name, SyncKind.UPGRADE) is SyncKind.UPGRADE
            run.desired_set = self.render_app(run.app, run.revision, upgrade=upgrade)
        except RenderError as e:
            e = RenderError(e.problems, cluster=self.cluster.name, app=run.name)  # name the app
            if run.end_failed(e.failure(), e):
                log.error(
                    "render failed; nothing applied or pruned",
                    cluster=self.cluster.name,
                    app=run.name,
                    error=str(e),
                )
            return
        if (
            run.app.helm is not None and run.app.helm.chart
        ):  # pinned (from a repository, or with its dependencies)
            pin = run.revision.chart(*chart_key(run.app.helm))
            run.result.chart = (
                str(pin) if pin is not None else chart_version(run.revision.tree, run.app.helm.chart)
            )
        run.reach(Phase.RENDERED)

    def _read_parents(
        self, runs: dict[str, AppRun], *, dry_run: bool, preview: bool
    ) -> dict[str, tuple[str, Inventory]]:
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
            self._claim(run, parents[run.store.name], dry_run=dry_run, preview=preview)
        out: dict[str, tuple[str, Inventory]] = {}
        for name, successor in olds.items():
            inv = parents[name]
            if inv.exists and name not in own and inv.claimed_by in ("", self.cluster.name):
                out[name] = (successor, inv)
        return out

    def _claim(self, run: AppRun, inventory: Inventory, *, dry_run: bool, preview: bool) -> None:
        """``run``'s parent as read: refused if another entry's, claimed if unclaimed (not in a
        dry run, nor while a change window holds it), its suspension an end of the pass (a note
        in a preview)."""
        assert run.store is not None
        try:
            run.store.check_claim(inventory)
            writes = not dry_run and not run.held  # a closed change window records nothing
            if writes and inventory.exists and run.due and run.desired_set is not None:
                inventory = run.store.claim(inventory)  # a parent written before claims: now ours
        except ClusterRefused as e:
            if run.end_refused(e.failure(), e):
                log.error("app refused; nothing applied, pruned or written", app=run.name, error=str(e))
            return
        run.inventory = inventory
        run.members = dict(inventory.members)
        if not (inventory.suspended or run.app.suspend):
            return
        where = "suspend = true" if run.app.suspend else "annotation on its ApplySet parent"
        if preview and run.due:  # reported: what resuming it would do (the others weigh as in a pass)
            run.notes.append(f"the app is suspended ({where}): nothing is applied until resumed")
            return
        run.end_suspended(PruneRefusal(PruneReason.SUSPENDED, f"app {run.name!r} suspended ({where})"))

    def _follow_pins(self, runs: dict[str, AppRun], *, dry_run: bool, preview: bool) -> None:
        """An app pinned by ``gitops-agent rollback`` renders the pinned commit, from the source's
        cache, instead of its source's (its run replaced in ``runs``); a pin its source moved past
        is cleared (``pins.decide``), not in a dry run, and the pass says so."""
        for name, run in list(runs.items()):
            pin = run.inventory.pin if run.inventory is not None else None
            if pin is None or run.phase in (Phase.REFUSED, Phase.SUSPENDED):
                continue
            followed = run.revision.sha if run.revision else None
            if pins.decide(pin, followed) is pins.PinAction.HOLD:
                runs[name] = self._pinned_run(run, pin, dry_run=dry_run, preview=preview)
                continue
            run.result.pin_cleared = pins.cleared_message(pin, followed or "")
            if preview or dry_run or not run.due:
                run.notes.append(run.result.pin_cleared.replace("cleared", "would be cleared", 1))
                continue
            assert run.store is not None and run.inventory is not None
            try:  # over the parent as read: a rollback written since stays
                gone: dict[str, str | None] = {ROLLBACK_TO: None, ROLLBACK_FROM: None, ROLLBACK_AT: None}
                run.store.set_annotations(gone, resource_version=run.inventory.resource_version)
            except AgentError as e:
                run.end_failed(Failure(FailureReason.API, f"rollback pin not cleared, nothing applied: {e}"))
                continue
            log.warning("rollback pin cleared; auto-sync resumed", app=name, detail=run.result.pin_cleared)

    def _pinned_run(self, run: AppRun, pin: Pin, *, dry_run: bool, preview: bool) -> AppRun:
        """``run`` again at the pinned commit: rendered, its parent (as read) claimed anew."""
        followed = run.revision.sha if run.revision else ""
        old = run.result
        result = ClusterResult(
            old.cluster, pin.revision, started=old.started, dry_run=old.dry_run, app=run.name, pin=pin
        )
        result.followed = followed
        fresh = AppRun(run.app, result, run.due, None)
        fresh.store = run.store
        try:
            fresh.revision = self.pinned_revision(run.app.source, pin.revision)
        except AgentError as e:
            message = f"rolled back to {pin.revision[:12]}, which cannot be rendered: {e}; nothing applied"
            fresh.end_failed(Failure(FailureReason.SOURCE, message), e)
            return fresh
        self._render(fresh)
        assert run.inventory is not None
        self._claim(fresh, run.inventory, dry_run=dry_run, preview=preview)
        if preview:
            fresh.notes.append(f"rolled back: pinned to {pin.revision[:12]} (from {pin.bad[:12] or '?'})")
        return fresh

    def pinned_revision(self, source: str, sha: str) -> Revision:
        """The commit ``sha`` of ``source`` from its cache alone (``source.pinned``)."""
        cache = self._caches.get(source)
        if cache is None:
            cache = self._caches[source] = GitSource.from_config(self.config, source)
        return revision_at(cache, sha)

    def _prepare(self, run: AppRun) -> None:
        if run.desired_set is None or run.phase is not Phase.RENDERED or run.store is None:
            return
        try:
            self._render_for_kind(run)
            run.desired = self.prepare(
                run.desired_set, run.store.id, default_namespace=namespaces.target_namespace(run.app)
            )
            self._check_scope(run)
            run.split_hooks()
            self.load_schema(run.desired)
        except RenderError as e:
            run.desired = None
            run.end_failed(e.failure(), e)
            return
        if not run.phase.ended:
            run.reach(Phase.PREPARED)

    def _render_for_kind(self, run: AppRun) -> None:
        """An install while the app has no parent (or its first install is under way), else an
        upgrade; a chart rendered for the other kind is rendered again (``--is-upgrade`` or not)."""
        assert run.inventory is not None and run.desired_set is not None and run.revision is not None
        installing = not run.inventory.exists or run.name in self._installing
        run.kind = SyncKind.INSTALL if installing else SyncKind.UPGRADE
        rendered = self._sync_kinds.get(run.name, SyncKind.UPGRADE)
        self._sync_kinds[run.name] = run.kind
        if rendered is not run.kind and run.desired_set.capabilities is not None:  # a chart was rendered
            try:
                run.desired_set = self.render_app(run.app, run.revision, upgrade=run.kind is SyncKind.UPGRADE)
            except RenderError as e:
                raise RenderError(e.problems, cluster=self.cluster.name, app=run.name) from e

    def _check_scope(self, run: AppRun) -> None:
        """An app declaring objects outside its scope fails closed, before any request for it.

        Only what lies inside its scope stays declared in this pass, so an object declared
        outside it never shields (nor hands over) another app's object.
        """
        assert run.desired is not None
        violations = self.scope_violations(run.app, run.desired)
        if not violations:
            return
        outside = {v.key for v in violations}
        run.desired = [o for o in run.desired if o.key not in outside]
        e = ScopeError(violations, cluster=self.cluster.name, app=run.name)
        if run.end_failed(e.failure(), e):
            log.error("app outside its scope; nothing applied or pruned", app=run.name, error=str(e))

    def _check_apis(self, runs: Mapping[str, AppRun]) -> None:
        """What the cluster does not serve, per active app (checked against all that is declared)."""
        everything = [o for r in runs.values() if r.desired for o in r.desired]
        for run in runs.values():
            if run.desired is not None and run.active:
                run.unserved, notes = self.check_apis(run.desired, also=everything)
                run.result.api_findings.extend([*run.unserved.values(), *notes])
                for f in run.unserved.values():
                    log.error("apiVersion not served; nothing sent for it", app=run.name, error=f.message)

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

    def _set_options(
        self, runs: Mapping[str, AppRun], holders: Mapping[str, tuple[str, str]], known: set[str]
    ) -> None:
        """Each known app's plan options: its own label; whose sets it may take from or must not."""
        for run in runs.values():
            if not run.known or run.store is None:
                continue
            mine = run.store.id
            run.options = self.plan_options(
                mine,
                detail=False,
                app=run.app,
                handover_from=frozenset(i for i, (a, _) in holders.items() if a in known and i != mine),
                protected=frozenset(i for i, (a, _) in holders.items() if a not in known and i != mine),
            )
            self.memo(run.name).reset(run.options, self._schema_generation)
            if run.phase is Phase.PREPARED:
                run.reach(Phase.PLANNED)

    # -- read live and decide -------------------------------------------------------------

    def _read_and_plan(self, shared: Shared, *, keep_live: bool) -> dict[str, list[Verdict]]:
        """Per identity (the apps acting as one ServiceAccount, or as the agent), one LIST per kind
        for its active apps' objects and members; each object planned for the app that manages
        it, on the listing threads as items are decoded, in the read of the first active app
        declaring it (so once, however many identities read it)."""
        declared_by = shared.declared
        groups: dict[str, list[AppRun]] = {}
        for run in shared.runs.values():
            if run.active:
                groups.setdefault(run.identity, []).append(run)
        reader: dict[ObjectKey, str] = {}
        for key, decl in declared_by.items():
            first = next((r for r, _ in decl if r.active), None)
            if first is not None:
                reader[key] = first.identity
        everything = [o for r in shared.runs.values() if r.known and r.desired for o in r.desired]
        verdicts: list[Verdict] = []
        for identity, group in groups.items():
            # Its apps' own objects too where another identity plans them: each app's prune and
            # inventory rest on what its own identity read.
            keys = {k for k, who in reader.items() if who == identity}
            for run in group:
                keys |= set(run.members)
                declared = {o.key for o in run.desired or ()}
                keys |= declared
                if not identity and (namespace := namespaces.to_create(run.app, declared)):
                    # Read with the rest (Namespaces are listed anyway where an app declares one),
                    # so that create_namespace asks nothing of a namespace that is there.
                    keys.add(ObjectKey("", "Namespace", "", namespace))

            def plan_chunk(
                gk: GroupKind, objects: dict[ObjectKey, Manifest | None], identity: str = identity
            ) -> list[Verdict]:
                return self._decide(shared, [k for k in objects if reader.get(k) == identity], objects)

            # Of the live objects the pass keeps only prune candidates whole (members no app
            # declares): holding every listed object until the plan was done was most of its memory.
            live = self.read_live(
                keys,
                everything,
                inspect=plan_chunk,
                keep=(lambda k: True) if keep_live else (lambda k: k not in declared_by),
                app=group[0].app,
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
            if any(r.active for r, _ in decl):
                out.extend(self._assign(shared, key, decl, live.get(key), todo, extra))
        for name, objs in todo.items():
            run = shared.runs[name]
            assert run.options is not None and run.revision is not None  # active: planned
            planned = self.memo(name).verdicts(
                name,
                self.cluster.name,
                run.revision.sha,
                objs,
                live,
                run.options,
                observe=run.app.settings.drift is DriftMode.REPORT,
            )
            for v in planned:
                if v.obj.key in extra:
                    giver, conflicts = extra[v.obj.key]
                    v = replace(v, taken_from=giver, conflicts=conflicts)
                out.append(v)
        return out

    def _assign(
        self,
        shared: Shared,
        key: ObjectKey,
        decl: list[tuple[AppRun, DesiredObject]],
        obj_live: Manifest | None,
        todo: dict[str, list[DesiredObject]],
        extra: dict[ObjectKey, tuple[str, tuple[AppConflict, ...]]],
    ) -> list[Verdict]:
        """The app that manages ``key`` gets it in ``todo`` (with a handover or conflicts in
        ``extra``); every other active declarer a SKIP verdict naming why."""
        part_of = ((obj_live or {}).get("metadata") or {}).get("labels", {}).get(PART_OF)
        holder = shared.holders.get(part_of) if part_of else None
        if len(decl) == 1 and (holder is None or holder[0] == decl[0][0].name):
            # The common case, as ``assign`` decides it (its sole declarer manages it), without
            # building its arguments: most of a steady pass is this line for every object.
            owner, obj = decl[0]
            if holder is not None:
                shared.release_stale(key, owner)
            if owner.active and owner.store is not None:
                todo.setdefault(owner.name, []).append(obj)
                if holder is not None and holder[1] != owner.store.name:
                    extra[key] = (holder[1], ())
            return []
        a = assign(
            key,
            [Declared(r.name, o.provenance.file) for r, o in decl],
            holder[0] if holder else None,
            shared.known,
        )
        out = []
        for run, obj in decl:
            if not run.active or run.name == a.owner:
                continue
            skip = SkipReason.OTHER_APP if a.owner is not None else SkipReason.OTHER_SET
            change = Change(
                key, Action.SKIP, obj.api_version, reason=a.reason, provenance=obj.provenance, skip=skip
            )
            out.append(Verdict(run.name, obj, change, None, conflicts=a.conflicts, passed=True))
        if a.owner is None:
            return out
        owner = shared.runs[a.owner]
        if holder is not None and holder[0] == a.owner:
            # Held by its owner already: a stale record of it elsewhere (a pass cut short
            # between a handover's apply and its settling) is dropped when this pass settles.
            shared.release_stale(key, owner)
        if owner.active and owner.store is not None:
            todo.setdefault(owner.name, []).append(next(o for r, o in decl if r is owner))
            giver = holder[1] if holder and holder[1] != owner.store.name else ""
            if giver or a.conflicts:
                extra[key] = (giver, a.conflicts)
        return out


__all__ = ["AppPlan", "ClusterPipeline", "PassPlan", "owner_of"]
