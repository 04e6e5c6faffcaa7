"""Kubernetes Events on an app's ApplySet parent for objects that failed, were pruned, or could
not be read (skipped because their listing failed or was refused: unknown, not absent), and for
the end of a wait on its rollout (``HealthFailed`` naming the blocker, ``HealthCurrent``), and
for drift an app with ``drift = "report"`` leaves (``DriftDetected``, naming field, who and when).

Called by ``fleet.Fleet`` after each (non-dry-run) pass, once per app, with that
cluster's own client: ``kubectl describe configmap <parent> -n <namespace>``
(the agent's name for a cluster entry's own app, ``<agent>.<app>`` for the others)
then shows what the agent could not apply or read and what it deleted; each message names the
app. Best effort: an Event that cannot be written is logged, never a reason to fail the pass.

One Event per (object, reason, revision): a repeat in a later pass of the
same revision bumps ``count`` and ``lastTimestamp`` instead of adding a new
one, and at most ``MAX_EVENTS`` are written per pass plus one summary, so a
broken commit cannot flood the API server. Messages of Secrets (and of any
object holding fields decrypted from Git) carry the HTTP status only: an API
server's validation message may quote a value (docs/safety.md rule 11).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from agent.errors import ApiError, ClusterError
from agent.kube.client import KubeClient
from agent.model import (
    ApiFinding,
    ApiProblem,
    AppHealth,
    ApplyResult,
    ClusterResult,
    Drift,
    HealthState,
    Note,
    Outcome,
    SkipReason,
)

log = structlog.get_logger("gitops_agent.events")

MAX_EVENTS = 20
_REASONS = {
    Outcome.FAILED: ("Warning", "ApplyFailed"),
    Outcome.PRUNED: ("Normal", "Pruned"),
    Outcome.ORPHANED: ("Normal", "Orphaned"),
}

#: An object skipped because its kind's listing failed or was refused (a namespaced RBAC asked for
#: a cluster-scoped kind): nothing was applied and its state is unknown, so the operator must see
#: it. Other skips (reconcile disabled, another app's or ApplySet's object) are decisions, not news.
_UNREAD = ("Warning", "LiveUnknown")


def reason_of(r: ApplyResult) -> tuple[str, str] | None:
    """(Event type, reason) of a reportable result, None for one that is not news."""
    if r.outcome is Outcome.SKIPPED:
        return _UNREAD if r.skip is SkipReason.LIVE_UNKNOWN else None
    return _REASONS.get(r.outcome)


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def message_for(r: ApplyResult) -> str:
    """What the Event says about one object; never a Secret's (or a decrypted field's) content."""
    secret = r.key.kind == "Secret" or r.sensitive
    if r.outcome is Outcome.FAILED:
        text = f"HTTP {r.status}" if secret else f"HTTP {r.status}: {r.message}"
        return f"{r.key}: {text}"[:1000]
    if r.message and not secret:
        return f"{r.key}: {r.message}"[:1000]
    return str(r.key)


def reportable(result: ClusterResult) -> list[ApplyResult]:
    return [r for r in result.results if reason_of(r) is not None]


def api_notes(result: ClusterResult) -> list[ApiFinding]:
    """Deprecation notes and the server's warnings (objects the cluster does not serve are
    failed objects already, with their own Event)."""
    return [f for f in result.api_findings if f.problem is not ApiProblem.NOT_SERVED]


def _finding_message(f: ApiFinding) -> str:
    """A Secret's warning may quote what was sent: only its apiVersion is named."""
    if f.key.kind == "Secret":
        return f"{f.key}: {f.api_version}: {f.problem.value}"
    return f"{f.key}: {f.message}"[:1000]


def reason_for(r: ApplyResult) -> tuple[str, str]:
    """(type, reason) of a reportable object's Event: ``Warning``/``ApplyFailed``, ``Normal``/``Pruned``..."""
    severity, reason = reason_of(r) or ("Normal", "")
    if r.note is Note.DELETE_REFUSED:
        return severity, "PruneFailed"
    if r.note is Note.API_NOT_SERVED:
        return severity, "APIVersionNotServed"
    return severity, reason


@dataclass(frozen=True)
class _Pass:
    """What an Event names besides its object: the cluster, the app and the revision."""

    cluster: str
    app: str
    revision: str


def emit(
    client: KubeClient,
    result: ClusterResult,
    *,
    parent_name: str,
    namespace: str,
    component: str,
    instance: str = "",
) -> int:
    """Write the pass's Events; returns how many were written or updated."""
    items: list[ApplyResult | ApiFinding] = [*reportable(result), *api_notes(result)]
    if not items or result.dry_run:
        return 0
    ref = _parent_ref(client, namespace, parent_name, result.cluster)
    if ref is None:
        return 0
    subject = _Pass(result.cluster, result.app, result.revision)
    written = 0
    for r in items[:MAX_EVENTS]:
        if isinstance(r, ApiFinding):
            reason = "RemovedAPIVersion" if r.problem is ApiProblem.REMOVED else "DeprecatedAPIVersion"
            message, about = _finding_message(r), f"{r.key}|{r.message}"
            written += _write(
                client, namespace, ref, subject, "Warning", reason, message, about, component, instance
            )
            continue
        severity, reason = reason_for(r)
        written += _write(
            client, namespace, ref, subject, severity, reason, message_for(r), str(r.key), component, instance
        )
    if len(items) > MAX_EVENTS:
        more = len(items) - MAX_EVENTS
        written += _write(
            client,
            namespace,
            ref,
            subject,
            "Warning",
            "MoreObjects",
            f"{more} more failed, pruned, unread or deprecated objects in this pass; see the agent's log",
            "summary",
            component,
            instance,
        )
    return written


def emit_health(
    client: KubeClient,
    cluster: str,
    health: AppHealth,
    *,
    parent_name: str,
    namespace: str,
    component: str,
    instance: str = "",
) -> int:
    """One Event for a wait's end: ``HealthFailed`` (Warning, naming the blocker) or ``HealthCurrent``."""
    if health.state is HealthState.FAILED:
        severity, reason = "Warning", "HealthFailed"
    elif health.state is HealthState.CURRENT:
        severity, reason = "Normal", "HealthCurrent"
    else:
        return 0
    ref = _parent_ref(client, namespace, parent_name, cluster)
    if ref is None:
        return 0
    subject = _Pass(cluster, health.app, health.revision)
    message = health.health.describe()[:1000]
    return _write(client, namespace, ref, subject, severity, reason, message, "health", component, instance)


def new_drift(result: ClusterResult, previous: ClusterResult | None) -> list[Drift]:
    """The drift ``result`` reports that ``previous`` (the app's last pass) did not: each is told once."""
    seen = {_drift_id(d) for d in previous.drift_reported} if previous is not None else set()
    return [d for d in result.drift_reported if _drift_id(d) not in seen]


def _drift_id(d: Drift) -> str:
    return f"{d.key}|{d.kind.value}|{d.path}|{d.manager}|{d.time}|{d.live!r}"


def emit_drift(
    client: KubeClient,
    result: ClusterResult,
    drift: list[Drift],
    *,
    parent_name: str,
    namespace: str,
    component: str,
    instance: str = "",
) -> int:
    """One ``DriftDetected`` Event per object with new drift (``new_drift``), each field named
    with Git's and live's value (masked by the plan where secret), who changed it and when."""
    if not drift or result.dry_run:
        return 0
    ref = _parent_ref(client, namespace, parent_name, result.cluster)
    if ref is None:
        return 0
    by_object: dict[str, list[Drift]] = {}
    for d in drift:
        by_object.setdefault(str(d.key), []).append(d)
    subject = _Pass(result.cluster, result.app, result.revision)
    written = 0
    for ds in list(by_object.values())[:MAX_EVENTS]:
        message = ("; ".join(d.describe() for d in ds) + " (drift = report: not corrected)")[:1000]
        about = "drift|" + "|".join(_drift_id(d) for d in ds)
        written += _write(
            client, namespace, ref, subject, "Warning", "DriftDetected", message, about, component, instance
        )
    return written


def _parent_ref(client: KubeClient, namespace: str, parent_name: str, cluster: str) -> dict[str, Any] | None:
    """The app's ApplySet parent as an Event's ``involvedObject``; None when it cannot be read."""
    try:
        parent = client.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{parent_name}")
    except (ApiError, ClusterError) as e:
        log.info("no events: ApplySet parent not readable", cluster=cluster, error=str(e))
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": parent_name,
        "namespace": namespace,
        "uid": (parent.get("metadata") or {}).get("uid", ""),
    }


def _write(
    client: KubeClient,
    namespace: str,
    ref: dict[str, Any],
    result: _Pass,
    severity: str,
    reason: str,
    message: str,
    subject: str,
    component: str,
    instance: str,
) -> int:
    digest = hashlib.sha256(f"{subject}|{reason}|{result.revision}".encode()).hexdigest()[:16]
    app = f" app {result.app}" if result.app else ""
    name = f"{ref['name']}.{digest}"
    now = _stamp(datetime.now(UTC))
    base = f"/api/v1/namespaces/{namespace}/events"
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": ref,
        "type": severity,
        "reason": reason,
        "message": f"revision {result.revision[:12]}{app}: {message}",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance or component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        client.request("POST", base, body=event)
        return 1
    except ApiError as e:
        if e.status != 409:
            log.warning("event not written", cluster=result.cluster, reason=reason, error=str(e))
            return 0
    except ClusterError as e:  # fenced: this replica may not write there any more
        log.info("event not written", cluster=result.cluster, reason=reason, error=str(e))
        return 0
    try:  # the same object, reason and revision as an earlier pass: count it
        old = client.request("GET", f"{base}/{name}")
        patch = {"count": int(old.get("count") or 1) + 1, "lastTimestamp": now}
        client.request("PATCH", f"{base}/{name}", body=patch, content_type="application/merge-patch+json")
        return 1
    except (ApiError, ClusterError) as e:
        log.warning("event not updated", cluster=result.cluster, reason=reason, error=str(e))
        return 0


def events_for(client: KubeClient, namespace: str, parent_name: str) -> Iterable[dict[str, Any]]:
    """The Events on a parent (tests and ``status``)."""
    doc = client.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        query={"fieldSelector": f"involvedObject.name={parent_name},involvedObject.kind=ConfigMap"},
    )
    return list(doc.get("items") or [])


def split_message(message: str) -> tuple[str, str]:
    """(revision, the rest) of a message ``_write`` made (``revision <sha12>[ app <name>]: <text>``);
    ("", the whole message) for any other."""
    head, sep, rest = message.partition(": ")
    words = head.split(" ")
    if sep and len(words) in (2, 4) and words[0] == "revision" and (len(words) == 2 or words[2] == "app"):
        return words[1], rest
    return "", message
