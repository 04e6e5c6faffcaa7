"""One reconcile pass for one cluster: render → read live → plan → apply → prune.

``ClusterReconciler`` holds what one cluster keeps between passes (its client,
discovery, schema and render caches) and sequences the stages; it decides
nothing itself. The scheduler runs one per cluster; the CLI's ``run --once``
and ``diff`` call it directly. Every failure ends as a ``ClusterResult`` with
a typed ``Failure`` (reason, state, readable message), never as an exception
that could reach another cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import structlog

from agent.apply import prune as prune_stage
from agent.apply import ssa as apply_stage
from agent.apply.inventory import PART_OF, Inventory, InventoryStore, Member, record_uids, widen
from agent.config.types import ClusterConfig, Config
from agent.errors import AgentError, ApiError, ClusterRefused, RenderError, RenderProblem, StatusCause
from agent.kube.client import KubeClient
from agent.model import (
    Action,
    ApplyResult,
    Change,
    ClusterResult,
    DesiredObject,
    DesiredSet,
    Manifest,
    ObjectKey,
    Outcome,
    Plan,
    PruneReason,
    PruneRefusal,
    Refusal,
    Revision,
    split_api_version,
)
from agent.plan.causes import replan_after_conflict
from agent.plan.planner import PlanOptions, plan, request_body
from agent.plan.schema import SchemaIndex
from agent.reconcile.identity import shared_message
from agent.reconcile.live import GroupKind, Inspect, LiveState, crd_scopes, read_live
from agent.render.renderer import RenderCache, RenderSpec

log = structlog.get_logger("gitops_agent.reconcile")
ClientFactory = Callable[[ClusterConfig], KubeClient]
#: (this entry, its cluster's kube-system UID or None) → the other entries reaching that cluster.
SameCluster = Callable[[str, str | None], list[str]]


def render_spec(cluster: ClusterConfig) -> RenderSpec:
    return RenderSpec(
        cluster=cluster.name,
        paths=cluster.paths,
        vars=dict(cluster.vars),
        exclude=cluster.settings.exclude,
        helm=cluster.helm,
        timeout=cluster.settings.render_timeout,
    )


class ClusterReconciler:
    """Reconciles one cluster; owns that cluster's client and caches."""

    def __init__(
        self,
        config: Config,
        cluster: ClusterConfig,
        *,
        client_factory: ClientFactory = KubeClient.from_config,
        render_cache: RenderCache | None = None,
        same_cluster: SameCluster | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        #: Set by ``Fleet``, which knows the other entries; alone (CLI tools) only the claim guards.
        self._same_cluster = same_cluster
        self.field_manager = config.field_manager(cluster)
        self._client_factory = client_factory
        self._client: KubeClient | None = None
        self.render_cache = render_cache or RenderCache()
        self.schema = SchemaIndex()
        self._schema_loaded: set[tuple[str, str]] = set()
        #: Bumped whenever a schema document is added: plans made before may differ after.
        self._schema_generation = 0
        #: Last NOOP verdict per object: (desired object, live (resourceVersion, uid), change).
        #: ``plan_object`` is a pure function of the desired object, the live object and the
        #: options, and a resourceVersion names exactly one stored state of an object, so an equal
        #: desired object against the same live version gets the same verdict without re-planning.
        self._noop_memo: dict[ObjectKey, tuple[DesiredObject, tuple[str, str], Change]] = {}
        self._memo_token: tuple[Any, ...] = ()

    @property
    def client(self) -> KubeClient:
        if self._client is None:
            self._client = self._client_factory(self.cluster)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def store(self) -> InventoryStore:
        return InventoryStore(
            self.client,
            name=self.config.agent.name,
            namespace=self.config.agent.namespace,
            field_manager=self.field_manager,
            claimant=self.cluster.name,
        )

    def check_identity(self) -> None:
        """Refuse the pass when another config entry reaches this very cluster (one GET, cached).

        Compared by the kube-system UID, not the URL: two addresses of one API server are one
        cluster. Where RBAC hides kube-system this cannot see anything; the claim on the
        ApplySet parent then refuses the second entry.
        """
        if self._same_cluster is None:
            return
        uid = self.client.cluster_uid()
        others = self._same_cluster(self.cluster.name, uid)
        if uid is not None and others:
            agent, name = self.config.agent, self.cluster.name
            message = shared_message(name, others, uid, agent=agent.name, namespace=agent.namespace)
            raise ClusterRefused(name, Refusal.SHARED_CLUSTER, message)

    # -- stages ---------------------------------------------------------------

    def render(self, revision: Revision) -> DesiredSet:
        # Through the cache's single flight: clusters sharing a render wait for the one rendering it
        # instead of each rendering (and holding) its own copy at the same moment.
        return self.render_cache.render(revision.tree, render_spec(self.cluster), revision=revision.sha)

    def prepare(self, desired: DesiredSet, inventory_id: str) -> list[DesiredObject]:
        """Default namespaces, refuse namespaced-ness mistakes, add our membership label."""
        disc = self.client.discovery()
        scopes = crd_scopes(desired.objects)
        out: list[DesiredObject] = []
        problems: list[RenderProblem] = []
        for obj in desired.objects:
            # Only metadata changes here (namespace, our label): copy that level and share the rest
            # with the render cache, which nothing downstream writes to (the planner and apply
            # copy before editing). A deep copy per object per pass cost time and a copy of every object.
            m = dict(obj.manifest)
            meta = m["metadata"] = dict(m.get("metadata") or {})
            if isinstance(meta.get("labels"), dict):
                meta["labels"] = dict(meta["labels"])
            group = obj.key.group
            info = disc.find(obj.api_version, obj.key.kind) or disc.find_group_kind(group, obj.key.kind)
            namespaced = info.namespaced if info else scopes.get((group, obj.key.kind))
            if namespaced is None:
                namespaced = bool(meta.get("namespace"))  # unknown kind: keep as written; apply reports it
            if namespaced and not meta.get("namespace"):
                meta["namespace"] = self.cluster.settings.default_namespace
            elif not namespaced and meta.get("namespace"):
                problems.append(
                    RenderProblem(
                        obj.provenance.file,
                        f"{obj.key.kind} {meta.get('name')} is cluster-scoped but sets a namespace",
                        line=obj.provenance.line,
                    )
                )
                continue
            meta.setdefault("labels", {})[PART_OF] = inventory_id
            out.append(DesiredObject(m, obj.provenance))
        if problems:
            raise RenderError(problems, cluster=self.cluster.name)
        return out

    def read_live(
        self,
        keys: Iterable[ObjectKey],
        desired: list[DesiredObject],
        *,
        inspect: Inspect | None = None,
        keep: Callable[[ObjectKey], bool] | None = None,
    ) -> LiveState:
        """``live.read_live`` on this cluster's client and pool size."""
        return read_live(
            self.client,
            keys,
            crd_scopes(desired),
            concurrency=self.cluster.settings.concurrency,
            inspect=inspect,
            keep=keep,
        )

    def load_schema(self, objs: Iterable[DesiredObject]) -> None:
        """OpenAPI v3 per group-version, once per client lifetime (list-map keys, int-or-string)."""
        for group, version in sorted({split_api_version(o.api_version) for o in objs}):
            gv = (group, version)
            if gv in self._schema_loaded:
                continue
            try:
                self.schema.add_document(self.client.openapi_v3(group, version))
                self._schema_generation += 1
            except ApiError as e:
                if e.is_cluster_level:
                    raise
                # A kind defined by a CRD of this pass has no schema yet: planner fallbacks apply
                # now, and the next pass asks again (marking it loaded would plan its list-maps
                # as atomic lists for good, re-applying every custom resource on every pass).
                if e.status == 404:
                    continue
            self._schema_loaded.add(gv)

    # -- the pass ---------------------------------------------------------------

    def reconcile(self, revision: Revision, *, dry_run: bool = False) -> ClusterResult:
        result = ClusterResult(self.cluster.name, revision.sha, started=datetime.now(UTC), dry_run=dry_run)
        bound = log.bind(cluster=self.cluster.name, revision=revision.short)
        try:
            self._pass(revision, result, dry_run=dry_run)
        except ClusterRefused as e:
            result.failure = e.failure()
            bound.error("cluster refused; nothing applied, pruned or written", error=str(e))
        except RenderError as e:
            result.failure = e.failure()
            bound.error("render failed; nothing applied or pruned", error=str(e))
        except AgentError as e:
            result.failure = e.failure()
            bound.error("reconcile failed", error=str(e))
        result.finished = datetime.now(UTC)
        return result

    def _pass(self, revision: Revision, result: ClusterResult, *, dry_run: bool) -> None:
        desired_set = self.render(revision)
        self.check_identity()  # before anything is written, by this entry or (racing) another
        store = self.store
        inventory = store.load()
        store.check_claim(inventory)
        if inventory.suspended:
            result.prune_refusal = PruneRefusal(
                PruneReason.SUSPENDED, "cluster suspended (annotation on the ApplySet parent)"
            )
            return
        if not dry_run and inventory.exists:
            inventory = store.claim(inventory)  # a parent written before claims existed: now ours
        desired = self.desired(desired_set, store.id)
        by_key = {o.key: o for o in desired}
        options = self.plan_options(store.id, detail=False)
        # Objects are planned on the listing threads as they are decoded, and of the live objects
        # only inventory members that left Git (prune candidates) are kept whole: holding every
        # listed object of the cluster until the plan was done was most of a pass's memory.
        self._memo_reset(options)

        def plan_chunk(gk: GroupKind, objects: dict[ObjectKey, Manifest | None]) -> list[_Verdict]:
            todo = [by_key[k] for k in objects if k in by_key]
            return self._verdicts(revision.sha, todo, objects, options)

        live = self.read_live(
            set(by_key) | inventory.keys(), desired, inspect=plan_chunk, keep=lambda k: k not in by_key
        )
        verdicts: list[_Verdict] = [v for planned in live.inspected.values() for v in planned]
        live.inspected.clear()
        # Not planned on a listing thread: kinds a CRD of this commit adds (nothing live yet:
        # create), and objects whose listing failed, which the planner skips (live state unknown)
        # instead of mistaking them for absent.
        planned = {v.obj.key for v in verdicts}
        rest = [o for o in desired if o.key not in planned]
        known: dict[ObjectKey, Manifest | None] = {o.key: None for o in rest if live.listed(o.key)}
        for v in self._verdicts(revision.sha, rest, known, options):
            verdicts.append(replace(v, change=live.explain(v.change)))
        the_plan = self._remember(revision.sha, desired, verdicts)
        del verdicts
        if not dry_run:
            wider = widen(inventory, by_key)
            if len(wider) != len(inventory.members):
                if not inventory.exists:  # created with the claim alone, so a racing entry loses
                    inventory = store.claim(inventory)
                store.write(wider)  # widen before applying (docs/safety.md rule 10)
        apply_opts = apply_stage.ApplyOptions(
            field_manager=self.field_manager, dry_run=dry_run, concurrency=self.cluster.settings.concurrency
        )

        def replan(key: ObjectKey, fresh: Manifest | None, causes: tuple[StatusCause, ...]) -> Change:
            return replan_after_conflict(by_key[key], fresh, options, causes)

        def body_for(change: Change) -> Manifest | None:
            return request_body(change, by_key[change.key])

        result.results.extend(
            apply_stage.apply_changes(self.client, the_plan.changes, apply_opts, replan, body_for)
        )
        decision = prune_stage.decide(
            inventory,
            set(by_key),
            live.objects,
            live.complete,
            self.prune_options(store.id, dry_run),
            render_empty=desired_set.empty,
        )
        if decision.refusal:
            refusal = decision.refusal
            if live.errors:
                refusal = replace(refusal, message=f"{refusal.message} [{'; '.join(live.errors)}]")
            result.prune_refusal = refusal
        result.results.extend(
            prune_stage.execute(self.client, decision, self.prune_options(store.id, dry_run))
        )
        if not dry_run:
            self._narrow(store, inventory, by_key, live, result.results, decision.gone)

    def _memo_reset(self, options: PlanOptions) -> None:
        token = (
            options.field_manager,
            options.rules,
            options.adopt,
            options.membership_label,
            id(options.schema),
            self._schema_generation,
        )
        if token != self._memo_token:
            self._noop_memo.clear()
            self._memo_token = token

    def _verdicts(
        self,
        revision: str,
        desired: list[DesiredObject],
        known: Mapping[ObjectKey, Manifest | None],
        options: PlanOptions,
    ) -> list[_Verdict]:
        """One verdict per desired object; reads the memo only (it may run on a listing thread)."""
        memo = self._noop_memo
        out: list[_Verdict] = []
        todo: list[DesiredObject] = []
        for obj in desired:
            live = known.get(obj.key)
            hit = memo.get(obj.key)
            if (
                hit is not None
                and live is not None
                and hit[1][0]
                and hit[1] == _version(live)
                and _same(hit[0], obj)
            ):
                out.append(_Verdict(obj, hit[2], hit[1], fresh=False))
            else:
                todo.append(obj)
        planned = plan(self.cluster.name, revision, todo, known, options).changes
        for obj, change in zip(todo, planned, strict=True):
            live = known.get(obj.key)
            out.append(_Verdict(obj, _slim(change), _version(live) if live is not None else None))
        return out

    def _remember(self, revision: str, desired: list[DesiredObject], verdicts: list[_Verdict]) -> Plan:
        """Record fresh NOOP verdicts, forget objects that left Git; the plan in ``desired`` order."""
        memo = self._noop_memo
        by_key = {v.obj.key: v for v in verdicts}
        for v in verdicts:
            if not v.fresh:
                continue
            if v.change.action is Action.NOOP and v.version is not None:
                memo[v.obj.key] = (v.obj, v.version, v.change)
            else:
                memo.pop(v.obj.key, None)
        if len(memo) > len(desired):  # objects that left Git
            wanted = {o.key for o in desired}
            for key in [k for k in memo if k not in wanted]:
                del memo[key]
        changes = tuple(by_key[o.key].change for o in desired)
        return Plan(cluster=self.cluster.name, revision=revision, changes=changes)

    def desired(self, desired_set: DesiredSet, inventory_id: str) -> list[DesiredObject]:
        """The rendered objects prepared for this cluster, with the OpenAPI schema they need loaded."""
        desired = self.prepare(desired_set, inventory_id)
        self.load_schema(desired)
        return desired

    def plan_options(self, inventory_id: str, *, detail: bool = True) -> PlanOptions:
        """How this cluster's objects are planned: by the pass, diff reports and takeover alike.

        ``detail=False`` (the pass): no report operations or path sets it would throw away.
        """
        return PlanOptions(
            detail=detail,
            field_manager=self.field_manager,
            rules=self.config.conflict_rules,
            schema=self.schema,
            adopt=self.cluster.settings.adopt,
            membership_label=(PART_OF, inventory_id),
        )

    def prune_options(self, inventory_id: str, dry_run: bool) -> prune_stage.PruneOptions:
        s = self.cluster.settings
        return prune_stage.PruneOptions(
            field_manager=self.field_manager,
            inventory_id=inventory_id,
            enabled=s.prune,
            allow_empty=s.allow_empty,
            max_prune_fraction=s.max_prune_fraction,
            brake_min_inventory=s.brake_min_inventory,
            max_prune=s.max_prune,
            propagation=s.propagation_policy,
            dry_run=dry_run,
        )

    def _narrow(
        self,
        store: InventoryStore,
        inventory: Inventory,
        desired: dict[ObjectKey, DesiredObject],
        live: LiveState,
        results: list[ApplyResult],
        released: set[ObjectKey],
    ) -> None:
        """Members after this pass: desired plus what could not be removed; UIDs recorded.

        ``released``: what the prune decision found gone or taken out of the set by hand
        (membership label removed); neither is ours to track any more.
        """
        done = {r.key for r in results if r.outcome in (Outcome.PRUNED, Outcome.ORPHANED)}
        gone = released | {
            k
            for k in inventory.members
            if k not in desired and not live.found(k) and live.complete.get((k.group, k.kind))
        }
        keep = [m for k, m in inventory.members.items() if k not in done and k not in gone]
        members = {m.key: m for m in keep}
        for k in desired:
            members.setdefault(k, Member(k))
        uids = dict(live.uids)
        uids.update(
            {r.key: r.uid for r in results if r.uid and r.outcome in (Outcome.CREATED, Outcome.CONFIGURED)}
        )
        new = {m.key: m for m in record_uids(members.values(), uids)}
        if new != inventory.members:
            store.write(new.values())


@dataclass(frozen=True)
class _Verdict:
    """One object's change, the live version it was planned against, and whether it was planned now."""

    obj: DesiredObject
    change: Change
    version: tuple[str, str] | None
    fresh: bool = True


def _slim(change: Change) -> Change:
    """The change as the pass keeps it until apply, which reads neither the report's operations
    (a JSON patch carrying a copy of every value sent) nor the path sets (declared, changed): they
    were most of what a plan held. Reports plan again with ``plan.plan`` and keep everything."""
    if change.operations or change.declared or change.changed:
        return replace(change, operations=(), declared=frozenset(), changed=frozenset())
    return change


def _same(a: DesiredObject, b: DesiredObject) -> bool:
    return a is b or (a.provenance == b.provenance and a.manifest == b.manifest)


def _version(live: Manifest) -> tuple[str, str]:
    meta = live.get("metadata") or {}
    return str(meta.get("resourceVersion") or ""), str(meta.get("uid") or "")
