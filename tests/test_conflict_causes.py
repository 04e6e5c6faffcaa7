"""A 409 names owners the object does not show; the conflict rules decide them in the same pass.

After managedFields were cleared (the documented JSON patch, or a restore or
migration leaving the same state), the object lists no managers, so the plan
predicts no conflict; the server then synthesises ``before-first-apply`` for
every field present and refuses a change to any of them. The re-plan reads the
owners from the 409's ``FieldManagerConflict`` causes (docs/safety.md rule 5): the default
rules force over ``before-first-apply``; a rule yielding to it keeps its field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.model import PART_OF, ApplyResult, ClusterResult, Outcome
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import TestNamespace, kubectl

pytestmark = pytest.mark.cluster

#: The documented way to strip managedFields (restores and migrations leave the same state).
CLEAR_MANAGED_FIELDS = json.dumps([{"op": "replace", "path": "/metadata/managedFields", "value": [{}]}])


def configmap(ns: str, data: dict[str, str]) -> dict[str, str]:
    doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": ns}}
    return {"clusters/pool-a/settings.yaml": json.dumps({**doc, "data": data})}


def live(kubeconfig: Path, ns: str) -> dict[str, Any]:
    out = kubectl(kubeconfig, "get", "configmap", "settings", "-n", ns, "-o", "json", "--show-managed-fields")
    return json.loads(out)  # type: ignore[no-any-return]


def managers(obj: dict[str, Any]) -> set[tuple[str, str]]:
    return {(e["manager"], e["operation"]) for e in obj["metadata"].get("managedFields") or ()}


def the_configmap(result: ClusterResult) -> ApplyResult:
    (res,) = [r for r in result.results if r.key.kind == "ConfigMap" and r.key.name == "settings"]
    return res


def strip_after_foreign_writes(kubeconfig: Path, ns: str) -> None:
    """A label and a data key by kubectl, then managedFields cleared: nobody is shown as owner."""
    kubectl(kubeconfig, "label", "configmap", "settings", "-n", ns, "team=payments")
    theirs = json.dumps({"data": {"theirs": "keep"}})
    kubectl(kubeconfig, "patch", "configmap", "settings", "-n", ns, "--type=merge", "-p", theirs)
    kubectl(kubeconfig, "patch", "configmap", "settings", "-n", ns, "--type=json", "-p", CLEAR_MANAGED_FIELDS)
    assert managers(live(kubeconfig, ns)) == set()


def test_drift_versus_cooperation_cleared_managed_fields_and_a_git_change_converge_in_the_same_pass(
    tmp_path: Path, namespace: TestNamespace, e2e: E2E
) -> None:
    ns, kc = namespace.name, namespace.cluster.kubeconfig
    repo = make_repo(tmp_path, configmap(ns, {"k": "v1"}))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": namespace.cluster}))
    ours = agent.config.agent.name
    assert the_configmap(agent.reconcile()["pool-a"]).outcome is Outcome.CREATED
    strip_after_foreign_writes(kc, ns)
    repo.commit(configmap(ns, {"k": "v2"}))

    res = the_configmap(agent.reconcile()["pool-a"])
    assert res.outcome is Outcome.CONFIGURED, res
    assert "data.k held by before-first-apply (Update): force" in res.message
    after = live(kc, ns)
    assert after["data"] == {"k": "v2", "theirs": "keep"}
    assert after["metadata"]["labels"]["team"] == "payments" and PART_OF in after["metadata"]["labels"]
    assert (ours, "Apply") in managers(after)
    ours_entry = next(e for e in after["metadata"]["managedFields"] if e["manager"] == ours)
    assert "f:k" in ours_entry["fieldsV1"]["f:data"]
    # Converged: the next pass has nothing to send.
    assert the_configmap(agent.reconcile()["pool-a"]).outcome is Outcome.UNCHANGED


def test_drift_versus_cooperation_a_named_owner_matching_a_yield_rule_keeps_its_field_and_the_rest_applies(
    tmp_path: Path, namespace: TestNamespace, e2e: E2E
) -> None:
    ns, kc = namespace.name, namespace.cluster.kubeconfig
    repo = make_repo(tmp_path, configmap(ns, {"k": "v1"}))
    rules = '\n[[conflict_rules]]\nmanager = "before-first-apply"\naction = "yield"\n'
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": namespace.cluster}, defaults=rules))
    ours = agent.config.agent.name
    assert the_configmap(agent.reconcile()["pool-a"]).outcome is Outcome.CREATED
    strip_after_foreign_writes(kc, ns)
    repo.commit(configmap(ns, {"k": "v2", "added": "by-git"}))

    res = the_configmap(agent.reconcile()["pool-a"])
    assert res.outcome is Outcome.CONFIGURED, res
    assert "data.k held by before-first-apply (Update): yield" in res.message
    after = live(kc, ns)
    assert after["data"] == {"k": "v1", "theirs": "keep", "added": "by-git"}
    assert after["metadata"]["labels"]["team"] == "payments"
    ours_entry = next(e for e in after["metadata"]["managedFields"] if e["manager"] == ours)
    assert "f:added" in ours_entry["fieldsV1"]["f:data"] and "f:k" not in ours_entry["fieldsV1"]["f:data"]
    # The yield now shows in managedFields: later passes yield without a 409 and send nothing.
    again = the_configmap(agent.reconcile()["pool-a"])
    assert again.outcome is Outcome.UNCHANGED and "yielded" in again.message
    assert live(kc, ns)["data"]["k"] == "v1"
