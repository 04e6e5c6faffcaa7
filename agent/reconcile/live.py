"""What one pass reads from a cluster: the live objects it wants, and how completely.

One LIST per kind (per namespace where RBAC is namespaced), side by side on the cluster's pool.
Items are handed over as they are decoded (``KubeClient.scan``), so a reconcile pass plans them
in chunks on the listing threads and keeps only prune candidates whole. Completeness is
recorded per kind and the objects whose listing failed are named with why: unknown is never
absent (docs/safety.md rule 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from agent.errors import ApiError
from agent.kube.client import KubeClient, ResourceInfo
from agent.model import CRD_KEY, Action, Change, DesiredObject, Manifest, ObjectKey, SkipReason

GroupKind = tuple[str, str]
#: Called on a listing thread with a chunk of one kind's wanted objects: those just listed, as they
#: are decoded, then (once the listing of their namespace or of the whole kind completed) the ones
#: not found, as ``None``. What it returns is kept (``LiveState.inspected``) only for listings that
#: completed, so no verdict rests on a listing that failed part-way; the objects need not be kept.
Inspect = Callable[[GroupKind, dict[ObjectKey, Manifest | None]], list[Any]]
#: Wanted objects planned per chunk of a listing: small enough that a chunk's decoded objects are
#: little memory, large enough that a chunk's bookkeeping is negligible.
CHUNK = 16
#: Kinds listed at once per cluster (at most its ``concurrency``). Each listing holds a page's text
#: (~0.6 MB at 500 items) and a chunk of decoded objects; decoding holds the GIL, so more listings
#: side by side add memory (several clusters list at once) without a faster pass.
LIST_WORKERS = 4


@dataclass
class LiveState:
    """What one pass read from the cluster."""

    #: Wanted objects found live (only those ``keep`` accepted when ``read_live`` was given one).
    objects: dict[ObjectKey, Manifest] = field(default_factory=dict)
    #: (group, kind) → every listing of that kind completed in this pass (the prune guard).
    complete: dict[GroupKind, bool] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: UID of every wanted object found live, kept whole or not.
    uids: dict[ObjectKey, str] = field(default_factory=dict)
    #: What ``inspect`` returned for each kind, from its listings that completed.
    inspected: dict[GroupKind, list[Any]] = field(default_factory=dict)
    #: Wanted objects whose live state is unknown (their listing failed), with why.
    unknown: dict[ObjectKey, str] = field(default_factory=dict)

    def found(self, key: ObjectKey) -> bool:
        return key in self.uids

    def listed(self, key: ObjectKey) -> bool:
        """Whether the live state of wanted ``key`` is known: absent from ``objects`` means absent."""
        return key not in self.unknown

    def explain(self, change: Change) -> Change:
        """A SKIP for unknown live state, with the failed listing named (a hook's SKIP needs none)."""
        why = self.unknown.get(change.key)
        if why is None or change.action is not Action.SKIP or change.skip is SkipReason.HELM_HOOK:
            return change
        return replace(change, reason=f"live state unknown: {why}", skip=SkipReason.LIVE_UNKNOWN)


def read_live(
    client: KubeClient,
    keys: Iterable[ObjectKey],
    crd_kinds: Mapping[GroupKind, bool],
    *,
    concurrency: int,
    inspect: Inspect | None = None,
    keep: Callable[[ObjectKey], bool] | None = None,
    namespaced: set[GroupKind] | None = None,
) -> LiveState:
    """One LIST per kind (per namespace where RBAC is namespaced); completeness recorded.

    ``namespaced``: kinds this identity may list only per namespace, kept across passes: listed
    per namespace at once (no refused cluster-wide LIST first); a kind refused now is added.

    Every wanted object is kept whole unless ``keep`` says otherwise. A reconcile pass plans
    with ``inspect`` on the listing threads as items are decoded and keeps only prune
    candidates, so a listing thread holds one page's text and one chunk of objects, never a
    whole kind (most of a steady pass's memory, with several clusters listing at once).
    """
    state = LiveState()
    wanted: dict[GroupKind, set[ObjectKey]] = {}
    for k in keys:
        wanted.setdefault((k.group, k.kind), set()).add(k)
    disc = client.discovery()
    served = {gk: info for gk in wanted if (info := disc.find_group_kind(*gk)) is not None}

    def listing(gk: GroupKind) -> _Listed | ApiError:
        try:
            return _list(client, gk, served[gk], wanted[gk], inspect, keep, namespaced)
        except ApiError as e:
            return e

    # Kinds are listed side by side on the cluster's own bounded pool: the server encodes
    # one list while we decode another. Results are then taken in a fixed order.
    workers = max(1, min(concurrency, LIST_WORKERS, len(served)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"list-{client.name}") as pool:
        listed = dict(zip(sorted(served), pool.map(listing, sorted(served)), strict=True))
    for gk, members in sorted(wanted.items()):
        _record(state, gk, members, served.get(gk), listed.get(gk), gk in crd_kinds, inspect is not None)
    return state


def _record(
    state: LiveState,
    gk: GroupKind,
    members: set[ObjectKey],
    info: ResourceInfo | None,
    got: _Listed | ApiError | None,
    crd_defined: bool,
    inspected: bool,
) -> None:
    """One kind's listing into ``state``: complete or not, and why each object is unknown."""
    if info is None or got is None:
        # Served nowhere: a kind a CRD in this commit adds has no objects yet.
        state.complete[gk] = crd_defined
        if not crd_defined:
            why = f"kind {gk[1]}.{gk[0]} is not served by the cluster"
            state.errors.append(why)
            state.unknown.update(dict.fromkeys(members, why))
        return
    if isinstance(got, ApiError):
        if got.is_cluster_level:
            raise got
        why = f"listing {info.kind}: {got}"
        state.complete[gk] = False
        state.errors.append(why)
        state.unknown.update(dict.fromkeys(members, why))
        return
    state.complete[gk] = not got.failed
    for namespace, why in got.failed.items():
        state.errors.append(why)
        state.unknown.update({k: why for k in members if k.namespace == namespace})
    state.objects.update(got.objects)
    state.uids.update(got.uids)
    if inspected:
        state.inspected[gk] = got.inspected


def _list(
    client: KubeClient,
    gk: GroupKind,
    info: ResourceInfo,
    members: set[ObjectKey],
    inspect: Inspect | None,
    keep: Callable[[ObjectKey], bool] | None,
    namespaced: set[GroupKind] | None = None,
) -> _Listed:
    """List one kind: the whole of it, or each wanted namespace when RBAC refuses the whole."""
    out = _Listed({}, {}, [], {})
    if namespaced is None or gk not in namespaced or not info.namespaced:
        try:
            _scan(client, gk, info, None, members, inspect, keep, out)
            return out
        except ApiError as e:
            if e.status != 403 or not info.namespaced:
                raise
        if namespaced is not None:
            namespaced.add(gk)
    # Namespaced RBAC: one LIST per namespace we care about; a refused namespace leaves only
    # its own objects unknown.
    for ns in sorted({k.namespace for k in members}):
        scope = {k for k in members if k.namespace == ns}
        try:
            _scan(client, gk, info, ns, scope, inspect, keep, out)
        except ApiError as e:
            if e.is_cluster_level:
                raise
            out.failed[ns] = f"listing {info.kind} in namespace {ns}: {e}"
    return out


def _scan(
    client: KubeClient,
    gk: GroupKind,
    info: ResourceInfo,
    namespace: str | None,
    members: set[ObjectKey],
    inspect: Inspect | None,
    keep: Callable[[ObjectKey], bool] | None,
    out: _Listed,
) -> None:
    """One listing into ``out``; nothing of it lands there unless it completed."""
    objects: dict[ObjectKey, Manifest] = {}
    uids: dict[ObjectKey, str] = {}
    verdicts: list[Any] = []
    chunk: dict[ObjectKey, Manifest | None] = {}

    def take(item: Manifest) -> None:
        key = ObjectKey.of(item)
        if key not in members:
            return  # the rest of the kind goes with the page's text
        uids[key] = str((item.get("metadata") or {}).get("uid") or "")
        if keep is None or keep(key):
            objects[key] = item
        if inspect is not None:
            chunk[key] = item
            if len(chunk) >= CHUNK:
                verdicts.extend(inspect(gk, dict(chunk)))
                chunk.clear()

    complete, _ = client.scan(info, take, namespace=namespace)
    if not complete:
        raise ApiError(client.name, 410, f"listing {info.kind} expired before it completed")
    if inspect is not None:
        chunk.update({k: None for k in members if k not in uids})
        verdicts.extend(inspect(gk, chunk))
    out.objects.update(objects)
    out.uids.update(uids)
    out.inspected.extend(verdicts)


@dataclass(frozen=True)
class _Listed:
    """One kind's listings as ``read_live`` keeps them (from those that completed)."""

    objects: dict[ObjectKey, Manifest]
    uids: dict[ObjectKey, str]
    inspected: list[Any]
    #: namespace → why its listing failed (namespaced RBAC only; others fail the whole kind).
    failed: dict[str, str]


def crd_scopes(objs: Iterable[DesiredObject]) -> dict[tuple[str, str], bool]:
    """(group, kind) → namespaced, for kinds defined by CRDs in the desired set."""
    scopes: dict[tuple[str, str], bool] = {}
    for o in objs:
        if (o.key.group, o.key.kind) == CRD_KEY:
            spec = o.manifest.get("spec") or {}
            kind = (spec.get("names") or {}).get("kind")
            if kind:
                scopes[(str(spec.get("group", "")), str(kind))] = spec.get("scope") == "Namespaced"
    return scopes
