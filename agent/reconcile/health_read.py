"""Reading the health of an app's objects from its cluster: the I/O beside ``plan.health``.

One step reads every followed object with one LIST per kind, selected by the app's membership
label (what the app applied carries it), so a step costs as many requests as the app has kinds,
whatever its size (per namespace of the followed objects where RBAC is namespaced: an app
acting as a namespace-bound ServiceAccount, whose reads are impersonated like its writes).
Only workloads that are not Current cost more: per namespace holding any, one LIST per kind
of their children (ReplicaSets, Pods) — by the workload's own selector when
it is the only one there — so that the blocking Pod can be named. A kind whose LIST fails
leaves its objects Unknown with the server's words: health is reported, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.config.health_checks import HealthCheck
from agent.errors import ApiError
from agent.kube.client import KubeClient, ResourceInfo
from agent.model import PART_OF, Health, HealthState, Manifest, ObjectKey
from agent.plan import health as assess_health
from agent.plan.health import CHILD_KINDS, child_index

#: A child kind's (group, version).
_CHILD_API = {"ReplicaSet": "apps/v1", "Pod": "v1"}


@dataclass
class Reading:
    """One step's view of the followed objects: each one's health, and what the step cost."""

    healths: dict[ObjectKey, Health] = field(default_factory=dict)
    #: Followed objects annotated out of health (``gitops-agent.io/health: ignore``).
    excluded: set[ObjectKey] = field(default_factory=set)
    requests: int = 0


def selector(match_labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def read(
    client: KubeClient,
    membership: str,
    keys: Iterable[ObjectKey],
    *,
    checks: Sequence[HealthCheck] = (),
    namespaced: set[tuple[str, str]] | None = None,
    selector: str = "",
) -> Reading:
    """The health of ``keys`` (members of the set ``membership``), each assessed with ``checks``.

    ``namespaced``: the kinds this identity may list only per namespace (shared with the pass's
    live reads, which learn it first), listed so straight away; a refused whole adds its kind.
    ``selector``: another label selector than the membership's (hooks: ``gitops-agent.io/hook-of``)."""
    out = Reading()
    by_kind: dict[tuple[str, str], set[ObjectKey]] = {}
    for k in keys:
        by_kind.setdefault((k.group, k.kind), set()).add(k)
    blocked: dict[ObjectKey, Manifest] = {}  # workloads not Current: their children name why
    for (group, kind), wanted in sorted(by_kind.items()):
        info = client.discovery().find_group_kind(group, kind)
        if info is None:
            for k in wanted:
                out.healths[k] = Health(
                    HealthState.UNKNOWN, f"the cluster does not serve {k.group_kind}", reason="NotServed"
                )
            continue
        by = selector or f"{PART_OF}={membership}"
        items, failed = list_members(client, info, by, wanted, out, namespaced)
        if isinstance(failed, ApiError):
            for k in wanted:
                out.healths[k] = Health(HealthState.UNKNOWN, f"not read: {failed}", reason="ReadFailed")
            continue
        found = {key: item for item in items if (key := ObjectKey.of(item)) in wanted}
        for k in wanted:
            obj = found.get(k)
            if isinstance(failed, dict) and k.namespace in failed:
                why = failed[k.namespace]
                out.healths[k] = Health(HealthState.UNKNOWN, f"not read: {why}", reason="ReadFailed")
            elif obj is None:
                out.healths[k] = Health(HealthState.NOT_FOUND, "not in the cluster", reason="NotFound")
            elif assess_health.excluded(obj):
                out.excluded.add(k)
            else:
                out.healths[k] = health = assess_health.assess(obj, checks=checks)
                if health.state not in (HealthState.CURRENT, HealthState.SUSPENDED) and kind in CHILD_KINDS:
                    blocked[k] = obj
    if blocked:
        children = _children(client, blocked, out)
        for k, obj in blocked.items():
            out.healths[k] = assess_health.assess(obj, children=children, checks=checks)
    return out


def list_members(
    client: KubeClient,
    info: ResourceInfo,
    selector: str,
    wanted: set[ObjectKey],
    out: Reading,
    namespaced: set[tuple[str, str]] | None,
) -> tuple[list[Manifest], ApiError | dict[str, ApiError] | None]:
    """The labelled LIST of one kind: cluster-wide, or per namespace of ``wanted`` where RBAC is
    namespaced (an app acting as a namespace-bound ServiceAccount). The error of the whole, or of
    each namespace whose listing failed."""
    gk = (info.group, info.kind)
    if namespaced is None or gk not in namespaced or not info.namespaced:
        try:
            out.requests += 1
            return list(client.list(info, label_selector=selector).items), None
        except ApiError as e:
            if e.status != 403 or not info.namespaced:
                return [], e
        if namespaced is not None:
            namespaced.add(gk)
    items: list[Manifest] = []
    failed: dict[str, ApiError] = {}
    for namespace in sorted({k.namespace for k in wanted}):
        try:
            out.requests += 1
            items.extend(client.list(info, namespace=namespace, label_selector=selector).items)
        except ApiError as e:
            failed[namespace] = e
    return items, failed


def _children(
    client: KubeClient, blocked: Mapping[ObjectKey, Manifest], out: Reading
) -> dict[str, list[Mapping[str, Any]]]:
    """The children of ``blocked`` workloads, by owner UID: per namespace and child kind one LIST,
    by the workload's selector when it is the only one there, else of the whole namespace."""
    wanted: dict[tuple[str, str], list[Manifest]] = {}
    for k, obj in blocked.items():
        for kind in CHILD_KINDS[k.kind]:
            wanted.setdefault((k.namespace, kind), []).append(obj)
    found: list[Manifest] = []
    for (namespace, kind), owners in sorted(wanted.items(), key=lambda kv: kv[0]):
        info = client.discovery().find(_CHILD_API[kind], kind)
        if info is None:
            continue
        labels = ((owners[0].get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        by = selector(labels) if len(owners) == 1 and labels else None
        try:
            out.requests += 1
            found.extend(client.list(info, namespace=namespace or None, label_selector=by).items)
        except ApiError:
            continue  # the blocker stays unnamed; the object's own health still stands
    return child_index(found)
