"""Decide and carry out deletions, only on positive evidence.

``decide`` is pure: from the inventory, the desired keys, this pass's live
listings and their completeness, it returns what may be deleted, what must be
orphaned, what is kept and why, or a refusal of the whole prune. ``execute``
performs the decision against the cluster. ``reconcile`` calls both after
applying.

An object is deleted only if (docs/safety.md rule 1) it is in this cluster's inventory,
carries our part-of label, that label is owned by our field manager's Apply
entry, its kind was listed completely in this pass, and it is absent from a
desired set that rendered without error. Everything else prunes nothing:
a failed or partial listing, an empty render without ``allow_empty``
(docs/safety.md rule 2), a set beyond the mass-deletion brake without the approval of
that exact set's digest (docs/safety.md rule 3), a member outside the app's scope
(``plan.scope``: an app never prunes outside it, whatever its inventory says).
``gitops-agent.io/prune: disabled``, and the keep annotations of the tools users come from
(Helm's ``helm.sh/resource-policy: keep``, Argo CD's ``Prune=false``/``Delete=false``
sync-options, Flux's ``kustomize.toolkit.fluxcd.io/prune: disabled``), orphan instead of
deleting, without changing the object's content (docs/safety.md rule 9). An ApplySet parent is
never pruned, and ``execute`` holds a delete that would take another app's, tool's or user's
objects with it (``cascade``; docs/safety.md, "Each app alone").
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent.apply import cascade
from agent.apply.inventory import Inventory
from agent.config.types import CLUSTER_DEFAULTS, PropagationPolicy
from agent.errors import ApiError
from agent.kube.client import KubeClient
from agent.model import (
    ARGOCD_NO_PRUNE,
    ARGOCD_SYNC_OPTIONS,
    DISABLED,
    FLUX_PRUNE,
    HELM_KEEP,
    HELM_RESOURCE_POLICY,
    ID_LABEL,
    PART_OF,
    PRUNE,
    RECONCILE,
    ApplyResult,
    Manifest,
    Note,
    ObjectKey,
    Outcome,
    PruneReason,
    PruneRefusal,
    ScopeRule,
    phase_of,
)
from agent.plan.scope import Scope


@dataclass(frozen=True)
class PruneOptions:
    field_manager: str
    inventory_id: str
    #: `prune = false` in config: nothing is ever deleted.
    enabled: bool = CLUSTER_DEFAULTS.prune
    allow_empty: bool = CLUSTER_DEFAULTS.allow_empty
    max_prune_fraction: float = CLUSTER_DEFAULTS.max_prune_fraction
    brake_min_inventory: int = CLUSTER_DEFAULTS.brake_min_inventory
    max_prune: int | None = CLUSTER_DEFAULTS.max_prune
    propagation: PropagationPolicy = CLUSTER_DEFAULTS.propagation_policy
    dry_run: bool = False
    #: The app whose inventory this is, named in the brake's approval command (None: the cluster's own).
    app: str | None = None
    #: The config file and cluster entry named in the brake's approval command.
    config_file: str | None = None
    cluster: str | None = None
    #: The app's scope: a member outside it is kept, never deleted (None: unrestricted).
    scope: Scope | None = None
    #: ApplySet id → app name, for the cluster's apps: a held delete names whose objects it would take
    #: (None: none known, every other set named by its id).
    set_names: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Candidate:
    key: ObjectKey
    uid: str
    api_version: str
    #: For an orphan: the annotation that keeps it (``key: value``), named in the report.
    kept_by: str = ""


@dataclass
class PruneDecision:
    """What this pass may do about objects that left Git."""

    delete: list[Candidate] = field(default_factory=list)
    orphan: list[Candidate] = field(default_factory=list)
    #: Still owned and kept (guard failed for this object); stays in the inventory.
    kept: dict[ObjectKey, str] = field(default_factory=dict)
    #: Gone already (or no longer ours): dropped from the inventory.
    gone: set[ObjectKey] = field(default_factory=set)
    #: What a kept object's result is about (out of scope, an inventory parent), for machines.
    notes: dict[ObjectKey, Note] = field(default_factory=dict)
    #: A refusal of every deletion in this pass (its message in users' words).
    refusal: PruneRefusal | None = None
    digest: str = ""
    #: This app's members and their recorded UIDs: what a delete may take with it (``cascade``).
    own: cascade.Ownership | None = None

    @property
    def out_of_scope(self) -> set[ObjectKey]:
        """Kept because they lie outside the app's scope (also in ``kept``, with the rule named)."""
        return {k for k, n in self.notes.items() if n is Note.OUT_OF_SCOPE}

    @property
    def refused(self) -> str | None:
        """The refusal's message, for readers that print it."""
        return self.refusal.message if self.refusal else None


def prune_digest(candidates: Iterable[Candidate]) -> str:
    """Names an exact prune set; an approval is valid for this set only."""
    lines = sorted(f"{c.key}|{c.uid}" for c in candidates)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def keep_annotation(annotations: Mapping[str, str]) -> str:
    """The annotation (``key: value``) that keeps an object when it leaves Git; "" when none does.

    Ours, and those of the tools users come from, so an object they marked is never deleted by
    a move to the agent: Helm's resource policy (cert-manager marks its CRDs), Argo CD's
    sync-options, Flux's prune annotation.
    """
    if annotations.get(PRUNE) == DISABLED:
        return f"{PRUNE}: {DISABLED}"
    if annotations.get(HELM_RESOURCE_POLICY, "").strip().lower() == HELM_KEEP:
        return f"{HELM_RESOURCE_POLICY}: {annotations[HELM_RESOURCE_POLICY]}"
    options = {o.strip() for o in annotations.get(ARGOCD_SYNC_OPTIONS, "").split(",")}
    if found := sorted(options & set(ARGOCD_NO_PRUNE)):
        return f"{ARGOCD_SYNC_OPTIONS}: {found[0]}"
    if annotations.get(FLUX_PRUNE) == DISABLED:
        return f"{FLUX_PRUNE}: {DISABLED}"
    return ""


def owns_membership_label(live: Manifest, field_manager: str) -> bool:
    """Is the part-of label ours by Apply? A restore tool's or a user's copy is not evidence."""
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        if (
            entry.get("manager") != field_manager
            or entry.get("operation") != "Apply"
            or entry.get("subresource")
        ):
            continue
        labels = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        if f"f:{PART_OF}" in labels:
            return True
    return False


def decide(
    inventory: Inventory,
    desired: set[ObjectKey],
    live: Mapping[ObjectKey, Manifest],
    listed_complete: Mapping[tuple[str, str], bool],
    options: PruneOptions,
    *,
    render_empty: bool,
    unknown_apps: Sequence[str] = (),
) -> PruneDecision:
    """Pure: which inventory members that left Git may go, and which guard stops the rest.

    ``unknown_apps``: other apps of the cluster whose render failed in this pass; an object
    leaving this app may be declared there, so nothing leaves until they render again.
    """
    d = PruneDecision()
    leaving = sorted(k for k in inventory.members if k not in desired)
    if not leaving:
        return d
    incomplete = sorted(f"{k}.{g}" if g else k for (g, k), ok in listed_complete.items() if not ok)
    if incomplete:
        d.refusal = PruneRefusal(
            PruneReason.UNKNOWN_STATE,
            f"not pruning: the live listing of {', '.join(incomplete)} failed or was incomplete"
            " (unknown is not absent)",
        )
    elif unknown_apps:
        d.refusal = PruneRefusal(
            PruneReason.OTHER_APP_UNKNOWN,
            f"not pruning: app(s) {', '.join(unknown_apps)} of this cluster did not render in this pass,"
            " and what leaves this app may have moved there (unknown is not absent)",
        )
    elif render_empty and not options.allow_empty:
        d.refusal = PruneRefusal(
            PruneReason.EMPTY_RENDER, "not pruning: the render is empty and allow_empty is false"
        )
    elif not options.enabled:
        d.refusal = PruneRefusal(PruneReason.DISABLED, "not pruning: prune = false for this app")
    if d.refusal:
        d.kept = {k: d.refusal.message for k in leaving}
        return d
    for key in leaving:
        outside = options.scope.violation(key) if options.scope is not None else None
        if outside is not None:
            d.kept[key] = f"outside the app's scope ({outside[1]}): this app never deletes it"
            parent = outside[0] is ScopeRule.INVENTORY_PARENT
            d.notes[key] = Note.INVENTORY_PARENT if parent else Note.OUT_OF_SCOPE
            continue
        if (key.group, key.kind) not in listed_complete:
            d.kept[key] = "its kind was not listed in this pass"
            continue
        obj = live.get(key)
        if obj is None:
            d.gone.add(key)
            continue
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        # A UID other than the recorded one is no evidence either way: a pass killed between
        # re-creating an object and narrowing the inventory leaves the old UID behind. Ownership
        # of the label by our Apply entry is the evidence (a restore tool's copy fails it), and
        # the delete's UID precondition uses the UID this pass listed.
        labels = meta.get("labels") or {}
        candidate = Candidate(key, meta.get("uid", ""), obj.get("apiVersion", ""))
        if ID_LABEL in labels:  # an ApplySet's parent (another app's, tool's): never a member to delete
            d.kept[key] = f"an ApplySet parent ({ID_LABEL}={labels[ID_LABEL]}): no app ever prunes one"
            d.notes[key] = Note.INVENTORY_PARENT
        elif labels.get(PART_OF) != options.inventory_id:
            d.gone.add(key)  # someone took it out of the set: no longer ours to track
        elif annotations.get(RECONCILE) == DISABLED:
            d.kept[key] = f"{RECONCILE}: {DISABLED}"
        elif not owns_membership_label(obj, options.field_manager):
            d.kept[key] = (
                "our Apply entry does not own its membership label (restored or edited); not deleting"
            )
        elif kept_by := keep_annotation(annotations):
            d.orphan.append(replace(candidate, kept_by=kept_by))
        else:
            d.delete.append(candidate)
    d.own = cascade.Ownership(
        options.inventory_id,
        frozenset(inventory.members),
        frozenset(m.uid for m in inventory.members.values() if m.uid),
        options.set_names or {},
    )
    d.digest = prune_digest(d.delete)
    size = len(inventory.members)
    n = len(d.delete)
    over_fraction = size >= options.brake_min_inventory and n / max(size, 1) > options.max_prune_fraction
    over_count = options.max_prune is not None and n > options.max_prune
    if (over_fraction or over_count) and inventory.approved_digest != d.digest:
        limit = (
            f"more than {options.max_prune}"
            if over_count
            else f"{n}/{size} > {options.max_prune_fraction:.0%} of the inventory"
        )
        app = f" --app {shlex.quote(options.app)}" if options.app else ""
        config = shlex.quote(options.config_file or "<file>")
        where = f"--config {config} --cluster {shlex.quote(options.cluster or '<name>')}"
        d.refusal = PruneRefusal(
            PruneReason.BRAKE,
            f"mass-deletion brake: {n} deletions ({limit}); approve this exact set with "
            f"`gitops-agent prune approve {where}{app} --digest {d.digest}`",
        )
        for c in d.delete:
            d.kept[c.key] = d.refusal.message
        d.delete = []
    return d


def execute(
    client: KubeClient,
    decision: PruneDecision,
    options: PruneOptions,
    *,
    waves: Mapping[ObjectKey, int] | None = None,
) -> list[ApplyResult]:
    """Orphan, then delete in reverse apply order (``waves``: each candidate's sync wave, the
    latest first); a failed or held delete stays in the inventory.

    What a delete would take with it is read as the identity that deletes (the app's
    ServiceAccount, if it has one): the shipped RBAC lets that identity list its namespaces.
    """
    results = [_orphan(client, c, options) for c in decision.orphan]
    held = _holds(client, decision, options)
    wave = waves or {}
    for c in sorted(decision.delete, key=lambda c: (-wave.get(c.key, 0), -phase_of(c.key), c.key)):
        if (hold := held.get(c.key)) is not None:
            results.append(
                ApplyResult(c.key, Outcome.PRUNE_SKIPPED, message=hold.message, uid=c.uid, note=hold.note)
            )
        else:
            results.append(_delete(client, c, options))
    for key, why in sorted(decision.kept.items()):
        results.append(ApplyResult(key, Outcome.PRUNE_SKIPPED, message=why, note=decision.notes.get(key)))
    return results


def _holds(
    reader: KubeClient, decision: PruneDecision, options: PruneOptions
) -> dict[ObjectKey, cascade.Hold]:
    """The deletes that would take objects that are not this app's with them (no request when
    nothing is deleted, or nothing deleted can take anything with it)."""
    owners_cascade = options.propagation is not PropagationPolicy.ORPHAN
    keys = [c.key for c in decision.delete]
    if not keys or decision.own is None or not cascade.needs_read(keys, owners_cascade=owners_cascade):
        return {}
    try:
        listing = cascade.read(reader, keys, owners_cascade=owners_cascade)
    except ApiError as e:  # discovery itself failed: nothing can be known about any cascade
        listing = cascade.Listing(incomplete=[f"discovery (HTTP {e.status or e.transport})"])
    candidates = [(c.key, c.uid) for c in decision.delete]
    return cascade.holds(candidates, listing, decision.own, owners_cascade=owners_cascade)


def _delete(client: KubeClient, c: Candidate, options: PruneOptions) -> ApplyResult:
    try:
        info = client.resource(c.api_version, c.key.kind)
        client.delete(
            info,
            c.key.namespace or None,
            c.key.name,
            uid=c.uid or None,
            propagation=options.propagation.capitalize(),
            dry_run=options.dry_run,
        )
    except ApiError as e:
        if e.status == 404:
            return ApplyResult(c.key, Outcome.PRUNED, message="already gone", uid=c.uid)
        return ApplyResult(
            c.key,
            Outcome.FAILED,
            status=e.status,
            message=f"delete refused: {e.api_message}",
            uid=c.uid,
            note=Note.DELETE_REFUSED,
        )
    return ApplyResult(c.key, Outcome.PRUNED, uid=c.uid)


def _orphan(client: KubeClient, c: Candidate, options: PruneOptions) -> ApplyResult:
    """Stop owning without changing content: drop our label and hand our fields over."""
    try:
        info = client.resource(c.api_version, c.key.kind)
        live = client.get(info, c.key.namespace or None, c.key.name)
        if live is None:
            return ApplyResult(c.key, Outcome.ORPHANED, message="already gone")
        meta = live["metadata"]
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
            {"op": "remove", "path": "/metadata/labels/" + PART_OF.replace("~", "~0").replace("/", "~1")},
            {
                "op": "replace",
                "path": "/metadata/managedFields",
                "value": handed_over(meta.get("managedFields") or [], options.field_manager),
            },
        ]
        if not options.dry_run:
            client.patch(
                info,
                c.key.namespace or None,
                c.key.name,
                patch,
                patch_type="json",
                field_manager=f"{options.field_manager}-orphan",
            )
    except ApiError as e:
        return ApplyResult(
            c.key, Outcome.FAILED, status=e.status, message=f"orphaning failed: {e.api_message}"
        )
    return ApplyResult(
        c.key,
        Outcome.ORPHANED,
        message=f"{c.kept_by or f'{PRUNE}: {DISABLED}'}; left in place, no longer tracked",
        uid=c.uid,
    )


def handed_over(entries: list[dict[str, Any]], field_manager: str) -> list[dict[str, Any]]:
    """managedFields with our Apply entry turned into an Update entry of ``<fm>-orphaned``.

    As kubectl's client-side→server-side upgrade does, ownership moves by editing
    managedFields, not by an apply that omits fields (which would delete those we
    alone own). The fields stay; a later apply by anyone can take them over.
    """
    out: list[dict[str, Any]] = []
    for e in entries:
        if e.get("manager") == field_manager and e.get("operation") == "Apply" and not e.get("subresource"):
            fields = json.loads(json.dumps(e.get("fieldsV1") or {}))
            labels = (fields.get("f:metadata") or {}).get("f:labels")
            if isinstance(labels, dict):
                labels.pop(f"f:{PART_OF}", None)
            e = {**e, "manager": f"{field_manager}-orphaned", "operation": "Update", "fieldsV1": fields}
        out.append(e)
    return out
