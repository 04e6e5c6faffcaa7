"""Argo CD hooks in the pass: created once per sync, deleted by their policies (docs/ordering.md).

A sync's hooks run when the app's revision or its rendered hooks changed since the last sync
whose hooks all ran (``mark``: ``<revision>:<digest>``, recorded on the app's ApplySet parent as
``gitops-agent.io/hooks-ran``), never every pass. ``HookRuns`` keeps, per app, which hook steps
of the sync under way were started and what each hook object is called in the cluster (a
``generateName`` hook is named by the server), so a pass that goes on with a sync never creates
a hook twice.

A hook object is labelled ``gitops-agent.io/hook-of=<app's ApplySet id>`` and never
``applyset.kubernetes.io/part-of``: it is no member of the app's inventory, so no prune (the
agent's or ``kubectl``'s) ever deletes it as one; only its delete policy does.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.errors import AgentError, ApiError
from agent.kube.client import KubeClient
from agent.model import (
    HOOK_OF,
    PART_OF,
    ApplyResult,
    DeletePolicy,
    DesiredObject,
    Manifest,
    Note,
    ObjectKey,
    Ordered,
    Outcome,
)

#: Bound on waiting for a hook's previous object to be gone (``BeforeHookCreation``).
GONE_WITHIN = 10.0


def digest(hooks: Iterable[DesiredObject]) -> str:
    """What the app's hooks are, in 16 hex digits: a rendered hook that changes runs them again."""
    docs = sorted(json.dumps(o.manifest, sort_keys=True, separators=(",", ":")) for o in hooks)
    return hashlib.sha256("\n".join(docs).encode()).hexdigest()[:16]


def hook_manifest(obj: DesiredObject, app_id: str) -> Manifest:
    """The object a hook is created as: labelled as the app's hook, not as its member."""
    manifest = copy.deepcopy(obj.manifest)
    labels = manifest.setdefault("metadata", {}).setdefault("labels", {})
    labels.pop(PART_OF, None)
    labels[HOOK_OF] = app_id
    return manifest


@dataclass
class HookSync:
    """One app's sync with hooks: its mark and the hook objects each started step created."""

    mark: str
    #: Step index (from 1) → the hook's key in Git → its key in the cluster.
    created: dict[int, dict[ObjectKey, ObjectKey]] = field(default_factory=dict)
    #: The phases (``Stage`` values) whose succeeded Helm hooks were deleted: never twice, as a
    #: later phase may have created a hook of the same name again.
    through: set[str] = field(default_factory=set)


@dataclass
class HookRuns:
    """The syncs with hooks under way, per app of one cluster (kept by its reconciler)."""

    _syncs: dict[str, HookSync] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sync(self, app: str, mark: str) -> HookSync:
        """``app``'s sync at ``mark`` (a sync at another mark is forgotten)."""
        with self._lock:
            current = self._syncs.get(app)
            if current is None or current.mark != mark:
                current = self._syncs[app] = HookSync(mark)
            return current

    def forget(self, app: str) -> None:
        with self._lock:
            self._syncs.pop(app, None)


def create(
    client: KubeClient, hooks: Iterable[tuple[Ordered, DesiredObject]], app_id: str, field_manager: str
) -> tuple[dict[ObjectKey, ObjectKey], list[ApplyResult]]:
    """Create each hook of a step (its previous object deleted first where its policy says so);
    what each is called in the cluster, and a result per hook (a failure is the hook's alone)."""
    created: dict[ObjectKey, ObjectKey] = {}
    results: list[ApplyResult] = []
    for ordered, obj in hooks:
        try:
            made = _create_one(client, ordered, obj, app_id, field_manager)
        except AgentError as e:
            results.append(
                ApplyResult(obj.key, Outcome.FAILED, message=f"hook not created: {e}", note=Note.HOOK)
            )
            continue
        key = ObjectKey.of(made)
        created[obj.key] = key
        uid = (made.get("metadata") or {}).get("uid")
        results.append(ApplyResult(key, Outcome.CREATED, message="hook created", uid=uid, note=Note.HOOK))
    return created, results


def _create_one(
    client: KubeClient, ordered: Ordered, obj: DesiredObject, app_id: str, field_manager: str
) -> Manifest:
    info = client.resource(obj.api_version, obj.key.kind)
    manifest = hook_manifest(obj, app_id)
    named = bool((manifest.get("metadata") or {}).get("name"))
    assert ordered.hook is not None
    if named and ordered.hook.deletes_on(DeletePolicy.BEFORE_HOOK_CREATION):
        _delete_and_wait(client, obj.key, obj.api_version)
    if not named:  # generateName: the server names it, so only a POST can create it
        return client.create(info, manifest, field_manager=field_manager)
    return client.apply(manifest, field_manager=field_manager, force=True, info=info)


def _delete_and_wait(client: KubeClient, key: ObjectKey, api_version: str) -> None:
    """Delete ``key`` if it is there, and wait (bounded) until it is gone."""
    info = client.resource(api_version, key.kind)
    namespace = key.namespace or None
    try:
        client.delete(info, namespace, key.name)
    except ApiError as e:
        if e.status != 404:
            raise
        return
    deadline = time.monotonic() + GONE_WITHIN
    while client.get(info, namespace, key.name) is not None:
        if time.monotonic() > deadline:
            raise ApiError(client.name, 409, f"{key}: still there {GONE_WITHIN:g}s after its deletion")
        time.sleep(0.1)


def delete(client: KubeClient, keys: Iterable[tuple[ObjectKey, str]]) -> list[str]:
    """Delete hook objects (key in the cluster, apiVersion) by their policy; the errors, in words."""
    errors = []
    for key, api_version in keys:
        try:
            client.delete(client.resource(api_version, key.kind), key.namespace or None, key.name)
        except ApiError as e:
            if e.status != 404:
                errors.append(f"{key}: {e}")
    return errors


__all__ = ["HookRuns", "HookSync", "create", "delete", "digest", "hook_manifest"]
