"""Sync waves in the pass, on a real API server (docs/ordering.md).

An app whose objects carry ``argocd.argoproj.io/sync-wave`` is applied wave by wave: a wave is
applied only once every object of the wave before is healthy (a Job complete), read from the
server. The ``pods`` cluster runs the Jobs (kube-scheduler, kwok, the Job controller): a Job
completes about a second after its Pod is scheduled, and fails when its image is tagged ``:fail``
(``backoffLimit: 0``). To look at a wave while it waits, a Job's Pod carries a scheduling gate
that the test removes (``tests.rollout.release``). Creation order is read back from the server:
the resourceVersion of each creation, from a watch (``tests.watchlog``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import FailureReason, Health, HealthState, ObjectKey, Outcome, PassState, Stage, Step
from agent.plan.health_tracker import Tracker
from agent.reconcile.waves import WAVE_POLL_FIRST, WaveAt, Waves, _Track
from agent.run.due import DueReason, Timing
from tests.agentkit import E2E, make_repo, manifests, write_config
from tests.rollout import HOLD_GATE, release
from tests.waiting import wait_for
from tests.watchlog import WatchLog, condition

JOB_SECONDS = 60.0


def cm(ns: str, name: str, wave: int | None = None) -> str:
    notes = f"  annotations:\n    argocd.argoproj.io/sync-wave: '{wave}'\n" if wave is not None else ""
    meta = f"metadata:\n  name: {name}\n  namespace: {ns}\n{notes}"
    return f"apiVersion: v1\nkind: ConfigMap\n{meta}data:\n  k: v\n"


def job(ns: str, name: str, *, held: bool = False, image: str = "registry.example.com/migrate:7") -> str:
    """A Job; ``held``: its Pod waits for ``release``; an image tagged ``:fail`` fails it at once."""
    gates = f"\n          schedulingGates: [{{name: {HOLD_GATE}}}]" if held else ""
    return f"""
    apiVersion: batch/v1
    kind: Job
    metadata:
      name: {name}
      namespace: {ns}
    spec:
      backoffLimit: 0
      template:
        spec:
          restartPolicy: Never{gates}
          containers:
            - name: migrate
              image: {image}
    """


def files(ns: str, *docs: str) -> dict[str, str]:
    # In the first wave: its objects' waves are applied in it (Argo CD does the same).
    wave = "  annotations:\n    argocd.argoproj.io/sync-wave: '-5'\n"
    namespace = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n{wave}"
    return {"clusters/pods/app.yaml": manifests(namespace, *docs)}


def app_namespace(e2e: E2E, cluster: LocalCluster) -> str:
    """The name of the namespace the app declares, deleted from the pods cluster after the test."""
    ns = e2e.namespace("waves")
    e2e.delete_after(cluster, "namespace", ns)
    return ns


def job_done(client: KubeClient, ns: str, name: str, condition: str = "Complete") -> bool:
    got = client.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
    conditions = got.get("status", {}).get("conditions") or []
    return any(c["type"] == condition and c["status"] == "True" for c in conditions)


def versions(client: KubeClient, ns: str) -> dict[str, int]:
    """Each object of ``ns`` by name → its resourceVersion (a Job's moves as its controller writes)."""
    out: dict[str, int] = {}
    for path in (f"/api/v1/namespaces/{ns}/configmaps", f"/apis/batch/v1/namespaces/{ns}/jobs"):
        for item in client.request("GET", path)["items"]:
            name = item["metadata"]["name"]
            if name != "kube-root-ca.crt":
                out[name] = int(item["metadata"]["resourceVersion"])
    return out


@pytest.mark.cluster
def test_waves_a_wave_is_applied_only_once_the_one_before_is_healthy_and_the_prune_runs_last_wave_first(
    tmp_path: Path, pods_cluster: LocalCluster, e2e: E2E
) -> None:
    ns = app_namespace(e2e, pods_cluster)
    docs = (cm(ns, "first", -1), job(ns, "migrate", held=True), cm(ns, "middle", 1), cm(ns, "last", 2))
    repo = make_repo(tmp_path, files(ns, *docs))
    agent = e2e.agent(write_config(tmp_path, repo, {"pods": pods_cluster}))
    client = agent.fleet.reconcilers["pods"].client
    # The Job controller writes the Job's status as it runs: its creation is read from a watch.
    log = WatchLog(
        pods_cluster, ns, ("/api/v1/namespaces/{ns}/configmaps", "/apis/batch/v1/namespaces/{ns}/jobs")
    )
    e2e.at_end(log.close)

    # Wave -1 is a ConfigMap (healthy at once); wave 0's Job has not completed: the pass ends there.
    r = agent.reconcile()["pods"]
    assert r.state is PassState.SYNCING and r.ok, (r.error, r.results)
    assert r.wave_wait is not None and (r.wave_wait.step, r.wave_wait.index, r.wave_wait.steps) == (
        "wave 0",
        3,
        5,
    )
    assert r.wave_wait.blocker is not None and r.wave_wait.blocker.name == "migrate"
    assert set(versions(client, ns)) == {"first", "migrate"}
    row = agent.fleet.status["pods"].rows()[0]
    assert row["state"] == "syncing" and row["wave"]["blocker"] == f"Job.batch/{ns}/migrate"
    # The scheduler looks again within seconds, not at the next interval.
    decision = agent.fleet.schedule("pods", agent.revision(), Timing(1.0, 60.0, 0.0))
    assert decision.wake is not None and decision.wake.reason is DueReason.WAVE

    # A second pass before the Job completed sends nothing and still waits for it.
    again = agent.reconcile()["pods"]
    assert again.state is PassState.SYNCING and not again.applied
    assert set(versions(client, ns)) == {"first", "migrate"}

    wait_for("the Job's Pod, to release it", lambda: release(client, ns), JOB_SECONDS)
    wait_for("the Job to complete", lambda: job_done(client, ns, "migrate"), JOB_SECONDS)
    r = agent.reconcile()["pods"]
    assert r.state is PassState.OK, (r.error, r.wave_wait)
    created = [e.name for e in log.events() if e.type == "ADDED" and e.name != "kube-root-ca.crt"]
    assert created == ["first", "migrate", "middle", "last"]
    assert log.first("Job", "migrate", condition("Complete")) < log.created("ConfigMap", "middle")

    # Objects leaving Git are pruned after the last wave, the latest wave first.
    repo.commit(files(ns, job(ns, "migrate", held=True), cm(ns, "middle", 1)))
    r = agent.reconcile()["pods"]
    assert r.state is PassState.OK, (r.error, r.wave_wait)
    assert [x.key.name for x in r.results if x.outcome is Outcome.PRUNED] == ["last", "first"]


@pytest.mark.cluster
def test_waves_a_failed_job_fails_the_app_naming_it_and_nothing_of_a_later_wave_is_applied(
    tmp_path: Path, pods_cluster: LocalCluster, e2e: E2E
) -> None:
    ns = app_namespace(e2e, pods_cluster)
    failing = job(ns, "migrate", image="registry.example.com/migrate:fail")  # exits 1, no retry
    repo = make_repo(tmp_path, files(ns, failing, cm(ns, "after", 1)))
    config = write_config(tmp_path, repo, {"pods": pods_cluster}, defaults='health_debounce = "0s"')
    agent = e2e.agent(config)
    client = agent.fleet.reconcilers["pods"].client
    assert agent.reconcile()["pods"].state is PassState.SYNCING

    wait_for("the Job to fail", lambda: job_done(client, ns, "migrate", "Failed"), JOB_SECONDS)
    r = agent.reconcile()["pods"]
    assert r.state is PassState.FAILED and r.failure is not None and r.failure.reason is FailureReason.WAVE
    assert f"Job.batch/{ns}/migrate" in r.failure.message and "BackoffLimitExceeded" in r.failure.message
    assert "later waves and the prune were not done" in r.failure.message
    assert set(versions(client, ns)) == {"migrate"}


@pytest.mark.cluster
def test_waves_a_wave_that_outlives_wave_timeout_fails_naming_what_it_waited_for(
    tmp_path: Path, pods_cluster: LocalCluster, e2e: E2E
) -> None:
    ns = app_namespace(e2e, pods_cluster)
    repo = make_repo(tmp_path, files(ns, job(ns, "migrate", held=True), cm(ns, "after", 1)))  # never released
    agent = e2e.agent(write_config(tmp_path, repo, {"pods": pods_cluster}, defaults='wave_timeout = "1s"'))
    assert agent.reconcile()["pods"].state is PassState.SYNCING
    time.sleep(1.2)
    r = agent.reconcile()["pods"]
    assert r.failure is not None and r.failure.reason is FailureReason.WAVE, (r.state, r.wave_wait)
    assert "wave 0 (2 of 3) did not become healthy" in r.failure.message and "after 1s" in r.failure.message


@pytest.mark.cluster
def test_waves_run_once_goes_on_with_a_waiting_wave_until_the_sync_is_through(
    tmp_path: Path, pods_cluster: LocalCluster, e2e: E2E
) -> None:
    ns = app_namespace(e2e, pods_cluster)
    repo = make_repo(tmp_path, files(ns, job(ns, "migrate"), cm(ns, "after", 1)))
    config = write_config(tmp_path, repo, {"pods": pods_cluster})
    client = KubeClient.from_config(config.cluster("pods"))
    e2e.at_end(client.close)

    # The Job completes on its simulated Pod while run --once looks again.
    once = CliRunner().invoke(main, ["run", "--once", "--config", config.file], catch_exceptions=False)
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
