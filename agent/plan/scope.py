"""An app's scope: which objects it may declare, and so write or prune (pure).

The pass, ``gitops-agent diff`` and the prune guard ask ``Scope.violation`` of each object
before any request is made for the app: an app that declares something outside its scope
fails closed, like a render error, naming each object, its file and the rule it breaks; an
inventory member outside it is never pruned by that app. The rules, in the order they are
checked: no app, scoped or not, declares an ApplySet parent of the agent (``inventory_parent``:
its apply, under the agent's own field manager, would overwrite that app's member list and
annotations); an app acting as its own ServiceAccount never writes the agent's namespace (where
inventories, prune approvals and suspension live); cluster-scoped objects only with
``allow_cluster_scoped``; namespaces matching ``allowed_namespaces``; kinds matching
``allowed_kinds``. Namespaced-ness comes from the key: objects are prepared (a namespaced
kind given its namespace, a cluster-scoped one refused one) before they are checked.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from agent.config.types import CLUSTER_DEFAULTS, AppConfig
from agent.model import DesiredObject, ObjectKey, ScopeRule, ScopeViolation


@dataclass(frozen=True)
class Scope:
    """One app's scope, as its settings say."""

    namespaces: tuple[str, ...] = CLUSTER_DEFAULTS.allowed_namespaces
    kinds: tuple[str, ...] = CLUSTER_DEFAULTS.allowed_kinds
    cluster_scoped: bool = CLUSTER_DEFAULTS.allow_cluster_scoped
    #: The agent's namespace when the app acts as its own ServiceAccount (closed to it), else "".
    agent_namespace: str = ""
    #: (agent name, agent namespace): where the agent's ApplySet parents are, closed to every app.
    parents: tuple[str, str] | None = None

    @classmethod
    def of(cls, app: AppConfig, agent_namespace: str, agent: str = "") -> Scope:
        s = app.settings
        return cls(
            namespaces=s.allowed_namespaces,
            kinds=s.allowed_kinds,
            cluster_scoped=s.allow_cluster_scoped,
            agent_namespace=agent_namespace if s.service_account else "",
            parents=(agent, agent_namespace) if agent else None,
        )

    @property
    def unrestricted(self) -> bool:
        return (
            self.namespaces == ("*",)
            and self.kinds == ("*",)
            and self.cluster_scoped
            and not self.agent_namespace
        )

    def violation(self, key: ObjectKey) -> tuple[ScopeRule, str] | None:
        """The first rule ``key`` breaks, with why in users' words; None when it is in scope."""
        if self.parents is not None and inventory_parent(key, *self.parents):
            return ScopeRule.INVENTORY_PARENT, (
                f"it is the agent's ApplySet parent {key.name} (an app's inventory: its members,"
                " suspension, prune approvals): no app declares, writes or prunes one"
            )
        if self.unrestricted:
            return None
        ns = key.namespace
        if self.agent_namespace and (ns == self.agent_namespace or _is_namespace(key, self.agent_namespace)):
            return ScopeRule.AGENT_NAMESPACE, (
                f"namespace {self.agent_namespace} is the agent's own (inventories, prune approvals,"
                " suspension): an app with a service_account never writes there"
            )
        if not ns and not self.cluster_scoped:
            return ScopeRule.CLUSTER_SCOPED, f"{key.kind} is cluster-scoped and allow_cluster_scoped is false"
        if ns and not _matches(ns, self.namespaces):
            return (
                ScopeRule.NAMESPACE,
                f"namespace {ns} is not in allowed_namespaces {_listed(self.namespaces)}",
            )
        if not _matches(key.group_kind, self.kinds):
            return ScopeRule.KIND, f"kind {key.group_kind} is not in allowed_kinds {_listed(self.kinds)}"
        return None

    def creation_violation(self, namespace: str, app: str) -> ScopeViolation | None:
        """Why ``create_namespace`` may not create ``namespace`` for ``app``: only a name matching
        ``allowed_namespaces`` (never the agent's own), whatever ``allow_cluster_scoped`` says."""
        if self.agent_namespace and namespace == self.agent_namespace:
            rule, why = ScopeRule.AGENT_NAMESPACE, "the agent's own namespace is never created for an app"
        elif not _matches(namespace, self.namespaces):
            rule, why = ScopeRule.NAMESPACE, f"not in allowed_namespaces {_listed(self.namespaces)}"
        else:
            return None
        message = f"create_namespace: namespace {namespace} is not created: {why} (app {app!r})"
        return ScopeViolation(ObjectKey("", "Namespace", "", namespace), rule, message)

    def violations(self, objects: Iterable[DesiredObject], app: str) -> tuple[ScopeViolation, ...]:
        """Every object of ``objects`` outside this scope, named with its file and rule."""
        if self.unrestricted and self.parents is None:
            return ()
        out = []
        for obj in objects:
            found = self.violation(obj.key)
            if found is not None:
                rule, why = found
                out.append(
                    ScopeViolation(obj.key, rule, f"{obj.key} ({obj.provenance}): {why} (app {app!r})")
                )
        return tuple(out)


def inventory_parent(key: ObjectKey, agent: str, namespace: str) -> bool:
    """Is ``key`` where an ApplySet parent of ``agent`` lives: the ConfigMap ``<agent>`` (a
    `[[clusters]]` entry's own app) or ``<agent>.<app>`` in the agent's namespace?"""
    return (
        key.group == ""
        and key.kind == "ConfigMap"
        and key.namespace == namespace
        and (key.name == agent or key.name.startswith(f"{agent}."))
    )


def _is_namespace(key: ObjectKey, name: str) -> bool:
    return key.group == "" and key.kind == "Namespace" and key.name == name


def _matches(value: str, globs: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(value, g) for g in globs)


def _listed(globs: tuple[str, ...]) -> str:
    return "[" + ", ".join(globs) + "]"
