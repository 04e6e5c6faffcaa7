"""The plan stage: readable desired/live fixture pairs, the ownership invariant as a property, and speed.

Fixtures live in ``tests/fixtures/plan/<case>.yaml`` (``desired``, ``live``,
``options``, ``expect``); paths in ``expect`` use ``fields.render_path``
spelling. ``_openapi.yaml`` is a trimmed OpenAPI v3 document that stands for
the server's schema (cases run with it unless ``options.schema`` is false).
"""

from __future__ import annotations

import ast
import copy
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config.types import DEFAULT_CONFLICT_RULES, ConflictRule
from agent.model import Action, DesiredObject, Manifest, ObjectKey, Provenance
from agent.plan import planner as plan_module
from agent.plan.expected import for_report
from agent.plan.fields import (
    decode_fields_v1,
    encode_fields_v1,
    item_element,
    manifest_paths,
    prefixes,
    render_path,
)
from agent.plan.planner import PlanOptions, expected_object, plan, plan_object, request_body
from agent.plan.schema import Node, SchemaIndex, root_node

FIXTURES = Path(__file__).parent / "fixtures" / "plan"
SCHEMA = SchemaIndex.from_openapi_v3([yaml.safe_load((FIXTURES / "_openapi.yaml").read_text())])
MANAGER = "gitops-agent"
CASES = sorted(p for p in FIXTURES.glob("*.yaml") if not p.name.startswith("_"))


def _options(raw: dict[str, Any] | None, *, detail: bool = True) -> PlanOptions:
    raw = raw or {}
    return PlanOptions(
        detail=detail,
        field_manager=MANAGER,
        rules=DEFAULT_CONFLICT_RULES,
        schema=SCHEMA if raw.get("schema", True) else None,
        adopt=raw.get("adopt", "if-unowned"),
        membership_label=("applyset.kubernetes.io/part-of", "applyset-test-v1")
        if raw.get("membership")
        else None,
    )


def _paths(manifest: Manifest) -> set[str]:
    group, _, version = manifest["apiVersion"].rpartition("/")
    node = root_node(SCHEMA, group, version, manifest["kind"])
    return {render_path(p) for p in manifest_paths(manifest, node)}


def _pointer_get(doc: Any, pointer: str) -> Any:
    for part in pointer.lstrip("/").split("/"):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_fixture(case: Path) -> None:
    spec = yaml.safe_load(case.read_text())
    options = _options(spec.get("options"))
    desired = DesiredObject(spec["desired"], Provenance(f"fixtures/{case.name}"))
    live_before = copy.deepcopy(spec["live"])
    change = plan_object(desired, spec["live"], options)
    expect = spec["expect"]
    explain = f"{spec['description']}\n{change}"

    assert change.action.value == expect["action"], explain
    assert spec["live"] == live_before, "planning must not modify the live object"
    if "force" in expect:
        assert change.force is expect["force"], explain
    if "changed" in expect:
        assert sorted(render_path(p) for p in change.changed) == sorted(expect["changed"]), explain
    if "released" in expect:
        assert [[render_path(p), removed] for p, removed in change.released] == expect["released"], explain
    if "conflicts" in expect:
        got = sorted([render_path(c.path), c.manager, c.resolution.value] for c in change.conflicts)
        assert got == sorted(expect["conflicts"]), explain
    if "body" in expect:
        assert change.body == expect["body"], explain
    if "operations" in expect:
        assert list(change.operations) == expect["operations"], explain
    for path in expect.get("body_lacks", ()):
        assert change.body is not None and path not in _paths(change.body), explain
    for path in expect.get("body_has", ()):
        assert change.body is not None and path in _paths(change.body), explain
    if "reason_contains" in expect:
        assert expect["reason_contains"] in change.reason, explain
    for pointer, value in (expect.get("expected_has") or {}).items():
        assert _pointer_get(expected_object(desired, spec["live"], options), pointer) == value
    for secret in expect.get("secret_values_absent", ()):
        assert secret not in repr(change) and secret not in json.dumps(change.operations), explain
    if change.action in (Action.UPDATE, Action.CONFLICT, Action.NOOP, Action.SKIP) and spec["live"]:
        assert change.uid == spec["live"]["metadata"]["uid"]
        assert change.resource_version == spec["live"]["metadata"]["resourceVersion"]
    assert change.provenance == desired.provenance


def test_a_secret_body_is_masked_and_request_body_restores_it() -> None:
    spec = yaml.safe_load((FIXTURES / "update-secret-masked.yaml").read_text())
    desired = DesiredObject(spec["desired"], Provenance("s.yaml"))
    change = plan_object(desired, spec["live"], _options(None))
    assert change.body is not None
    assert set(change.body["data"].values()) == {"***"}
    assert "stringData" not in change.body  # folded into data: a masked body sent by mistake fails (base64)
    real = request_body(change, desired)
    assert real is not None and real["data"] == {"password": "aHVudGVyMi1uZXc=", "user": "YWRtaW4="}
    assert change.body["data"]["password"] == "***", "request_body must not unmask the plan"


def test_decrypted_fields_of_any_kind_are_masked_in_the_plan_and_request_body_restores_them() -> None:
    spec = yaml.safe_load((FIXTURES / "update-decrypted-configmap-masked.yaml").read_text())
    desired = DesiredObject(spec["desired"], Provenance("c.yaml"))
    for live in (spec["live"], None):  # an update, and a create
        change = plan_object(desired, live, _options(None))
        assert change.body is not None
        assert change.body["data"] == {"token": "***", "dsn": "***", "level": "debug"}
        real = request_body(change, desired)
        assert real is not None and real["data"] == spec["desired"]["data"]
        assert change.body["data"]["token"] == "***", "request_body must not unmask the plan"


def test_plan_gives_each_object_one_change_and_skips_unknown_live_state() -> None:
    base = yaml.safe_load((FIXTURES / "noop-foreign-label-kept.yaml").read_text())
    a = DesiredObject(base["desired"], Provenance("a.yaml"))
    other = copy.deepcopy(base["desired"])
    other["metadata"]["name"] = "api"
    b = DesiredObject(other, Provenance("b.yaml"))
    result = plan("c1", "abc", [a, b], {a.key: base["live"]}, _options(None))
    assert [c.action for c in result.changes] == [Action.NOOP, Action.SKIP]
    assert "unknown" in result.changes[1].reason
    assert result.summary()["noop"] == 1 and not result.has_changes


# ---------------------------------------------------------------------------
# The invariant (docs/safety.md rule 4): no change touches a path that is neither in Git nor ours.

_NAMES = st.sampled_from(["app", "team", "tier", "a.b/c", "x:y"])
_VALUES = st.sampled_from(["1", "2", "web", ""])
_MANAGERS = [
    (MANAGER, "Apply", ""),
    ("kubectl-edit", "Update", ""),
    ("kube-controller-manager", "Update", "scale"),
    ("helm", "Update", ""),
    ("argocd-controller", "Apply", ""),
]


@st.composite
def _deployment(draw: st.DrawFn) -> Manifest:
    containers = []
    for name in draw(st.lists(st.sampled_from(["app", "sidecar", "init"]), unique=True, max_size=2)):
        c: dict[str, Any] = {"name": name, "image": draw(st.sampled_from(["nginx:1", "nginx:2"]))}
        if draw(st.booleans()):
            c["env"] = [
                {"name": n, "value": draw(_VALUES)}
                for n in draw(st.lists(st.sampled_from(["A", "B"]), unique=True, max_size=2))
            ]
        if draw(st.booleans()):
            c["resources"] = {"limits": {"cpu": draw(st.sampled_from(["1", "1000m", "500m", 2]))}}
        containers.append(c)
    spec: dict[str, Any] = {"template": {"spec": {"containers": containers}}}
    if draw(st.booleans()):
        spec["replicas"] = draw(st.integers(0, 4))
    meta: dict[str, Any] = {"name": "web", "namespace": "shop"}
    meta["labels"] = draw(st.dictionaries(_NAMES, _VALUES, max_size=3))
    if draw(st.booleans()):
        meta["annotations"] = draw(st.dictionaries(_NAMES, _VALUES, max_size=2))
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


@st.composite
def _triple(draw: st.DrawFn) -> tuple[Manifest, Manifest, PlanOptions]:
    desired, live = draw(_deployment()), draw(_deployment())
    node = root_node(None, "apps", "v1", "Deployment")
    live_paths = sorted(manifest_paths(live, node) | prefixes(manifest_paths(live, node)))
    stale = sorted(manifest_paths(desired, node))  # entries may claim paths live no longer has
    entries: list[dict[str, Any]] = []
    for manager, operation, sub in _MANAGERS:
        owned: set[tuple[str, ...]] = (
            draw(st.sets(st.sampled_from(live_paths + stale))) if live_paths else set()
        )
        keep: bool = draw(st.booleans())
        if owned and keep:
            entries.append(
                {
                    "manager": manager,
                    "operation": operation,
                    "subresource": sub,
                    "apiVersion": "apps/v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": encode_fields_v1(owned),
                }
            )
    live["metadata"].update(uid="u", resourceVersion="1", managedFields=[e for e in entries if e])
    adopt = draw(st.sampled_from(["always", "if-unowned"]))
    return desired, live, PlanOptions(MANAGER, DEFAULT_CONFLICT_RULES, None, adopt)


def _value_at(doc: Any, path: tuple[str, ...], node: Node) -> Any:
    """The value at a field path, or a sentinel when absent."""
    for element in path:
        if element.startswith("f:") and isinstance(doc, dict) and element[2:] in doc:
            doc, node = doc[element[2:]], node.field(element[2:])
        elif isinstance(doc, list):
            info = node.list_info()
            found = [it for i, it in enumerate(doc) if item_element(info, it, i) == element]
            if not found:
                return "<absent>"
            doc, node = found[0], node.item()
        else:
            return "<absent>"
    return doc


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_triple())
def test_no_change_touches_a_path_neither_in_git_nor_ours(
    triple: tuple[Manifest, Manifest, PlanOptions],
) -> None:
    desired, live, options = triple
    node = root_node(None, "apps", "v1", "Deployment")
    ours = next(
        (
            e
            for e in live["metadata"]["managedFields"]
            if e["manager"] == MANAGER and e["operation"] == "Apply"
        ),
        None,
    )
    owned = decode_fields_v1(ours["fieldsV1"]) if ours else frozenset()
    git = manifest_paths(desired, node)
    allowed = git | prefixes(git) | owned | prefixes(owned)

    def permitted(path: tuple[str, ...]) -> bool:
        # Declaring or owning a leaf (an atomic value) covers everything inside it.
        return path in allowed or any(path[:i] in git or path[:i] in owned for i in range(1, len(path)))

    change = plan_object(DesiredObject(desired, Provenance("p.yaml")), copy.deepcopy(live), options)
    touched = set(change.changed) | {p for p, _ in change.released} | {c.path for c in change.conflicts}
    touched |= set(change.declared)
    if change.body is not None:
        touched |= manifest_paths(change.body, node)
    assert all(permitted(p) for p in touched), [p for p in touched if not permitted(p)]
    if change.action is Action.UPDATE:
        # The rendered operations, applied to live, leave every other path's value untouched.
        after = jsonpatch.apply_patch(for_report(live), list(change.operations))
        for path in manifest_paths(live, node):
            if not permitted(path):
                assert _value_at(after, path, node) == _value_at(live, path, node), render_path(path)
    else:
        assert change.operations == () or change.action is Action.CREATE


# ---------------------------------------------------------------------------
# Speed: unchanged objects are decided locally, with no request at all.


_CLIENT_MODULES = {"kubernetes", "urllib3", "requests", "httpx", "http", "socket", "subprocess"}


def _unchanged(i: int) -> tuple[DesiredObject, Manifest]:
    manifest: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"web-{i}", "namespace": f"ns-{i % 50}", "labels": {"app": f"web-{i}"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": f"web-{i}"}},
            "template": {
                "metadata": {"labels": {"app": f"web-{i}"}},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "nginx:1.27",
                            "ports": [{"containerPort": 80}],
                            "env": [{"name": "MODE", "value": "prod"}],
                            "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                        }
                    ]
                },
            },
        },
    }
    node = root_node(SCHEMA, "apps", "v1", "Deployment")
    live = copy.deepcopy(manifest)
    live["metadata"].update(
        uid=f"uid-{i}",
        resourceVersion=str(i),
        managedFields=[
            {
                "manager": MANAGER,
                "operation": "Apply",
                "apiVersion": "apps/v1",
                "fieldsType": "FieldsV1",
                "fieldsV1": encode_fields_v1(manifest_paths(manifest, node)),
            },
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "subresource": "status",
                "apiVersion": "apps/v1",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:replicas": {}, "f:readyReplicas": {}}},
            },
        ],
    )
    live["status"] = {"replicas": 2, "readyReplicas": 2}
    key = ObjectKey.of(manifest)
    assert key
    return DesiredObject(manifest, Provenance(f"apps/web-{i}.yaml")), live


def test_planning_5000_unchanged_objects_is_local_and_fast(
    monkeypatch: pytest.MonkeyPatch, record_property: Any
) -> None:
    pairs = [_unchanged(i) for i in range(5000)]
    desired = [d for d, _ in pairs]
    live = {d.key: lv for d, lv in pairs}

    # Pure by construction: the module imports no client, and any socket use would fail the test.
    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the plan stage opened a network connection")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    for source in sorted(Path(plan_module.__file__).parent.glob("*.py")):
        tree = ast.parse(source.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        clients = {m for m in imported if m.split(".")[0] in _CLIENT_MODULES or m.startswith("agent.kube")}
        assert not clients, f"{source} imports {clients}"

    options = PlanOptions(MANAGER, DEFAULT_CONFLICT_RULES, SCHEMA)
    started = time.perf_counter()
    result = plan("bench", "abc", desired, live, options)
    elapsed = time.perf_counter() - started

    assert result.summary()["noop"] == 5000, result.summary()
    record_property("plan_5000_unchanged_seconds", round(elapsed, 3))
    print(
        f"\nplanned 5,000 unchanged objects in {elapsed:.2f}s ({elapsed / 5:.2f} ms/object)", file=sys.stderr
    )
    assert elapsed < 30, f"planning 5,000 unchanged objects took {elapsed:.1f}s"


def test_an_update_reason_names_the_changed_paths_and_where_inside_atomic_values() -> None:
    base = yaml.safe_load((FIXTURES / "noop-foreign-label-kept.yaml").read_text())
    desired = copy.deepcopy(base["desired"])
    desired["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:1.28"
    desired["spec"]["selector"]["matchLabels"]["tier"] = "web"
    desired["metadata"]["labels"].pop("app")
    change = plan_object(DesiredObject(desired, Provenance("d.yaml")), base["live"], _options(None))
    assert change.action is Action.UPDATE
    assert "changed: spec.selector (matchLabels.tier), spec.template.spec.containers[name=app].image" in (
        change.reason
    ), change.reason
    assert "released: metadata.labels.app" in change.reason, change.reason


def test_a_long_list_of_changed_paths_is_truncated() -> None:
    from agent.plan.fields import name_list

    assert name_list([f"data.k{i}" for i in range(10)]) == "data.k0, data.k1, data.k2, data.k3 and 6 more"
    assert name_list(["x" * 150, "y" * 150]) == "x" * 150 + " and 1 more"


@pytest.mark.parametrize(
    ("first", "then", "resolution"),
    [("yield", "force", "yield"), ("force", "yield", "force")],
    ids=["yield-then-force", "force-then-yield"],
)
def test_the_first_matching_conflict_rule_decides(first: str, then: str, resolution: str) -> None:
    # kubectl-edit (Update, no subresource) owns the image Git changes back; both rules match it.
    spec = yaml.safe_load((FIXTURES / "update-kubectl-drift-forced.yaml").read_text())
    desired = copy.deepcopy(spec["desired"])
    desired["spec"]["replicas"] = 4  # ours, uncontested: the body is sent either way
    rules = (
        ConflictRule(manager="kubectl-edit", operation="Update", action=first),
        ConflictRule(manager="kubectl-*", action=then),
    )
    options = PlanOptions(MANAGER, rules, SCHEMA)
    change = plan_object(DesiredObject(desired, Provenance("d.yaml")), spec["live"], options)

    image = "spec.template.spec.containers[name=app].image"
    assert [(render_path(c.path), c.manager, c.resolution.value) for c in change.conflicts] == [
        (image, "kubectl-edit", resolution)
    ], change
    assert change.action is Action.UPDATE and change.body is not None, change
    assert change.body["spec"]["replicas"] == 4
    assert change.force is (resolution == "force"), change
    assert (image in _paths(change.body)) is (resolution == "force"), change.body
