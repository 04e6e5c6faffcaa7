"""Argo CD hooks in the pass, on a real API server (docs/ordering.md).

``PreSync`` hooks run before anything else of the app is written, ``PostSync`` ones once the
last wave is healthy; a hook runs once per revision (a second pass runs none), is never a member
of the app's inventory, and ``HookSucceeded`` deletes it once it succeeded. A ``generateName``
hook is created with a POST. A failing ``PreSync`` hook stops the sync before the app's objects
and inventory are written, and the app's ``SyncFail`` hooks run. The ``pods`` cluster runs the
hook Jobs on simulated Pods (an image tagged ``:fail`` exits 1); a hook the test looks at while it
waits holds its Pod with a scheduling gate until the test removes it (``tests.rollout.release``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli.diff import diff
from agent.kube.client import KubeClient
from agent.model import HOOK_OF, HOOKS_RAN, FailureReason, Outcome, PassState
from tests.agentkit import E2E, make_repo, manifests, write_config
from tests.clusters import TestNamespace
from tests.rollout import HOLD_GATE, release
from tests.waiting import wait_for

JOB_SECONDS = 60.0


def hook_job(
    ns: str,
    name: str,
    hook: str,
    policy: str = "",
    *,
    generate: bool = False,
    held: bool = False,
    tag: str = "1",
) -> str:
    """A hook Job; ``held``: its Pod waits for ``release``; ``tag="fail"``: it exits 1 (no retry)."""
    naming = f"generateName: {name}-" if generate else f"name: {name}"
    delete = f"\n        argocd.argoproj.io/hook-delete-policy: {policy}" if policy else ""
    gates = f"\n          schedulingGates: [{{name: {HOLD_GATE}}}]" if held else ""
    return f"""
    apiVersion: batch/v1
    kind: Job
    metadata:
      {naming}
      namespace: {ns}
      annotations:
        argocd.argoproj.io/hook: {hook}{delete}
    spec:
      backoffLimit: 0
      template:
        spec:
          restartPolicy: Never{gates}
          containers:
            - name: run
              image: registry.example.com/{name}:{tag}
    """


def cm(ns: str, name: str, wave: int = 0, hook: str = "") -> str:
    notes = f"    argocd.argoproj.io/sync-wave: '{wave}'\n"
    if hook:
        notes += f"    argocd.argoproj.io/hook: {hook}\n"
    meta = f"metadata:\n  name: {name}\n  namespace: {ns}\n  annotations:\n{notes}"
    return f"apiVersion: v1\nkind: ConfigMap\n{meta}data:\n  k: v\n"


def files(*docs: str) -> dict[str, str]:
    return {"clusters/pods/app.yaml": manifests(*docs)}


def listed(client: KubeClient, ns: str, kind: str) -> dict[str, dict[str, Any]]:
    path = {"Job": f"/apis/batch/v1/namespaces/{ns}/jobs", "ConfigMap": f"/api/v1/namespaces/{ns}/configmaps"}
    items = client.request("GET", path[kind])["items"]
    return {i["metadata"]["name"]: i for i in items if i["metadata"]["name"] != "kube-root-ca.crt"}


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def run_to(client: KubeClient, ns: str, name: str, condition: str = "Complete") -> None:
    """Release the held Pods of ``ns`` (if any) and wait for Job ``name`` to meet ``condition``."""

    def met() -> bool:
        release(client, ns)
        got = client.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
        conditions = got.get("status", {}).get("conditions") or []
        return any(c["type"] == condition and c["status"] == "True" for c in conditions)

    wait_for(f"Job {name}: {condition}", met, JOB_SECONDS)


@pytest.mark.cluster
def test_hooks_run_in_their_phase_once_per_revision_never_as_members_and_hook_succeeded_ones_are_deleted(
    tmp_path: Path, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    repo = make_repo(tmp_path, files())
    agent = e2e.agent(write_config(tmp_path, repo, {"pods": pods_namespace.cluster}))
    client = agent.fleet.reconcilers["pods"].client
    ns = pods_namespace.name
    repo.commit(
        files(
            hook_job(ns, "migrate", "PreSync", "HookSucceeded", held=True),
            cm(ns, "app"),
            cm(ns, "later", 1),
            hook_job(ns, "smoke", "PostSync", "HookSucceeded", generate=True, held=True),
        )
    )

    # The diff report lists the sync's steps in the order they would run (and creates no hook).
    report = CliRunner().invoke(
        diff, ["--config", agent.config.file, "--format", "json"], catch_exceptions=False
    )
    (app,) = [a for c in json.loads(report.stdout)["clusters"] for a in c["apps"]]
    assert [line.split(":")[0] for line in app["sync"]] == [
        "pre-sync hooks (wave 0)",
        "wave 0",
        "wave 1",
        "post-sync hooks (wave 0)",
    ]
    assert f"Job.batch/{ns}/migrate (argocd hook)" in app["sync"][0] and not listed(client, ns, "Job")

    # PreSync first: nothing else of the app written, not even its inventory.
    r = agent.reconcile()["pods"]
    assert r.state is PassState.SYNCING, (r.error, r.results)
    assert r.wave_wait is not None and r.wave_wait.step == "pre-sync hooks (wave 0)"
    jobs = listed(client, ns, "Job")
    assert set(jobs) == {"migrate"} and jobs["migrate"]["metadata"]["labels"][HOOK_OF]
    assert not listed(client, ns, "ConfigMap") and not agent.tracked("pods")
    migrate, migrate_uid = rv(jobs["migrate"]), jobs["migrate"]["metadata"]["uid"]

    # A pass before it completed creates nothing again.
    again = agent.reconcile()["pods"]
    assert again.state is PassState.SYNCING and not again.applied, again.results
    # (The same object: its Job controller writes its status meanwhile, so not its resourceVersion.)
    assert listed(client, ns, "Job")["migrate"]["metadata"]["uid"] == migrate_uid

    run_to(client, ns, "migrate")
    r = agent.reconcile()["pods"]
    assert r.state is PassState.SYNCING and r.wave_wait is not None, (r.error, r.results)
    assert r.wave_wait.step == "post-sync hooks (wave 0)"
    jobs, maps = listed(client, ns, "Job"), listed(client, ns, "ConfigMap")
    assert "migrate" not in jobs  # HookSucceeded
    (smoke,) = [n for n in jobs if n.startswith("smoke-")]  # generateName: named by the server
    assert migrate < rv(maps["app"]) < rv(maps["later"]) < rv(jobs[smoke])

    run_to(client, ns, smoke)
    r = agent.reconcile()["pods"]
    assert r.state is PassState.OK, (r.error, r.results)
    assert not listed(client, ns, "Job")
    assert {k.name for k in agent.tracked("pods")} == {"app", "later"}  # hooks are never members
    parents = listed(client, agent.config.agent.namespace, "ConfigMap")  # the app's inventory parent
    assert any(HOOKS_RAN in (p["metadata"].get("annotations") or {}) for p in parents.values()), parents

    # The same revision again: no hook runs.
    r = agent.reconcile()["pods"]
    assert r.state is PassState.OK and not any(x.outcome is Outcome.CREATED for x in r.results)
    assert not listed(client, ns, "Job")


@pytest.mark.cluster
def test_hooks_a_failing_presync_hook_stops_the_sync_before_any_other_write_and_syncfail_hooks_run(
    tmp_path: Path, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    repo = make_repo(tmp_path, files())
    config = write_config(tmp_path, repo, {"pods": pods_namespace.cluster}, defaults='health_debounce = "0s"')
    agent = e2e.agent(config)
    client = agent.fleet.reconcilers["pods"].client
    ns = pods_namespace.name
    repo.commit(
        files(
            hook_job(ns, "migrate", "PreSync", tag="fail"),
            cm(ns, "app"),
            cm(ns, "sync-failed", hook="SyncFail"),
        )
    )
    assert agent.reconcile()["pods"].state is PassState.SYNCING

    run_to(client, ns, "migrate", "Failed")
    r = agent.reconcile()["pods"]
    assert r.failure is not None and r.failure.reason is FailureReason.HOOK, (r.state, r.results)
    assert f"hook Job.batch/{ns}/migrate" in r.failure.message and "BackoffLimitExceeded" in r.failure.message
    maps = listed(client, ns, "ConfigMap")
    assert "app" not in maps and not agent.tracked("pods")
    assert maps["sync-failed"]["metadata"]["labels"][HOOK_OF]  # the SyncFail hook ran
    # The default policy, BeforeHookCreation, keeps the failed Job until the hook runs again.
    failed = listed(client, ns, "Job")["migrate"]

    # Its retry runs the PreSync hook again: the failed Job deleted, a new one created.
    r = agent.reconcile()["pods"]
    assert r.state is PassState.SYNCING, (r.error, r.results)
    assert listed(client, ns, "Job")["migrate"]["metadata"]["uid"] != failed["metadata"]["uid"]
