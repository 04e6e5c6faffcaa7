"""Reading an app's objects and their owners' children for ``gitops-agent tree``: the I/O
beside ``report.tree``.

The app's objects are its inventory's members, read as a wait reads them (one LIST per kind by
the app's membership label, per namespace where RBAC is namespaced: ``health_read.list_members``).
Their children are found by ``ownerReferences``: per namespace holding a workload, one LIST of
each child kind (a Deployment's ReplicaSets, their Pods; a CronJob's Jobs, their Pods). A kind
that cannot be read leaves its objects unread with the server's words, never absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from agent.apply.inventory import Inventory
from agent.errors import ApiError
from agent.kube.client import KubeClient
from agent.model import PART_OF, Manifest, ObjectKey
from agent.reconcile.health_read import Reading, list_members

#: For each owner kind: the kinds of the objects it creates (their own children are read too).
CHILDREN: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "Deployment": ("ReplicaSet", "Pod"),
        "ReplicaSet": ("Pod",),
        "StatefulSet": ("Pod",),
        "DaemonSet": ("Pod",),
        "Job": ("Pod",),
        "CronJob": ("Job", "Pod"),
    }
)
_CHILD_API = {"ReplicaSet": "apps/v1", "Pod": "v1", "Job": "batch/v1"}


@dataclass
class TreeReading:
    """The app's members as read (None: not in the cluster), what could not be read, and every
    object of a child kind in the namespaces of its workloads."""

    members: dict[ObjectKey, Manifest | None] = field(default_factory=dict)
    #: Member → why it was not read (its kind not served, its LIST refused or failed).
    unread: dict[ObjectKey, str] = field(default_factory=dict)
    children: list[Manifest] = field(default_factory=list)
    #: ``namespace/Kind`` → why its children were not read (their owners' health still stands).
    children_unread: dict[str, str] = field(default_factory=dict)


def read(client: KubeClient, inventory: Inventory) -> TreeReading:
    """The members of ``inventory`` and their owners' children, from ``client``'s cluster."""
    out = TreeReading()
    by_kind: dict[tuple[str, str], set[ObjectKey]] = {}
    for k in inventory.members:
        by_kind.setdefault((k.group, k.kind), set()).add(k)
    for (group, kind), wanted in sorted(by_kind.items()):
        info = client.discovery().find_group_kind(group, kind)
        if info is None:
            out.unread.update({k: f"the cluster does not serve {k.group_kind}" for k in wanted})
            continue
        items, failed = list_members(client, info, f"{PART_OF}={inventory.id}", wanted, Reading(), None)
        if isinstance(failed, ApiError):
            out.unread.update({k: f"not read: {failed}" for k in wanted})
            continue
        found = {key: item for item in items if (key := ObjectKey.of(item)) in wanted}
        for k in wanted:
            if isinstance(failed, dict) and k.namespace in failed:
                out.unread[k] = f"not read: {failed[k.namespace]}"
            else:
                out.members[k] = found.get(k)
    _read_children(client, out)
    return out


def _read_children(client: KubeClient, out: TreeReading) -> None:
    wanted: set[tuple[str, str]] = set()
    for k, obj in out.members.items():
        if obj is not None and k.group in ("apps", "batch"):
            wanted.update((k.namespace, kind) for kind in CHILDREN.get(k.kind, ()))
    for namespace, kind in sorted(wanted):
        info = client.discovery().find(_CHILD_API[kind], kind)
        if info is None:
            continue
        try:
            out.children.extend(client.list(info, namespace=namespace).items)
        except ApiError as e:
            out.children_unread[f"{namespace}/{kind}"] = str(e)
