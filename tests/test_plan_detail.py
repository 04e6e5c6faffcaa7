"""The reconcile pass plans with ``detail=False``: the same verdicts, without the report's extras.

Cases are the plan fixtures (create, noop, update, yielded and forced conflicts, Secrets,
ignore-fields, adoption, skips), each also planned as a create, and with an ignored path
another manager holds; every one is planned both ways and must agree on everything the
apply stage reads.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.model import IGNORE_FIELDS, Action, Change, DesiredObject, Manifest, Provenance
from agent.plan.planner import plan_object, request_body, send_body
from tests.test_plan import CASES, _options


def _verdict(change: Change) -> dict[str, Any]:
    """Everything of a change but the report's extras (operations, declared, changed)."""
    out = dataclasses.asdict(change)
    for extra in ("operations", "declared", "changed"):
        out.pop(extra)
    return out


def _variants(spec: dict[str, Any]) -> list[tuple[str, Manifest, Manifest | None]]:
    desired, live = spec["desired"], spec["live"]
    out = [("as written", desired, live), ("as a create", desired, None)]
    ignoring = copy.deepcopy(desired)
    annotations = ignoring.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[IGNORE_FIELDS] = "/metadata/labels"
    out.append(("ignoring labels", ignoring, live))
    return out


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_planning_without_detail_gives_the_same_verdict(case: Path) -> None:
    spec = yaml.safe_load(case.read_text())
    for name, manifest, live in _variants(spec):
        desired = DesiredObject(manifest, Provenance(f"fixtures/{case.name}"))
        full = plan_object(desired, copy.deepcopy(live), _options(spec.get("options"), detail=True))
        lean = plan_object(desired, copy.deepcopy(live), _options(spec.get("options"), detail=False))
        assert _verdict(lean) == _verdict(full), f"{case.stem} ({name})"
        assert request_body(lean, desired) == request_body(full, desired), f"{case.stem} ({name})"
        assert lean.operations == (), f"{case.stem} ({name}): no report operations without detail"
        if lean.action is Action.CREATE:
            assert not lean.declared and not lean.changed and full.declared and full.operations


def test_the_verdicts_cover_every_kind_of_case() -> None:
    seen: set[str] = set()
    for case in CASES:
        spec = yaml.safe_load(case.read_text())
        for _name, manifest, live in _variants(spec):
            change = plan_object(DesiredObject(manifest, Provenance("x")), live, _options(None, detail=False))
            seen.add(change.action.value)
            seen.update(c.resolution.value for c in change.conflicts)
            if change.force:
                seen.add("force")
            if change.released:
                seen.add("released")
    assert {"create", "noop", "update", "conflict", "skip", "yield", "force", "released"} <= seen, seen


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_planning_never_writes_into_gits_manifest(case: Path) -> None:
    spec = yaml.safe_load(case.read_text())
    for name, manifest, live in _variants(spec):
        desired = DesiredObject(manifest, Provenance("x"))
        before = copy.deepcopy(manifest)
        for detail in (True, False):
            options = _options(spec.get("options"), detail=detail)
            change = plan_object(desired, copy.deepcopy(live), options)
            request_body(change, desired)
            send_body(desired, copy.deepcopy(live), options)
        assert manifest == before, f"{case.stem} ({name})"


def test_a_manifest_with_nothing_to_remove_is_sent_as_it_is_not_copied() -> None:
    manifest: Manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "ns"},
        "data": {"k": "v"},
    }
    desired = DesiredObject(manifest, Provenance("c.yaml"))
    assert plan_object(desired, None, _options(None, detail=False)).body is manifest
    with_status = {**manifest, "status": {"x": 1}, "metadata": {**manifest["metadata"], "uid": "u"}}
    change = plan_object(DesiredObject(with_status, Provenance("c.yaml")), None, _options(None, detail=False))
    body = change.body
    assert body == manifest and "status" in with_status and "uid" in with_status["metadata"]
