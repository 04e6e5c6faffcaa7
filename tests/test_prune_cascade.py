"""What a prune would take with it, as pure decisions (docs/safety.md rule 6, "Each app alone";
rule 9, `ownership_ends`), table by table.

A delete is held while the server would delete, with it, anything that is not this app's: a CRD's
custom resources, a Namespace's content, an owner's dependents (ownerReferences). The integration
tests on real API servers are in ``tests/test_app_boundaries.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.apply.cascade import Listed, Listing, Ownership, holds, needs_read
from agent.apply.inventory import Inventory, Member
from agent.apply.prune import PruneOptions, decide, keep_annotation
from agent.model import ID_LABEL, PART_OF, Note, ObjectKey
from agent.plan.scope import Scope

ME, OTHER = "applyset-me-v1", "applyset-other-v1"
NAMES = {ME: "infra", OTHER: "web"}
NS = ObjectKey("", "Namespace", "", "shop")
CRD = ObjectKey("apiextensions.k8s.io", "CustomResourceDefinition", "", "widgets.example.com")


def obj(
    kind: str, name: str, *, ns: str = "shop", group: str = "", part_of: str = "", **owners: bool
) -> Listed:
    """A listed object; ``owners``: owner UID → controller."""
    return Listed(ObjectKey(group, kind, ns, name), f"uid-{name}", part_of, tuple(owners.items()))


def own(*members: Listed, extra: tuple[ObjectKey, ...] = ()) -> Ownership:
    return Ownership(ME, frozenset([*(m.key for m in members), *extra]), frozenset(), NAMES)


def test_each_app_alone_a_namespace_holding_another_apps_objects_is_held_naming_the_app_and_the_count() -> (
    None
):
    theirs = [obj("ConfigMap", f"cm-{i}", part_of=OTHER) for i in range(60)]
    users = obj("ConfigMap", "zz-users")
    listing = Listing([*theirs, users])
    held = holds([(NS, "uid-ns")], listing, own(extra=(NS,)), owners_cascade=True)
    hold = held[NS]
    assert hold.note is Note.HOLDS_FOREIGN and hold.count == 61
    assert hold.holders == ((OTHER, 60), ("", 1))
    assert "60 of app 'web'" in hold.message and "1 in no ApplySet" in hold.message


def test_each_app_alone_a_namespace_of_only_our_members_their_controller_dependents_and_defaults_goes() -> (
    None
):
    deploy = obj("Deployment", "web", group="apps", part_of=ME)
    rs = obj("ReplicaSet", "web-1", group="apps", **{"uid-web": True})
    pod = obj("Pod", "web-1-a", **{"uid-web-1": True})
    svc = obj("Service", "web", part_of=ME)
    endpoints = obj("Endpoints", "web")
    slices = obj("EndpointSlice", "web-x", group="discovery.k8s.io", **{"uid-web": True})
    defaults = [obj("ServiceAccount", "default"), obj("ConfigMap", "kube-root-ca.crt")]
    listing = Listing([deploy, rs, pod, svc, endpoints, slices, *defaults])
    assert holds([(NS, "uid-ns")], listing, own(deploy, svc, extra=(NS,)), owners_cascade=True) == {}


def test_each_app_alone_a_controller_dependent_that_another_applyset_holds_is_not_ours() -> None:
    deploy = obj("Deployment", "web", group="apps", part_of=ME)
    adopted = obj("ReplicaSet", "web-1", group="apps", part_of=OTHER, **{"uid-web": True})
    listing = Listing([deploy, adopted])
    held = holds([(deploy.key, deploy.uid)], listing, own(deploy), owners_cascade=True)
    assert held[deploy.key].holders == ((OTHER, 1),)


def test_each_app_alone_a_users_dependent_of_a_pruned_owner_holds_it_unless_propagation_orphans() -> None:
    owner = obj("ConfigMap", "settings", part_of=ME)
    theirs = obj("Secret", "copy", **{"uid-settings": False})
    listing = Listing([owner, theirs])
    held = holds([(owner.key, owner.uid)], listing, own(owner), owners_cascade=True)
    assert held[owner.key].note is Note.HOLDS_FOREIGN and "Secret/shop/copy" in held[owner.key].message
    assert holds([(owner.key, owner.uid)], listing, own(owner), owners_cascade=False) == {}


def test_each_app_alone_a_crd_is_held_while_custom_resources_that_are_not_ours_use_it() -> None:
    ours = obj("Widget", "a", group="example.com", part_of=ME)
    theirs = obj("Widget", "b", group="example.com", part_of=OTHER)
    listing = Listing([ours, theirs], crd_kinds={CRD: ("example.com", "Widget")})
    held = holds([(CRD, "uid-crd")], listing, own(ours, extra=(CRD,)), owners_cascade=True)
    assert held[CRD].holders == ((OTHER, 1),) and "its custom resources" in held[CRD].message
    listing = Listing([ours], crd_kinds={CRD: ("example.com", "Widget")})
    assert holds([(CRD, "uid-crd")], listing, own(ours, extra=(CRD,)), owners_cascade=True) == {}


def test_unknown_is_not_absent_an_incomplete_cascade_listing_or_an_unserved_crd_holds_the_delete() -> None:
    listing = Listing([], incomplete=["Widget.example.com (HTTP 403)"])
    held = holds([(NS, "uid-ns")], listing, own(extra=(NS,)), owners_cascade=True)
    assert held[NS].note is Note.CASCADE_UNKNOWN and "Widget.example.com (HTTP 403)" in held[NS].message
    held = holds([(CRD, "u")], Listing(crd_kinds={CRD: None}), own(extra=(CRD,)), owners_cascade=True)
    assert held[CRD].note is Note.CASCADE_UNKNOWN
    # A delete that takes nothing with it (propagation orphan) is not held by what was not read.
    cm = ObjectKey("", "ConfigMap", "shop", "x")
    assert set(holds([(NS, "n"), (cm, "c")], listing, own(), owners_cascade=False)) == {NS}


def test_only_deletes_that_can_take_something_with_them_cost_a_read() -> None:
    cm = ObjectKey("", "ConfigMap", "shop", "x")
    assert not needs_read([], owners_cascade=True)
    assert not needs_read([cm], owners_cascade=False)
    assert needs_read([cm], owners_cascade=True)
    assert needs_read([NS], owners_cascade=False) and needs_read([CRD], owners_cascade=False)


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({"gitops-agent.io/prune": "disabled"}, "gitops-agent.io/prune: disabled"),
        ({"helm.sh/resource-policy": "keep"}, "helm.sh/resource-policy: keep"),
        ({"argocd.argoproj.io/sync-options": "Validate=false, Prune=false"}, "Prune=false"),
        ({"argocd.argoproj.io/sync-options": "Delete=false"}, "Delete=false"),
        ({"kustomize.toolkit.fluxcd.io/prune": "disabled"}, "kustomize.toolkit.fluxcd.io/prune: disabled"),
        ({"argocd.argoproj.io/sync-options": "Prune=true"}, ""),
        ({"helm.sh/resource-policy": "delete"}, ""),
        ({}, ""),
    ],
)
def test_ownership_ends_keep_annotations_of_helm_argocd_and_flux_are_honoured(
    annotations: dict[str, str], named: str
) -> None:
    found = keep_annotation(annotations)
    assert (named in found) if named else found == ""


def live(name: str, *, ns: str = "shop", labels: dict[str, str] | None = None, **annotations: str) -> Any:
    fields = {"f:metadata": {"f:labels": {f"f:{PART_OF}": {}}}}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "labels": {PART_OF: ME, **(labels or {})},
            "annotations": annotations,
            "managedFields": [{"manager": "agent-x", "operation": "Apply", "fieldsV1": fields}],
        },
    }


def test_ownership_ends_a_member_with_helms_keep_policy_leaves_the_inventory_and_stays() -> None:
    k = ObjectKey("", "ConfigMap", "shop", "kept")
    inv = Inventory("agent-x", "gitops-agent", exists=True)
    inv.members[k] = Member(k, "uid-kept")
    live_objects = {k: live("kept", **{"helm.sh/resource-policy": "keep"})}
    options = PruneOptions(field_manager="agent-x", inventory_id=ME)
    d = decide(inv, set(), live_objects, {("", "ConfigMap"): True}, options, render_empty=False)
    assert d.delete == [] and [(c.key, c.kept_by) for c in d.orphan] == [(k, "helm.sh/resource-policy: keep")]


def test_each_app_alone_an_inventory_parent_is_never_pruned_by_name_or_by_its_applyset_label() -> None:
    by_name = ObjectKey("", "ConfigMap", "gitops-agent", "agent-x.web")
    by_label = ObjectKey("", "ConfigMap", "shop", "someone-elses-set")
    inv = Inventory("agent-x.infra", "gitops-agent", exists=True)
    for k in (by_name, by_label):
        inv.members[k] = Member(k, f"uid-{k.name}")
    live_objects = {
        by_name: live(by_name.name, ns="gitops-agent", labels={ID_LABEL: OTHER}),
        by_label: live(by_label.name, labels={ID_LABEL: "applyset-kubectl-v1"}),
    }
    scope = Scope(parents=("agent-x", "gitops-agent"))
    options = PruneOptions(field_manager="agent-x", inventory_id=ME, scope=scope)
    d = decide(inv, set(), live_objects, {("", "ConfigMap"): True}, options, render_empty=False)
    assert d.delete == [] and d.orphan == []
    assert d.notes == {by_name: Note.INVENTORY_PARENT, by_label: Note.INVENTORY_PARENT}
