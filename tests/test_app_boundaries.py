"""App boundaries on real local API servers (docs/safety.md rule 6, each_cluster_alone — and each
app alone — and rule 9, ownership_ends).

No app's prune deletes another app's or tool's objects, directly or by cascade: a CRD whose
custom resources another app declares, a Namespace holding another app's objects (more than one
page of a kind), are kept and named with the other app and the count, pass after pass, the other
app's objects keeping their UIDs, and pruned once nothing foreign is left. No app writes or
prunes another app's ApplySet parent, scoped or not. Objects marked with Helm's, Argo CD's or
Flux's keep annotations leave the inventory and stay when they leave Git. The pure decisions
are in ``tests/test_prune_cascade.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.apply.inventory import Member, applyset_id
from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.errors import ScopeError
from agent.kube.client import KubeClient
from agent.model import (
    AGENT_LABEL,
    PART_OF,
    SUSPENDED,
    ApplyResult,
    ClusterResult,
    FailureReason,
    Note,
    ObjectKey,
    Outcome,
    PassState,
    ScopeRule,
)
from agent.reconcile.reconciler import ClusterReconciler
from agent.reconcile.takeover import run_takeover
from tests.agentkit import E2E, Repo, make_repo, unique, write_config
from tests.appkit import AppsAgent, members, parent, write_apps_config
from tests.clusters import ClusterPool, kubectl
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: v\n"


def uids(cluster: LocalCluster, resource: str, ns: str) -> dict[str, str]:
    out = json.loads(kubectl(cluster.kubeconfig, "get", resource, "-n", ns, "-o", "json"))
    return {i["metadata"]["name"]: i["metadata"]["uid"] for i in out["items"]}


def result_for(result: ClusterResult, key: ObjectKey) -> ApplyResult:
    (found,) = [r for r in result.results if r.key == key]
    return found


def apps_agent(e2e: E2E, cfg: Config, cluster: LocalCluster) -> AppsAgent:
    """The fleet for ``cfg``, closed after the test; the apps' parents deleted after it."""
    agent = AppsAgent(cfg)
    e2e.at_end(agent.close)
    selector = f"{AGENT_LABEL}={cfg.agent.name}"
    e2e.delete_after(cluster, "configmap", "-n", cfg.agent.namespace, "-l", selector)
    return agent


def converge(agent: AppsAgent) -> dict[str, ClusterResult]:
    """Passes until every app's succeeded (an app's CRD is served a moment after it is applied)."""
    for _ in range(5):
        results = agent.reconcile()
        if all(r.ok and r.state is PassState.OK for r in results.values()):
            return results
    raise AssertionError(f"apps did not converge: {results}")


def test_each_app_alone_a_crd_another_apps_custom_resources_use_is_kept_and_named_until_they_are_gone(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("crd-users")
    group = f"{unique('g')}.example.com"
    crd_name = f"certificates.{group}"
    e2e.delete_after(a, "crd", crd_name)
    crd = f"""apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {crd_name}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: certificates, singular: certificate, kind: Certificate}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""
    certs = "---\n".join(
        f"apiVersion: {group}/v1\nkind: Certificate\nmetadata:\n  name: c{i}\n  namespace: {ns}\n"
        for i in range(3)
    )
    files = {
        "apps/cert-manager/crds.yaml": crd,
        "apps/cert-manager/ns.yaml": NS.format(ns=ns),
        "apps/web/certs.yaml": certs,
    }
    repo = make_repo(tmp_path, files)
    apps = [
        {"name": "cert-manager", "path": "apps/cert-manager"},
        {"name": "web", "path": "apps/web", "depends_on": ["cert-manager"]},
    ]
    cfg = write_apps_config(tmp_path, repo, a, apps)
    agent = apps_agent(e2e, cfg, a)
    converge(agent)
    before = uids(a, f"certificates.{group}", ns)
    assert sorted(before) == ["c0", "c1", "c2"]
    # cert-manager's chart with `crds.enabled: false`: the CRD leaves that app's Git.
    del files["apps/cert-manager/crds.yaml"]
    repo.commit(files)
    crd_key = ObjectKey("apiextensions.k8s.io", "CustomResourceDefinition", "", crd_name)
    for _ in range(3):
        results = agent.reconcile()
        assert all(r.ok for r in results.values()), results
        kept = result_for(results["cert-manager"], crd_key)
        assert kept.outcome is Outcome.PRUNE_SKIPPED and kept.note is Note.HOLDS_FOREIGN, kept
        assert "3 of app 'web'" in kept.message, kept.message
        assert uids(a, f"certificates.{group}", ns) == before, "another app's custom resources were deleted"
        assert crd_key in members(cfg, a, "cert-manager")
    # Once nothing foreign uses it, the CRD is pruned.
    repo.commit(files | {"apps/web/certs.yaml": CM.format(name="web", ns=ns)})
    pruned = []
    for _ in range(3):
        results = agent.reconcile()
        pruned += [r for r in results["cert-manager"].results if r.key == crd_key]
        if pruned[-1].outcome is Outcome.PRUNED:
            break
    assert pruned[-1].outcome is Outcome.PRUNED, pruned
    # The API server removes a CRD after its custom-resource cleanup finalizer: gone soon after.
    gone = ("get", "crd", crd_name, "--ignore-not-found", "-o", "name")
    wait_for("the CRD to be gone", lambda: kubectl(a.kubeconfig, *gone).strip() == "", 30)


def test_each_app_alone_a_namespace_holding_more_than_a_page_of_another_apps_objects_is_kept_until_empty(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns, other = e2e.namespace("shared-ns"), e2e.namespace("infra-own")
    names = [f"cm-{i:03d}" for i in range(60)]
    files = {
        "apps/infra/ns.yaml": NS.format(ns=ns),
        "apps/infra/other.yaml": NS.format(ns=other),
        "apps/web/cms.yaml": "---\n".join(CM.format(name=n, ns=ns) for n in names),
        "apps/web/keep.yaml": CM.format(name="keep", ns=other),
    }
    repo = make_repo(tmp_path, files)
    apps = [
        {"name": "infra", "path": "apps/infra"},
        {"name": "web", "path": "apps/web", "depends_on": ["infra"], "max_prune_fraction": 1.0},
    ]
    cfg = write_apps_config(tmp_path, repo, a, apps)
    agent = apps_agent(e2e, cfg, a)
    converge(agent)
    # A user's object, listed after the first 50 of its kind.
    kubectl(a.kubeconfig, "create", "configmap", "zz-users-data", "-n", ns, "--from-literal=k=v")
    before = uids(a, "configmaps", ns)
    assert len(before) == 62  # web's 60, the user's, kube-root-ca.crt
    del files["apps/infra/ns.yaml"]
    repo.commit(files)
    ns_key = ObjectKey("", "Namespace", "", ns)
    for _ in range(3):
        results = agent.reconcile()
        assert all(r.ok for r in results.values()), results
        kept = result_for(results["infra"], ns_key)
        assert kept.outcome is Outcome.PRUNE_SKIPPED and kept.note is Note.HOLDS_FOREIGN, kept
        assert "60 of app 'web'" in kept.message and "1 in no ApplySet" in kept.message, kept.message
        assert uids(a, "configmaps", ns) == before, "objects in the namespace were deleted"
    # Web's objects leave Git (pruned by web), the user's is deleted: nothing foreign is left.
    del files["apps/web/cms.yaml"]
    repo.commit(files)
    kubectl(a.kubeconfig, "delete", "configmap", "zz-users-data", "-n", ns)
    outcomes = []
    for _ in range(3):
        results = agent.reconcile()
        outcomes += [r.outcome for r in results["infra"].results if r.key == ns_key]
        if outcomes[-1] is Outcome.PRUNED:
            break
    assert outcomes[-1] is Outcome.PRUNED, outcomes
    assert ns_key not in members(cfg, a, "infra")


def _infra_and_web(
    tmp_path: Path, a: LocalCluster, e2e: E2E, prefix: str
) -> tuple[Config, AppsAgent, Repo, dict[str, str]]:
    """Two converged apps on ``a``: infra (a Namespace and a ConfigMap in it) and web (a ConfigMap);
    the config, the agent, the repository and its files."""
    ns = e2e.namespace(prefix)
    files = {
        "apps/infra/objects.yaml": NS.format(ns=ns) + "---\n" + CM.format(name="settings", ns=ns),
        "apps/web/web.yaml": CM.format(name="web", ns=ns),
    }
    repo = make_repo(tmp_path, files)
    apps = [{"name": "infra", "path": "apps/infra"}, {"name": "web", "path": "apps/web"}]
    cfg = write_apps_config(tmp_path, repo, a, apps)
    agent = apps_agent(e2e, cfg, a)
    converge(agent)
    return cfg, agent, repo, files


def test_each_app_alone_an_app_declaring_another_apps_inventory_parent_fails_closed_and_writes_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    cfg, agent, repo, files = _infra_and_web(tmp_path, a, e2e, "parents")
    victim, home = f"{cfg.agent.name}.infra", cfg.agent.namespace
    infra_members = members(cfg, a, "infra")
    parent_uid = uids(a, "configmaps", home)[victim]
    # The app without a service_account writes with the agent's field manager, as inventories are.
    forged = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {victim}\n  namespace: {home}\n"
        f'  annotations:\n    {SUSPENDED}: "true"\ndata:\n  members: none\n'
    )
    repo.commit(files | {"apps/web/forged.yaml": forged})
    for _ in range(3):
        results = agent.reconcile()
        web = results["web"]
        assert web.failure is not None and web.failure.reason is FailureReason.SCOPE, web
        assert web.failure.scope is ScopeRule.INVENTORY_PARENT and victim in web.failure.message
        assert results["infra"].ok and results["infra"].state is PassState.OK, results["infra"]
    assert members(cfg, a, "infra") == infra_members
    assert uids(a, "configmaps", home)[victim] == parent_uid
    store = parent(cfg, a, "infra")
    try:
        assert not store.load().suspended
    finally:
        store.client.close()


def test_each_app_alone_another_apps_parent_left_in_this_apps_inventory_is_never_pruned(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """What the old bug left behind: web applied infra's parent (same field manager) and recorded it."""
    a = cluster_pool["pool-a"]
    cfg, agent, _, _ = _infra_and_web(tmp_path, a, e2e, "parents")
    victim = f"{cfg.agent.name}.infra"
    victim_key = ObjectKey("", "ConfigMap", cfg.agent.namespace, victim)
    web_id = applyset_id(f"{cfg.agent.name}.web", cfg.agent.namespace)
    client = KubeClient.from_config(cfg.clusters[0])
    store = parent(cfg, a, "web")
    try:
        # Web's apply of infra's parent, whole (as the old bug's apply left it) and labelled as web's.
        info = client.resource("v1", "ConfigMap")
        whole = client.get(info, cfg.agent.namespace, victim) or {}
        meta = whole["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": victim,
                "namespace": cfg.agent.namespace,
                "labels": {**meta.get("labels", {}), PART_OF: web_id},
                "annotations": meta.get("annotations", {}),
            },
            "binaryData": whole.get("binaryData", {}),
        }
        client.apply(body, field_manager=cfg.agent.name, force=True)
        store.write([*store.load().members.values(), Member(victim_key)])
    finally:
        client.close()
        store.client.close()
    infra_members = members(cfg, a, "infra")
    parent_uid = uids(a, "configmaps", cfg.agent.namespace)[victim]
    for _ in range(3):
        results = agent.reconcile()
        kept = result_for(results["web"], victim_key)
        assert kept.outcome is Outcome.PRUNE_SKIPPED and kept.note is Note.INVENTORY_PARENT, kept
        assert results["infra"].ok, results["infra"]
    assert uids(a, "configmaps", cfg.agent.namespace)[victim] == parent_uid
    assert members(cfg, a, "infra") == infra_members


def test_ownership_ends_objects_marked_keep_by_helm_argocd_or_flux_leave_the_inventory_and_stay(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("keep")
    marks = {
        "helm": "helm.sh/resource-policy: keep",
        "argo-prune": 'argocd.argoproj.io/sync-options: "Validate=false,Prune=false"',
        "argo-delete": "argocd.argoproj.io/sync-options: Delete=false",
        "flux": "kustomize.toolkit.fluxcd.io/prune: disabled",
    }
    docs = [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {n}\n  namespace: {ns}\n"
        f"  annotations:\n    {mark}\ndata:\n  k: v\n"
        for n, mark in marks.items()
    ]
    files = {
        "clusters/pool-a/ns.yaml": NS.format(ns=ns),
        "clusters/pool-a/kept.yaml": "---\n".join(docs),
        "clusters/pool-a/plain.yaml": CM.format(name="plain", ns=ns),
    }
    repo = make_repo(tmp_path, files)
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    agent = e2e.agent(cfg)
    assert agent.reconcile()["pool-a"].ok
    before = uids(a, "configmaps", ns)
    repo.commit({"clusters/pool-a/ns.yaml": files["clusters/pool-a/ns.yaml"]})
    r = agent.reconcile()["pool-a"]
    assert r.ok, r
    by_name = {x.key.name: x for x in r.results if x.key.kind == "ConfigMap"}
    assert by_name["plain"].outcome is Outcome.PRUNED
    for n, mark in marks.items():
        assert by_name[n].outcome is Outcome.ORPHANED, by_name[n]
        assert mark.split(":")[0] in by_name[n].message, by_name[n].message
    after = uids(a, "configmaps", ns)
    assert {n: after[n] for n in marks} == {n: before[n] for n in marks}
    assert "plain" not in after
    assert not {k.name for k in agent.tracked()} & set(marks)
    out = json.loads(kubectl(a.kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))
    assert all(PART_OF not in (i["metadata"].get("labels") or {}) for i in out["items"])


def owned_by(
    cluster: LocalCluster, ns: str, kind: str, name: str, owner_uid: str, *, controller: bool
) -> None:
    """Give ``kind/name`` an ownerReference to the ConfigMap ``settings`` (a controller or a user)."""
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "settings",
        "uid": owner_uid,
        "controller": controller,
    }
    patch = json.dumps({"metadata": {"ownerReferences": [ref]}})
    kubectl(cluster.kubeconfig, "patch", kind, name, "-n", ns, "--type=merge", "-p", patch)


def test_each_app_alone_an_owner_whose_dependents_are_not_this_apps_is_kept_controller_dependents_go_with_it(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("owners")
    files = {
        "apps/infra/objects.yaml": NS.format(ns=ns) + "---\n" + CM.format(name="settings", ns=ns),
        "apps/web/web.yaml": CM.format(name="web-data", ns=ns),
    }
    repo = make_repo(tmp_path, files)
    apps = [
        {"name": "infra", "path": "apps/infra"},
        {"name": "web", "path": "apps/web", "depends_on": ["infra"]},
    ]
    cfg = write_apps_config(tmp_path, repo, a, apps)
    agent = apps_agent(e2e, cfg, a)
    converge(agent)
    owner = uids(a, "configmaps", ns)["settings"]
    # What a controller of infra's object made (goes with it), a user's copy and web's member
    # that name it as their owner (neither is infra's to delete).
    kubectl(a.kubeconfig, "create", "configmap", "settings-cache", "-n", ns, "--from-literal=k=v")
    owned_by(a, ns, "configmap", "settings-cache", owner, controller=True)
    kubectl(a.kubeconfig, "create", "secret", "generic", "users-copy", "-n", ns, "--from-literal=k=v")
    owned_by(a, ns, "secret", "users-copy", owner, controller=False)
    owned_by(a, ns, "configmap", "web-data", owner, controller=True)
    before = uids(a, "configmaps", ns) | uids(a, "secrets", ns)
    repo.commit(files | {"apps/infra/objects.yaml": NS.format(ns=ns)})
    key = ObjectKey("", "ConfigMap", ns, "settings")
    for _ in range(3):
        results = agent.reconcile()
        assert all(r.ok for r in results.values()), results
        kept = result_for(results["infra"], key)
        assert kept.outcome is Outcome.PRUNE_SKIPPED and kept.note is Note.HOLDS_FOREIGN, kept
        assert "2 object(s)" in kept.message and "1 of app 'web'" in kept.message, kept.message
        assert "1 in no ApplySet" in kept.message and "users-copy" in kept.message, kept.message
        assert uids(a, "configmaps", ns) | uids(a, "secrets", ns) == before
    # The user's copy gone, web's member no longer owned by it: only the controller's dependent
    # is left, and it goes with its owner.
    kubectl(a.kubeconfig, "delete", "secret", "users-copy", "-n", ns)
    kubectl(
        a.kubeconfig,
        "patch",
        "configmap",
        "web-data",
        "-n",
        ns,
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/metadata/ownerReferences"}]',
    )
    results = agent.reconcile()
    assert result_for(results["infra"], key).outcome is Outcome.PRUNED, results["infra"]
    wait_for(
        "the controller's dependent collected", lambda: "settings-cache" not in uids(a, "configmaps", ns), 30
    )
    assert uids(a, "configmaps", ns)["web-data"] == before["web-data"]


def test_each_app_alone_takeover_refuses_an_app_declaring_an_inventory_parent_and_writes_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    cfg, agent, repo, files = _infra_and_web(tmp_path, a, e2e, "takeover")
    victim, home = f"{cfg.agent.name}.infra", cfg.agent.namespace
    # An operator's annotation (`gitops-agent resume` writes one) is held by another manager:
    # a takeover naming it would force web's body, under the inventory's own manager, onto it.
    store = parent(cfg, a, "infra")
    try:
        store.set_annotation(SUSPENDED, "false")
    finally:
        store.client.close()
    before = json.loads(kubectl(a.kubeconfig, "get", "configmap", victim, "-n", home, "-o", "json"))
    forged = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {victim}\n  namespace: {home}\n"
        f'  annotations:\n    {SUSPENDED}: "true"\n'
    )
    repo.commit(files | {"apps/web/forged.yaml": forged})
    web = next(app for app in cfg.apps if app.name == "web")
    reconciler = ClusterReconciler(cfg, cfg.clusters[0])
    try:
        with pytest.raises(ScopeError) as refused:
            run_takeover(reconciler, agent.revision(), [f"{cfg.agent.name}-operator"], apply=True, app=web)
    finally:
        reconciler.close()
    assert refused.value.violations[0].rule is ScopeRule.INVENTORY_PARENT
    after = json.loads(kubectl(a.kubeconfig, "get", "configmap", victim, "-n", home, "-o", "json"))
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
