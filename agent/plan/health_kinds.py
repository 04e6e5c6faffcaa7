"""The per-kind health rules, and the blockers they name: pure, from an object's own status.

``agent.plan.health.assess`` calls ``RULES[(group, kind)]`` once the generic rules
(deletion, observed generation, ``Reconciling``/``Stalled``) have not decided. Each rule
follows kstatus (sigs.k8s.io/cli-utils v0.37.2) unless docs/health.md lists it as a gap we
close on purpose (a paused Deployment is Suspended, a Job must complete, a LoadBalancer needs
an address, a Pod whose image cannot be pulled has Failed). Children (ReplicaSets of a
Deployment, Pods of the others) are read only to name the ``Blocker``, never to decide the state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.model import Blocker, Health, HealthState

Obj = Mapping[str, Any]
Children = Mapping[str, Sequence[Obj]]
Rule = Callable[[Obj, Children], Health]

#: Container waiting reasons that do not pass by themselves: the Pod has Failed (kstatus reads
#: only CrashLoopBackOff, and only in a running Pod).
FAILING_WAITING = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
#: The Deployment controller's annotation numbering its ReplicaSets: the highest is the new one.
REVISION = "deployment.kubernetes.io/revision"


class Malformed(Exception):
    """A status field has a type the API never gives it: the object's health is Unknown."""


# -- reading fields ------------------------------------------------------------------------


def field(obj: Obj, path: str) -> Any:
    """``obj`` at a dotted path (``status.replicas``); None when any step is missing."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def number(obj: Obj, path: str, default: int) -> int:
    value = field(obj, path)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{path} is {value!r}, not an integer")
    return value


def text(obj: Obj, path: str, default: str = "") -> str:
    value = field(obj, path)
    if value is None:
        return default
    if not isinstance(value, str):
        raise Malformed(f"{path} is {value!r}, not a string")
    return value


def conditions(obj: Obj) -> list[Obj]:
    found = field(obj, "status.conditions")
    if found is None:
        return []
    if not isinstance(found, list) or not all(isinstance(c, Mapping) for c in found):
        raise Malformed("status.conditions is not a list of conditions")
    return found


def condition(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in conditions(obj) if c.get("type") == kind), None)


def holds(obj: Obj, kind: str, status: str = "True") -> Obj | None:
    """The condition ``kind`` when its status is ``status``."""
    c = condition(obj, kind)
    return c if c is not None and c.get("status") == status else None


def name_of(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def uid_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def blocker(obj: Obj, reason: str, message: str = "") -> Blocker:
    namespace, name = name_of(obj)
    return Blocker(str(obj.get("kind", "")), namespace, name, reason or "Unknown", message)


def from_condition(obj: Obj, c: Obj, fallback: str) -> Blocker:
    return blocker(obj, str(c.get("reason") or fallback), str(c.get("message") or ""))


def current(message: str, reason: str = "") -> Health:
    return Health(HealthState.CURRENT, message, reason=reason)


def in_progress(reason: str, message: str, why: Blocker | None = None) -> Health:
    return Health(HealthState.IN_PROGRESS, message, why, reason)


def failed(reason: str, message: str, why: Blocker | None = None) -> Health:
    return Health(HealthState.FAILED, message, why, reason)


def suspended(reason: str, message: str) -> Health:
    return Health(HealthState.SUSPENDED, message, reason=reason)


# -- blockers among children ----------------------------------------------------------------


def pod_problem(pod: Obj) -> Blocker | None:
    """What keeps one Pod from running, in the kubelet's or the scheduler's words."""
    for key in ("status.initContainerStatuses", "status.containerStatuses"):
        statuses = field(pod, key) or []
        for cs in statuses if isinstance(statuses, list) else ():
            waiting = field(cs, "state.waiting") if isinstance(cs, Mapping) else None
            if isinstance(waiting, Mapping) and waiting.get("reason") in FAILING_WAITING:
                return blocker(pod, str(waiting["reason"]), str(waiting.get("message") or ""))
    if text(pod, "status.phase") == "Failed":
        if reason := text(pod, "status.reason"):  # the kubelet's own: Evicted, DeadlineExceeded
            return blocker(pod, reason, text(pod, "status.message"))
        return exited(pod) or blocker(pod, "PodFailed", text(pod, "status.message"))
    scheduled = holds(pod, "PodScheduled", "False")
    if scheduled is not None:
        return from_condition(pod, scheduled, "Unschedulable")
    return None


def exited(pod: Obj) -> Blocker | None:
    """The first container that ended with a non-zero exit code, in the runtime's words."""
    statuses = field(pod, "status.containerStatuses") or []
    for cs in statuses if isinstance(statuses, list) else ():
        ended = field(cs, "state.terminated") if isinstance(cs, Mapping) else None
        if isinstance(ended, Mapping) and ended.get("exitCode") not in (None, 0):
            said = f"container {cs.get('name')} exited with code {ended['exitCode']}"
            return blocker(pod, str(ended.get("reason") or "Error"), said)
    return None


def pods_blocker(pods: Sequence[Obj]) -> Blocker | None:
    """The first Pod (by name) that cannot run; one whose containers fail before one not scheduled."""
    found = [b for b in (pod_problem(p) for p in sorted(pods, key=name_of)) if b is not None]
    return next((b for b in found if b.reason != "Unschedulable"), found[0] if found else None)


def deployment_blocker(obj: Obj, children: Children) -> Blocker | None:
    """The new ReplicaSet's failure to create Pods, else one of its Pods that cannot run."""
    sets = children.get(uid_of(obj), ())
    if not sets:
        return None

    def revision(rs: Obj) -> int:
        value = str(((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION, ""))
        return int(value) if value.isdigit() else -1

    newest = max(sets, key=revision)
    if (c := holds(newest, "ReplicaFailure")) is not None:
        return from_condition(newest, c, "ReplicaFailure")
    return pods_blocker(children.get(uid_of(newest), ()))


def own_pods_blocker(obj: Obj, children: Children) -> Blocker | None:
    return pods_blocker(children.get(uid_of(obj), ()))


# -- the rules ------------------------------------------------------------------------------


def always_current(obj: Obj, children: Children) -> Health:
    return current("always ready")


def deployment(obj: Obj, children: Children) -> Health:
    if field(obj, "spec.paused") is True:
        return suspended("Paused", "rollout paused (spec.paused)")
    progress = condition(obj, "Progressing")
    if progress is not None and progress.get("reason") == "ProgressDeadlineExceeded":
        stuck = deployment_blocker(obj, children) or from_condition(obj, progress, "ProgressDeadlineExceeded")
        said = str(progress.get("message") or "progress deadline exceeded")
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
        said = str(c.get("message") or "cannot create Pods")
        return in_progress("ReplicaFailure", said, from_condition(obj, c, "ReplicaFailure"))
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
        stuck = from_condition(obj, c, "JobFailed")
        return failed(stuck.reason, stuck.message or "Job failed", stuck)
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
        return failed(problem.reason, problem.message or "Pod failed", problem)
    if phase == "Running" and holds(obj, "Ready") is not None:
        return current("ready")
    if problem is not None and problem.reason in FAILING_WAITING:
        return failed(problem.reason, problem.message or problem.reason, problem)
    if phase not in ("", "Pending", "Running"):
        raise Malformed(f"status.phase is {phase!r}")
    if problem is not None:  # not scheduled yet: an autoscaler may add a node; the timeout decides
        return in_progress(problem.reason, problem.message or "not scheduled", problem)
    if phase == "Running":
        return in_progress("PodRunningNotReady", "running, not Ready")
    return in_progress("PodPending", "pending" if phase else "not observed by a kubelet yet")


def pvc(obj: Obj, children: Children) -> Health:
    phase = text(obj, "status.phase", "unknown")
    if phase == "Bound":
        return current("Bound")
    if phase == "Lost":
        return failed("ClaimLost", "its PersistentVolume is gone", blocker(obj, "ClaimLost"))
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
            why = from_condition(obj, c, "NamesNotAccepted")
            return failed(why.reason, why.message or "names not accepted", why)
        if c.get("type") == "Established":
            if c.get("status") == "True":
                return current("Established")
            if c.get("status") == "False" and c.get("reason") != "Installing":
                why = from_condition(obj, c, "NotEstablished")
                return failed(why.reason, why.message or "not established", why)
    return in_progress("Installing", "not Established yet")


def apiservice(obj: Obj, children: Children) -> Health:
    c = condition(obj, "Available")
    if c is not None and c.get("status") == "True":
        return current("Available")
    if c is None:
        return in_progress("NotObserved", "not checked by the aggregator yet")
    why = from_condition(obj, c, "NotAvailable")
    return in_progress(why.reason, why.message or "not Available", why)


def namespace(obj: Obj, children: Children) -> Health:
    if text(obj, "status.phase") == "Terminating":
        return Health(HealthState.TERMINATING, "namespace terminating", reason="Terminating")
    return current("Active")


def hpa(obj: Obj, children: Children) -> Health:
    able = holds(obj, "AbleToScale", "False")
    if able is not None:
        why = from_condition(obj, able, "NotAbleToScale")
        return in_progress(why.reason, why.message or "cannot scale its target", why)
    active = condition(obj, "ScalingActive")
    if active is not None and active.get("status") == "False":
        if active.get("reason") == "ScalingDisabled":  # its target is scaled to zero on purpose
            return suspended("ScalingDisabled", str(active.get("message") or "scaling disabled"))
        why = from_condition(obj, active, "ScalingInactive")
        return in_progress(why.reason, why.message or "cannot compute a replica count", why)
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
