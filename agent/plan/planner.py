"""The plan stage: a pure, three-way, field-manager-aware diff (docs/safety.md rules 4, 5, 8, 11).

For each desired object, ``plan_object`` weighs three things: Git's manifest,
what our field manager's Apply entry owns in live ``managedFields``, and live
values; it returns exactly one ``Change``:

- ``SKIP``: live (or Git) says ``gitops-agent.io/reconcile: disabled``, the
  object exists and ``adopt`` refuses it, its live state is unknown, or it is a
  Helm hook of delete/rollback phases only (``hooks``).
- ``CREATE``: absent in live.
- ``NOOP``: every declared path, normalised (``normalize``), equals live, and
  our Apply entry (operation Apply, no subresource, same apiVersion) owns
  exactly the paths the body declares. No request is needed.
- ``UPDATE``: something will be sent: a differing path we may write, or our
  ownership to fix (released paths, paths not yet ours, re-adoption).
- ``CONFLICT``: every differing path belongs to another manager and is
  yielded, and our ownership is already exact: nothing is sent (``body`` is
  ``None``); the conflicts say who holds what.

Conflicts: a declared path whose live value differs and that another entry
owns (Apply or Update, on the object or a subresource). The first
``ConflictRule`` matching (manager, operation, subresource) decides, default
yield; ``gitops-agent.io/force-fields`` forces listed paths; our own manager's
non-Apply entries are always forced. A path with any yielding owner is yielded
(``force`` covers the whole request) and left out of ``body``; ``force`` is
set when a forced conflict remains. A value equal to live only once normalised (the server
added a default inside it, or canonicalised a quantity) is not a change, but another owner's
copy of it would still conflict: where another entry holds it, it is sent as live spells it.

The config's ``[[ignore]]`` rules (``ignore_rules``) leave fields out the same way as the
``ignore-fields`` annotation below, except a field only we hold, which is sent as live holds it;
each change counts the fields per rule (``Change.ignored``).

Per-object annotations in Git (comma-separated JSON-pointer-like paths):
``gitops-agent.io/ignore-fields: /spec/replicas`` — never sent nor compared
(if our entry still owns such a path, it is released by the next write that
happens for another reason, and shown as released); ``gitops-agent.io/force-
fields: /spec/replicas`` — force that path whatever the rules say.

No client exists here: planning is pure by construction. Secret values are
masked in every ``Change`` (body, operations, conflicts); the apply stage gets
the real body back with ``request_body(change, desired)``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonpatch

from agent.config.ignore_rules import IgnoreRule
from agent.config.types import CLUSTER_DEFAULTS, Adopt, ConflictRule, choices
from agent.model import (
    FORCE_FIELDS,
    IGNORE_FIELDS,
    PART_OF,
    RECONCILE,
    Action,
    Change,
    DesiredObject,
    FieldConflict,
    FieldPath,
    Manifest,
    ObjectKey,
    Plan,
    Resolution,
    SkipReason,
    split_api_version,
)
from agent.plan import hooks, ignore_rules, masking
from agent.plan.compare import differences
from agent.plan.expected import expected_after, for_report, whole_item_if_key
from agent.plan.fields import (
    ManagedEntry,
    is_under,
    managed_entries,
    manifest_paths,
    name_list,
    pointer_to_path,
    remove_path,
    render_path,
    replace_path,
)
from agent.plan.normalize import secret_string_data_as_data
from agent.plan.schema import Node, SchemaIndex, root_node

#: Never part of an apply body: server-set identity and bookkeeping.
_SERVER_METADATA = ("managedFields", "resourceVersion", "uid", "creationTimestamp", "generation", "selfLink")


@dataclass(frozen=True)
class PlanOptions:
    """How to plan one cluster's objects."""

    #: Our field manager (the agent name unless configured otherwise).
    field_manager: str
    #: Ordered conflict rules; first match wins, no match yields.
    rules: Sequence[ConflictRule]
    #: The cluster's OpenAPI v3 index; ``None``: conservative fallbacks (``schema.FallbackNode``).
    schema: SchemaIndex | None = None
    #: Whether to take over existing objects that are not ours.
    adopt: Adopt = CLUSTER_DEFAULTS.adopt
    #: (label, value) marking our objects, e.g. ("applyset.kubernetes.io/part-of", id).
    membership_label: tuple[str, str] | None = None
    #: Membership values of sets this app takes objects over from (another app of the cluster
    #: that no longer declares them, or the app this one was renamed from): adopted as they are.
    handover_from: frozenset[str] | None = None
    #: Membership values of this agent's other apps on the cluster: their members are never
    #: adopted, whatever ``adopt`` says (only ``handover_from`` moves them).
    protected: frozenset[str] | None = None
    #: (membership value, app) of this agent's apps on the cluster: a refusal names the app.
    set_owners: frozenset[tuple[str, str]] | None = None
    #: The app's ignore rules (``[[apps.ignore]]``, else ``[[ignore]]``): fields left alone.
    ignore: Sequence[IgnoreRule] = ()
    #: False = the reconcile pass: no report operations and no path sets where the verdict does
    #: not need them (a CREATE carries neither). The verdict itself is the same either way.
    detail: bool = True


@dataclass(frozen=True)
class _Context:
    """Everything about one object the steps below share."""

    desired: Manifest  # status and server metadata removed, ignored paths removed
    live: Manifest
    node: Node
    secret: bool
    #: What of the object is masked in the change: a Secret's values, decrypted fields.
    masks: masking.Masks
    ours: ManagedEntry | None
    others: tuple[ManagedEntry, ...]


def plan(
    cluster: str,
    revision: str,
    desired: Sequence[DesiredObject],
    live: Mapping[ObjectKey, Manifest | None],
    options: PlanOptions,
) -> Plan:
    """One ``Change`` per desired object, in the order given. A key missing from ``live`` is SKIPped."""
    changes: list[Change] = []
    for obj in desired:
        if obj.key not in live and not hooks.deferred_hook(obj.manifest):  # a hook needs no live state
            unknown = "live state unknown: not listed in this pass"
            changes.append(_change(obj, Action.SKIP, reason=unknown, skip=SkipReason.LIVE_UNKNOWN))
            continue
        changes.append(plan_object(obj, live.get(obj.key), options))
    return Plan(cluster=cluster, revision=revision, changes=tuple(changes))


def _change(obj: DesiredObject, action: Action, **kw: Any) -> Change:
    return Change(key=obj.key, action=action, api_version=obj.api_version, provenance=obj.provenance, **kw)


def _annotation(manifest: Manifest | None, name: str) -> str:
    return str((((manifest or {}).get("metadata") or {}).get("annotations") or {}).get(name) or "")


def _pointer_paths(manifest: Manifest, annotation: str, node: Node) -> tuple[FieldPath, ...]:
    raw = _annotation(manifest, annotation)
    paths = (pointer_to_path(p.strip(), manifest, node) for p in raw.split(",") if p.strip())
    return tuple(p for p in paths if p)


def _body(
    manifest: Manifest, live: Manifest | None, node: Node, options: PlanOptions
) -> tuple[Manifest, tuple[FieldPath, ...], ignore_rules.Ignored]:
    """What may be applied (``_clean``, then what the rules keep), the paths left out, the rules' verdict."""
    ruled = ignore_rules.resolve(options.ignore, manifest, live, node, options.field_manager)
    ignored = (*_pointer_paths(manifest, IGNORE_FIELDS, node), *ruled.dropped)
    body = _clean(manifest, ignored, node)
    if ruled.dropped:
        body = ignore_rules.without_emptied(body, ruled.dropped, node)
    return ignore_rules.with_kept(body, ruled.kept, node), ignored, ruled


def _clean(manifest: Manifest, ignored: Sequence[FieldPath], node: Node) -> Manifest:
    """``manifest`` without status, server-set metadata and ignored paths: what may be applied.

    Copied only as deep as a removal reaches; usually nothing is removed and the manifest
    itself is returned (shared with the render cache: nothing downstream writes into a
    change's body, and ``plan_object``/``send_body`` copy before removing yielded paths).
    """
    meta = manifest.get("metadata")
    server_meta = isinstance(meta, dict) and any(k in meta for k in _SERVER_METADATA)
    string_data = masking.is_secret(manifest) and isinstance(manifest.get("stringData"), dict)
    if ignored:
        out = copy.deepcopy(manifest)
    elif "status" in manifest or server_meta or string_data:
        out = dict(manifest)
    else:
        return manifest
    out.pop("status", None)
    if server_meta:
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k not in _SERVER_METADATA}
    for path in ignored:
        remove_path(out, path, node)
    if string_data:
        # stringData is write-only: the server folds it into data. Sending data makes our
        # ownership and comparison exact, and a masked body sent by mistake fails (invalid
        # base64) instead of writing "***" into the Secret.
        out["data"] = secret_string_data_as_data(out)
        del out["stringData"]
    return out


def plan_object(desired: DesiredObject, live: Manifest | None, options: PlanOptions) -> Change:
    """The verdict for one object; see the module docstring for the rules."""
    if options.adopt not in choices(Adopt):
        raise ValueError(f"adopt must be one of {', '.join(choices(Adopt))}, got {options.adopt!r}")
    manifest = desired.manifest
    if phases := hooks.deferred_hook(manifest):
        return _change(desired, Action.SKIP, reason=hooks.skip_reason(phases), skip=SkipReason.HELM_HOOK)
    group, version = split_api_version(desired.api_version)
    node = root_node(options.schema, group, version, str(manifest.get("kind", "")))
    secret = masking.is_secret(manifest)
    masks = masking.masks_of(manifest, live)
    rv = str((live or {}).get("metadata", {}).get("resourceVersion") or "") or None
    uid = str((live or {}).get("metadata", {}).get("uid") or "") or None
    ids: dict[str, Any] = {"resource_version": rv, "uid": uid}

    for source, where in ((live, "live"), (manifest, "Git")):
        if _annotation(source, RECONCILE) == "disabled":
            why = f"{RECONCILE}: disabled (in {where})"
            return _change(desired, Action.SKIP, reason=why, skip=SkipReason.RECONCILE_DISABLED, **ids)

    body, ignored, ruled = _body(manifest, live, node, options)
    counted = {"ignored": ruled.counts}
    if live is None:
        # Masked by what the body itself says, so that ``request_body`` restores exactly that.
        shown = masking.mask_secret(body)
        if not options.detail:
            return _change(desired, Action.CREATE, body=shown, **counted)
        paths = manifest_paths(body, node)
        return _change(
            desired,
            Action.CREATE,
            body=shown,
            declared=paths,
            changed=paths,
            operations=tuple(jsonpatch.make_patch({}, for_report(shown)).patch),
            **counted,
        )

    entries = managed_entries(live)
    ours = next((e for e in entries if _is_our_apply(e, options.field_manager)), None)
    skip, refusal, adopting = _adoption(live, entries, ours, options)
    if skip is not None:
        return _change(desired, Action.SKIP, reason=refusal, skip=skip, **ids)
    ctx = _Context(body, live, node, secret, masks, ours, tuple(e for e in entries if e is not ours))

    diff = differences(body, live, node, owned=ours.paths if ours else frozenset(), secret=secret)
    changed = diff.changed
    conflicts = _conflicts(ctx, changed, diff.values, options, _pointer_paths(manifest, FORCE_FIELDS, node))
    yielded = {c.path for c in conflicts if c.resolution is Resolution.YIELD}
    respelled = _respelled(ctx, diff.respelled)
    if yielded or respelled:
        body = copy.deepcopy(body)
        for path in yielded:
            remove_path(body, path, node)
        for path, value in respelled.items():
            replace_path(body, path, node, copy.deepcopy(value))
    declared = manifest_paths(body, node)
    owned = ours.paths if ours else frozenset()
    # An ignored path we still own does not by itself cost a write (module docstring).
    owned_checked = frozenset(p for p in owned if not any(is_under(p, i) for i in ignored))
    ownership_exact = (
        ours is not None and ours.api_version == desired.api_version and owned_checked == declared
    )
    pending = {p for p in changed if not any(is_under(p, y) or is_under(y, p) for y in yielded)}
    pending |= diff.reordered

    if not changed and not diff.reordered and ownership_exact:
        return _change(desired, Action.NOOP, declared=declared, **ids, **counted)
    if not pending and ownership_exact:
        return _change(
            desired,
            Action.CONFLICT,
            declared=declared,
            changed=frozenset(changed),
            conflicts=conflicts,
            reason="every differing path is owned by another manager and yielded; nothing to send",
            **ids,
            **counted,
        )
    released = _released(owned - declared, ctx.others)
    ops: tuple[dict[str, Any], ...] = ()
    if options.detail:
        expected = expected_after(live, body, released, node)
        before, after = masking.mask_pair(live, expected) if masks else (live, expected)
        ops = tuple(jsonpatch.make_patch(for_report(before), for_report(after)).patch)
    forced = any(c.resolution is Resolution.FORCE for c in conflicts)
    reason = _update_reason(ctx, adopting, pending, released, options, diff.reordered, diff.inside)
    return _change(
        desired,
        Action.UPDATE,
        body=masking.mask_secret(body),
        declared=declared,
        changed=frozenset(changed | diff.reordered),
        released=released,
        conflicts=conflicts,
        force=forced,
        operations=ops,
        reason=reason,
        **ids,
        **counted,
    )


def _is_our_apply(entry: ManagedEntry, manager: str) -> bool:
    return entry.manager == manager and entry.operation == "Apply" and not entry.subresource


def _set_of(value: str, label_key: str, options: PlanOptions) -> str:
    """The set an object is a member of, in users' words: the app of this agent whose ApplySet
    it is, where known, else the raw membership label (another agent's or tool's set)."""
    app = next((a for i, a in options.set_owners or () if i == value), None)
    return f"app {app!r} (its ApplySet {value})" if app else f"another set ({label_key}={value})"


def _adoption(
    live: Manifest, entries: Sequence[ManagedEntry], ours: ManagedEntry | None, options: PlanOptions
) -> tuple[SkipReason | None, str, bool]:
    """(why not, in words, or None; whether this write adopts an object that was not ours).

    Membership decides before field ownership: every app of an agent shares its field manager,
    so "our Apply entry" says only that this agent wrote the object, not which of its apps.
    """
    meta = live.get("metadata") or {}
    labels = meta.get("labels") or {}
    label_key, label_value = options.membership_label or (PART_OF, None)
    current = labels.get(label_key)
    if label_value is not None and current == label_value:
        return None, "", False
    if label_value is not None and current is not None:
        if current in (options.handover_from or ()):
            return None, "", True
        if current in (options.protected or ()):
            return SkipReason.OTHER_SET, f"a member of {_set_of(current, label_key, options)}", False
        if options.adopt != Adopt.ALWAYS:
            why = f"belongs to {_set_of(current, label_key, options)}; adopt = {options.adopt} refuses"
            return SkipReason.OTHER_SET, why, False
        return None, "", True
    if ours is not None:
        return None, "", False
    if options.adopt == Adopt.ALWAYS:
        return None, "", True
    if options.adopt == Adopt.NEVER:
        return SkipReason.ADOPT_REFUSED, "exists and is not ours (adopt = never)", False
    if label_key in labels:
        why = f"belongs to {_set_of(labels[label_key], label_key, options)}; adopt = if-unowned refuses"
        return SkipReason.OTHER_SET, why, False
    if meta.get("ownerReferences"):
        owners = ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in meta["ownerReferences"])
        return SkipReason.ADOPT_REFUSED, f"has ownerReferences ({owners}); adopt = if-unowned refuses", False
    appliers = sorted(
        {e.manager for e in entries if e.operation == "Apply" and e.manager != options.field_manager}
    )
    if appliers:
        why = f"applied by another manager ({', '.join(appliers)}); adopt = if-unowned refuses"
        return SkipReason.ADOPT_REFUSED, why, False
    return None, "", True


def _respelled(ctx: _Context, respelled: Mapping[FieldPath, Any]) -> dict[FieldPath, Any]:
    """Of the values Git spells differently from live but means the same, those another entry holds.

    The server finds conflicts before it defaults or canonicalises: an apply of Git's spelling
    (a ``fieldRef`` without the ``apiVersion`` the server added, ``cpu: 1000m`` stored as ``"1"``)
    replaces a value another manager owns, and is refused (409) every pass although the stored
    object would not change (an object ``helm install`` created, taken over). Sent in live's
    spelling, the apply changes nothing there and shares the field with its owner.
    """
    return {p: v for p, v in respelled.items() if any(_overlap(p, e) is not None for e in ctx.others)}


def _conflicts(
    ctx: _Context,
    changed: set[FieldPath],
    values: Mapping[FieldPath, tuple[Any, Any]],
    options: PlanOptions,
    forced_paths: Sequence[FieldPath],
) -> tuple[FieldConflict, ...]:
    """Changed paths another entry owns, each resolved; a path is yielded if any owner yields."""
    found: dict[FieldPath, list[ManagedEntry]] = {}
    for path in sorted(changed):
        for entry in ctx.others:
            unit = _overlap(path, entry)
            if unit is not None:
                found.setdefault(whole_item_if_key(unit), []).append(entry)
    out: list[FieldConflict] = []
    for unit, owners in sorted(found.items()):
        resolutions = [_resolve(unit, e, options, forced_paths) for e in owners]
        final = Resolution.YIELD if Resolution.YIELD in resolutions else Resolution.FORCE
        desired_value, live_value = values.get(unit, (None, None))
        for e in owners:
            out.append(
                FieldConflict(
                    path=unit,
                    manager=e.manager,
                    operation=e.operation,
                    subresource=e.subresource,
                    resolution=final,
                    desired=masking.mask_value(unit, desired_value, secret=ctx.masks),
                    live=masking.mask_value(unit, live_value, secret=ctx.masks),
                )
            )
    return tuple(out)


def _overlap(path: FieldPath, entry: ManagedEntry) -> FieldPath | None:
    """The unit the server would conflict on if ``entry`` owns ``path``, or ``None``.

    Exact ownership is the normal case. The other two cover a schema we guessed
    differently from the server: they hold an atomic ancestor of our path (we must
    yield their whole field), or we declare atomically what they own in parts.
    """
    if path in entry.paths:
        return path
    if path in entry.inner:
        return path
    for i in range(len(path) - 1, 0, -1):
        prefix = path[:i]
        if prefix in entry.paths and prefix not in entry.inner and prefix[-1].startswith("f:"):
            return prefix
    return None


def _resolve(
    path: FieldPath, entry: ManagedEntry, options: PlanOptions, forced: Sequence[FieldPath]
) -> Resolution:
    if any(is_under(path, f) for f in forced):
        return Resolution.FORCE
    if entry.manager == options.field_manager:
        return Resolution.FORCE  # our own plain patches (e.g. orphaning) are not someone else's
    for rule in options.rules:
        if rule.matches(entry.manager, entry.operation, entry.subresource):
            return Resolution.FORCE if rule.action == "force" else Resolution.YIELD
    return Resolution.YIELD


def _released(
    paths: frozenset[FieldPath], others: Sequence[ManagedEntry]
) -> tuple[tuple[FieldPath, bool], ...]:
    """Each path we give up, with whether the server removes it (no other manager owns it or below it)."""
    theirs = frozenset().union(*(e.paths for e in others)) if others else frozenset()
    inner = frozenset().union(*(e.inner for e in others)) if others else frozenset()
    removed = {p: p not in theirs and p not in inner for p in paths}
    for p in paths:
        item = whole_item_if_key(p)
        if item != p:
            # A key field leaves only with its item, never on its own.
            removed[p] = removed[p] and removed.get(item, False)
    return tuple((p, removed[p]) for p in sorted(paths))


def _update_reason(
    ctx: _Context,
    adopting: bool,
    pending: set[FieldPath],
    released: Sequence[tuple[FieldPath, bool]],
    options: PlanOptions,
    reordered: set[FieldPath],
    inside: Mapping[FieldPath, tuple[str, ...]],
) -> str:
    parts: list[str] = []
    if adopting:
        parts.append(f"adopting an existing object (adopt = {options.adopt})")
    elif ctx.ours is None:
        holders = sorted({e.manager for e in ctx.others}) or ["nobody"]
        parts.append(f"re-adopting: our field manager owns nothing (fields held by {', '.join(holders)})")
    elif ctx.ours.api_version and ctx.ours.api_version != str(ctx.desired.get("apiVersion", "")):
        parts.append(f"our Apply entry was recorded at {ctx.ours.api_version}")
    if pending:
        shown = [_shown(p, reordered, inside) for p in sorted(pending)]
        parts.append("changed: " + name_list(shown))
    if released:
        parts.append("released: " + name_list([render_path(p) for p, _ in released]))
    return "; ".join(parts) or "ownership of declared paths to be brought in line"


def _shown(path: FieldPath, reordered: set[FieldPath], inside: Mapping[FieldPath, tuple[str, ...]]) -> str:
    if path in reordered:
        return f"{render_path(path)} (order)"
    where = inside.get(path)
    return f"{render_path(path)} ({', '.join(where)})" if where else render_path(path)


def expected_object(desired: DesiredObject, live: Manifest | None, options: PlanOptions) -> Manifest | None:
    """The unmasked object the plan expects after applying (``None`` when nothing is sent).

    For comparing with a server-side dry-run apply; never put its result in a report (Secrets).
    """
    change = plan_object(desired, live, options)
    if change.body is None:
        return None
    body = request_body(change, desired)
    if live is None or body is None:
        return body
    group, version = split_api_version(desired.api_version)
    node = root_node(options.schema, group, version, str(desired.manifest.get("kind", "")))
    return expected_after(live, body, change.released, node)


def request_body(change: Change, desired: DesiredObject) -> Manifest | None:
    """The body to send for ``change``: ``change.body`` with its masked values restored from Git."""
    if change.body is None:
        return None
    masks = masking.masks_of(change.body)
    if not masks:
        return change.body
    body = copy.deepcopy(change.body)
    for path in masks.paths:
        _restore(body, desired.manifest, path)
    if masks.secret:
        real = secret_string_data_as_data(desired.manifest)
        if isinstance(body.get("data"), dict):
            body["data"] = {k: real[k] for k in body["data"] if k in real}
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if masking.LAST_APPLIED in annotations:
        annotations[masking.LAST_APPLIED] = _annotation(desired.manifest, masking.LAST_APPLIED)
    return body


def _restore(body: Manifest, real: Manifest, path: tuple[str, ...]) -> None:
    """Git's value at ``path`` put back where the body holds (a mask of) it."""
    target: Any = body
    source: Any = real
    for key in path[:-1]:
        target = target.get(key) if isinstance(target, dict) else None
        source = source.get(key) if isinstance(source, dict) else None
    last = path[-1] if path else None
    if isinstance(target, dict) and isinstance(source, dict) and last in target and last in source:
        target[last] = copy.deepcopy(source[last])


def send_body(desired: DesiredObject, live: Manifest | None, options: PlanOptions) -> Manifest | None:
    """The unmasked body a write for this object carries, whatever the verdict (``None`` for SKIP).

    For UPDATE/CREATE it is ``request_body``; for NOOP/CONFLICT it is what *would* be sent:
    Git's manifest cleaned, yielded paths left out. The cross-check test sends it as a
    dry-run to prove a NOOP changes nothing; ``takeover`` sends it with force.
    """
    change = plan_object(desired, live, options)
    if change.action is Action.SKIP:
        return None
    if change.body is not None:
        return request_body(change, desired)
    group, version = split_api_version(desired.api_version)
    node = root_node(options.schema, group, version, str(desired.manifest.get("kind", "")))
    body = _body(desired.manifest, live, node, options)[0]
    if change.yielded:
        body = copy.deepcopy(body)  # _clean may return Git's manifest itself
    for conflict in change.yielded:
        remove_path(body, conflict.path, node)
    return body


def whole_body(desired: DesiredObject, options: PlanOptions, live: Manifest | None = None) -> Manifest:
    """Git's manifest as a forced apply would send it over ``live``, nothing yielded (ignored paths
    still left out): what ``reconcile.confirm`` dry-runs to tell a conflict of spelling from one of values."""
    group, version = split_api_version(desired.api_version)
    node = root_node(options.schema, group, version, str(desired.manifest.get("kind", "")))
    return _body(desired.manifest, live, node, options)[0]


def summary_line(plan_: Plan) -> str:
    """``create 1, update 2, noop 40, ...`` for logs."""
    return ", ".join(f"{k} {v}" for k, v in plan_.summary().items() if v)


__all__ = [
    "FORCE_FIELDS",
    "IGNORE_FIELDS",
    "PART_OF",
    "RECONCILE",
    "PlanOptions",
    "expected_object",
    "plan",
    "plan_object",
    "request_body",
    "send_body",
    "summary_line",
    "whole_body",
]
