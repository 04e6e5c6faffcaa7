"""What deleting an object would take with it, and whether that is this app's to take.

``prune.execute`` asks before it deletes anything (docs/safety.md, "Each app alone"). The API
server deletes a Namespace's content with it, a CRD's custom resources with it, and, unless
``propagation_policy = "orphan"``, every object whose ownerReferences point at it (transitively).
Such a delete is held, naming whose objects it would take and how many, while any of them is not
this app's: a member of another ApplySet (another app of the agent, another agent, kubectl), or
an object in none that is not a ``controller: true`` dependent (direct or transitive) of this
app's own members (users' objects, other tools'). Controller-created dependents (ReplicaSets,
Pods, EndpointSlices) go with their owner, as they always did.

``read`` is the I/O: one paginated LIST per listable kind, per namespace a pruned Namespace or
namespaced object is in (cluster-wide when a CRD or another cluster-scoped object is pruned),
only in a pass that deletes something, so steady passes cost nothing more. A listing that failed
or did not complete holds every delete (unknown is not absent). ``holds`` is pure over it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.errors import ApiError
from agent.kube.client import KubeClient, ResourceInfo
from agent.model import CRD_KEY, PART_OF, Manifest, Note, ObjectKey

#: What the control plane creates in every namespace by itself: never a reason to keep one.
_NAMESPACE_DEFAULTS = {("ServiceAccount", "default"), ("ConfigMap", "kube-root-ca.crt")}
#: Kinds that are records of what happened, not state anyone owns (both Event APIs).
_NOT_STATE = {"Event"}
#: Above this many namespaces to read, each kind is listed once across all namespaces instead.
_MAX_NAMESPACED_READS = 3


@dataclass(frozen=True, slots=True)
class Listed:
    """One object of a cascade listing: only what the check reads."""

    key: ObjectKey
    uid: str
    part_of: str
    #: (owner UID, controller) of each ownerReference.
    owners: tuple[tuple[str, bool], ...] = ()


@dataclass(frozen=True)
class Ownership:
    """What is this app's: its ApplySet id and members; the names of the sets the agent knows."""

    set_id: str
    members: frozenset[ObjectKey]
    #: The members' UIDs as the inventory recorded them.
    member_uids: frozenset[str] = frozenset()
    #: ApplySet id → the app it belongs to (this agent's apps of the cluster).
    set_names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Hold:
    """A delete held for what it would take with it: ``note`` for machines, ``message`` for people."""

    key: ObjectKey
    note: Note
    message: str
    #: How many objects that are not this app's it would delete.
    count: int = 0
    #: Whose they are, with how many each: an app's name, another ApplySet's id, or "" (in none).
    holders: tuple[tuple[str, int], ...] = ()


@dataclass
class Listing:
    """The objects a cascade read found, and what it could not read completely (in words)."""

    objects: list[Listed] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    #: A pruned CRD (its key) → the (group, kind) of its custom resources; None when not served.
    crd_kinds: dict[ObjectKey, tuple[str, str] | None] = field(default_factory=dict)


def _is_namespace(key: ObjectKey) -> bool:
    return key.group == "" and key.kind == "Namespace"


def _is_crd(key: ObjectKey) -> bool:
    return (key.group, key.kind) == CRD_KEY


def needs_read(candidates: Iterable[ObjectKey], *, owners_cascade: bool) -> bool:
    """Whether deleting ``candidates`` can take anything with it (else no request is made)."""
    return any(owners_cascade or _is_namespace(k) or _is_crd(k) for k in candidates)


def _listed(item: Manifest) -> Listed:
    meta = item.get("metadata") or {}
    key = ObjectKey.of(item)
    owners = tuple(
        (str(o.get("uid", "")), bool(o.get("controller"))) for o in meta.get("ownerReferences") or []
    )
    return Listed(key, str(meta.get("uid", "")), (meta.get("labels") or {}).get(PART_OF, ""), owners)


def read(reader: KubeClient, candidates: Sequence[ObjectKey], *, owners_cascade: bool) -> Listing:
    """Everything deleting ``candidates`` could take with it, from complete paginated LISTs."""
    out = Listing()
    discovery = reader.discovery(refresh=True)  # a kind created since the cache would be missed
    crds = [k for k in candidates if _is_crd(k)]
    for k in crds:
        plural, _, group = k.name.partition(".")
        served = next((r for r in discovery.all() if r.group == group and r.plural == plural), None)
        out.crd_kinds[k] = (group, served.kind) if served else None
    everywhere = bool(crds) or (
        owners_cascade and any(not k.namespace and not _is_namespace(k) for k in candidates)
    )
    namespaces = sorted(
        {k.name for k in candidates if _is_namespace(k)}
        | ({k.namespace for k in candidates if k.namespace} if owners_cascade else set())
    )
    wide = everywhere or len(namespaces) > _MAX_NAMESPACED_READS
    seen: set[tuple[str, str]] = set()
    for info in discovery.all():
        if (
            not info.kind
            or info.kind in _NOT_STATE
            or "list" not in info.verbs
            or (info.group, info.kind) in seen
        ):
            continue
        seen.add((info.group, info.kind))
        if not info.namespaced and not everywhere:
            continue
        for ns in [None] if wide or not info.namespaced else namespaces:
            _read_kind(reader, info, ns, out, keep=None if everywhere else set(namespaces))
    return out


def _read_kind(
    reader: KubeClient, info: ResourceInfo, namespace: str | None, out: Listing, *, keep: set[str] | None
) -> None:
    where = f"{info.kind}.{info.group}" if info.group else info.kind
    where += f" in namespace {namespace}" if namespace else ""

    def take(item: Manifest) -> None:
        listed = _listed(item)
        if keep is None or listed.key.namespace in keep:
            out.objects.append(listed)

    try:
        complete, _ = reader.scan(info, take, namespace=namespace)
    except ApiError as e:
        if e.status == 404:  # the kind went away since discovery: nothing of it to take
            return
        out.incomplete.append(f"{where} (HTTP {e.status or e.transport})")
        return
    if not complete:
        out.incomplete.append(f"{where} (the listing expired part-way)")


def holds(
    candidates: Sequence[tuple[ObjectKey, str]], listing: Listing, own: Ownership, *, owners_cascade: bool
) -> dict[ObjectKey, Hold]:
    """Pure: which of ``candidates`` (key, UID) may not be deleted, and why, from ``listing``.

    ``owners_cascade``: the delete's propagation policy deletes dependents (not ``orphan``); a
    Namespace's and a CRD's content goes whatever the policy.
    """
    candidates = [(k, uid) for k, uid in candidates if needs_read([k], owners_cascade=owners_cascade)]
    if listing.incomplete:
        what = "; ".join(listing.incomplete)
        return {
            k: Hold(
                k,
                Note.CASCADE_UNKNOWN,
                f"not deleting: what it would delete with it could not be listed completely ({what});"
                " unknown is not absent",
            )
            for k, _ in candidates
        }
    children: dict[str, list[Listed]] = {}
    for o in listing.objects:
        for uid, _ in o.owners:
            children.setdefault(uid, []).append(o)
    mine = _own_or_dependent(listing.objects, own, children)
    pruned = {k for k, _ in candidates}
    out: dict[ObjectKey, Hold] = {}
    for key, uid in candidates:
        taken = _taken_with(key, uid, listing, children)
        foreign = sorted(
            (o for o in taken if o.key not in pruned and o.uid not in mine and not _default(o, taken, mine)),
            key=lambda o: o.key,
        )
        if foreign:
            out[key] = _hold(key, foreign, own)
    for key, _ in candidates:
        if _is_crd(key) and listing.crd_kinds.get(key, ()) is None:
            out[key] = Hold(
                key,
                Note.CASCADE_UNKNOWN,
                "not deleting: the cluster does not serve this CRD's resources, so what deleting it"
                " would take with it cannot be listed (unknown is not absent)",
            )
    return out


def _own_or_dependent(
    objects: Sequence[Listed], own: Ownership, children: Mapping[str, list[Listed]]
) -> set[str]:
    """UIDs of this app's members and of their ``controller: true`` dependents, transitively.

    A dependent that is a member of another ApplySet is never this app's, whoever controls it.
    """
    roots = {o.uid for o in objects if o.part_of == own.set_id and o.key in own.members}
    mine = set(roots | own.member_uids)
    todo = list(mine)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child.uid in mine or (child.part_of and child.part_of != own.set_id):
                continue
            if any(c and uid in mine for uid, c in child.owners):
                mine.add(child.uid)
                todo.append(child.uid)
    return mine - {""}


def _taken_with(
    key: ObjectKey, uid: str, listing: Listing, children: Mapping[str, list[Listed]]
) -> list[Listed]:
    """Everything the server deletes with ``key``: its content (Namespace, CRD), then, transitively,
    whatever names one of those in its ownerReferences."""
    if _is_namespace(key):
        direct = [o for o in listing.objects if o.key.namespace == key.name]
    elif _is_crd(key) and (gk := listing.crd_kinds.get(key)):
        direct = [o for o in listing.objects if (o.key.group, o.key.kind) == gk]
    else:
        direct = []
    taken = {o.uid: o for o in direct}
    todo = [uid, *taken]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child.uid not in taken:
                taken[child.uid] = child
                todo.append(child.uid)
    return list(taken.values())


def _default(o: Listed, taken: Sequence[Listed], mine: set[str]) -> bool:
    """Made by the control plane for the namespace or for one of this app's Services."""
    if (o.key.kind, o.key.name) in _NAMESPACE_DEFAULTS and o.key.group == "":
        return True
    # The endpoints controller names a Service's Endpoints after it, without an ownerReference.
    return (o.key.group, o.key.kind) == ("", "Endpoints") and any(
        t.key == o.key._replace(kind="Service") and t.uid in mine for t in taken
    )


def _hold(key: ObjectKey, foreign: Sequence[Listed], own: Ownership) -> Hold:
    counts: dict[str, int] = {}
    first: dict[str, ObjectKey] = {}
    for o in foreign:
        counts[o.part_of] = counts.get(o.part_of, 0) + 1
        first.setdefault(o.part_of, o.key)
    holders = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    parts = []
    for set_id, n in holders:
        if not set_id:
            whose = "in no ApplySet (users' or other tools', "
        elif set_id in own.set_names:
            whose = f"of app {own.set_names[set_id]!r} ("
        else:
            whose = f"of another ApplySet ({set_id}, "
        parts.append(f"{n} {whose}e.g. {first[set_id]})")
    what = (
        "its content"
        if _is_namespace(key)
        else "its custom resources"
        if _is_crd(key)
        else "its dependents (ownerReferences)"
    )
    message = (
        f"kept: deleting it would delete with {what} {len(foreign)} object(s) that are not this app's:"
        f" {'; '.join(parts)}; it stays in the inventory and is deleted once none is left"
    )
    return Hold(key, Note.HOLDS_FOREIGN, message, len(foreign), holders)
