"""Multi-tenancy on a real API server with RBAC on (docs/tenancy.md).

One cluster for the module, installed as its administrator with the shipped
``manifests/multi-tenant`` variant (and its tenant file copied for ``team-b``). From then on
the agent runs with its ServiceAccount's token (``local-cluster token``), never the admin
kubeconfig, whose ``system:masters`` group would bypass RBAC; the tenants are the
ServiceAccounts the agent impersonates.

- A tenant declaring objects in another tenant's namespace and a ClusterRoleBinding is refused
  before any request is made as it, named in ``run`` and ``diff``; nothing is written; the
  other tenant is applied and its health read as itself.
- A tenant whose account lacks ``delete`` on ConfigMaps: the preflight says so in one line
  before the pass; nothing is applied.
- A missing ServiceAccount is named as missing; an account the agent may not impersonate is
  named as such; neither as a bare 403.
- The agent's own identity cannot write tenant namespaces, and a tenant's identity cannot
  write the agent's namespace (prune approvals, suspension): access reviews say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.config.load import load_config
from agent.config.types import ClusterConfig, Config
from agent.dev import localcluster
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.kube.connection import Connection
from agent.model import AccessProblem, FailureReason, HealthState, ScopeRule
from agent.reconcile.reconciler import ClusterReconciler
from agent.source.git import GitSource
from tests import clusters
from tests.agentkit import config_head, make_repo, manifests, unique
from tests.appkit import toml_value
from tests.clusters import kubectl
from tests.test_install_manifests import build_text
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
VARIANT = ROOT / "manifests" / "multi-tenant"
TENANT_FILE = VARIANT / "tenant-team-a.yaml"
CLUSTER = "tenancy"
AGENT_SA = "gitops-agent/gitops-agent"


@dataclass(frozen=True)
class Tenancy:
    cluster: LocalCluster
    #: The agent's ServiceAccount, bound only by the shipped multi-tenant RBAC.
    agent_kubeconfig: Path


def admin_apply(cluster: LocalCluster, tmp: Path, text: str) -> None:
    f = tmp / f"{unique('setup')}.yaml"
    f.write_text(text)
    kubectl(cluster.kubeconfig, "apply", "--server-side", "--field-manager=installer", "-f", str(f))


@pytest.fixture(scope="module")
def tenancy(cluster_state_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    clusters.require_control_plane()
    cluster = clusters.start(CLUSTER, cluster_state_dir)
    try:
        tmp = tmp_path_factory.mktemp("tenancy-setup")
        admin_apply(cluster, tmp, build_text(VARIANT))
        tenant = TENANT_FILE.read_text()
        admin_apply(cluster, tmp, tenant.replace("team-a", "team-b"))
        # team-c: set up like the others, then its account deleted (a tenant whose account is gone).
        admin_apply(cluster, tmp, tenant.replace("team-a", "team-c"))
        kubectl(cluster.kubeconfig, "delete", "serviceaccount", "gitops-tenant", "-n", "team-c")
        kc = localcluster.token(CLUSTER, cluster_state_dir, AGENT_SA, cluster_role=None)
        who = json.loads(kubectl(kc, "auth", "whoami", "-o", "json"))["status"]["userInfo"]
        assert who["username"] == "system:serviceaccount:gitops-agent:gitops-agent"
        assert "system:masters" not in who.get("groups", [])
        yield Tenancy(cluster, kc)
    finally:
        clusters.delete(CLUSTER, cluster_state_dir)


class Recording(Connection):
    """The agent's connection, noting whom each request acted as (instrumentation, not a fake).

    A client and the views acting as ServiceAccounts share it, so it sees every request.
    """

    sent: list[tuple[str, str, str]]

    def send(self, method: str, path: str, **options: Any) -> bytes:
        self.__dict__.setdefault("sent", []).append((method, path, options.get("impersonate") or ""))
        return super().send(method, path, **options)


def recording(cluster: ClusterConfig) -> KubeClient:
    return KubeClient(Recording.from_config(cluster))


def tenant_config(tmp_path: Path, repo: Any, kubeconfig: Path, apps: list[Mapping[str, Any]]) -> Config:
    lines = [*config_head(tmp_path, repo, unique("mt")), "[[clusters]]", f'name = "{CLUSTER}"']
    lines.append(f'kubeconfig = "{kubeconfig}"')
    for app in apps:
        lines += ["", "[[apps]]", f'cluster = "{CLUSTER}"']
        lines += [f"{k} = {toml_value(v)}" for k, v in app.items()]
    p = tmp_path / "tenancy.toml"
    p.write_text("\n".join(lines) + "\n")
    return load_config(p)


def configmap(name: str, ns: str, value: str = "v") -> str:
    meta = f"metadata:\n  name: {name}\n  namespace: {ns}\n"
    return f"apiVersion: v1\nkind: ConfigMap\n{meta}data:\n  k: {value}\n"


def exists(cluster: LocalCluster, *what: str) -> bool:
    return bool(kubectl(cluster.kubeconfig, "get", *what, "--ignore-not-found", "-o", "name").strip())


def data_of(cluster: LocalCluster, name: str, ns: str) -> dict[str, str]:
    out = json.loads(kubectl(cluster.kubeconfig, "get", "configmap", name, "-n", ns, "-o", "json"))
    return dict(out["data"])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def reconciler(config: Config) -> ClusterReconciler:
    return ClusterReconciler(config, config.cluster(CLUSTER), client_factory=recording)


TENANT_A = {
    "name": "tenant-a",
    "path": "apps/a",
    "service_account": "team-a/gitops-tenant",
    "allowed_namespaces": ["team-a"],
    "allow_cluster_scoped": False,
}


def test_a_tenant_writing_outside_its_scope_is_refused_before_any_request_and_the_other_is_unaffected(
    tmp_path: Path, tenancy: Tenancy
) -> None:
    c = tenancy.cluster
    mine, intrusion, escalate, theirs = unique("a-ok"), unique("a-in-b"), unique("a-admin"), unique("b-ok")
    crb = f"""
        apiVersion: rbac.authorization.k8s.io/v1
        kind: ClusterRoleBinding
        metadata:
          name: {escalate}
        roleRef:
          apiGroup: rbac.authorization.k8s.io
          kind: ClusterRole
          name: cluster-admin
        subjects:
          - kind: ServiceAccount
            name: gitops-tenant
            namespace: team-a
        """
    repo = make_repo(
        tmp_path,
        {
            "apps/a/objects.yaml": manifests(configmap(mine, "team-a"), configmap(intrusion, "team-b"), crb),
            "apps/b/objects.yaml": configmap(theirs, "team-b"),
        },
    )
    tenant_b = {
        "name": "tenant-b",
        "path": "apps/b",
        "service_account": "team-b/gitops-tenant",
        "allowed_namespaces": ["team-b"],
        "allow_cluster_scoped": False,
        "wait": True,
    }
    cfg = tenant_config(tmp_path, repo, tenancy.agent_kubeconfig, [TENANT_A, tenant_b])
    rec = reconciler(cfg)
    try:
        results = {r.app: r for r in rec.reconcile_apps(GitSource.from_config(cfg).poll())}
        a, b = results["tenant-a"], results["tenant-b"]
        assert a.failure is not None and a.failure.reason is FailureReason.SCOPE, a.failure
        assert a.failure.scope is ScopeRule.NAMESPACE
        message = a.failure.message
        assert f"ConfigMap/team-b/{intrusion} (apps/a/objects.yaml:9): namespace team-b is not in" in message
        crb_key = f"ClusterRoleBinding.rbac.authorization.k8s.io/{escalate}"
        assert f"{crb_key} (apps/a/objects.yaml:17)" in message
        assert "allow_cluster_scoped is false" in message and f"ConfigMap/team-a/{mine}" not in message
        assert not a.results, "nothing applied or pruned for the refused app"
        client = rec.client.connection
        assert isinstance(client, Recording)
        as_a = [s for s in client.sent if s[2] == "system:serviceaccount:team-a:gitops-tenant"]
        assert as_a == [], "no request made as tenant A"

        assert b.ok and b.failure is None, (b.error, b.results)
        assert [r.outcome.value for r in b.results] == ["created"]
        assert data_of(c, theirs, "team-b") == {"k": "v"}
        in_b = [s for s in client.sent if s[1].startswith("/api/v1/namespaces/team-b/configmaps")]
        assert {s[2] for s in in_b} == {"system:serviceaccount:team-b:gitops-tenant"}, (
            "tenant B's reads and writes are made as tenant B"
        )
        # Its health is read as tenant B too (namespace-bound: listed in its namespace).
        (health,) = rec.step_health()
        assert health.app == "tenant-b" and health.state is HealthState.CURRENT, health
        whole = [
            s
            for s in client.sent
            if s[0] == "GET"
            and s[1] == "/api/v1/configmaps"
            and s[2] == "system:serviceaccount:team-b:gitops-tenant"
        ]
        assert len(whole) == 1, (
            f"the health read asked again for the whole kind the pass was refused: {whole}"
        )
    finally:
        rec.close()
    assert not exists(c, "configmap", mine, "-n", "team-a"), "nothing of tenant A written"
    assert not exists(c, "configmap", intrusion, "-n", "team-b")
    assert not exists(c, "clusterrolebinding", escalate)

    # The same refusal in `run --once` (exit 1, the objects named) and in `gitops-agent diff`.
    run = cli("run", "--once", "--config", str(cfg.file))
    assert run.returncode == 1, run.stderr
    assert f"ConfigMap/team-b/{intrusion}" in run.stderr and "outside its scope" in run.stderr, run.stderr
    diff = cli("diff", "--config", str(cfg.file), "--format", "text")
    assert diff.returncode == 2, diff.stdout + diff.stderr
    assert f"ConfigMap/team-b/{intrusion}" in diff.stdout and escalate in diff.stdout, diff.stdout
    assert not exists(c, "configmap", intrusion, "-n", "team-b")
    assert not exists(c, "clusterrolebinding", escalate)


def test_the_preflight_names_a_missing_delete_rule_in_one_line_and_nothing_is_half_applied(
    tmp_path: Path, tenancy: Tenancy
) -> None:
    c = tenancy.cluster
    sa = unique("nodelete")
    # As the cluster's administrator: an account that may read and apply ConfigMaps but not
    # delete them, and the agent's right to act as it.
    admin_apply(
        c,
        tmp_path,
        manifests(
            f"apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {sa}\n  namespace: team-a\n",
            f"""
            apiVersion: rbac.authorization.k8s.io/v1
            kind: Role
            metadata: {{name: {sa}, namespace: team-a}}
            rules:
              - apiGroups: [""]
                resources: ["configmaps"]
                verbs: ["get", "list", "create", "patch"]
            """,
            f"""
            apiVersion: rbac.authorization.k8s.io/v1
            kind: RoleBinding
            metadata: {{name: {sa}, namespace: team-a}}
            roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {sa}}}
            subjects: [{{kind: ServiceAccount, name: {sa}, namespace: team-a}}]
            """,
            f"""
            apiVersion: rbac.authorization.k8s.io/v1
            kind: Role
            metadata: {{name: {sa}-impersonate, namespace: team-a}}
            rules:
              - apiGroups: [""]
                resources: ["serviceaccounts"]
                resourceNames: ["{sa}"]
                verbs: ["impersonate"]
            """,
            f"""
            apiVersion: rbac.authorization.k8s.io/v1
            kind: RoleBinding
            metadata: {{name: {sa}-impersonate, namespace: team-a}}
            roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {sa}-impersonate}}
            subjects: [{{kind: ServiceAccount, name: gitops-agent, namespace: gitops-agent}}]
            """,
        ),
    )
    keep, old, new = unique("keep"), unique("old"), unique("new")
    repo = make_repo(
        tmp_path, {"apps/a/cm.yaml": manifests(configmap(keep, "team-a"), configmap(old, "team-a"))}
    )
    app = {**TENANT_A, "service_account": f"team-a/{sa}"}
    cfg = tenant_config(tmp_path, repo, tenancy.agent_kubeconfig, [app])
    rec = reconciler(cfg)
    source = GitSource.from_config(cfg)
    try:
        (first,) = rec.reconcile_apps(source.poll())
        assert first.ok, (first.error, first.results)
        repo.commit({"apps/a/cm.yaml": manifests(configmap(keep, "team-a", "v2"), configmap(new, "team-a"))})
        (second,) = rec.reconcile_apps(source.poll())
    finally:
        rec.close()
    assert second.failure is not None and second.failure.reason is FailureReason.ACCESS, second.failure
    assert second.failure.access is AccessProblem.RULE_MISSING
    assert second.failure.message == (
        f"preflight: ServiceAccount team-a/{sa} may not delete configmaps in namespace team-a"
        f" (for ConfigMap/team-a/{old}); nothing applied or pruned for app 'tenant-a'"
    )
    assert not second.results
    assert data_of(c, keep, "team-a") == {"k": "v"}, "the update was not applied"
    assert not exists(c, "configmap", new, "-n", "team-a"), "the create was not applied"
    assert exists(c, "configmap", old, "-n", "team-a")


def test_a_missing_or_unimpersonable_service_account_is_named_as_such_not_as_a_forbidden(
    tmp_path: Path, tenancy: Tenancy
) -> None:
    c = tenancy.cluster
    gone, stranger = unique("gone"), unique("stranger")
    repo = make_repo(
        tmp_path,
        {"apps/c/cm.yaml": configmap(gone, "team-c"), "apps/d/cm.yaml": configmap(stranger, "team-a")},
    )
    apps = [
        {"name": "tenant-c", "path": "apps/c", "service_account": "team-c/gitops-tenant"},
        # `default` exists in team-a, but the agent may impersonate only gitops-tenant there.
        {"name": "stranger", "path": "apps/d", "service_account": "team-a/default"},
    ]
    cfg = tenant_config(tmp_path, repo, tenancy.agent_kubeconfig, apps)
    rec = reconciler(cfg)
    try:
        results = {r.app: r for r in rec.reconcile_apps(GitSource.from_config(cfg).poll())}
    finally:
        rec.close()
    missing, denied = results["tenant-c"].failure, results["stranger"].failure
    assert missing is not None and missing.access is AccessProblem.MISSING_ACCOUNT, missing
    assert missing.message == (
        "preflight: ServiceAccount team-c/gitops-tenant does not exist;"
        " nothing applied or pruned for app 'tenant-c'"
    )
    assert denied is not None and denied.access is AccessProblem.IMPERSONATION_DENIED, denied
    assert "the agent may not impersonate ServiceAccount team-a/default" in denied.message
    assert "403" not in missing.message + denied.message
    assert not exists(c, "configmap", gone, "-n", "team-c")
    assert not exists(c, "configmap", stranger, "-n", "team-a")


def may(client: KubeClient, verb: str, resource: str, namespace: str = "", **more: str) -> bool:
    attributes = {"verb": verb, "resource": resource, **more}
    if namespace:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    answer = client.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review)
    return bool(answer["status"].get("allowed"))


def test_the_agents_own_identity_cannot_write_tenant_namespaces_nor_a_tenant_the_agents(
    tenancy: Tenancy,
) -> None:
    agent = KubeClient.connect("agent", kubeconfig=str(tenancy.agent_kubeconfig))
    try:
        for verb in ("create", "patch", "delete", "update"):
            assert not may(agent, verb, "configmaps", "team-a"), verb
            assert not may(agent, verb, "deployments", "team-b", group="apps"), verb
        rbac = "rbac.authorization.k8s.io"
        assert not may(agent, "create", "clusterrolebindings", group=rbac)
        assert not may(agent, "create", "namespaces")
        assert not may(agent, "impersonate", "serviceaccounts", "team-a", name="default")
        assert not may(agent, "impersonate", "users")
        # What it needs itself: act as the tenants, its inventories, Leases, Events, kube-system.
        assert may(agent, "impersonate", "serviceaccounts", "team-a", name="gitops-tenant")
        assert may(agent, "patch", "configmaps", "gitops-agent")
        assert may(agent, "update", "leases", "gitops-agent", group="coordination.k8s.io")
        assert may(agent, "create", "events", "gitops-agent")
        assert may(agent, "get", "namespaces", name="kube-system")

        # Operator state (the ApplySet parents' approvals and suspension, Leases, Events) is
        # beyond a tenant's identity.
        tenant = agent.impersonating("team-a/gitops-tenant")
        assert may(tenant, "create", "configmaps", "team-a")
        for verb in ("create", "patch", "update", "delete"):
            assert not may(tenant, verb, "configmaps", "gitops-agent"), verb
            assert not may(tenant, verb, "leases", "gitops-agent", group="coordination.k8s.io"), verb
        assert not may(tenant, "create", "configmaps", "team-b")
    finally:
        agent.close()


def test_create_namespace_creates_a_tenants_namespace_as_the_tenant_only_once_its_rbac_allows_it(
    tmp_path: Path, tenancy: Tenancy
) -> None:
    c = tenancy.cluster
    extra, name, role = unique("team-a-extra"), unique("a-cm"), unique("ns-creator")
    repo = make_repo(tmp_path, {"apps/a/cm.yaml": configmap(name, "team-a")})
    app = {
        **TENANT_A,
        "allowed_namespaces": ["team-a", "team-a-*"],
        "default_namespace": extra,
        "create_namespace": True,
    }
    cfg = tenant_config(tmp_path, repo, tenancy.agent_kubeconfig, [app])
    as_tenant = "system:serviceaccount:team-a:gitops-tenant"
    rec = reconciler(cfg)
    try:
        (refused,) = rec.reconcile_apps(GitSource.from_config(cfg).poll())
        # The agent itself may not create namespaces; the tenant may not yet either: refused as it.
        assert refused.failure is not None and "403" in refused.failure.message, refused.failure
        assert as_tenant in refused.failure.message and not exists(c, "namespace", extra)
        assert not exists(c, "configmap", name, "-n", "team-a"), "nothing applied after the refusal"

        grant = (
            f"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: {role}}}\n"
            'rules: [{apiGroups: [""], resources: [namespaces], verbs: [get, create]}]\n---\n'
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n"
            f"metadata: {{name: {role}}}\n"
            f"roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}\n"
            "subjects: [{kind: ServiceAccount, name: gitops-tenant, namespace: team-a}]\n"
        )
        admin_apply(c, tmp_path, grant)
        wait_for(
            "the tenant's new RBAC to be in force",
            lambda: (
                kubectl(
                    c.kubeconfig, "auth", "can-i", "create", "namespaces", f"--as={as_tenant}", check=False
                ).strip()
                == "yes"
            ),
            timeout=30,
        )
        (done,) = rec.reconcile_apps(GitSource.from_config(cfg).poll())
        assert done.ok, done.failure
        live = json.loads(kubectl(c.kubeconfig, "get", "namespace", extra, "-o", "json"))
        assert live["metadata"]["labels"]["gitops-agent.io/created-by"] == f"{cfg.agent.name}.tenant-a"
        client = rec.client.connection
        assert isinstance(client, Recording)
        posts = [s for s in client.sent if s[0] == "POST" and s[1] == "/api/v1/namespaces"]
        assert posts and {s[2] for s in posts} == {as_tenant}, posts
    finally:
        rec.close()
        kubectl(c.kubeconfig, "delete", "namespace", extra, "--ignore-not-found", "--wait=false", check=False)
        kubectl(
            c.kubeconfig, "delete", "clusterrole,clusterrolebinding", role, "--ignore-not-found", check=False
        )
