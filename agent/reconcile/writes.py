"""One app's writes in a pass, step by step of its sync: widen, apply, hooks, prune.

``AppWrites`` holds what ``ClusterReconciler._write`` does once an app's plan is confirmed:
its inventory widened before anything of it is applied (docs/safety.md rule 10), its changes
applied in the steps of its sync (``plan.ordering``: its Argo CD ``PreSync`` hooks, then wave by
wave with its ``Sync`` hooks, then its ``PostSync`` hooks), each step only once the one before is
healthy (``reconcile.waves``), and its prune after the last. An app in one wave without hooks is
applied at once, as it always was: the same requests.

Hooks run when the app's revision or its hooks changed since the last sync whose hooks all ran
(``reconcile.hook_runs``); a ``PreSync`` hook runs before the inventory is widened, so one that
fails leaves the app's objects and inventory untouched. On a failure the app's ``SyncFail``
hooks are created (not waited for).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import replace

import structlog

from agent.apply import ssa as apply_stage
from agent.apply.inventory import widen
from agent.errors import StatusCause
from agent.kube.client import KubeClient
from agent.model import (
    HELM_HOOK,
    HOOKS_RAN,
    PRUNE_HELD,
    Action,
    ApiFinding,
    ApiProblem,
    ApplyResult,
    Change,
    DeletePolicy,
    Failure,
    FailureReason,
    HookTool,
    Manifest,
    Note,
    ObjectKey,
    Outcome,
    PruneReason,
    SkipReason,
    Stage,
    Step,
    SyncKind,
)
from agent.plan import masking
from agent.plan.causes import replan_after_conflict
from agent.plan.planner import request_body
from agent.reconcile import hook_runs
from agent.reconcile.appruns import Shared
from agent.reconcile.pipeline import AppPlan, ClusterPipeline
from agent.reconcile.waves import Gate, WaveAt, Waves, applied_keys

log = structlog.get_logger("gitops_agent.reconcile")

#: Ends the ``hooks-ran`` mark of a first install with Helm hooks (``_hook_mark``).
INSTALLED = ":install"
#: Outcomes of objects the cluster holds as Git says: what a wave waits for.
_IN_CLUSTER = (Outcome.CREATED, Outcome.CONFIGURED, Outcome.UNCHANGED)


class AppWrites(ClusterPipeline):
    """The writes of one app's pass (see the module docstring); ``ClusterReconciler`` is one."""

    #: The sync steps apps wait on across passes, and their syncs with hooks under way.
    waves: Waves
    hook_runs: hook_runs.HookRuns

    def _sync(
        self,
        ap: AppPlan,
        changes: tuple[Change, ...],
        client: KubeClient,
        options: apply_stage.ApplyOptions,
        shared: Shared,
    ) -> bool:
        """Widen, then apply ``changes`` step by step, each after the one before is healthy;
        whether every step is through, so the prune may run. One wave, no hook (or a dry run):
        widened and applied at once."""
        run = ap.run
        self._left_out(ap)
        mark = self._hook_mark(ap)
        steps = _steps(ap, due=mark is not None and not options.dry_run)
        if run.kind is SyncKind.INSTALL and mark is not None and not options.dry_run:
            self._installing.add(run.name)  # an install until it is through, over passes
        if options.dry_run or (len(steps) <= 1 and not any(o.hook for s in steps for o in s.objects)):
            if not options.dry_run:
                self._widen(ap)
            self._apply(ap, changes, client, options, shared)
            return True
        widened = False
        for index, step in enumerate(steps, 1):
            if step.stage is not Stage.PRE and not widened:
                self._phase_through(ap, client, steps, Stage.PRE, mark)
                self._widen(ap)
                widened = True
            keys = {o.key for o in step.objects if o.hook is None}
            before = len(run.result.results)
            self._apply(ap, tuple(c for c in changes if c.key in keys), client, options, shared, keys)
            hooks = self._start_hooks(ap, client, step, index, mark or "")
            done = run.result.results[before:]
            if not all(r.ok for r in done):
                failed = sum(not r.ok for r in done)
                message = f"{step.label} ({index} of {len(steps)}): {failed} object(s) failed"
                reason = (
                    FailureReason.HOOK
                    if any(not r.ok and r.key in ap.hooks for r in done)
                    else FailureReason.WAVE
                )
                self._failed(
                    ap, client, Failure(reason, f"{message}; later waves and the prune were not done")
                )
                return False
            if (index == len(steps) or _before_helm_post(steps, index)) and not hooks:
                continue
            if not self._through(ap, client, step, index, len(steps), done, hooks):
                return False
        if not widened:
            self._widen(ap)
        self._phase_through(ap, client, steps, Stage.POST, mark)
        self._hooks_ran(ap, mark)
        self._installing.discard(run.name)
        return True

    def _hook_mark(self, ap: AppPlan) -> str | None:
        """``<revision>:<digest>`` of the app's hooks when they are due in this sync; None if not."""
        order = ap.order
        hooks = {o.key for s in (*order.steps, *order.on_fail) for o in s.objects if o.hook}
        if not hooks or ap.run.revision is None:
            return None
        sha = ap.run.revision.sha
        mark = f"{sha}:{hook_runs.digest(ap.hooks[k] for k in sorted(hooks))}"
        helm = any(o.hook.tool is HookTool.HELM for o in ap.order.hooks if o.hook is not None)
        if ap.run.kind is SyncKind.INSTALL and helm:
            mark += INSTALLED
        inventory = ap.run.inventory or ap.ready.inventory
        ran = inventory.annotations.get(HOOKS_RAN, "")
        # Installed at this revision: the upgrade hooks wait for the next change, as in Helm.
        return None if ran == mark or (ran.endswith(INSTALLED) and ran.startswith(f"{sha}:")) else mark

    def _hooks_ran(self, ap: AppPlan, mark: str | None) -> None:
        """A sync whose hooks all ran: recorded on the parent, so the next pass runs none."""
        if mark is None:
            return
        self.hook_runs.forget(ap.run.name)
        inventory = ap.run.inventory or ap.ready.inventory
        if inventory.exists:
            ap.ready.store.set_annotation(HOOKS_RAN, mark)

    def _left_out(self, ap: AppPlan) -> None:
        """What the sync never applies (``Skip``, delete hooks) in the results, with why."""
        for left in ap.order.left_out:
            hook, skip = left.ordered.hook, SkipReason.HOOK
            why = f"Argo CD hook, not applied by a sync ({left.why})"
            if hook is not None and hook.tool is HookTool.HELM:
                events = ", ".join(hook.events) or "no known event"
                why, skip = (
                    f"Helm {events} hook ({HELM_HOOK}): not applied by this sync ({left.why})",
                    SkipReason.HELM_HOOK,
                )
            ap.run.result.results.append(
                ApplyResult(left.ordered.key, Outcome.SKIPPED, message=why, skip=skip)
            )

    def _start_hooks(
        self, ap: AppPlan, client: KubeClient, step: Step, index: int, mark: str
    ) -> dict[ObjectKey, ObjectKey]:
        """Create the step's hooks, once per sync: their keys (Git's → the cluster's)."""
        hooks = [(o, ap.hooks[o.key]) for o in step.objects if o.hook is not None]
        if not hooks:
            return {}
        sync = self.hook_runs.sync(ap.run.name, mark)
        if index not in sync.created:
            created, results = hook_runs.create(client, hooks, ap.ready.store.id, self.field_manager)
            sync.created[index] = created
            ap.run.result.results.extend(results)
            log.info(
                "hooks created", app=ap.run.name, step=step.label, hooks=[str(k) for k in created.values()]
            )
        return sync.created[index]

    def _through(
        self,
        ap: AppPlan,
        client: KubeClient,
        step: Step,
        index: int,
        steps: int,
        done: list[ApplyResult],
        hooks: dict[ObjectKey, ObjectKey],
    ) -> bool:
        """Whether the step just applied (``done``: its results; ``hooks``: its hook objects) lets
        the next one go; else the app's pass ends syncing (waiting for it) or failed."""
        run = ap.run
        assert run.revision is not None
        sent = any(r.outcome in (Outcome.CREATED, Outcome.CONFIGURED) for r in done)
        if not sent and self.waves.through(run.name, run.revision.sha, step):
            return True  # found healthy at this revision, and nothing in it changed since
        at = WaveAt(run.app, run.revision.sha, ap.ready.store.id, step, index, steps)
        held = applied_keys(step, {r.key for r in done if r.outcome in _IN_CLUSTER})
        look = self.waves.look(
            client,
            at,
            held,
            time.monotonic(),
            hooks=sorted(hooks.values()),
            checks=run.app.health_checks,
            namespaced=self._namespaced_lists.setdefault(run.identity, set()),
            gone_when_done={v for k, v in hooks.items() if _ttl_job(ap.hooks[k].manifest)},
        )
        if look.gate is Gate.WAITING and look.wait is not None:
            run.end_syncing(look.wait)
            log.info("sync step not healthy yet", app=run.name, detail=look.wait.message)
            return False
        policy = DeletePolicy.HOOK_SUCCEEDED if look.gate is Gate.READY else DeletePolicy.HOOK_FAILED
        self._delete_hooks(ap, client, step, hooks, policy)
        if look.gate is Gate.READY:
            return True
        by_cluster = {v: k for k, v in hooks.items()}
        hook = by_cluster.get(look.failed) if look.failed else None
        name = f"hook {look.failed}" if hook is not None else ""
        self._failed(ap, client, look.failure(at, FailureReason.HOOK if hook else FailureReason.WAVE, name))
        return False

    def _delete_hooks(
        self,
        ap: AppPlan,
        client: KubeClient,
        step: Step,
        hooks: dict[ObjectKey, ObjectKey],
        policy: DeletePolicy,
    ) -> None:
        """Delete the step's hook objects whose delete policy is ``policy`` (Helm's succeeded
        ones wait for their whole phase: ``_phase_through``)."""
        gone = [
            (hooks[o.key], ap.hooks[o.key].api_version)
            for o in step.objects
            if o.hook is not None and o.hook.deletes_on(policy) and o.key in hooks
            if not (policy is DeletePolicy.HOOK_SUCCEEDED and o.hook.tool is HookTool.HELM)
        ]
        for error in hook_runs.delete(client, gone):
            log.warning("hook not deleted", app=ap.run.name, error=error)

    def _phase_through(
        self, ap: AppPlan, client: KubeClient, steps: tuple[Step, ...], stage: Stage, mark: str | None
    ) -> None:
        """Every hook of ``stage`` succeeded: its Helm ``hook-succeeded`` hooks deleted, the last
        created first, as Helm does once all hooks of an event succeeded (so a ServiceAccount of
        weight -5 outlives the Job of weight 1 that runs as it)."""
        sync = self.hook_runs.sync(ap.run.name, mark) if mark is not None else None
        if sync is None or stage.value in sync.through:
            return
        sync.through.add(stage.value)
        created = sync.created
        gone = [
            (created[i][o.key], ap.hooks[o.key].api_version)
            for i, step in enumerate(steps, 1)
            if step.stage is stage
            for o in step.objects
            if o.hook is not None and o.hook.tool is HookTool.HELM and o.key in created.get(i, {})
            if o.hook.deletes_on(DeletePolicy.HOOK_SUCCEEDED)
        ]
        for error in hook_runs.delete(client, reversed(gone)):
            log.warning("hook not deleted", app=ap.run.name, error=error)

    def _failed(self, ap: AppPlan, client: KubeClient, failure: Failure) -> None:
        """The app's sync failed: said, and its ``SyncFail`` hooks created (once per sync)."""
        run = ap.run
        run.end_failed(failure)
        self._installing.discard(run.name)  # its retry is an upgrade once it has a parent, as in Helm
        log.error("sync failed", app=run.name, error=failure.message)
        mark = self._hook_mark(ap)
        if mark is None or not ap.order.on_fail:
            return
        for index, step in enumerate(ap.order.on_fail, 1):
            self._start_hooks(ap, client, step, -index, mark)
        self.hook_runs.forget(run.name)  # its retry runs the sync's hooks again

    def _widen(self, ap: AppPlan) -> None:
        """Record what is about to be applied before applying it (docs/safety.md rule 10)."""
        run, store = ap.run, ap.ready.store
        inventory = run.inventory or ap.ready.inventory
        wider = widen(inventory, ap.mine)
        if len(wider) == len(inventory.members):
            return
        if not inventory.exists:  # created with the claim alone, so a racing entry loses
            run.inventory = store.claim(inventory)
        store.write(wider)
        run.members = {m.key: m for m in wider}

    def _apply(
        self,
        ap: AppPlan,
        changes: tuple[Change, ...],
        client: KubeClient,
        options: apply_stage.ApplyOptions,
        shared: Shared,
        keys: Collection[ObjectKey] | None = None,
    ) -> None:
        """Send the changes (what the cluster does not serve fails here, before any request);
        results masked; warnings kept; handovers released once the taker applied them.
        ``keys``: the wave being applied (None: every object)."""
        run, result, by_key = ap.run, ap.run.result, ap.by_key

        def replan(key: ObjectKey, fresh: Manifest | None, causes: tuple[StatusCause, ...]) -> Change:
            return replan_after_conflict(by_key[key], fresh, ap.ready.options, causes)

        def body_for(change: Change) -> Manifest | None:
            return request_body(change, by_key[change.key])

        blocked = {k for k in run.unserved if k in ap.mine and (keys is None or k in keys)}
        sendable = [c for c in changes if c.key not in blocked or c.action is Action.SKIP]
        applied = apply_stage.apply_changes(client, sendable, options, replan, body_for)
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
            obj = by_key[r.key]
            result.api_findings.extend(
                ApiFinding(r.key, obj.api_version, ApiProblem.WARNING, w, file=str(obj.provenance))
                for w in r.warnings
            )
            if r.key in ap.taken and r.outcome in (Outcome.CREATED, Outcome.CONFIGURED):
                shared.release(ap.taken[r.key], r.key)

    def _prune(self, ap: AppPlan, client: KubeClient, *, dry_run: bool) -> None:
        """Delete what the decision allows; a refusal said (and a brake's hold recorded once)."""
        decision, result, inventory = ap.decision, ap.run.result, ap.run.inventory or ap.ready.inventory
        if decision.refusal:
            refusal = decision.refusal
            if ap.live.errors:
                refusal = replace(refusal, message=f"{refusal.message} [{'; '.join(ap.live.errors)}]")
            result.prune_refusal = refusal
        held = decision.digest if decision.refusal and decision.refusal.reason is PruneReason.BRAKE else ""
        if not dry_run and inventory.exists and held != inventory.held_digest:
            ap.ready.store.set_annotation(
                PRUNE_HELD, held or None
            )  # written when it changes, never each pass
        pruned = ap.prune(client)
        values = ap.run.secret_values()
        result.results.extend(masking.scrub_result(r, values, sensitive=False) for r in pruned)


def _ttl_job(manifest: Manifest) -> bool:
    """A Job deleted once it finished (``ttlSecondsAfterFinished``: ingress-nginx's hooks say 0)."""
    spec = manifest.get("spec")
    return manifest.get("kind") == "Job" and isinstance(spec, dict) and "ttlSecondsAfterFinished" in spec


def _before_helm_post(steps: tuple[Step, ...], index: int) -> bool:
    """Whether step ``index`` (from 1) is the app's last objects and only Helm post hooks follow:
    ``helm install`` and ``helm upgrade`` (without ``--wait``) run those once the objects are
    created, not once they are healthy (a LoadBalancer Service may never get an address)."""
    rest = steps[index:]
    return (
        steps[index - 1].stage is Stage.SYNC
        and bool(rest)
        and all(
            s.stage is Stage.POST
            and all(o.hook is not None and o.hook.tool is HookTool.HELM for o in s.objects)
            for s in rest
        )
    )


def _steps(ap: AppPlan, *, due: bool) -> tuple[Step, ...]:
    """The app's sync steps: with its hooks when they are due, else its waves alone."""
    if due:
        return ap.order.steps
    out = []
    for s in ap.order.steps:
        plain = tuple(o for o in s.objects if o.hook is None)
        if plain:
            out.append(Step(s.stage, s.wave, plain))
    return tuple(out)


__all__ = ["AppWrites"]
