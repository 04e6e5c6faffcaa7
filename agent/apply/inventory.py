"""The per-app inventory: a KEP-3659 ApplySet parent plus the member list it lacks.

One parent per (agent name, cluster, app), a ConfigMap in the agent's namespace
*in that cluster*, keyed by the configured agent name (not the replica), so a
replica that takes over finds the same set: a `[[clusters]]` entry's own app
keeps the parent named after the agent that every release before apps wrote
(upgrading changes nothing on the cluster), an `[[apps]]` app's is named
``<agent>.<app>`` (``parent_name``). Parents are labelled ``gitops-agent.io/agent``
(a parent written before apps gets the label with its next write), so one
labelled LIST reads every app's parent of a cluster (``load_parents``). It carries the
standard ``applyset.kubernetes.io/id`` label and the tooling /
contains-group-kinds / additional-namespaces annotations, so ``kubectl`` sees
what the agent owns; members carry ``applyset.kubernetes.io/part-of=<id>``.

ApplySets have no member list, so the parent also stores the identities and
UIDs of the members we applied (gzip'd JSON in ``binaryData``; 10k members fit
well under the 1 MiB object limit). Widened before applying, narrowed only
after pruning (docs/safety.md rule 10). Operator state that must survive restarts
(suspension, prune approvals) lives in the parent's annotations.

The parent is keyed by agent name only, so two config entries (or two installs
of one name) serving one cluster would share it and prune each other's objects.
The parent therefore records which entry it belongs to (``CLAIMED_BY``), set
atomically by the first entry that creates it (or, for a parent written before
claims existed, by the first entry that passes after the upgrade); any other
entry is refused before it writes anything.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent import __version__
from agent.errors import ApiError, ClusterRefused
from agent.kube.client import KubeClient, ResourceInfo
from agent.model import (
    ADDITIONAL_NAMESPACES,
    AGENT_LABEL,
    APPLIED_REVISION,
    CLAIMED_BY,
    GROUP_KINDS,
    ID_LABEL,
    PRUNE_APPROVAL,
    PRUNE_HELD,
    ROLLBACK_AT,
    ROLLBACK_FROM,
    ROLLBACK_TO,
    SUSPENDED,
    TOOLING,
    ObjectKey,
    Pin,
    Refusal,
)

MEMBERS_KEY = "members.json.gz"
PARENT_KIND = "ConfigMap"


def applyset_id(name: str, namespace: str, kind: str = PARENT_KIND, group: str = "") -> str:
    """``applyset-<base64url(sha256(name.namespace.Kind.group))>-v1`` exactly as KEP-3659 and kubectl."""
    digest = hashlib.sha256(f"{name}.{namespace}.{kind}.{group}".encode()).digest()
    return "applyset-" + base64.urlsafe_b64encode(digest).decode().rstrip("=") + "-v1"


def parent_name(agent: str, app: str, *, implicit: bool) -> str:
    """The ApplySet parent of an app: the agent's own name for a `[[clusters]]` entry's app (as
    before apps), ``<agent>.<app>`` for an `[[apps]]` entry (a DNS subdomain: both are labels)."""
    return agent if implicit else f"{agent}.{app}"


@dataclass(frozen=True, slots=True)
class Member:
    key: ObjectKey
    uid: str = ""

    def to_json(self) -> dict[str, str]:
        k = self.key
        return {"group": k.group, "kind": k.kind, "namespace": k.namespace, "name": k.name, "uid": self.uid}

    @classmethod
    def from_json(cls, d: dict[str, str]) -> Member:
        return cls(
            ObjectKey.interned(d.get("group", ""), d["kind"], d.get("namespace", ""), d["name"]),
            d.get("uid", ""),
        )


@dataclass
class Inventory:
    """The parent's content as read in this pass; ``exists`` is False before the first apply."""

    name: str
    namespace: str
    members: dict[ObjectKey, Member] = field(default_factory=dict)
    group_kinds: set[str] = field(default_factory=set)
    annotations: dict[str, str] = field(default_factory=dict)
    exists: bool = False
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, obj: dict[str, Any] | None, name: str, namespace: str) -> Inventory:
        """The parent ``obj`` as read (``None``: not there yet)."""
        inv = cls(name, namespace)
        if obj is None:
            return inv
        meta = obj.get("metadata") or {}
        inv.exists = True
        inv.uid = meta.get("uid", "")
        inv.resource_version = meta.get("resourceVersion", "")
        inv.annotations = dict(meta.get("annotations") or {})
        inv.labels = dict(meta.get("labels") or {})
        inv.group_kinds = {g for g in inv.annotations.get(GROUP_KINDS, "").split(",") if g}
        blob = (obj.get("binaryData") or {}).get(MEMBERS_KEY)
        if blob:
            for d in json.loads(gzip.decompress(base64.b64decode(blob))):
                m = Member.from_json(d)
                inv.members[m.key] = m
        return inv

    @property
    def id(self) -> str:
        return applyset_id(self.name, self.namespace)

    @property
    def suspended(self) -> bool:
        return self.annotations.get(SUSPENDED, "").lower() == "true"

    @property
    def pin(self) -> Pin | None:
        """The rollback pin ``gitops-agent rollback`` wrote (None: the app follows its source)."""
        to = self.annotations.get(ROLLBACK_TO, "")
        if not to:
            return None
        return Pin(to, self.annotations.get(ROLLBACK_FROM, ""), self.annotations.get(ROLLBACK_AT, ""))

    @property
    def approved_digest(self) -> str:
        return self.annotations.get(PRUNE_APPROVAL, "")

    @property
    def held_digest(self) -> str:
        """The prune set the brake held in the last pass (``""``: none)."""
        return self.annotations.get(PRUNE_HELD, "")

    @property
    def applied_revision(self) -> str:
        """The revision the app's last successful pass applied (``drift = "report"`` only; ``""``)."""
        return self.annotations.get(APPLIED_REVISION, "")

    @property
    def claimed_by(self) -> str:
        """The config entry this inventory belongs to; ``""`` before the first claim."""
        return self.annotations.get(CLAIMED_BY, "")

    def keys(self) -> set[ObjectKey]:
        return set(self.members)


class InventoryStore:
    """Reads and writes one cluster's ApplySet parent with server-side apply.

    ``claimant``: the config entry writing through this store; every write records it.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        name: str,
        namespace: str,
        field_manager: str,
        claimant: str = "",
        agent: str = "",
    ) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.field_manager = field_manager
        self.claimant = claimant
        #: The agent whose parent this is (``AGENT_LABEL``); a parent named after the agent by default.
        self.agent = agent or name

    @property
    def labels(self) -> dict[str, str]:
        return {ID_LABEL: self.id, AGENT_LABEL: self.agent}

    @property
    def id(self) -> str:
        return applyset_id(self.name, self.namespace)

    def _info(self) -> ResourceInfo:
        return self.client.resource("v1", PARENT_KIND)

    def load(self) -> Inventory:
        """Read the parent; any error propagates (an unreadable inventory prunes nothing)."""
        return Inventory.of(
            self.client.get(self._info(), self.namespace, self.name), self.name, self.namespace
        )

    def delete(self, inventory: Inventory) -> None:
        """Delete the parent as read (UID and resourceVersion preconditions): a renamed app's, once empty."""
        self.client.delete(
            self._info(),
            self.namespace,
            self.name,
            uid=inventory.uid or None,
            resource_version=inventory.resource_version or None,
        )

    def ensure_namespace(self, *, dry_run: bool = False) -> None:
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        self.client.apply(ns, field_manager=self.field_manager, dry_run=dry_run)

    def write(self, members: Iterable[Member], *, extra_annotations: dict[str, str] | None = None) -> None:
        """Replace the member list (and the group-kinds and namespaces derived from it)."""
        ordered = sorted(members, key=lambda m: m.key)
        group_kinds = sorted({m.key.group_kind for m in ordered})
        namespaces = sorted(
            {m.key.namespace for m in ordered if m.key.namespace and m.key.namespace != self.namespace}
        )
        blob = gzip.compress(
            json.dumps([m.to_json() for m in ordered], separators=(",", ":")).encode(), mtime=0
        )
        annotations = {
            TOOLING: f"gitops-agent/v{__version__}",
            GROUP_KINDS: ",".join(group_kinds),
            ADDITIONAL_NAMESPACES: ",".join(namespaces),
        }
        if self.claimant:
            annotations[CLAIMED_BY] = self.claimant
        annotations.update(extra_annotations or {})
        parent = {
            "apiVersion": "v1",
            "kind": PARENT_KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": self.labels,
                "annotations": annotations,
            },
            "binaryData": {MEMBERS_KEY: base64.b64encode(blob).decode()},
        }
        # Force: the parent is ours alone; a stray kubectl edit must not wedge the inventory.
        self.client.apply(parent, field_manager=self.field_manager, force=True)

    def check_claim(self, inventory: Inventory) -> None:
        """Raise ``ClusterRefused`` when the parent belongs to another entry than ``claimant``."""
        other = inventory.claimed_by
        if not other or other == self.claimant:
            return
        raise ClusterRefused(
            self.claimant,
            Refusal.CLAIMED,
            f"entry {self.claimant!r} refused: this cluster's inventory (ApplySet parent ConfigMap "
            f"{self.namespace}/{self.name}) belongs to entry {other!r} ({CLAIMED_BY}), so entries "
            f"{other!r} and {self.claimant!r} (of this config, or of another install named "
            f"{self.name!r}) serve one cluster and would prune each other's objects; nothing was "
            "applied, pruned or written there. Serve the cluster from one entry (list both teams' "
            "paths in it), or give the other install its own [agent] name. If the entry was only "
            f"renamed, move the claim: kubectl annotate configmap {self.name} -n {self.namespace} "
            f"{CLAIMED_BY}={self.claimant} --overwrite",
        )

    def claim(self, inventory: Inventory) -> Inventory:
        """The parent claimed by ``claimant`` before this pass's first write; the parent as it now is.

        Both ways of claiming are atomic, so of two entries racing only one wins and the other
        is refused (``check_claim`` on the parent read again): an absent parent is created
        (POST: 409 for the loser) with only its label and the claim; a parent written before
        claims existed gets the claim under a ``resourceVersion`` precondition (409 if it
        changed since it was read).
        """
        assert self.claimant, "claiming needs the claiming entry's name"
        self.check_claim(inventory)
        if inventory.claimed_by == self.claimant:
            return inventory
        info = self._info()
        try:
            if inventory.exists:
                patch = {
                    "metadata": {
                        "resourceVersion": inventory.resource_version,
                        "annotations": {CLAIMED_BY: self.claimant},
                    }
                }
                self.client.patch(info, self.namespace, self.name, patch, field_manager=self.field_manager)
            else:
                self.ensure_namespace()
                parent = {
                    "apiVersion": "v1",
                    "kind": PARENT_KIND,
                    "metadata": {
                        "name": self.name,
                        "namespace": self.namespace,
                        "labels": self.labels,
                        "annotations": {TOOLING: f"gitops-agent/v{__version__}", CLAIMED_BY: self.claimant},
                    },
                }
                self.client.create(info, parent, field_manager=self.field_manager)
        except ApiError as e:
            if e.status != 409:  # 409: another writer came first; what it wrote decides below
                raise
        fresh = self.load()
        self.check_claim(fresh)
        if fresh.claimed_by != self.claimant:  # changed again in between: not ours to write
            changed = "the ApplySet parent changed while it was being claimed"
            raise ApiError(self.claimant, 409, changed, reason="Conflict")
        return fresh

    def set_annotation(self, key: str, value: str | None) -> None:
        """Operator state (suspend, approvals) via a plain merge patch: it must not touch members."""
        self.set_annotations({key: value})

    def set_annotations(self, values: dict[str, str | None], *, resource_version: str = "") -> None:
        """Several annotations in one merge patch (None removes one); with ``resource_version``,
        only over the parent as read (409 when it changed since: a newer rollback stays)."""
        meta: dict[str, object] = {"annotations": values}
        if resource_version:
            meta["resourceVersion"] = resource_version
        self.client.patch(
            self._info(),
            self.namespace,
            self.name,
            {"metadata": meta},
            field_manager=f"{self.field_manager}-operator",
        )


def widen(inv: Inventory, keys: Iterable[ObjectKey]) -> list[Member]:
    """Members after adding ``keys`` (before applying: a crash then never loses track)."""
    merged = dict(inv.members)
    for k in keys:
        merged.setdefault(k, Member(k))
    return list(merged.values())


def record_uids(members: Iterable[Member], uids: dict[ObjectKey, str]) -> list[Member]:
    return [Member(m.key, uids.get(m.key) or m.uid) for m in members]


def load_parents(
    client: KubeClient, namespace: str, agent: str, names: Iterable[str], *, unlabelled: Iterable[str] = ()
) -> dict[str, Inventory]:
    """The parents ``names`` of ``agent``'s apps on one cluster, with one labelled LIST.

    ``unlabelled``: parents that may predate ``AGENT_LABEL`` (the implicit app's, written before
    apps): one GET each when the LIST did not return them, until their next write labels them.
    Where RBAC refuses the LIST, or it expired before it completed, every parent is read with a
    GET. Errors propagate: an unreadable inventory prunes nothing.
    """
    wanted = list(dict.fromkeys(names))
    info = client.resource("v1", PARENT_KIND)
    found: dict[str, dict[str, Any]] = {}
    try:
        listed = client.list(info, namespace=namespace, label_selector=f"{AGENT_LABEL}={agent}")
    except ApiError as e:
        if e.status != 403 or e.is_cluster_level:
            raise
        unlabelled = wanted  # no LIST allowed: read each parent on its own
    else:
        if listed.complete:
            found = {str((o.get("metadata") or {}).get("name", "")): o for o in listed.items}
        else:  # expired part-way: what it missed is unknown, so read each parent on its own
            unlabelled = wanted
    legacy = set(unlabelled)
    out: dict[str, Inventory] = {}
    for name in wanted:
        obj = found.get(name)
        if obj is None and name in legacy:
            obj = client.get(info, namespace, name)
        out[name] = Inventory.of(obj, name, namespace)
    return out
