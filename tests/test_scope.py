"""An app's scope and identity as pure decisions: the scope rules, pruning kept in scope, what
the preflight asks for, and how the config spells them (``tests/test_tenancy.py`` runs them on
a real API server with RBAC)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.apply.inventory import Inventory, Member
from agent.apply.prune import PruneOptions, decide
from agent.config.load import parse_config
from agent.config.types import AppConfig
from agent.errors import ConfigError
from agent.kube.client import ResourceInfo
from agent.model import PART_OF, Action, Change, DesiredObject, Note, ObjectKey, Provenance, ScopeRule
from agent.plan.scope import Scope
from agent.reconcile.preflight import Need, needs

FM = "agent-x"
ID = "applyset-abc-v1"
TENANT = Scope(namespaces=("team-a", "team-a-*"), kinds=("ConfigMap", "*.apps"), cluster_scoped=False)


def cm(ns: str, name: str = "x") -> ObjectKey:
    return ObjectKey("", "ConfigMap", ns, name)


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        (cm("team-a"), None),
        (cm("team-a-dev"), None),
        (ObjectKey("apps", "Deployment", "team-a", "web"), None),
        (cm("team-b"), ScopeRule.NAMESPACE),
        (ObjectKey("", "Secret", "team-a", "s"), ScopeRule.KIND),
        (ObjectKey("rbac.authorization.k8s.io", "ClusterRoleBinding", "", "admin"), ScopeRule.CLUSTER_SCOPED),
        (ObjectKey("", "Namespace", "", "team-a"), ScopeRule.CLUSTER_SCOPED),
    ],
)
def test_an_object_breaks_the_first_rule_of_its_apps_scope_it_fails(key: ObjectKey, rule: ScopeRule) -> None:
    found = TENANT.violation(key)
    assert (found[0] if found else None) is rule


def test_the_agents_namespace_is_closed_to_apps_acting_as_a_service_account_whatever_their_scope() -> None:
    app = parse_config(config(service_account="team-a/deployer")).apps[0]
    scope = Scope.of(app, "gitops-agent")
    found = scope.violation(cm("gitops-agent", "gitops-agent.web"))
    assert found is not None and found[0] is ScopeRule.AGENT_NAMESPACE
    assert "prune approvals" in found[1]
    found = scope.violation(ObjectKey("", "Namespace", "", "gitops-agent"))
    assert found is not None and found[0] is ScopeRule.AGENT_NAMESPACE
    # The agent's own apps (no service_account) may manage the agent itself (self-management).
    own = parse_config(config()).apps[0]
    assert Scope.of(own, "gitops-agent").violation(cm("gitops-agent")) is None


def test_violations_name_the_object_its_file_and_line_the_rule_and_the_app() -> None:
    obj = DesiredObject(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "team-b"}},
        Provenance("apps/a/cm.yaml", 0, 3),
    )
    (v,) = TENANT.violations([obj], "tenant-a")
    assert v.rule is ScopeRule.NAMESPACE
    assert v.message == (
        "ConfigMap/team-b/x (apps/a/cm.yaml:3): namespace team-b is not in allowed_namespaces"
        " [team-a, team-a-*] (app 'tenant-a')"
    )


def test_an_unrestricted_scope_allows_everything() -> None:
    assert Scope().unrestricted
    assert Scope().violation(ObjectKey("rbac.authorization.k8s.io", "ClusterRole", "", "x")) is None


# -- pruning stays in scope ----------------------------------------------------------------


def live(key: ObjectKey) -> dict[str, Any]:
    fields = {"f:metadata": {"f:labels": {f"f:{PART_OF}": {}}}}
    return {
        "apiVersion": "v1",
        "kind": key.kind,
        "metadata": {
            "name": key.name,
            "namespace": key.namespace,
            "uid": f"uid-{key.name}",
            "labels": {PART_OF: ID},
            "managedFields": [{"manager": FM, "operation": "Apply", "fieldsV1": fields}],
        },
    }


def test_an_app_never_prunes_outside_its_scope_whatever_its_inventory_says() -> None:
    inside, outside = cm("team-a", "old"), cm("team-b", "theirs")
    inv = Inventory("agent-x", "gitops-agent", exists=True)
    for k in (cm("team-a", "kept"), inside, outside):
        inv.members[k] = Member(k, f"uid-{k.name}")
    options = PruneOptions(field_manager=FM, inventory_id=ID, scope=TENANT)
    d = decide(
        inv,
        {cm("team-a", "kept")},
        {k: live(k) for k in (inside, outside)},
        {("", "ConfigMap"): True},
        options,
        render_empty=False,
    )
    assert [c.key for c in d.delete] == [inside]
    assert outside in d.kept and outside in d.out_of_scope
    assert d.kept[outside] == (
        "outside the app's scope (namespace team-b is not in allowed_namespaces [team-a, team-a-*]):"
        " this app never deletes it"
    )
    # Without a scope, the same inventory deletes both: the guard is what keeps it.
    unscoped = PruneOptions(field_manager=FM, inventory_id=ID)
    d = decide(
        inv,
        {cm("team-a", "kept")},
        {k: live(k) for k in (inside, outside)},
        {("", "ConfigMap"): True},
        unscoped,
        render_empty=False,
    )
    assert sorted(c.key for c in d.delete) == sorted([inside, outside])


def test_an_out_of_scope_member_is_reported_with_its_note() -> None:
    from agent.apply.prune import execute

    inv = Inventory("agent-x", "gitops-agent", exists=True)
    inv.members[cm("team-b")] = Member(cm("team-b"), "uid-x")
    options = PruneOptions(field_manager=FM, inventory_id=ID, scope=TENANT)
    d = decide(
        inv, set(), {cm("team-b"): live(cm("team-b"))}, {("", "ConfigMap"): True}, options, render_empty=False
    )
    (result,) = execute(None, d, options)  # type: ignore[arg-type]  # nothing to delete: no request
    assert result.note is Note.OUT_OF_SCOPE


# -- what the preflight asks ------------------------------------------------------------------

CONFIGMAPS = ResourceInfo("", "v1", "ConfigMap", "configmaps", True, frozenset())
ROLES = ResourceInfo("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False, frozenset())


def resolve(key: ObjectKey) -> ResourceInfo | None:
    return {"ConfigMap": CONFIGMAPS, "ClusterRole": ROLES}.get(key.kind)


def test_the_preflight_asks_each_distinct_verb_resource_and_namespace_once() -> None:
    body = {"kind": "ConfigMap"}
    changes = [
        Change(cm("team-a", "new"), Action.CREATE, body=body),
        Change(cm("team-a", "other"), Action.CREATE, body=body),
        Change(cm("team-a", "changed"), Action.UPDATE, body=body),
        Change(cm("team-a", "same"), Action.NOOP),
        Change(ObjectKey("rbac.authorization.k8s.io", "ClusterRole", "", "r"), Action.UPDATE, body=body),
        Change(ObjectKey("example.com", "Widget", "team-a", "w"), Action.CREATE, body=body),  # not served yet
    ]
    wanted = needs(changes, delete=[cm("team-b", "old")], unread=[cm("team-c")], resolve=resolve)
    assert sorted(wanted) == sorted(
        [
            Need("patch", "", "configmaps", "team-a"),
            Need("create", "", "configmaps", "team-a"),
            Need("patch", "rbac.authorization.k8s.io", "clusterroles", ""),
            Need("delete", "", "configmaps", "team-b"),
            Need("list", "", "configmaps", "team-c"),
        ]
    )
    assert wanted[Need("create", "", "configmaps", "team-a")] == cm("team-a", "new")
    assert str(Need("delete", "", "configmaps", "team-b")) == "delete configmaps in namespace team-b"
    assert str(Need("patch", "rbac.authorization.k8s.io", "clusterroles", "")) == (
        "patch clusterroles.rbac.authorization.k8s.io cluster-wide"
    )


def test_a_steady_pass_needs_nothing() -> None:
    assert needs([Change(cm("team-a"), Action.NOOP)], resolve=resolve) == {}


# -- the config -------------------------------------------------------------------------------


def config(**app: Any) -> dict[str, Any]:
    return {
        "source": {"url": "https://git.example.com/fleet.git"},
        "clusters": [{"name": "c", "kubeconfig": "/dev/null"}],
        "apps": [{"name": "web", "cluster": "c", "path": "apps/web", **app}],
    }


def test_service_account_and_scope_are_read_per_app_over_the_clusters_defaults() -> None:
    data = config(
        service_account="team-a/deployer", allowed_namespaces=["team-a"], allowed_kinds=["ConfigMap"]
    )
    data["defaults"] = {"allow_cluster_scoped": False, "service_account": "ops/default-tenant"}
    data["apps"].append({"name": "other", "cluster": "c", "path": "apps/other"})
    web, other = parse_config(data, base_dir=Path("/")).apps
    assert isinstance(web, AppConfig)
    s = web.settings
    assert (s.service_account, s.allowed_namespaces, s.allowed_kinds, s.allow_cluster_scoped) == (
        "team-a/deployer",
        ("team-a",),
        ("ConfigMap",),
        False,
    )
    assert other.settings.service_account == "ops/default-tenant"  # the default for apps naming none
    assert other.settings.allowed_namespaces == ("*",)


@pytest.mark.parametrize(
    ("app", "where", "says"),
    [
        ({"service_account": "deployer"}, "apps[0].service_account", '"namespace/name"'),
        ({"service_account": "Team/x"}, "apps[0].service_account", '"namespace/name"'),
        ({"allowed_namespaces": ["team-a", ""]}, "apps[0].allowed_namespaces[1]", "must not be empty"),
        ({"allowed_kinds": "ConfigMap"}, "apps[0].allowed_kinds", "expected array"),
        ({"allow_cluster_scoped": "no"}, "apps[0].allow_cluster_scoped", "expected boolean"),
    ],
)
def test_a_bad_identity_or_scope_names_its_key(app: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(config(**app), base_dir=Path("/"))
    assert e.value.path == where and says in e.value.message
