"""The prune guards as a pure decision (docs/safety.md rules 1, 2, 3, 9), table by table."""

from __future__ import annotations

from typing import Any

import pytest

from agent.apply.inventory import Inventory, Member
from agent.apply.prune import PruneOptions, decide, handed_over, owns_membership_label, prune_digest
from agent.model import PART_OF, PRUNE_APPROVAL, ObjectKey

FM = "agent-x"
ID = "applyset-abc-v1"


def key(name: str, kind: str = "ConfigMap") -> ObjectKey:
    return ObjectKey("", kind, "ns", name)


def live(
    name: str, *, uid: str = "", label: bool = True, owned: bool = True, **annotations: str
) -> dict[str, Any]:
    labels = {PART_OF: ID} if label else {}
    fields = {"f:metadata": {"f:labels": {f"f:{PART_OF}": {}}}} if owned else {"f:data": {}}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "labels": labels,
            "annotations": {k.replace("_", "/"): v for k, v in annotations.items()},
            "managedFields": [{"manager": FM, "operation": "Apply", "fieldsV1": fields}],
        },
    }


def inventory(names: list[str], **annotations: str) -> Inventory:
    inv = Inventory("agent-x", "gitops-agent", annotations=dict(annotations), exists=True)
    for n in names:
        inv.members[key(n)] = Member(key(n), f"uid-{n}")
    return inv


def options(**kw: Any) -> PruneOptions:
    return PruneOptions(field_manager=FM, inventory_id=ID, **kw)


COMPLETE = {("", "ConfigMap"): True}


def test_prunes_only_what_left_git_with_full_evidence() -> None:
    inv = inventory(["a", "b", "c"])
    d = decide(inv, {key("a")}, {key(n): live(n) for n in "abc"}, COMPLETE, options(), render_empty=False)
    assert sorted(c.key.name for c in d.delete) == ["b", "c"]
    assert d.refused is None and not d.kept


def test_unknown_is_not_absent_incomplete_listing_prunes_nothing() -> None:
    inv = inventory(["a", "b"])
    d = decide(inv, {key("a")}, {}, {("", "ConfigMap"): False}, options(), render_empty=False)
    assert d.delete == [] and d.refused and "unknown is not absent" in d.refused
    assert key("b") in d.kept


def test_unknown_is_not_absent_any_failed_kind_refuses_the_whole_prune() -> None:
    inv = inventory(["a", "b"])
    listed = {("", "ConfigMap"): True, ("apps", "Deployment"): False}
    d = decide(inv, {key("a")}, {key("b"): live("b")}, listed, options(), render_empty=False)
    assert d.delete == [] and "Deployment.apps" in (d.refused or "")


def test_unknown_is_not_absent_kind_not_listed_is_kept() -> None:
    inv = inventory(["a"])
    inv.members[key("s", "Secret")] = Member(key("s", "Secret"), "uid-s")
    d = decide(inv, {key("a")}, {}, COMPLETE, options(), render_empty=False)
    assert d.delete == [] and key("s", "Secret") in d.kept


def test_fail_closed_empty_render_prunes_nothing_unless_allowed() -> None:
    inv = inventory(["a", "b"])
    objs = {key(n): live(n) for n in "ab"}
    d = decide(inv, set(), objs, COMPLETE, options(), render_empty=True)
    assert d.delete == [] and "empty" in (d.refused or "")
    d = decide(inv, set(), objs, COMPLETE, options(allow_empty=True), render_empty=True)
    assert len(d.delete) == 2


def test_label_not_owned_by_our_apply_entry_is_not_evidence() -> None:
    inv = inventory(["a", "b"])
    d = decide(inv, {key("a")}, {key("b"): live("b", owned=False)}, COMPLETE, options(), render_empty=False)
    assert d.delete == [] and "does not own its membership label" in d.kept[key("b")]


def test_a_recreated_object_whose_label_our_apply_owns_is_deleted_by_its_live_uid() -> None:
    """After a crash between re-creating and recording, the inventory's UID is stale: still ours."""
    inv = inventory(["a", "b"])
    d = decide(inv, {key("a")}, {key("b"): live("b", uid="other")}, COMPLETE, options(), render_empty=False)
    assert [(c.key, c.uid) for c in d.delete] == [(key("b"), "other")]


def test_a_recreated_object_whose_label_another_manager_owns_is_kept() -> None:
    inv = inventory(["a", "b"])
    restored = live("b", uid="other", owned=False)
    d = decide(inv, {key("a")}, {key("b"): restored}, COMPLETE, options(), render_empty=False)
    assert d.delete == [] and "does not own its membership label" in d.kept[key("b")]


def test_already_gone_or_unlabelled_is_dropped_from_the_inventory() -> None:
    inv = inventory(["a", "b", "c"])
    d = decide(inv, {key("a")}, {key("c"): live("c", label=False)}, COMPLETE, options(), render_empty=False)
    assert d.gone == {key("b"), key("c")} and d.delete == []


def test_ownership_ends_on_purpose_prune_disabled_orphans_reconcile_disabled_keeps() -> None:
    inv = inventory(["a", "b", "c"])
    objs = {
        key("b"): live("b", **{"gitops-agent.io_prune": "disabled"}),
        key("c"): live("c", **{"gitops-agent.io_reconcile": "disabled"}),
    }
    d = decide(inv, {key("a")}, objs, COMPLETE, options(), render_empty=False)
    assert [c.key for c in d.orphan] == [key("b")]
    assert key("c") in d.kept and d.delete == []


def test_prune_disabled_in_config_deletes_nothing() -> None:
    inv = inventory(["a", "b"])
    d = decide(inv, {key("a")}, {key("b"): live("b")}, COMPLETE, options(enabled=False), render_empty=False)
    assert d.delete == [] and "prune = false" in (d.refused or "")


@pytest.mark.parametrize(
    ("size", "leaving", "opts", "braked"),
    [
        (10, 5, {}, False),  # exactly half: allowed
        (10, 6, {}, True),  # more than half of >= 10
        (9, 9, {}, False),  # below brake_min_inventory
        (20, 3, {"max_prune": 2}, True),
        (20, 2, {"max_prune": 2}, False),
        (10, 2, {"max_prune_fraction": 0.1}, True),
    ],
)
def test_mass_deletion_brake_thresholds(size: int, leaving: int, opts: dict[str, Any], braked: bool) -> None:
    names = [f"o{i}" for i in range(size)]
    inv = inventory(names)
    desired = {key(n) for n in names[leaving:]}
    d = decide(inv, desired, {key(n): live(n) for n in names}, COMPLETE, options(**opts), render_empty=False)
    assert (d.refused is not None) is braked
    assert len(d.delete) == (0 if braked else leaving)


def test_mass_deletion_brake_lifted_only_by_the_exact_digest() -> None:
    names = [f"o{i}" for i in range(10)]
    objs = {key(n): live(n) for n in names}
    d = decide(inventory(names), {key("o9")}, objs, COMPLETE, options(), render_empty=False)
    assert d.refused and d.digest in d.refused and d.delete == []
    approved = inventory(names, **{PRUNE_APPROVAL: d.digest})
    d2 = decide(approved, {key("o9")}, objs, COMPLETE, options(), render_empty=False)
    assert len(d2.delete) == 9 and d2.refused is None
    # A different set (one more object leaving) voids the approval.
    d3 = decide(approved, set(), objs, COMPLETE, options(allow_empty=True), render_empty=True)
    assert d3.refused and d3.delete == []


def test_prune_digest_depends_on_members_and_uids_only() -> None:
    from agent.apply.prune import Candidate

    a = [Candidate(key("a"), "1", "v1"), Candidate(key("b"), "2", "v1")]
    assert prune_digest(a) == prune_digest(reversed(a))
    assert prune_digest(a) != prune_digest([Candidate(key("a"), "9", "v1"), a[1]])


def test_owns_membership_label_requires_our_apply_entry() -> None:
    obj = live("a")
    assert owns_membership_label(obj, FM)
    assert not owns_membership_label(obj, "someone-else")
    obj["metadata"]["managedFields"][0]["operation"] = "Update"
    assert not owns_membership_label(obj, FM)


def test_handed_over_keeps_fields_but_drops_the_label_and_our_apply_entry() -> None:
    entries = [
        {
            "manager": FM,
            "operation": "Apply",
            "fieldsV1": {"f:data": {"f:x": {}}, "f:metadata": {"f:labels": {f"f:{PART_OF}": {}}}},
        },
        {
            "manager": "kubectl-label",
            "operation": "Update",
            "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}},
        },
    ]
    out = handed_over(entries, FM)
    assert out[1] == entries[1]
    assert out[0]["manager"] == f"{FM}-orphaned" and out[0]["operation"] == "Update"
    assert out[0]["fieldsV1"]["f:data"] == {"f:x": {}}
    assert f"f:{PART_OF}" not in out[0]["fieldsV1"]["f:metadata"]["f:labels"]
    assert entries[0]["manager"] == FM  # input untouched
