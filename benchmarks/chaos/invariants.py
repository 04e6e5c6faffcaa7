"""The safety invariants the chaos runner checks after every step: pure functions over snapshots.

``snapshot`` (the one function here with I/O) reads a cluster as its admin, never through the
agent; every other function takes what was read and what the runner knows (Git's content, the
UIDs it saw, the foreign objects and fields it wrote) and returns what is wrong, in words that
name the object and the cluster. ``runner`` adds the step and the seed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.apply.inventory import Inventory
from agent.model import ID_LABEL, PART_OF
from benchmarks.chaos.content import NS, NS_K, Key
from benchmarks.chaos.world import Sample

AGENT_NAMESPACE = "gitops-agent"
#: Invariant 7: growth allowed between an agent process's first sample after warm-up and its last.
RSS_SLACK_MB = 40.0
FD_SLACK = 20
WARM_UP_SECONDS = 30.0


class Invariant(enum.StrEnum):
    NOT_DELETED = "1 nothing in Git deleted"
    FOREIGN_OBJECTS = "2 objects outside the inventory untouched"
    FOREIGN_FIELDS = "3 foreign fields kept"
    DRIFT = "4 drift corrected"
    INVENTORY = "5 inventory covers every labelled object"
    LIVENESS = "6 /healthz never failed"
    RESOURCES = "7 RSS and fds flat"


@dataclass(frozen=True)
class Violation:
    invariant: Invariant
    where: str
    what: str
    step: int = 0

    def describe(self, seed: int) -> str:
        where = f"{self.where} at step {self.step} (seed {seed})"
        return f"invariant {self.invariant} violated on {where}: {self.what}"


@dataclass(frozen=True)
class Live:
    """What the checks read of one live object."""

    uid: str
    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    managers: tuple[str, ...]
    fields: Mapping[str, Any]


@dataclass
class Snapshot:
    """One cluster as its admin read it: our namespaces' objects and the inventories' member lists."""

    cluster: str
    objects: dict[Key, Live] = field(default_factory=dict)
    #: Members of each ApplySet (by id), read before and after the objects (union of both reads).
    members: dict[str, set[Key]] = field(default_factory=dict)


# ---------------------------------------------------------------- reading


def _live(obj: dict[str, Any]) -> tuple[Key, Live]:
    meta = obj["metadata"]
    kind = obj["kind"]
    fields: dict[str, Any] = {}
    if kind == "ConfigMap":
        fields["data"] = obj.get("data") or {}
    elif kind == "Deployment":
        spec = obj.get("spec") or {}
        fields["replicas"] = spec.get("replicas")
        containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or [{}]
        fields["image"] = containers[0].get("image")
        fields["generation"] = (meta.get("annotations") or {}).get("chaos.example/generation")
    live = Live(
        uid=meta["uid"],
        resource_version=meta["resourceVersion"],
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        managers=tuple(e.get("manager", "") for e in meta.get("managedFields") or []),
        fields=fields,
    )
    return (kind, meta.get("namespace", ""), meta["name"]), live


Get = Callable[[str], tuple[int, Any]]


def snapshot(cluster: str, get: Get) -> Snapshot:
    """Read ``cluster`` with ``get`` (a GET as admin: path → (status, body)); raises ``OSError`` on failure.

    Parents are read before and after the objects: an object appears only after the parent
    was widened, and leaves before it is narrowed, so one of the two reads lists it.
    """
    snap = Snapshot(cluster)
    before = _parents(get)
    lists = [(f"/api/v1/namespaces/{ns}/configmaps", "ConfigMap") for ns in (NS, NS_K)]
    lists += [
        (f"/apis/apps/v1/namespaces/{NS}/deployments", "Deployment"),
        ("/api/v1/namespaces", "Namespace"),
    ]
    for path, kind in lists:
        code, body = get(path)
        if code != 200:
            raise OSError(f"{cluster}: GET {path} answered {code}")
        for item in body.get("items") or []:
            item["kind"] = kind
            key, live = _live(item)
            if kind != "Namespace" or key[2] in (NS, NS_K):
                snap.objects[key] = live
    after = _parents(get)
    for inv_id in before.keys() | after.keys():
        snap.members[inv_id] = before.get(inv_id, set()) | after.get(inv_id, set())
    return snap


def _parents(get: Get) -> dict[str, set[Key]]:
    code, body = get(f"/api/v1/namespaces/{AGENT_NAMESPACE}/configmaps?labelSelector={ID_LABEL}")
    if code == 404:
        return {}
    if code != 200:
        raise OSError(f"GET the ApplySet parents answered {code}")
    out: dict[str, set[Key]] = {}
    for item in body.get("items") or []:
        meta = item["metadata"]
        inv = Inventory.of(item, meta["name"], meta["namespace"])
        out[inv.id] = {(k.kind, k.namespace, k.name) for k in inv.members}
    return out


# ---------------------------------------------------------------- checks


def not_deleted(snap: Snapshot, protected: Iterable[Key], known: Mapping[Key, str]) -> list[str]:
    """Invariant 1: every protected object seen before is still there with the same UID."""
    out = []
    for key in sorted(protected):
        uid = known.get(key)
        if uid is None:
            continue
        live = snap.objects.get(key)
        if live is None:
            out.append(f"{_name(key)} was deleted (in Git at the last revision that rendered)")
        elif live.uid != uid:
            out.append(f"{_name(key)} was deleted and re-created (UID {uid} -> {live.uid})")
    return out


def foreign_objects(snap: Snapshot, foreign: Mapping[Key, tuple[str, str]], field_manager: str) -> list[str]:
    """Invariant 2: objects the runner created outside the inventory: same UID, same resourceVersion."""
    out = []
    for key, (uid, rv) in sorted(foreign.items()):
        live = snap.objects.get(key)
        if live is None or live.uid != uid:
            out.append(f"{_name(key)} (not in any inventory) was deleted")
        elif live.resource_version != rv:
            who = " by our field manager" if field_manager in live.managers else ""
            out.append(
                f"{_name(key)} (not in any inventory) was written{who}: "
                f"resourceVersion {rv} -> {live.resource_version}"
            )
    return out


def foreign_fields(snap: Snapshot, expected: Mapping[Key, Mapping[str, Any]]) -> list[str]:
    """Invariant 3: labels, annotations and replicas others set are still what they set.

    ``expected`` per object: ``label:NAME``, ``annotation:NAME`` or ``replicas`` → value.
    """
    out = []
    for key, wanted in sorted(expected.items()):
        live = snap.objects.get(key)
        if live is None:
            continue  # its deletion is invariant 1's business
        for what, value in sorted(wanted.items()):
            kind, _, name = what.partition(":")
            got = {"label": live.labels, "annotation": live.annotations}.get(kind, live.fields).get(
                name or kind
            )
            if got != value:
                out.append(f"{_name(key)}: {what} set by another manager is {got!r}, not {value!r}")
    return out


def drifted(snap: Snapshot, declared: Mapping[Key, Mapping[str, Any]]) -> list[str]:
    """Invariant 4 (at quiet points): every object Git declares exists with Git's values."""
    out = []
    for key, fields in sorted(declared.items()):
        live = snap.objects.get(key)
        if live is None:
            out.append(f"{_name(key)} is in Git but not in the cluster")
            continue
        for name, value in sorted(fields.items()):
            if live.fields.get(name) != value:
                out.append(f"{_name(key)}: {name} is {live.fields.get(name)!r}, Git says {value!r}")
    return out


def inventory_covers(snap: Snapshot) -> list[str]:
    """Invariant 5: every object carrying our part-of label is a member of that ApplySet's parent."""
    out = []
    for key, live in sorted(snap.objects.items()):
        inv_id = live.labels.get(PART_OF)
        if inv_id is None:
            continue
        if inv_id not in snap.members:
            out.append(f"{_name(key)} carries {PART_OF}={inv_id} but no parent has that id")
        elif key not in snap.members[inv_id]:
            out.append(f"{_name(key)} carries {PART_OF}={inv_id} but is not in that parent's member list")
    return out


def liveness(failures: Iterable[tuple[float, int, str]]) -> list[str]:
    """Invariant 6: /healthz answers seen while only clusters (not the agent) were faulty."""
    return [f"/healthz answered {code or 'nothing'}: {body}" for _, code, body in failures]


def resources(samples: Mapping[int, list[Sample]]) -> list[str]:
    """Invariant 7: per agent process, last sample ≤ first sample after warm-up + slack."""
    out = []
    for pid, rows in samples.items():
        warm = warm_sample(rows)
        if warm is None:
            continue
        last = rows[-1]
        if last.rss_mb > warm.rss_mb + RSS_SLACK_MB:
            out.append(
                f"agent pid {pid}: RSS {warm.rss_mb:.0f} MB -> {last.rss_mb:.0f} MB (> +{RSS_SLACK_MB:g} MB)"
            )
        if last.fds > warm.fds + FD_SLACK:
            out.append(f"agent pid {pid}: open fds {warm.fds} -> {last.fds} (> +{FD_SLACK})")
    return out


def warm_sample(rows: list[Sample]) -> Sample | None:
    """The first sample at least ``WARM_UP_SECONDS`` after the process's first one."""
    if not rows:
        return None
    return next((s for s in rows if s.at - rows[0].at >= WARM_UP_SECONDS), None)


def _name(key: Key) -> str:
    kind, ns, name = key
    return f"{kind} {ns}/{name}" if ns else f"{kind} {name}"
