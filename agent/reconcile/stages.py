"""The stages of a pass on one cluster's client: render, prepare, read live, plan and prune options.

``ClusterStages`` holds what one cluster keeps between passes (its client, discovery, the
OpenAPI schema index, the render cache) and the inventories of its apps. It decides nothing:
``reconciler.ClusterReconciler`` sequences these stages for a pass over the cluster's apps;
``report.diff`` and ``reconcile.takeover`` use them for their previews.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import replace

from agent.apply import prune as prune_stage
from agent.apply.inventory import InventoryStore, applyset_id, parent_name
from agent.config.types import AppConfig, ClusterConfig, Config, substitutes
from agent.errors import ApiError, ClusterRefused, RenderError, RenderProblem
from agent.kube.client import KubeClient
from agent.model import (
    CRD_KEY,
    PART_OF,
    ApiFinding,
    Change,
    DesiredObject,
    DesiredSet,
    Manifest,
    ObjectKey,
    Refusal,
    Revision,
    ScopeViolation,
    SyncKind,
    split_api_version,
)
from agent.plan import apis
from agent.plan.planner import PlanOptions
from agent.plan.schema import SchemaIndex
from agent.plan.scope import Scope
from agent.reconcile import namespaces, preflight
from agent.reconcile.apps import cluster_apps
from agent.reconcile.charts import with_charts
from agent.reconcile.identity import shared_message
from agent.reconcile.keys import load_keys
from agent.reconcile.live import GroupKind, Inspect, LiveState, crd_scopes, read_live
from agent.reconcile.verdicts import NoopMemo
from agent.render.renderer import Capabilities, RenderCache, RenderSpec
from agent.render.sops import SOPS_KEY
from agent.source.checkout import reading
from agent.source.git import GitSource

ClientFactory = Callable[[ClusterConfig], KubeClient]
#: (this entry, its cluster's kube-system UID or None) → the other entries reaching that cluster.
SameCluster = Callable[[str, str | None], list[str]]


def render_spec(cluster: ClusterConfig) -> RenderSpec:
    """What a `[[clusters]]` entry's own app renders."""
    return RenderSpec(
        cluster=cluster.name,
        paths=cluster.paths,
        vars=dict(cluster.vars) if substitutes(cluster.settings.substitute, cluster.vars) else None,
        exclude=cluster.settings.exclude,
        helm=cluster.helm,
        timeout=cluster.settings.render_timeout,
        memory=cluster.settings.render_memory,
    )


def app_render_spec(app: AppConfig) -> RenderSpec:
    """What one app renders: its paths, its variables (over the cluster's), its settings."""
    return RenderSpec(
        cluster=app.cluster,
        paths=app.paths,
        vars=dict(app.vars) if substitutes(app.settings.substitute, app.vars) else None,
        exclude=app.settings.exclude,
        helm=app.helm,
        timeout=app.settings.render_timeout,
        memory=app.settings.render_memory,
    )


class ClusterStages:
    """One cluster's client and caches, and the stages of a pass on them (``ClusterReconciler``
    sequences them; diff reports and takeover use them directly)."""

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
        self.apps = cluster_apps(config, cluster)
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
        #: Identity ("": the agent's own) → kinds it may list only per namespace (a cluster-wide
        #: LIST was refused once): listed per namespace straight away in later passes.
        self._namespaced_lists: dict[str, set[GroupKind]] = {}
        #: App → the Helm sync its last pass rendered for (a pass renders for it first); the apps
        #: whose first install is under way (an install until its sync is through: ``writes``).
        self._sync_kinds: dict[str, SyncKind] = {}
        self._installing: set[str] = set()
        #: App → its no-op memo, kept across passes (``pipeline``).
        self._memos: dict[str, NoopMemo] = {}
        #: Source name → its cache, read for rollback pins (never the network).
        self._caches: dict[str, GitSource] = {}

    @property
    def client(self) -> KubeClient:
        if self._client is None:
            self._client = self._client_factory(self.cluster)
        return self._client

    @property
    def client_if_open(self) -> KubeClient | None:
        """The client if a pass has made one (``Fleet`` fences an abandoned pass's without making one)."""
        return self._client

    def client_for(self, app: AppConfig | None) -> KubeClient:
        """The client ``app``'s requests go through: acting as its ServiceAccount, if it names one.

        Inventories, Events, discovery and OpenAPI stay on ``client``: the agent's own identity.
        """
        return self.client.impersonating(app.settings.service_account if app else "")

    def scope_of(self, app: AppConfig | None) -> Scope | None:
        """``app``'s scope (None: the cluster entry's own app outside a pass, unrestricted)."""
        agent = self.config.agent
        return Scope.of(app, agent.namespace, agent.name) if app is not None else None

    def scope_violations(
        self, app: AppConfig | None, desired: list[DesiredObject]
    ) -> tuple[ScopeViolation, ...]:
        """What of the prepared ``desired`` lies outside ``app``'s scope (before any request for
        it), and the namespace ``create_namespace`` would create outside it."""
        scope = self.scope_of(app)
        if scope is None or app is None:
            return ()
        found = scope.violations(desired, app.name)
        created = namespaces.to_create(app, {o.key for o in desired})
        refused = scope.creation_violation(created, app.name) if created else None
        return (*found, refused) if refused is not None else found

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- inventories ------------------------------------------------------------

    def parent_of(self, app: str) -> str:
        """The name of ``app``'s ApplySet parent (the cluster's own app: the agent's name)."""
        implicit = next((a.implicit for a in self.apps if a.name == app), app == self.cluster.name)
        return parent_name(self.config.agent.name, app, implicit=implicit)

    def store_for(self, parent: str) -> InventoryStore:
        return InventoryStore(
            self.client,
            name=parent,
            namespace=self.config.agent.namespace,
            field_manager=self.field_manager,
            claimant=self.cluster.name,
            agent=self.config.agent.name,
        )

    @property
    def store(self) -> InventoryStore:
        """The inventory of the cluster entry's own app (the parent every release before apps used)."""
        return self.store_for(self.config.agent.name)

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

    def preflight(
        self,
        app: AppConfig,
        changes: Iterable[Change],
        decision: prune_stage.PruneDecision,
        unread: Iterable[ObjectKey],
    ) -> None:
        """What ``app``'s pass needs of its ServiceAccount, asked of the server before anything is
        written (``preflight.check``: raises ``AccessDenied`` naming every missing rule)."""
        disc = self.client.discovery()
        wanted = preflight.needs(
            changes,
            delete=[c.key for c in decision.delete],
            orphan=[c.key for c in decision.orphan],
            unread=unread,
            resolve=lambda k: disc.find_group_kind(k.group, k.kind),
        )
        preflight.check(
            self.client,
            app.settings.service_account,
            wanted,
            app=app.name,
            concurrency=self.cluster.settings.concurrency,
        )

    def create_namespace(
        self, app: AppConfig, declared: Container[ObjectKey], live: LiveState | None = None
    ) -> None:
        """``app``'s target namespace, created as the app if ``create_namespace`` asks for it.

        ``live``: this pass's read, where it listed the namespace: found there, nothing is asked."""
        if name := namespaces.to_create(app, declared):
            key = ObjectKey("", "Namespace", "", name)
            if live is not None and live.complete.get(("", "Namespace")) and live.found(key):
                return
            client, agent = self.client_for(app), self.config.agent.name
            namespaces.ensure_namespace(
                client, name, agent=agent, app=app.name, field_manager=self.field_manager
            )

    # -- stages ---------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """This cluster's version and served API versions, for charts (asked only by a chart's
        render; both cached by the client)."""
        disc = self.client.discovery()
        return Capabilities(self.client.server_version(), tuple(disc.api_versions()))

    def spec_for(self, app: AppConfig | None = None) -> RenderSpec:
        """What ``app`` (default: the cluster entry's own) renders here: Helm told this cluster's
        capabilities, and its age identities loaded now (a rotated key takes effect on the next
        pass); ``RenderError`` when they cannot be."""
        spec = render_spec(self.cluster) if app is None else app_render_spec(app)
        decryption = (self.cluster.settings if app is None else app.settings).decryption

        def read_secret(namespace: str, name: str) -> Manifest | None:
            # As the app: a tenant's key Secret is read as the tenant, so only its own. A client
            # exists only once a key is read (an app that fails to render asks nothing).
            client = self.client_for(app)
            return client.get(client.resource("v1", "Secret"), namespace, name)

        keys = load_keys(
            decryption,
            read_secret=read_secret,
            namespace=self.config.agent.namespace,
            cluster=self.cluster.name,
        )
        return replace(spec, keys=keys, capabilities=self.capabilities)

    def render(self, revision: Revision) -> DesiredSet:
        """The cluster entry's own app (``render_app`` for any app)."""
        # Through the cache's single flight: clusters sharing a render wait for the one rendering it
        # instead of each rendering (and holding) its own copy at the same moment.
        return self.render_at(revision, self.spec_for())

    def render_app(
        self, app: AppConfig, revision: Revision, *, upgrade: bool = False, tests: bool = False
    ) -> DesiredSet:
        """``app`` at ``revision``: its charts as their first install or (``upgrade``) a later
        revision, with their ``test`` hooks (``tests``) or without."""
        # The chart the source's poll fetched, or built with its dependencies.
        spec = replace(with_charts(self.spec_for(app), app, revision), is_upgrade=upgrade, tests=tests)
        return self.render_at(revision, spec)

    def render_at(self, revision: Revision, spec: RenderSpec) -> DesiredSet:
        """Render ``revision``'s checkout, held while it is read (``checkout.reading``)."""
        with reading(revision.tree):
            return self.render_cache.render(revision.tree, spec, revision=revision.sha)

    def prepare(
        self, desired: DesiredSet, inventory_id: str, *, default_namespace: str | None = None
    ) -> list[DesiredObject]:
        """Default namespaces, refuse namespaced-ness mistakes, add our membership label.

        Refuses anything encrypted (a sealed render, an object with SOPS metadata): ciphertext
        is never sent to a cluster, whatever rendered it."""
        if desired.sealed:
            why = "rendered without decrypting its encrypted files: for reports only, never applied"
            raise RenderError([RenderProblem("", why)], cluster=self.cluster.name)
        encrypted = [
            RenderProblem(
                o.provenance.file, f"{o.key} still carries sops metadata: never sent", line=o.provenance.line
            )
            for o in desired.objects
            if SOPS_KEY in o.manifest
        ]
        if encrypted:
            raise RenderError(encrypted, cluster=self.cluster.name)
        disc = self.client.discovery()
        scopes = crd_scopes(desired.objects)
        fallback = default_namespace or self.cluster.settings.default_namespace
        # Each kind's scope here: with the membership label and the default namespace, all that
        # preparing depends on besides the render, so clusters alike share one prepared copy.
        namespaced: dict[tuple[str, str], bool | None] = {}
        for obj in desired.objects:
            kind = (obj.api_version, obj.key.kind)
            if kind not in namespaced:
                group = obj.key.group
                info = disc.find(obj.api_version, obj.key.kind) or disc.find_group_kind(group, obj.key.kind)
                namespaced[kind] = info.namespaced if info else scopes.get((group, obj.key.kind))
        token = (inventory_id, fallback, tuple(sorted(namespaced.items())))
        return self.render_cache.prepared(
            desired, token, lambda: self._prepared(desired, inventory_id, fallback, namespaced)
        )

    def _prepared(
        self,
        desired: DesiredSet,
        inventory_id: str,
        fallback: str,
        scopes: Mapping[tuple[str, str], bool | None],
    ) -> list[DesiredObject]:
        out: list[DesiredObject] = []
        problems: list[RenderProblem] = []
        for obj in desired.objects:
            # Only metadata changes here (namespace, our label): copy that level and share the rest
            # with the render cache, which nothing downstream writes to (the planner and apply
            # copy before editing). A deep copy per object per pass cost time and a copy of every object.
            m = dict(obj.manifest)
            meta = m["metadata"] = dict(m.get("metadata") or {})
            # ``labels: null`` is valid (render refuses any other non-mapping): ours goes in a new map.
            meta["labels"] = dict(meta.get("labels") or {})
            namespaced = scopes[(obj.api_version, obj.key.kind)]
            if namespaced is None:
                namespaced = bool(meta.get("namespace"))  # unknown kind: keep as written; apply reports it
            if namespaced and not meta.get("namespace"):
                meta["namespace"] = fallback
            elif not namespaced and meta.get("namespace"):
                problems.append(
                    RenderProblem(
                        obj.provenance.file,
                        f"{obj.key.kind} {meta.get('name')} is cluster-scoped but sets a namespace",
                        line=obj.provenance.line,
                    )
                )
                continue
            meta["labels"][PART_OF] = inventory_id
            out.append(DesiredObject(m, obj.provenance))
        if problems:
            raise RenderError(problems, cluster=self.cluster.name)
        return out

    def check_apis(
        self, desired: list[DesiredObject], *, also: Iterable[DesiredObject] = ()
    ) -> tuple[dict[ObjectKey, ApiFinding], list[ApiFinding]]:
        """Before anything is written: the objects whose group/version/kind the cluster does not
        serve (each fails alone, nothing sent for it), and notes on the others: versions
        deprecated at the cluster's release or by a CRD of the render, and versions the
        cluster's ``kubernetes_version`` target removes. ``also``: the pass's other apps' objects
        (their CRDs are applied in the same pass)."""
        also = [o for o in also if (o.key.group, o.key.kind) == CRD_KEY]
        unserved = apis.unserved(desired, self.client.discovery().served(), also=also)
        if unserved:  # served since discovery was read (a CRD applied by someone else)? Ask once.
            unserved = apis.unserved(desired, self.client.discovery(refresh=True).served(), also=also)
        rest = [o for o in desired if o.key not in unserved]
        try:
            release: apis.Release | None = apis.parse_release(self.client.server_version())
        except ValueError:
            release = None  # a distribution's odd gitVersion: the table's deprecations are skipped
        notes = list(apis.deprecations(rest, release).values())
        target = self.cluster.settings.kubernetes_version
        if target:
            removed = apis.removed_by(rest, apis.parse_release(target))
            notes = [n for n in notes if n.key not in removed] + list(removed.values())
        return unserved, notes

    def read_live(
        self,
        keys: Iterable[ObjectKey],
        desired: list[DesiredObject],
        *,
        inspect: Inspect | None = None,
        keep: Callable[[ObjectKey], bool] | None = None,
        app: AppConfig | None = None,
    ) -> LiveState:
        """``live.read_live`` on this cluster's pool size, as ``app``'s identity (``client_for``)."""
        identity = app.settings.service_account if app else ""
        return read_live(
            self.client_for(app),
            keys,
            crd_scopes(desired),
            concurrency=self.cluster.settings.concurrency,
            inspect=inspect,
            keep=keep,
            namespaced=self._namespaced_lists.setdefault(identity, set()),
        )

    def load_schema(self, objs: Iterable[DesiredObject]) -> None:
        """OpenAPI v3 per group-version, once per client lifetime (list-map keys, int-or-string)."""
        kinds: dict[tuple[str, str], set[str]] = {}
        for o in objs:
            kinds.setdefault(split_api_version(o.api_version), set()).add(o.key.kind)
        for (group, version), wanted in sorted(kinds.items()):
            gv = (group, version)
            if gv in self._schema_loaded:
                continue
            try:
                self.schema.add_document(self.client.openapi_v3(group, version))
                self._schema_generation += 1
                if not all(self.schema.knows(group, version, k) for k in wanted):
                    # Published before a CRD of this pass was in it: ask again next pass, or its
                    # list-maps would be planned as atomic lists for good (a re-apply every pass).
                    continue
            except ApiError as e:
                if e.is_cluster_level:
                    raise
                # A kind defined by a CRD of this pass has no schema yet: planner fallbacks apply
                # now, and the next pass asks again (marking it loaded would plan its list-maps
                # as atomic lists for good, re-applying every custom resource on every pass).
                if e.status == 404:
                    continue
            self._schema_loaded.add(gv)

    def desired(self, desired_set: DesiredSet, inventory_id: str) -> list[DesiredObject]:
        """The rendered objects prepared for this cluster, with the OpenAPI schema they need loaded."""
        desired = self.prepare(desired_set, inventory_id)
        self.load_schema(desired)
        return desired

    def plan_options(
        self,
        inventory_id: str,
        *,
        detail: bool = True,
        app: AppConfig | None = None,
        handover_from: frozenset[str] | None = None,
        protected: frozenset[str] | None = None,
    ) -> PlanOptions:
        """How an app's objects are planned: by the pass, diff reports and takeover alike.

        ``detail=False`` (the pass): no report operations or path sets it would throw away.
        ``app``: the cluster entry's own app when not given. Outside a pass (reports), members
        of the cluster's other apps are never planned as adoptable (``protected``).
        """
        agent, namespace = self.config.agent.name, self.config.agent.namespace
        owners = frozenset(
            (applyset_id(parent_name(agent, a.name, implicit=a.implicit), namespace), a.name)
            for a in self.apps
        )
        if protected is None:
            protected = frozenset(i for i, _ in owners) - {inventory_id}
        return PlanOptions(
            detail=detail,
            field_manager=self.field_manager,
            rules=app.conflict_rules if app else self.config.conflict_rules,
            schema=self.schema,
            adopt=(app.settings if app else self.cluster.settings).adopt,
            membership_label=(PART_OF, inventory_id),
            handover_from=handover_from,
            protected=protected,
            set_owners=owners,
            ignore=app.ignore if app else self.config.ignore,
        )

    def prune_options(
        self, inventory_id: str, dry_run: bool, app: AppConfig | None = None
    ) -> prune_stage.PruneOptions:
        s = app.settings if app else self.cluster.settings
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
            app=None if app is None or app.implicit else app.name,
            scope=self.scope_of(app),
            set_names={
                applyset_id(self.parent_of(a.name), self.config.agent.namespace): a.name for a in self.apps
            },
            config_file=self.config.file or None,
            cluster=self.cluster.name,
        )
