"""Reading the health of an app's objects from its cluster: the I/O beside ``plan.health``.

One step reads every followed object with one LIST per kind, selected by the app's membership
label (what the app applied carries it), so a step costs as many requests as the app has kinds,
whatever its size. Only a workload that is not Current costs more: one LIST per kind of its
children (ReplicaSets, Pods), by the workload's own selector, so that its blocking Pod can be
named. A kind whose LIST fails leaves its objects Unknown with the server's words: health is
reported, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.config.health_checks import HealthCheck
from agent.errors import ApiError
from agent.kube.client import KubeClient
from agent.model import PART_OF, Health, HealthState, Manifest, ObjectKey
from agent.plan import health as assess_health
from agent.plan.health import CHILD_KINDS, child_index

#: A child kind's (group, version).
_CHILD_API = {"ReplicaSet": "apps/v1", "Pod": "v1"}


@dataclass
class Reading:
    """One step's view of the followed objects: each one's health, and what the step cost."""

    healths: dict[ObjectKey, Health] = field(default_factory=dict)
    requests: int = 0


def selector(match_labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def read(
    client: KubeClient,
    membership: str,
    keys: Iterable[ObjectKey],
    *,
    checks: Sequence[HealthCheck] = (),
) -> Reading:
    """The health of ``keys`` (members of the set ``membership``), each assessed with ``checks``."""
    out = Reading()
    by_kind: dict[tuple[str, str], set[ObjectKey]] = {}
    for k in keys:
        by_kind.setdefault((k.group, k.kind), set()).add(k)
    for (group, kind), wanted in sorted(by_kind.items()):
        info = client.discovery().find_group_kind(group, kind)
        if info is None:
            for k in wanted:
                out.healths[k] = Health(
                    HealthState.UNKNOWN, f"the cluster does not serve {k.group_kind}", reason="NotServed"
                )
            continue
        found: dict[ObjectKey, Manifest] = {}
        try:
            out.requests += 1
            listed = client.list(info, label_selector=f"{PART_OF}={membership}")
        except ApiError as e:
            for k in wanted:
                out.healths[k] = Health(HealthState.UNKNOWN, f"not read: {e}", reason="ReadFailed")
            continue
        for item in listed.items:
            key = ObjectKey.of(item)
            if key in wanted:
                found[key] = item
        for k in wanted:
            obj = found.get(k)
            if obj is None:
                out.healths[k] = Health(HealthState.NOT_FOUND, "not in the cluster", reason="NotFound")
                continue
            if assess_health.excluded(obj):
                continue
            first = assess_health.assess(obj, checks=checks)
            if first.state in (HealthState.CURRENT, HealthState.SUSPENDED) or kind not in CHILD_KINDS:
                out.healths[k] = first
                continue
            children, cost = _children(client, obj, CHILD_KINDS[kind])
            out.requests += cost
            out.healths[k] = assess_health.assess(obj, children=children, checks=checks)
    return out


def _children(
    client: KubeClient, obj: Manifest, kinds: Sequence[str]
) -> tuple[dict[str, list[Mapping[str, Any]]], int]:
    """The objects of ``kinds`` in ``obj``'s namespace matched by its selector, by owner UID."""
    spec = obj.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    namespace = (obj.get("metadata") or {}).get("namespace") or None
    found: list[Manifest] = []
    cost = 0
    if not labels:
        return {}, cost
    for kind in kinds:
        info = client.discovery().find(_CHILD_API[kind], kind)
        if info is None:
            continue
        try:
            cost += 1
            found.extend(client.list(info, namespace=namespace, label_selector=selector(labels)).items)
        except ApiError:
            continue  # the blocker stays unnamed; the object's own health still stands
    return child_index(found), cost
