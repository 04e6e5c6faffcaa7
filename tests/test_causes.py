"""Reading a 409's Status and the owners its causes name; re-planning with them (pure).

``tests/fixtures/status/*.json`` are verbatim answers of the pinned kube-apiserver
(v1.35.4) to server-side applies under field manager ``agent``: after managedFields
were cleared (``before-first-apply``), against another Apply manager whose name
needs escaping, and against ``/scale`` and ``kubectl-edit`` owners of a Deployment
(list keys in the field spelling). The server orders causes by map iteration, so
they are compared as sets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config.types import DEFAULT_CONFLICT_RULES, ConflictRule
from agent.errors import StatusCause
from agent.kube.status import parse_status
from agent.model import Action, DesiredObject, Provenance, Resolution
from agent.plan.causes import NamedOwner, named_owners, parse_owner, replan_after_conflict, server_field
from agent.plan.planner import PlanOptions, plan_object

STATUS = Path(__file__).parent / "fixtures" / "status"
BEFORE_FIRST_APPLY = (STATUS / "before-first-apply.json").read_bytes()
CONTAINER = ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"web"}')
WEB = '.spec.template.spec.containers[name="web"]'
PORT_NAME = f'{WEB}.ports[containerPort=80,protocol="TCP"].name'


def test_a_409_status_carries_its_causes_as_typed_values() -> None:
    status = parse_status(BEFORE_FIRST_APPLY, "Conflict")
    assert status.reason == "Conflict"
    assert status.details is not None
    assert status.details.causes == (
        StatusCause("FieldManagerConflict", ".data.k", 'conflict with "before-first-apply" using v1'),
    )


def test_a_status_without_details_or_an_answer_that_is_no_status_has_no_causes() -> None:
    assert parse_status(b'{"kind":"Status","reason":"Forbidden","message":"no"}', "").details is None
    assert parse_status(b"<html>bad gateway</html>", "Bad Gateway").details is None


@pytest.mark.parametrize(
    ("fixture", "owners"),
    [
        ("before-first-apply", [NamedOwner(".data.k", "before-first-apply", "Update", "", "v1")]),
        (
            "apply-manager",
            [
                NamedOwner(".data.k", 'other "quoted" tool', "Apply"),
                NamedOwner(".metadata.labels.app.kubernetes.io/name", 'other "quoted" tool', "Apply"),
            ],
        ),
        (
            "subresource-and-list-keys",
            [
                NamedOwner(".spec.replicas", "kube-controller-manager", "Update", "scale", "apps/v1"),
                NamedOwner(f"{WEB}.image", "kubectl-edit", "Update", "", "apps/v1"),
                NamedOwner(PORT_NAME, "kubectl-edit", "Update", "", "apps/v1"),
            ],
        ),
    ],
)
def test_each_field_manager_conflict_cause_names_its_owner_operation_and_subresource(
    fixture: str, owners: list[NamedOwner]
) -> None:
    details = parse_status((STATUS / f"{fixture}.json").read_bytes(), "").details
    assert details is not None
    assert sorted(named_owners(details.causes), key=repr) == sorted(owners, key=repr)


@pytest.mark.parametrize(
    "cause",
    [
        StatusCause("FieldValueInvalid", ".data.k", 'conflict with "before-first-apply" using v1'),
        StatusCause("FieldManagerConflict", ".data.k", 'conflicts with "x" using v1 and more'),
        StatusCause("FieldManagerConflict", "", 'conflict with "x"'),
    ],
    ids=["other-type", "other-grammar", "no-field"],
)
def test_a_cause_of_another_type_or_grammar_names_no_owner(cause: StatusCause) -> None:
    assert parse_owner(cause) is None


@pytest.mark.parametrize(
    ("path", "spelled"),
    [
        (("f:data", "f:k"), ".data.k"),
        (("f:metadata", "f:labels", "f:app.kubernetes.io/name"), ".metadata.labels.app.kubernetes.io/name"),
        ((*CONTAINER, "f:image"), f"{WEB}.image"),
        (
            (*CONTAINER, "f:ports", 'k:{"protocol":"TCP","containerPort":80}', "f:name"),
            PORT_NAME,
        ),
        (("f:metadata", "f:finalizers", 'v:"a\\"b"'), '.metadata.finalizers[="a\\"b"]'),
        (("f:spec", "f:args", "i:2"), ".spec.args[2]"),
    ],
)
def test_our_paths_are_spelled_as_the_server_spells_conflicting_fields(
    path: tuple[str, ...], spelled: str
) -> None:
    assert server_field(path) == spelled


def _cleared_configmap() -> tuple[DesiredObject, dict[str, object]]:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "default"},
        "data": {"k": "v2", "added": "by-git"},
    }
    live = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "default", "resourceVersion": "7", "uid": "u"},
        "data": {"k": "v1", "theirs": "keep"},
    }
    return DesiredObject(manifest, Provenance("x.yaml")), live


def test_a_re_plan_forces_an_owner_a_409_named_when_the_default_rules_force_it() -> None:
    desired, live = _cleared_configmap()
    options = PlanOptions(field_manager="agent", rules=DEFAULT_CONFLICT_RULES, detail=False)
    assert plan_object(desired, live, options).force is False  # the object shows no owner
    causes = parse_status(BEFORE_FIRST_APPLY, "").details.causes  # type: ignore[union-attr]
    change = replan_after_conflict(desired, live, options, causes)
    assert change.action is Action.UPDATE and change.force is True
    assert [(c.manager, c.operation, c.resolution) for c in change.conflicts] == [
        ("before-first-apply", "Update", Resolution.FORCE)
    ]
    assert change.body is not None and change.body["data"] == {"k": "v2", "added": "by-git"}
    assert change.resource_version == "7"
    assert json.dumps(live).count("managedFields") == 0  # the live object itself is untouched


def test_a_re_plan_yields_an_owner_a_409_named_to_a_yield_rule_and_sends_the_rest() -> None:
    desired, live = _cleared_configmap()
    rules = (ConflictRule(manager="before-first-apply", action="yield"), *DEFAULT_CONFLICT_RULES)
    options = PlanOptions(field_manager="agent", rules=rules, detail=False)
    causes = parse_status(BEFORE_FIRST_APPLY, "").details.causes  # type: ignore[union-attr]
    change = replan_after_conflict(desired, live, options, causes)
    assert change.action is Action.UPDATE and change.force is False
    assert [c.resolution for c in change.conflicts] == [Resolution.YIELD]
    assert change.body is not None and change.body["data"] == {"added": "by-git"}
    assert "data.k held by before-first-apply (Update): yield" in change.reason
