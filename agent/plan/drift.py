"""Drift, decided from the plan: which planned writes would overwrite what someone changed by hand.

Two pure steps, both fed by the plan and never by a client:

- ``observe`` (on the listing threads, where the live object is at hand, for apps with
  ``drift = "report"``): for an ``UPDATE``, one ``Drift`` per differing Git-declared field that is
  not yielded to its owner, with Git's value, live's (masked where the object holds secrets) and
  who wrote it and when, from the live ``managedFields``: the entry that owns the field, else
  (a field removed by hand is owned by no one) the latest entry written by another manager.
- ``hold`` (in the pass's write step): while the app's revision is the one it last applied
  successfully, those updates and the re-creation of objects deleted by hand are drift: reported
  and left out of what is sent. At a new revision everything is sent (the app is applied whole),
  and the drift it overwrites is said as corrected (``corrected``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.model import (
    Action,
    Change,
    DesiredObject,
    Drift,
    DriftFate,
    DriftKind,
    Evidence,
    FieldPath,
    Manifest,
    ObjectKey,
    split_api_version,
)
from agent.plan import masking
from agent.plan.fields import decode_fields_v1, is_under, name_list, prefixes, render_path, value_at
from agent.plan.schema import SchemaIndex, root_node


@dataclass(frozen=True)
class Writer:
    """One ``managedFields`` entry, with its time (``fields.ManagedEntry`` has no use for it)."""

    manager: str
    operation: str
    subresource: str
    time: str
    paths: frozenset[FieldPath]

    def owns(self, path: FieldPath) -> bool:
        """It owns ``path``, something inside it, or an atomic ancestor of it."""
        if path in self.paths or path in prefixes(self.paths):
            return True
        return any(path[:i] in self.paths for i in range(len(path) - 1, 0, -1))


def writers(live: Manifest, field_manager: str) -> list[Writer]:
    """The entries of ``live``'s ``managedFields`` written by others than ``field_manager``."""
    out = []
    for raw in (live.get("metadata") or {}).get("managedFields") or ():
        if not isinstance(raw, dict) or raw.get("fieldsType", "FieldsV1") != "FieldsV1":
            continue
        manager = str(raw.get("manager", ""))
        if manager == field_manager:
            continue
        try:
            paths = decode_fields_v1(raw.get("fieldsV1") or {})
        except ValueError:
            continue
        out.append(
            Writer(
                manager,
                str(raw.get("operation", "")),
                str(raw.get("subresource", "")),
                str(raw.get("time", "")),
                paths,
            )
        )
    return out


def who(path: FieldPath, entries: Iterable[Writer]) -> tuple[Writer | None, Evidence]:
    """The writer of ``path``'s live value: its owner (the latest, if several), else the latest writer."""
    entries = list(entries)
    owners = [e for e in entries if e.owns(path)]
    if owners:
        return max(owners, key=lambda e: e.time), Evidence.OWNER
    if entries:
        return max(entries, key=lambda e: e.time), Evidence.LATEST
    return None, Evidence.NONE


def observe(
    obj: DesiredObject, live: Manifest, change: Change, *, field_manager: str, schema: SchemaIndex | None
) -> tuple[Drift, ...]:
    """The drift an ``UPDATE`` of ``obj`` would overwrite (see the module docstring); () for others.

    ``change`` must still carry its path sets (before ``verdicts.slim``).
    """
    if change.action is not Action.UPDATE or not change.changed:
        return ()
    yielded = [c.path for c in change.yielded]
    paths = sorted(p for p in change.changed if not any(is_under(p, y) or is_under(y, p) for y in yielded))
    if not paths:
        return ()
    group, version = split_api_version(obj.api_version)
    node = root_node(schema, group, version, str(obj.manifest.get("kind", "")))
    masks = masking.masks_of(obj.manifest, live)
    entries = writers(live, field_manager)
    out = []
    for path in paths:
        writer, evidence = who(path, entries)
        git, now = _plain(value_at(obj.manifest, path, node)[1]), _plain(value_at(live, path, node)[1])
        if masks.covers(path):  # Git may say it in stringData: declared, so masked whatever it reads
            git, now = masking.MASK, masking.mask_value(path, now, secret=masks)
        out.append(
            Drift(
                obj.key,
                DriftKind.CHANGED,
                render_path(path),
                git=git,
                live=now,
                manager=writer.manager if writer else "",
                operation=writer.operation if writer else "",
                subresource=writer.subresource if writer else "",
                time=writer.time if writer else "",
                evidence=evidence,
            )
        )
    return tuple(out)


def _plain(value: Any) -> Any:
    """A copy of a JSON value small enough to keep in a result (deep values cut at 2 KiB of text)."""
    if isinstance(value, dict | list):
        text = json.dumps(value, sort_keys=True, default=str)
        return value if len(text) <= 2048 else text[:2047] + "…"
    return value


def deleted(key: ObjectKey) -> Drift:
    """An object Git declares, deleted in the cluster (no ``managedFields`` are left to read)."""
    return Drift(key, DriftKind.DELETED)


@dataclass(frozen=True)
class Held:
    """What the write step sends, and the drift it leaves (``hold``)."""

    changes: tuple[Change, ...]
    #: Object → its drift, for the objects nothing is sent for.
    held: dict[ObjectKey, tuple[Drift, ...]]

    @property
    def drift(self) -> list[Drift]:
        return [d for ds in self.held.values() for d in ds]


def hold(
    changes: Iterable[Change], evidence: Mapping[ObjectKey, tuple[Drift, ...]], members: Collection[ObjectKey]
) -> Held:
    """The changes of a pass at an unchanged revision, less its drift: an update with drift
    (``evidence``) and the create of a member (deleted by hand) are held; the rest is sent
    (ownership repairs, objects that never made it)."""
    send: list[Change] = []
    held: dict[ObjectKey, tuple[Drift, ...]] = {}
    for c in changes:
        if c.action is Action.UPDATE and evidence.get(c.key):
            held[c.key] = evidence[c.key]
        elif c.action is Action.CREATE and c.key in members:
            held[c.key] = (deleted(c.key),)
        else:
            send.append(c)
    return Held(tuple(send), held)


def held_message(drift: Iterable[Drift]) -> str:
    """The held object's result message: what drifted (values stay in ``ClusterResult.drift``)."""
    drift = list(drift)
    if any(d.kind is DriftKind.DELETED for d in drift):
        return 'deleted in the cluster; not re-created (drift = "report")'
    fields = name_list(sorted({d.path for d in drift}))
    return f'drift reported, not corrected (drift = "report"): {fields}'


def corrected(
    changes: Iterable[Change],
    evidence: Mapping[ObjectKey, tuple[Drift, ...]],
    members: Collection[ObjectKey],
    applied: Collection[ObjectKey],
) -> list[Drift]:
    """The drift a new revision's apply overwrote: of the objects it applied (``applied``), the
    fields another manager owned (a field only Git changed is no drift) and the members it
    re-created."""
    out: list[Drift] = []
    for c in changes:
        if c.key not in applied:
            continue
        if c.action is Action.UPDATE:
            out.extend(
                replace(d, fate=DriftFate.CORRECTED)
                for d in evidence.get(c.key, ())
                if d.evidence is Evidence.OWNER
            )
        elif c.action is Action.CREATE and c.key in members:
            out.append(replace(deleted(c.key), fate=DriftFate.CORRECTED))
    return out


__all__ = ["Held", "Writer", "corrected", "deleted", "held_message", "hold", "observe", "who", "writers"]
