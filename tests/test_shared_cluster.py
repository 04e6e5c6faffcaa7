"""Two config entries serving one cluster are refused, never left to delete each other's objects.

Every entry's inventory (ApplySet parent) is keyed by the agent name, so two
``[[clusters]]`` entries reaching one cluster (two teams, two paths) would
share it: each pass of one would prune what the other applied. On real API
servers: the same cluster through two kubeconfigs (``127.0.0.1`` and
``localhost``) is recognised by its kube-system UID and both entries are
refused, whichever passes first; where RBAC hides kube-system, the claim
recorded on the parent refuses the entry it does not name; a single entry
claims its parent, a parent written before claims existed included.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.dev import localcluster
from agent.dev.process import LocalCluster
from agent.model import ObjectKey, Outcome
from tests.agentkit import E2E, make_repo, unique, write_config
from tests.clusters import ClusterControl, ClusterPool, kubectl

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
CLAIM = "gitops-agent.io/claimed-by"
AGENT_NAMESPACE = "gitops-agent"


def configmap(ns: str, name: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: v\n"


def uid_of(cluster: LocalCluster, name: str, ns: str) -> str:
    """The ConfigMap's UID, ``""`` if it does not exist (a delete and re-create changes it)."""
    out = kubectl(cluster.kubeconfig, "get", "configmap", name, "-n", ns, "--ignore-not-found", "-o", "json")
    return str(json.loads(out)["metadata"]["uid"]) if out.strip() else ""


def parent(cluster: LocalCluster, agent: str) -> dict[str, Any]:
    """The agent's ApplySet parent as the cluster holds it (``{}`` if absent)."""
    out = kubectl(
        cluster.kubeconfig,
        "get",
        "configmap",
        agent,
        "-n",
        AGENT_NAMESPACE,
        "--ignore-not-found",
        "-o",
        "json",
    )
    return json.loads(out) if out.strip() else {}


def claim(obj: dict[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(CLAIM)


def run_once(config: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--once", "--config", config],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_two_entries_reaching_one_cluster_through_two_urls_are_both_refused_and_nothing_is_touched(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("shared")
    kubectl(a.kubeconfig, "create", "namespace", ns)
    # The same API server under another name: only its kube-system UID says it is the same cluster.
    via_localhost = tmp_path / "localhost.kubeconfig"
    text = a.kubeconfig.read_text()
    assert "https://127.0.0.1:" in text
    via_localhost.write_text(text.replace("https://127.0.0.1:", "https://localhost:"))
    repo = make_repo(
        tmp_path,
        {
            "clusters/team-a/app.yaml": configmap(ns, "team-a-data"),
            "clusters/team-b/app.yaml": configmap(ns, "team-b-data"),
        },
    )
    name = unique("agent")
    first = e2e.agent(write_config(tmp_path, repo, {"team-a": a}, agent=name))
    assert first.reconcile()["team-a"].ok
    team_a_data, inventory = uid_of(a, "team-a-data", ns), parent(a, name)
    assert team_a_data and inventory

    both = write_config(tmp_path, repo, {"team-a": a, "team-b": via_localhost}, agent=name)
    agent = e2e.agent(both)
    # A daemon passes each entry on its own schedule: the first pass of either entry, before
    # the other ever passed, already refuses.
    alone = agent.fleet.reconcile_one("team-a", agent.revision())
    together = agent.reconcile()
    status = {n: st.to_json() for n, st in agent.fleet.status.items()}

    assert uid_of(a, "team-a-data", ns) == team_a_data, "team-a's object was deleted (or re-created)"
    assert uid_of(a, "team-b-data", ns) == "", "team-b's object was applied"
    assert parent(a, name)["metadata"]["resourceVersion"] == inventory["metadata"]["resourceVersion"]
    for result in (alone, together["team-a"], together["team-b"]):
        assert not result.ok and result.refused == "shared-cluster", (result.cluster, result.error)
        assert "'team-a'" in (result.error or "") and "'team-b'" in (result.error or ""), result.error
        assert result.results == [] and result.prune_refused is None
    for entry in ("team-a", "team-b"):
        assert status[entry]["state"] == "refused" and status[entry]["refused"] == "shared-cluster"

    done = run_once(both.file)
    assert done.returncode == 1, (done.stdout, done.stderr)
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:] if line.strip()}
    for entry in ("team-a", "team-b"):
        assert "refused (shared-cluster): entries 'team-a' and 'team-b'" in rows[entry], done.stdout
    assert uid_of(a, "team-a-data", ns) == team_a_data
    assert uid_of(a, "team-b-data", ns) == ""
    assert parent(a, name)["metadata"]["resourceVersion"] == inventory["metadata"]["resourceVersion"]


def namespaced_rbac(cluster: LocalCluster, ns: str, service_account: str, role: str) -> str:
    """Roles like ``manifests/namespaced``: everything in ``ns``, the parent's ConfigMap and Namespace."""
    sa_ns, sa = service_account.split("/")
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": role, "namespace": ns},
            "rules": [
                {
                    "apiGroups": ["*"],
                    "resources": ["*"],
                    "verbs": ["get", "list", "create", "patch", "delete"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": role, "namespace": AGENT_NAMESPACE},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
                {
                    "apiGroups": [""],
                    "resources": ["namespaces"],
                    "resourceNames": [AGENT_NAMESPACE],
                    "verbs": ["get", "patch"],
                },
            ],
        },
    ]
    for where in (ns, AGENT_NAMESPACE):
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": role, "namespace": where},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": subject,
            }
        )
    stream = "\n---\n".join(json.dumps(d) for d in docs)
    localcluster.kubectl(cluster.kubeconfig, "apply", "--server-side", "-f", "-", stdin=stream)
    return role


def test_where_rbac_hides_kube_system_the_claim_on_the_inventory_refuses_the_entry_it_does_not_name(
    tmp_path: Path, cluster_pool: ClusterPool, cluster_ctl: ClusterControl, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("claimed")
    kubectl(a.kubeconfig, "create", "namespace", ns)
    service_account = f"{ns}/{unique('team-b')}"
    role = unique("team-b")
    e2e.delete_after(a, "role,rolebinding", role, "-n", AGENT_NAMESPACE)
    namespaced_rbac(a, ns, service_account, role)
    limited = cluster_ctl.token(a, service_account, cluster_role=None)
    # The namespaced install: team-b's identity cannot read kube-system, so no UID to compare.
    hidden = localcluster.kubectl(limited, "auth", "can-i", "get", "namespaces/kube-system", check=False)
    assert hidden.stdout.strip() == "no", hidden
    repo = make_repo(
        tmp_path,
        {
            "clusters/team-a/app.yaml": configmap(ns, "team-a-data"),
            "clusters/team-b/app.yaml": configmap(ns, "team-b-data"),
        },
    )
    name = unique("agent")
    first = e2e.agent(write_config(tmp_path, repo, {"team-a": a}, agent=name))
    assert first.reconcile()["team-a"].ok
    team_a_data, inventory = uid_of(a, "team-a-data", ns), parent(a, name)
    assert team_a_data and claim(inventory) == "team-a"

    agent = e2e.agent(write_config(tmp_path, repo, {"team-a": a, "team-b": limited}, agent=name))
    results = agent.reconcile()
    status = {n: st.to_json() for n, st in agent.fleet.status.items()}

    assert uid_of(a, "team-a-data", ns) == team_a_data, "team-a's object was deleted (or re-created)"
    assert uid_of(a, "team-b-data", ns) == "", "team-b's object was applied"
    after = parent(a, name)
    assert after["metadata"]["resourceVersion"] == inventory["metadata"]["resourceVersion"]
    assert claim(after) == "team-a"
    refused = results["team-b"]
    assert not refused.ok and refused.refused == "claimed", refused.error
    assert "'team-a'" in (refused.error or "") and "'team-b'" in (refused.error or ""), refused.error
    assert refused.results == []
    assert status["team-b"]["state"] == "refused" and status["team-b"]["refused"] == "claimed"
    assert results["team-a"].ok and results["team-a"].refused is None, results["team-a"].error
    assert status["team-a"]["state"] == "ok"


def test_a_single_entry_keeps_working_and_claims_its_inventory_also_one_written_before_claims_existed(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("single")
    objects = configmap(ns, "keep") + "---\n" + configmap(ns, "gone")
    repo = make_repo(
        tmp_path,
        {
            "clusters/pool-a/app.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n"
            + objects
        },
    )
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    name = agent.config.agent.name
    first = agent.reconcile()["pool-a"]
    assert first.ok and first.count(Outcome.CREATED) == 3, first.error
    assert claim(parent(a, name)) == "pool-a"

    # A parent as the agent wrote it before claims existed: the next pass claims it, members kept.
    kubectl(a.kubeconfig, "annotate", "configmap", name, "-n", AGENT_NAMESPACE, f"{CLAIM}-")
    assert claim(parent(a, name)) is None
    members = agent.tracked()
    again = agent.reconcile()["pool-a"]
    assert again.ok and again.count(Outcome.UNCHANGED) == 3, again.error
    assert claim(parent(a, name)) == "pool-a"
    assert agent.tracked() == members

    repo.commit(
        {
            "clusters/pool-a/app.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n"
            + configmap(ns, "keep")
        }
    )
    pruned = agent.reconcile()["pool-a"]
    assert pruned.ok and pruned.count(Outcome.PRUNED) == 1, pruned.error
    assert uid_of(a, "gone", ns) == "" and uid_of(a, "keep", ns)
    assert ObjectKey("", "ConfigMap", ns, "gone") not in agent.tracked()
    assert claim(parent(a, name)) == "pool-a"
