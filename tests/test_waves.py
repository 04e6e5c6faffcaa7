"""Sync waves in the pass, on a real API server (docs/ordering.md).

An app whose objects carry ``argocd.argoproj.io/sync-wave`` is applied wave by wave: a wave is
applied only once every object of the wave before is healthy (a Job complete), read from the
server. Without a kubelet or Job controller here, the test writes the Job's status through the
status subresource as the Job controller would (``tests.rollout.finish_job``); with simulated
Pods only those writes go. Creation order is read back from the server (``resourceVersion``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.kube.client import KubeClient
from agent.model import FailureReason, Health, HealthState, ObjectKey, Outcome, PassState, Stage, Step
from agent.plan.health_tracker import Tracker
from agent.reconcile.waves import WAVE_POLL_FIRST, WaveAt, Waves, _Track
from agent.run.due import DueReason, Timing
from tests.agentkit import E2E, make_repo, manifests, write_config
from tests.clusters import ClusterPool
from tests.rollout import finish_job


def cm(ns: str, name: str, wave: int | None = None) -> str:
    notes = f"  annotations:\n    argocd.argoproj.io/sync-wave: '{wave}'\n" if wave is not None else ""
    meta = f"metadata:\n  name: {name}\n  namespace: {ns}\n{notes}"
    return f"apiVersion: v1\nkind: ConfigMap\n{meta}data:\n  k: v\n"


def job(ns: str, name: str) -> str:
    return f"""
    apiVersion: batch/v1
    kind: Job
    metadata:
      name: {name}
      namespace: {ns}
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: migrate
              image: registry.example.com/migrate:7
    """


def files(ns: str, *docs: str) -> dict[str, str]:
    # In the first wave: its objects' waves are applied in it (Argo CD does the same).
    wave = "  annotations:\n    argocd.argoproj.io/sync-wave: '-5'\n"
    namespace = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n{wave}"
    return {"clusters/pool-a/app.yaml": manifests(namespace, *docs)}


def versions(client: KubeClient, ns: str) -> dict[str, int]:
    """Each object of ``ns`` by name → the resourceVersion it was created at (creation order)."""
    out: dict[str, int] = {}
    for path in (f"/api/v1/namespaces/{ns}/configmaps", f"/apis/batch/v1/namespaces/{ns}/jobs"):
        for item in client.request("GET", path)["items"]:
            name = item["metadata"]["name"]
            if name != "kube-root-ca.crt":
                out[name] = int(item["metadata"]["resourceVersion"])
    return out


@pytest.mark.cluster
def test_waves_a_wave_is_applied_only_once_the_one_before_is_healthy_and_the_prune_runs_last_wave_first(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("waves")
    docs = (cm(ns, "first", -1), job(ns, "migrate"), cm(ns, "middle", 1), cm(ns, "last", 2))
    repo = make_repo(tmp_path, files(ns, *docs))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    client = agent.fleet.reconcilers["pool-a"].client

    # Wave -1 is a ConfigMap (healthy at once); wave 0's Job has not completed: the pass ends there.
    r = agent.reconcile()["pool-a"]
    assert r.state is PassState.SYNCING and r.ok, (r.error, r.results)
    assert r.wave_wait is not None and (r.wave_wait.step, r.wave_wait.index, r.wave_wait.steps) == (
        "wave 0",
        3,
        5,
    )
    assert r.wave_wait.blocker is not None and r.wave_wait.blocker.name == "migrate"
    assert set(versions(client, ns)) == {"first", "migrate"}
    row = agent.fleet.status["pool-a"].rows()[0]
    assert row["state"] == "syncing" and row["wave"]["blocker"] == f"Job.batch/{ns}/migrate"
    # The scheduler looks again within seconds, not at the next interval.
    decision = agent.fleet.schedule("pool-a", agent.revision(), Timing(1.0, 60.0, 0.0))
    assert decision.wake is not None and decision.wake.reason is DueReason.WAVE

    # A second pass before the Job completed sends nothing and still waits for it.
    again = agent.reconcile()["pool-a"]
    assert again.state is PassState.SYNCING and not again.applied
    assert set(versions(client, ns)) == {"first", "migrate"}

    finish_job(client, ns, "migrate")
    r = agent.reconcile()["pool-a"]
    assert r.state is PassState.OK, (r.error, r.wave_wait)
    created = versions(client, ns)
    assert sorted(created, key=created.__getitem__) == ["first", "migrate", "middle", "last"]

    # Objects leaving Git are pruned after the last wave, the latest wave first.
    repo.commit(files(ns, job(ns, "migrate"), cm(ns, "middle", 1)))
    r = agent.reconcile()["pool-a"]
    assert r.state is PassState.OK, (r.error, r.wave_wait)
    assert [x.key.name for x in r.results if x.outcome is Outcome.PRUNED] == ["last", "first"]


@pytest.mark.cluster
def test_waves_a_failed_job_fails_the_app_naming_it_and_nothing_of_a_later_wave_is_applied(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("waves")
    repo = make_repo(tmp_path, files(ns, job(ns, "migrate"), cm(ns, "after", 1)))
    config = write_config(tmp_path, repo, {"pool-a": a}, defaults='health_debounce = "0s"')
    agent = e2e.agent(config)
    client = agent.fleet.reconcilers["pool-a"].client
    assert agent.reconcile()["pool-a"].state is PassState.SYNCING

    finish_job(client, ns, "migrate", failed=True)
    r = agent.reconcile()["pool-a"]
    assert r.state is PassState.FAILED and r.failure is not None and r.failure.reason is FailureReason.WAVE
    assert f"Job.batch/{ns}/migrate" in r.failure.message and "BackoffLimitExceeded" in r.failure.message
    assert "later waves and the prune were not done" in r.failure.message
    assert set(versions(client, ns)) == {"migrate"}


@pytest.mark.cluster
def test_waves_a_wave_that_outlives_wave_timeout_fails_naming_what_it_waited_for(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("waves")
    repo = make_repo(tmp_path, files(ns, job(ns, "migrate"), cm(ns, "after", 1)))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, defaults='wave_timeout = "1s"'))
    assert agent.reconcile()["pool-a"].state is PassState.SYNCING
    time.sleep(1.2)
    r = agent.reconcile()["pool-a"]
    assert r.failure is not None and r.failure.reason is FailureReason.WAVE, (r.state, r.wave_wait)
    assert "wave 0 (2 of 3) did not become healthy" in r.failure.message and "after 1s" in r.failure.message


@pytest.mark.cluster
def test_waves_run_once_goes_on_with_a_waiting_wave_until_the_sync_is_through(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("waves")
    repo = make_repo(tmp_path, files(ns, job(ns, "migrate"), cm(ns, "after", 1)))
    config = write_config(tmp_path, repo, {"pool-a": a})
    client = KubeClient.from_config(config.cluster("pool-a"))
    e2e.at_end(client.close)

    def complete_when_created() -> None:  # the Job controller's part, once the pass created the Job
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if client.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs")["items"]:
                finish_job(client, ns, "migrate")
                return
            time.sleep(0.2)

    controller = threading.Thread(target=complete_when_created, daemon=True)
    controller.start()
    once = CliRunner().invoke(main, ["run", "--once", "--config", config.file], catch_exceptions=False)
    controller.join(timeout=30)
    assert once.exit_code == 0, once.output
    assert set(versions(client, ns)) == {"migrate", "after"}


def test_waves_look_again_a_tenth_of_a_second_after_the_first_look_doubling_and_at_1_s_after_a_change() -> (
    None
):
    a, b = (ObjectKey("apps", "Deployment", "shop", n) for n in "ab")
    track = _Track("rev", ("sync", 0), Tracker(started=0.0, timeout=300.0, debounce=30.0, keys=[a, b]))
    at = WaveAt(cast(Any, None), "rev", "id", Step(Stage.SYNC, 0, ()), 1, 2)
    rolling, done = Health(HealthState.IN_PROGRESS, "rolling"), Health(HealthState.CURRENT, "ok")

    def recheck(report: dict[ObjectKey, Health], now: float) -> float:
        pending = [k for k, h in report.items() if h.state is not HealthState.CURRENT]
        return Waves._wait(track, at, report, pending, now).recheck

    # A short rollout is seen through soon after the wave's apply; nothing changing, twice as late.
    assert [recheck({a: rolling, b: rolling}, t) for t in (0.0, 0.1, 0.3)] == [WAVE_POLL_FIRST, 0.2, 0.4]
    # A change seen later starts again at 1 s, as a health wait does (never more passes than that).
    assert recheck({a: done, b: rolling}, 0.7) == 1.0
    assert recheck({a: done, b: rolling}, 1.7) == 2.0
