"""An app's objects as a tree: each with its owners' children and its health, as
``gitops-agent tree`` prints it (like ``kubectl tree`` or ``argocd app resources``).

Pure: ``reconcile.tree_read`` reads the objects; here each is assessed by the same rules a wait
uses (``plan.health``, the app's custom checks included) with its children by owner UID, so a
Deployment's health names the Pod that holds it up and the Pod is right below it. Health
messages of Secrets are left out, as everywhere the agent reports (docs/safety.md rule 11).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from agent.config.health_checks import HealthCheck
from agent.model import Health, HealthState, Manifest, ObjectKey
from agent.plan.health import assess, child_index, excluded


@dataclass(frozen=True)
class Node:
    """One object: the app's own (``member``) or a child of one, with its own children."""

    key: ObjectKey
    uid: str
    #: None: annotated out of health (``gitops-agent.io/health: ignore``).
    health: Health | None
    member: bool
    children: tuple[Node, ...] = ()

    def to_json(self) -> dict[str, Any]:
        k, h = self.key, self.health
        secret = k.kind == "Secret" and k.group == ""
        return {
            "group": k.group,
            "kind": k.kind,
            "namespace": k.namespace,
            "name": k.name,
            "uid": self.uid,
            "member": self.member,
            "health": None
            if h is None
            else {
                "state": h.state.value,
                "reason": h.reason,
                "message": "" if secret else h.message,
                "blocker": str(h.blocker) if h.blocker else None,
            },
            "children": [c.to_json() for c in self.children],
        }


def _uid(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _order(key: ObjectKey) -> tuple[bool, str, str, str, str]:
    return (bool(key.namespace), key.namespace, key.kind, key.group, key.name)


def build(
    members: Mapping[ObjectKey, Manifest | None],
    unread: Mapping[ObjectKey, str],
    children: Sequence[Manifest],
    *,
    checks: Sequence[HealthCheck] = (),
) -> tuple[Node, ...]:
    """The app's objects, cluster-scoped first then by namespace, kind and name, each with its
    descendants (an owner's children in the same order)."""
    index = child_index(children)

    def key_of(obj: Mapping[str, Any]) -> ObjectKey:
        return ObjectKey.of(cast(Manifest, obj))

    def node(obj: Mapping[str, Any], seen: frozenset[str]) -> Node:
        uid = _uid(obj)
        below = sorted(index.get(uid, ()), key=lambda o: _order(key_of(o))) if uid not in seen else []
        kids = tuple(node(c, seen | {uid}) for c in below)
        health = None if excluded(obj) else assess(obj, children=index, checks=checks)
        return Node(key_of(obj), uid, health, member=False, children=kids)

    out: list[Node] = []
    for key in sorted({*members, *unread}, key=_order):
        obj = members.get(key)
        if key in unread:
            out.append(Node(key, "", Health(HealthState.UNKNOWN, unread[key], reason="ReadFailed"), True))
        elif obj is None:
            out.append(
                Node(key, "", Health(HealthState.NOT_FOUND, "not in the cluster", reason="NotFound"), True)
            )
        else:
            n = node(obj, frozenset())
            out.append(Node(key, n.uid, n.health, True, n.children))
    return tuple(out)


def _said(h: Health) -> str:
    """The message, and what blocks the object when that is another (a Deployment's Pod)."""
    if h.blocker is None or h.message == h.blocker.message:
        return h.message
    return "; ".join(filter(None, (h.message.rstrip("."), str(h.blocker))))


def _lines(nodes: Sequence[Node], prefix: str, rows: list[tuple[str, ...]], top: bool) -> None:
    for i, n in enumerate(nodes):
        last = i == len(nodes) - 1
        glyph = "" if top else ("└─" if last else "├─")
        h, k = n.health, n.key
        secret = k.kind == "Secret" and k.group == ""
        rows.append(
            (
                k.namespace or "-",
                f"{prefix}{glyph}{k.kind}/{k.name}",
                h.state.value if h else "ignored",
                (h.reason if h else "") or "-",
                "" if h is None or secret else _said(h),
            )
        )
        _lines(n.children, prefix if top else prefix + ("  " if last else "│ "), rows, False)


def format_tree(nodes: Sequence[Node]) -> list[tuple[str, ...]]:
    """The rows of the table: NAMESPACE, NAME (indented under its owner), HEALTH, REASON, MESSAGE."""
    rows: list[tuple[str, ...]] = [("NAMESPACE", "NAME", "HEALTH", "REASON", "MESSAGE")]
    _lines(nodes, "", rows, True)
    return rows
