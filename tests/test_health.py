"""Health of one object, and of an app: a table of real objects' statuses (tests/fixtures/health/).

Each fixture is an object as the API server returns it, written from the Kubernetes API
reference and the controllers' own condition reasons. Children (ReplicaSets, Pods) are
fixtures too, tied to their owners by ``ownerReferences``; they only name the blocker. The
same fixtures go through kstatus itself in tests/test_health_oracle.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.model import Blocker, Health, HealthState, ObjectKey
from agent.plan.health import CHILD_KINDS, ORDER, assess, child_index, excluded, summarize, worst

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "health"

C, P, F, S, U, T = (
    HealthState.CURRENT,
    HealthState.IN_PROGRESS,
    HealthState.FAILED,
    HealthState.SUSPENDED,
    HealthState.UNKNOWN,
    HealthState.TERMINATING,
)


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Case:
    fixture: str
    state: HealthState
    reason: str = ""
    #: ``Health.describe()`` exactly, when the case is about what it says.
    says: str = ""
    children: tuple[str, ...] = ()


BAD_IMAGE_PODS = ("replicaset-old", "replicaset-bad-image", "pod-image-pull-backoff", "pod-err-image-pull")
PULL = 'Pod web-6c8d7f9b4-abcde: ImagePullBackOff (Back-off pulling image "registry.example.com/web:nope")'

CASES = (
    # Deployment
    Case("deployment-available", C),
    Case("deployment-rolling", P, "LessUpdated", "InProgress: 2 of 3 replicas updated"),
    Case("deployment-generation-not-observed", P, "LatestGenerationNotObserved"),
    Case(
        "deployment-bad-image",
        P,
        "LessAvailable",
        f"InProgress: 0 of 3 updated replicas available; {PULL}",
        BAD_IMAGE_PODS,
    ),
    Case(
        "deployment-progress-deadline",
        F,
        "ProgressDeadlineExceeded",
        f'Failed: ReplicaSet "web-6c8d7f9b4" has timed out progressing; {PULL}',
        BAD_IMAGE_PODS,
    ),
    Case("deployment-paused", S, "Paused"),
    Case("deployment-hpa-scaled", P, "LessAvailable", "InProgress: 3 of 5 updated replicas available"),
    Case("deployment-scaled-to-zero", C),
    Case(
        "deployment-replica-failure",
        P,
        "LessReplicas",
        "InProgress: 0 of 2 replicas created; ReplicaSet web-6c8d7f9b4: FailedCreate (pods "
        '"web-6c8d7f9b4-x7k2p" is forbidden: exceeded quota: shop-quota, requested: cpu=500m, used: '
        "cpu=2, limited: cpu=2)",
        ("replicaset-replica-failure",),
    ),
    Case(
        "deployment-unschedulable",
        P,
        "LessAvailable",
        "InProgress: 2 of 3 updated replicas available; Pod web-6c8d7f9b4-mnbvc: Unschedulable (0/3 nodes "
        "are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims "
        "found for incoming pod.)",
        ("replicaset-unschedulable", "pod-unschedulable"),
    ),
    Case("deployment-malformed", U, "MalformedStatus", "Unknown: status.replicas is 'three', not an integer"),
    # ReplicaSet
    Case("replicaset-available", C),
    Case("replicaset-old", C),
    Case(
        "replicaset-bad-image",
        P,
        "LessAvailable",
        f"InProgress: 0 of 3 replicas available; {PULL}",
        ("pod-image-pull-backoff",),
    ),
    Case("replicaset-replica-failure", P, "ReplicaFailure"),
    Case("replicaset-unschedulable", P, "LessAvailable"),
    # StatefulSet
    Case("statefulset-ready", C),
    Case("statefulset-rolling", P, "LessUpdated"),
    Case("statefulset-partition-done", C),
    Case("statefulset-partition-rolling", P, "PartitionRollout"),
    Case("statefulset-ondelete-ready", C),
    Case("statefulset-ondelete-not-ready", P, "LessReady"),
    Case(
        "statefulset-crashloop",
        P,
        "LessReady",
        "InProgress: 2 of 3 replicas ready; Pod db-2: CrashLoopBackOff (back-off 5m0s restarting failed "
        "container=app pod=db-2_shop(c7a0...))",
        ("pod-db-0", "pod-crashloop"),
    ),
    # DaemonSet
    Case("daemonset-ready", C),
    Case("daemonset-updating", P, "LessUpdated", "InProgress: 1 of 3 Pods updated"),
    Case("daemonset-not-observed", P, "NotObserved"),
    Case("daemonset-ondelete", C),
    # Job and CronJob
    Case("job-complete", C),
    Case(
        "job-backoff-limit",
        F,
        "BackoffLimitExceeded",
        "Failed: Job migrate: BackoffLimitExceeded (Job has reached the specified backoff limit)",
        ("pod-migrate-failed",),
    ),
    Case("job-deadline", F, "DeadlineExceeded"),
    Case("job-running", P, "JobRunning", "InProgress: running: 0 succeeded, 1 active, 0 failed"),
    Case("job-not-started", P, "JobNotStarted"),
    Case("job-suspended", S, "Suspended"),
    Case("cronjob-scheduled", C),
    Case("cronjob-suspended", S, "Suspended"),
    # Pod
    Case("pod-running-ready", C),
    Case("pod-running-not-ready", P, "PodRunningNotReady"),
    Case("pod-ready-other-pending", P, "PodPending"),
    Case("pod-image-pull-backoff", F, "ImagePullBackOff", f"Failed: {PULL}"),
    Case("pod-err-image-pull", F, "ErrImagePull"),
    Case("pod-crashloop", F, "CrashLoopBackOff"),
    Case(
        "pod-create-config-error",
        F,
        "CreateContainerConfigError",
        'Failed: Pod api-5b6c7d8e9-zz9yy: CreateContainerConfigError (secret "api-credentials" not found)',
    ),
    Case("pod-init-crashloop", F, "CrashLoopBackOff"),
    Case("pod-unschedulable", P, "Unschedulable"),
    Case("pod-succeeded", C),
    Case("pod-evicted", F, "Evicted"),
    Case(
        "pod-migrate-failed",
        F,
        "Error",
        "Failed: Pod migrate-7hq2d: Error (container app exited with code 3)",
    ),
    Case("pod-db-0", C),
    # Storage, network, API extensions
    Case("pvc-bound", C),
    Case("pvc-pending", P, "NotBound"),
    Case("pvc-lost", F, "ClaimLost"),
    Case("service-clusterip", C),
    Case("service-lb-pending", P, "NoLoadBalancerAddress"),
    Case("service-lb-ready", C),
    Case("ingress-address", C),
    Case("ingress-no-address", P, "NoLoadBalancerAddress"),
    Case("crd-established", C),
    Case("crd-installing", P, "Installing"),
    Case("crd-names-conflict", F, "ListKindConflict"),
    Case("apiservice-available", C),
    Case("apiservice-missing-endpoints", P, "MissingEndpoints"),
    Case("namespace-active", C),
    Case("namespace-terminating", T),
    # Autoscaling and disruption budgets
    Case("hpa-active", C),
    Case("hpa-no-metrics", P, "FailedGetResourceMetric"),
    Case("hpa-scaling-disabled", S, "ScalingDisabled"),
    Case("pdb-observed", C),
    Case("pdb-not-observed", P, "NotObserved"),
    # Kinds without a rule: kstatus's standard conditions
    Case("configmap", C),
    Case("widget-ready", C),
    Case(
        "widget-not-ready",
        P,
        "WaitingForBackend",
        "InProgress: Widget blue: WaitingForBackend (backend db-0 is not reachable yet)",
    ),
    Case("widget-stalled", F, "InvalidSpec"),
    Case("widget-reconciling", P, "Progressing"),
    Case("widget-no-status", C),
    Case("widget-generation-not-observed", P, "LatestGenerationNotObserved"),
)


def test_the_table_covers_every_fixture_and_forty_cases() -> None:
    named = {c.fixture for c in CASES}
    assert named == {p.stem for p in FIXTURES.glob("*.json")}
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c.fixture for c in CASES])
def test_assess_reads_a_real_objects_status(case: Case) -> None:
    children = child_index(fixture(n) for n in case.children)
    health = assess(fixture(case.fixture), children=children)
    assert health.state is case.state, health
    if case.reason:
        assert health.reason == case.reason, health
    if case.says:
        assert health.describe() == case.says


def test_ready_false_is_in_progress_never_failed_whatever_its_reason() -> None:
    obj = fixture("widget-not-ready")
    for reason in ("Failed", "Error", "CrashLoopBackOff", "ProgressDeadlineExceeded"):
        obj["status"]["conditions"][0]["reason"] = reason
        assert assess(obj).state is HealthState.IN_PROGRESS


def test_an_hpa_scaling_a_healthy_deployment_up_is_in_progress_not_failed() -> None:
    """The scale subresource bumps spec.replicas and the generation; the controller observes it."""
    obj = fixture("deployment-available")
    obj["spec"]["replicas"] = 8
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] = 3
    assert assess(obj).state is HealthState.IN_PROGRESS
    obj["status"].update(replicas=8, updatedReplicas=8)
    assert assess(obj).state is HealthState.IN_PROGRESS
    obj["status"].update(readyReplicas=8, availableReplicas=8)
    assert assess(obj).state is HealthState.CURRENT


def test_children_only_name_the_blocker_never_change_the_state() -> None:
    for case in CASES:
        if case.children:
            alone = assess(fixture(case.fixture))
            assert alone.state is case.state and alone.reason == (case.reason or alone.reason)


def test_the_blocker_is_a_pod_of_the_newest_replicaset_not_of_the_old_one() -> None:
    old_pod = fixture("pod-crashloop")
    old_pod["metadata"]["ownerReferences"] = fixture("pod-image-pull-backoff")["metadata"]["ownerReferences"]
    old_pod["metadata"]["ownerReferences"][0]["uid"] = fixture("replicaset-old")["metadata"]["uid"]
    children = child_index([*map(fixture, BAD_IMAGE_PODS), old_pod])
    health = assess(fixture("deployment-bad-image"), children=children)
    assert health.blocker == Blocker(
        "Pod",
        "shop",
        "web-6c8d7f9b4-abcde",
        "ImagePullBackOff",
        'Back-off pulling image "registry.example.com/web:nope"',
    )


def test_deletion_reads_terminating_before_any_rule() -> None:
    obj = fixture("deployment-available")
    obj["metadata"]["deletionTimestamp"] = "2025-03-04T10:05:00Z"
    assert assess(obj).state is HealthState.TERMINATING


def test_the_health_annotation_ignore_excludes_an_object() -> None:
    obj = fixture("deployment-bad-image")
    assert not excluded(obj)
    obj["metadata"]["annotations"]["gitops-agent.io/health"] = "ignore"
    assert excluded(obj)
    obj["metadata"]["annotations"]["gitops-agent.io/health"] = "yes"
    assert not excluded(obj)


def test_child_kinds_name_what_the_follower_lists_for_each_workload() -> None:
    assert CHILD_KINDS["Deployment"] == ("ReplicaSet", "Pod")
    for kind in ("StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        assert CHILD_KINDS[kind] == ("Pod",)


def test_worst_orders_failed_unknown_in_progress_suspended_current() -> None:
    assert worst([]) is HealthState.CURRENT
    assert worst([C, S]) is S
    assert worst([S, P, C]) is P
    assert worst([P, U]) is U
    assert worst([U, F, C]) is F
    assert worst([Health(C, "ok"), Health(P, "rolling")]) is P
    assert ORDER.index(HealthState.NOT_FOUND) > ORDER.index(P)
    assert set(ORDER) == set(HealthState)


def test_an_apps_summary_counts_and_names_its_worst_object() -> None:
    web = ObjectKey("apps", "Deployment", "shop", "web")
    db = ObjectKey("apps", "StatefulSet", "shop", "db")
    cm = ObjectKey("", "ConfigMap", "shop", "cfg")
    healths = {
        web: assess(fixture("deployment-bad-image"), children=child_index(map(fixture, BAD_IMAGE_PODS))),
        db: assess(fixture("statefulset-ready")),
        cm: Health(HealthState.CURRENT, "always ready"),
    }
    app = summarize(healths)
    assert app.state is HealthState.IN_PROGRESS
    assert app.message == (
        "2 of 3 objects Current; Deployment.apps/shop/web: 0 of 3 updated replicas available"
    )
    assert app.blocker == healths[web].blocker
    both_current = summarize({db: healths[db], cm: healths[cm]})
    assert both_current == Health(HealthState.CURRENT, "2 of 2 objects Current")
    assert summarize({}).state is HealthState.CURRENT
