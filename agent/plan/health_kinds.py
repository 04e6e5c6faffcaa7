"""The per-kind health rules, and the blockers they name: pure, from an object's own status.

``agent.plan.health.assess`` calls ``RULES[(group, kind)]`` once the generic rules
(deletion, observed generation, ``Reconciling``/``Stalled``) have not decided. Each rule
follows kstatus (sigs.k8s.io/cli-utils v0.37.2) unless docs/health.md lists it as a gap we
close on purpose (a paused Deployment is Suspended, a Job must complete, a LoadBalancer needs
an address, a Pod whose image cannot be pulled has Failed). Children (ReplicaSets of a
Deployment, Pods of the others) are read only to name the ``Blocker``, never to decide the state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agent.model import Health, HealthState
from agent.plan.health_status import (
    FAILING_WAITING,
    Children,
    Malformed,
    Obj,
    blocker,
    condition,
    conditions,
    current,
    deployment_blocker,
    failed,
    field,
    from_condition,
    held_by,
    holds,
    in_progress,
    number,
    own_pods_blocker,
    pod_problem,
    suspended,
    text,
)

Rule = Callable[[Obj, Children], Health]


# -- the rules ------------------------------------------------------------------------------


def always_current(obj: Obj, children: Children) -> Health:
    return current("always ready")


def deployment(obj: Obj, children: Children) -> Health:
    if field(obj, "spec.paused") is True:
        return suspended("Paused", "rollout paused (spec.paused)")
    progress = condition(obj, "Progressing")
    if progress is not None and progress.get("reason") == "ProgressDeadlineExceeded":
        said = str(progress.get("message") or "progress deadline exceeded")
        stuck = deployment_blocker(obj, children) or from_condition(
            obj, progress, "ProgressDeadlineExceeded", said
        )
        return failed("ProgressDeadlineExceeded", said, stuck)
    # Without a deadline the controller never writes Progressing (kstatus reads it as progressing).
    progressing = number(obj, "spec.progressDeadlineSeconds", 2**31 - 1) == 2**31 - 1 or (
        progress is not None
        and progress.get("status") == "True"
        and progress.get("reason") == "NewReplicaSetAvailable"
    )
    wanted = number(obj, "spec.replicas", 1)
    replicas = number(obj, "status.replicas", 0)
    updated = number(obj, "status.updatedReplicas", 0)
    ready = number(obj, "status.readyReplicas", 0)
    available = number(obj, "status.availableReplicas", 0)
    why = deployment_blocker(obj, children)
    if wanted > replicas:
        return in_progress("LessReplicas", f"{replicas} of {wanted} replicas created", why)
    if wanted > updated:
        return in_progress("LessUpdated", f"{updated} of {wanted} replicas updated", why)
    if replicas > wanted:
        return in_progress("ExtraPods", f"{replicas - wanted} old replicas terminating", why)
    if updated > available:
        return in_progress("LessAvailable", f"{available} of {updated} updated replicas available", why)
    if wanted > ready:
        return in_progress("LessReady", f"{ready} of {wanted} replicas ready", why)
    if not progressing:
        return in_progress("ReplicaSetNotAvailable", "new ReplicaSet not available yet", why)
    if holds(obj, "Available") is None:
        return in_progress("DeploymentNotAvailable", "Deployment not Available yet", why)
    return current(f"{replicas} replicas available")


def replicaset(obj: Obj, children: Children) -> Health:
    if (c := holds(obj, "ReplicaFailure")) is not None:
        failure = from_condition(obj, c, "ReplicaFailure", "cannot create Pods")
        return in_progress("ReplicaFailure", failure.message, failure)
    wanted = number(obj, "spec.replicas", 1)
    replicas = number(obj, "status.replicas", 0)
    why = own_pods_blocker(obj, children)
    for path, what, reason in (
        ("status.fullyLabeledReplicas", "labelled", "LessLabelled"),
        ("status.availableReplicas", "available", "LessAvailable"),
        ("status.readyReplicas", "ready", "LessReady"),
    ):
        if wanted > (have := number(obj, path, 0)):
            return in_progress(reason, f"{have} of {wanted} replicas {what}", why)
    if replicas > wanted:
        return in_progress("ExtraPods", f"{replicas - wanted} replicas terminating", why)
    return current(f"{replicas} replicas available")


def statefulset(obj: Obj, children: Children) -> Health:
    wanted = number(obj, "spec.replicas", 1)
    replicas = number(obj, "status.replicas", 0)
    ready = number(obj, "status.readyReplicas", 0)
    why = own_pods_blocker(obj, children)
    if wanted > replicas:
        return in_progress("LessReplicas", f"{replicas} of {wanted} replicas created", why)
    if wanted > ready:
        return in_progress("LessReady", f"{ready} of {wanted} replicas ready", why)
    if replicas > wanted:
        return in_progress("ExtraPods", f"{replicas - wanted} replicas terminating", why)
    # OnDelete: Pods take the new template only when someone deletes them; ready is all we wait for.
    if text(obj, "spec.updateStrategy.type") == "OnDelete":
        return current(f"{ready} replicas ready (OnDelete: updates wait for Pods to be deleted)")
    updated = number(obj, "status.updatedReplicas", 0)
    partition = number(obj, "spec.updateStrategy.rollingUpdate.partition", -1)
    # The server defaults the partition to 0, so every RollingUpdate StatefulSet takes this path.
    if partition > 0:
        if updated < wanted - partition:
            said = f"{updated} of {wanted - partition} replicas above the partition updated"
            return in_progress("PartitionRollout", said, why)
        return current(f"partitioned rollout complete: {updated} updated")
    if partition == 0:
        if updated < wanted:
            return in_progress("LessUpdated", f"{updated} of {wanted} replicas updated", why)
        return current(f"{updated} replicas ready and updated")
    if wanted > (have := number(obj, "status.currentReplicas", 0)):
        return in_progress("LessCurrent", f"{have} of {wanted} replicas at the current revision", why)
    if text(obj, "status.currentRevision") != text(obj, "status.updateRevision"):
        return in_progress("RevisionMismatch", "waiting for the update revision to become current", why)
    return current(f"{replicas} replicas ready")


def daemonset(obj: Obj, children: Children) -> Health:
    # The controller always writes both once it has seen the object (kstatus insists too).
    for path in ("metadata.generation", "status.observedGeneration"):
        if field(obj, path) is None:
            return in_progress("NotObserved", f"{path} not set yet")
    desired = number(obj, "status.desiredNumberScheduled", -1)
    if desired == -1:
        return in_progress("NoDesiredNumber", "status.desiredNumberScheduled not set yet")
    why = own_pods_blocker(obj, children)
    # OnDelete: Pods take the new template only when someone deletes them.
    on_delete = text(obj, "spec.updateStrategy.type") == "OnDelete"
    for path, what, reason in (
        ("status.currentNumberScheduled", "scheduled", "LessCurrent"),
        ("status.updatedNumberScheduled", "updated", "LessUpdated"),
        ("status.numberAvailable", "available", "LessAvailable"),
        ("status.numberReady", "ready", "LessReady"),
    ):
        if on_delete and reason == "LessUpdated":
            continue
        if desired > (have := number(obj, path, 0)):
            return in_progress(reason, f"{have} of {desired} Pods {what}", why)
    return current(f"{desired} Pods ready")


def job(obj: Obj, children: Children) -> Health:
    if (c := holds(obj, "Complete")) is not None:
        return current(f"complete: {number(obj, 'status.succeeded', 0)} succeeded")
    if (c := holds(obj, "Failed")) is not None:
        return held_by(from_condition(obj, c, "JobFailed", "Job failed"), HealthState.FAILED)
    if field(obj, "spec.suspend") is True:
        return suspended("Suspended", "Job suspended (spec.suspend)")
    why = own_pods_blocker(obj, children)
    if not text(obj, "status.startTime"):
        return in_progress("JobNotStarted", "Job not started", why)
    counts = ", ".join(f"{number(obj, f'status.{k}', 0)} {k}" for k in ("succeeded", "active", "failed"))
    return in_progress("JobRunning", f"running: {counts}", why)


def cronjob(obj: Obj, children: Children) -> Health:
    if field(obj, "spec.suspend") is True:
        return suspended("Suspended", "CronJob suspended (spec.suspend)")
    return current("scheduled")


def pod(obj: Obj, children: Children) -> Health:
    phase = text(obj, "status.phase")
    if phase == "Succeeded":
        return current("completed")
    problem = pod_problem(obj)
    if phase == "Failed":
        assert problem is not None  # pod_problem names every failed Pod
        return held_by(problem, HealthState.FAILED)
    if phase == "Running" and holds(obj, "Ready") is not None:
        return current("ready")
    if problem is not None and problem.reason in FAILING_WAITING:
        return held_by(problem, HealthState.FAILED)
    if phase not in ("", "Pending", "Running"):
        raise Malformed(f"status.phase is {phase!r}")
    if problem is not None:  # not scheduled yet: an autoscaler may add a node; the timeout decides
        return held_by(problem, HealthState.IN_PROGRESS)
    if phase == "Running":
        return in_progress("PodRunningNotReady", "running, not Ready")
    return in_progress("PodPending", "pending" if phase else "not observed by a kubelet yet")


def pvc(obj: Obj, children: Children) -> Health:
    phase = text(obj, "status.phase", "unknown")
    if phase == "Bound":
        return current("Bound")
    if phase == "Lost":
        return held_by(blocker(obj, "ClaimLost", "its PersistentVolume is gone"), HealthState.FAILED)
    return in_progress("NotBound", f"not Bound (phase {phase})")


def load_balanced(obj: Obj, what: str) -> Health:
    addresses = field(obj, "status.loadBalancer.ingress")
    if isinstance(addresses, list) and addresses:
        first = addresses[0] if isinstance(addresses[0], Mapping) else {}
        return current(f"load balancer at {first.get('ip') or first.get('hostname') or '?'}")
    return in_progress("NoLoadBalancerAddress", f"{what} has no load-balancer address yet")


def service(obj: Obj, children: Children) -> Health:
    if text(obj, "spec.type", "ClusterIP") != "LoadBalancer":
        return current("Service is ready")
    if not text(obj, "spec.clusterIP"):
        return in_progress("NoIPAssigned", "no cluster IP assigned yet")
    return load_balanced(obj, "Service")


def ingress(obj: Obj, children: Children) -> Health:
    return load_balanced(obj, "Ingress")


def crd(obj: Obj, children: Children) -> Health:
    for c in conditions(obj):
        if c.get("type") == "NamesAccepted" and c.get("status") == "False":
            return held_by(
                from_condition(obj, c, "NamesNotAccepted", "names not accepted"), HealthState.FAILED
            )
        if c.get("type") == "Established":
            if c.get("status") == "True":
                return current("Established")
            if c.get("status") == "False" and c.get("reason") != "Installing":
                why = from_condition(obj, c, "NotEstablished", "not established")
                return held_by(why, HealthState.FAILED)
    return in_progress("Installing", "not Established yet")


def apiservice(obj: Obj, children: Children) -> Health:
    c = condition(obj, "Available")
    if c is not None and c.get("status") == "True":
        return current("Available")
    if c is None:
        return in_progress("NotObserved", "not checked by the aggregator yet")
    return held_by(from_condition(obj, c, "NotAvailable", "not Available"), HealthState.IN_PROGRESS)


def namespace(obj: Obj, children: Children) -> Health:
    if text(obj, "status.phase") == "Terminating":
        return Health(HealthState.TERMINATING, "namespace terminating", reason="Terminating")
    return current("Active")


def hpa(obj: Obj, children: Children) -> Health:
    able = holds(obj, "AbleToScale", "False")
    if able is not None:
        why = from_condition(obj, able, "NotAbleToScale", "cannot scale its target")
        return held_by(why, HealthState.IN_PROGRESS)
    active = condition(obj, "ScalingActive")
    if active is not None and active.get("status") == "False":
        if active.get("reason") == "ScalingDisabled":  # its target is scaled to zero on purpose
            return suspended("ScalingDisabled", str(active.get("message") or "scaling disabled"))
        why = from_condition(obj, active, "ScalingInactive", "cannot compute a replica count")
        return held_by(why, HealthState.IN_PROGRESS)
    if active is not None or field(obj, "status.currentReplicas") is not None:
        return current(f"{number(obj, 'status.currentReplicas', 0)} replicas")
    return in_progress("NotObserved", "not observed by the autoscaler yet")


def pdb(obj: Obj, children: Children) -> Health:
    if field(obj, "status.observedGeneration") is None:
        return in_progress("NotObserved", "not observed by the disruption controller yet")
    allowed = number(obj, "status.disruptionsAllowed", 0)
    return current(f"{allowed} disruptions allowed")


#: (group, kind) → rule. Kinds absent here follow the ``Ready`` condition, else are Current.
RULES: Mapping[tuple[str, str], Rule] = {
    ("", "Pod"): pod,
    ("", "Service"): service,
    ("", "PersistentVolumeClaim"): pvc,
    ("", "Namespace"): namespace,
    ("", "ConfigMap"): always_current,
    ("", "Secret"): always_current,
    ("apps", "Deployment"): deployment,
    ("extensions", "Deployment"): deployment,
    ("apps", "ReplicaSet"): replicaset,
    ("extensions", "ReplicaSet"): replicaset,
    ("apps", "StatefulSet"): statefulset,
    ("apps", "DaemonSet"): daemonset,
    ("extensions", "DaemonSet"): daemonset,
    ("batch", "Job"): job,
    ("batch", "CronJob"): cronjob,
    ("policy", "PodDisruptionBudget"): pdb,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): crd,
    ("apiregistration.k8s.io", "APIService"): apiservice,
    ("networking.k8s.io", "Ingress"): ingress,
    ("autoscaling", "HorizontalPodAutoscaler"): hpa,
}
