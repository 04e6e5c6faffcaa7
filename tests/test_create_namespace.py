"""``create_namespace``: a chart's release namespace is created before its objects are applied.

Real charts (ingress-nginx, from the corpus, unmodified) put their namespaced objects in the
release namespace and do not declare it; without this setting every one of them fails with
``namespaces "x" not found``. The namespace is created as the app, only inside its
``allowed_namespaces``, labelled with the app that made it, and is never an inventory member,
so it is never pruned; a Namespace the render declares is an ordinary member instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config.load import load_config
from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.model import FailureReason, ObjectKey, Outcome, ScopeRule
from tests.agentkit import E2E, Repo, config_head, make_repo, unique
from tests.appkit import AppsAgent, counting, members
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
CREATED_BY = "gitops-agent.io/created-by"


def chart_files(release: str) -> dict[str, str]:
    """The corpus's ingress-nginx chart as it is, and values that keep it to itself on a shared
    test cluster (no admission webhook, an IngressClass of its own)."""
    src = CORPUS / "ingress-nginx-chart"
    files = {
        f"charts/ingress-nginx/{p.relative_to(src).as_posix()}": p.read_text()
        for p in sorted(src.rglob("*"))
        if (p.is_file() and p.suffix in (".yaml", ".yml", ".tpl", ".txt")) or p.name == ".helmignore"
    }
    files["values/edge.yaml"] = (
        "controller:\n  admissionWebhooks:\n    enabled: false\n"
        f"  ingressClassResource:\n    name: {release}\n    controllerValue: k8s.io/{release}\n"
        "  service:\n    type: ClusterIP\n"
    )
    return files


def write(tmp_path: Path, repo: Repo, cluster: LocalCluster, app: list[str], *, agent: str) -> Config:
    lines = [*config_head(tmp_path, repo, agent), "[[clusters]]", 'name = "pool-a"']
    lines += [f'kubeconfig = "{cluster.kubeconfig}"', "", "[[apps]]", 'cluster = "pool-a"', *app]
    p = tmp_path / f"{agent}.toml"
    p.write_text("\n".join(lines) + "\n")
    return load_config(p)


def namespace_of(cluster: LocalCluster, name: str) -> dict | None:  # type: ignore[type-arg]
    out = kubectl(cluster.kubeconfig, "get", "namespace", name, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def test_the_ingress_nginx_release_namespace_is_created_as_the_app_labelled_and_never_pruned(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns, release, agent = e2e.namespace("ingress"), unique("edge"), unique("cn-agent")
    e2e.delete_after(a, "clusterrole,clusterrolebinding", f"{release}-ingress-nginx")
    e2e.delete_after(a, "ingressclass", release)
    repo = make_repo(tmp_path, chart_files(release))
    app = [
        'name = "edge"',
        'paths = ["charts/ingress-nginx"]',
        "create_namespace = true",
        "[apps.helm]",
        'chart = "charts/ingress-nginx"',
        f'release_name = "{release}"',
        f'namespace = "{ns}"',
        'values_files = ["values/edge.yaml"]',
    ]
    cfg = write(tmp_path, repo, a, app, agent=agent)
    runner = AppsAgent(cfg)
    e2e.at_end(runner.close)
    assert namespace_of(a, ns) is None
    result = runner.reconcile()["edge"]
    assert result.ok, (result.failure, [(str(r.key), r.message) for r in result.results if not r.ok])
    created = namespace_of(a, ns)
    assert created is not None and created["metadata"]["labels"][CREATED_BY] == f"{agent}.edge"
    applied = {r.key for r in result.results if r.outcome is Outcome.CREATED}
    assert ObjectKey("apps", "Deployment", ns, f"{release}-ingress-nginx-controller") in applied
    assert ObjectKey("", "Namespace", "", ns) not in members(cfg, a, "edge")
    with counting(a) as counted:
        again = runner.reconcile()["edge"]
    assert again.ok and again.count(Outcome.UNCHANGED) == len(again.results), "found, nothing changed"
    # Found in the pass's own read of Namespaces: nothing asked of it on its own.
    assert not any(k.startswith("GET namespaces") for k in counted.requests.by_resource), counted.requests

    # The app is pointed at an empty directory: the chart's objects are pruned, the namespace the
    # agent created (no member) is not.
    repo.commit({**chart_files(release), "empty/README.txt": "nothing here\n"}, "empty the app")
    emptied = ['name = "edge"', 'paths = ["empty"]', "allow_empty = true", "max_prune_fraction = 1.0"]
    later = AppsAgent(write(tmp_path, repo, a, emptied, agent=agent))
    e2e.at_end(later.close)
    gone = later.reconcile()["edge"]
    assert gone.ok, gone.failure
    pruned = {r.key for r in gone.results if r.outcome is Outcome.PRUNED}
    assert ObjectKey("apps", "Deployment", ns, f"{release}-ingress-nginx-controller") in pruned
    assert ObjectKey("", "Namespace", "", ns) not in pruned and namespace_of(a, ns) is not None
    assert not members(cfg, a, "edge")


def test_a_namespace_outside_allowed_namespaces_is_not_created_and_the_app_fails_before_any_request(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    team, outside = e2e.namespace("team-a"), e2e.namespace("elsewhere")
    kubectl(a.kubeconfig, "create", "namespace", team)
    cm = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: {team}\ndata: {{k: v}}\n"
    repo = make_repo(tmp_path, {"apps/a/cm.yaml": cm})
    app = [
        'name = "tenant"',
        'paths = ["apps/a"]',
        "create_namespace = true",
        f'default_namespace = "{outside}"',
        f'allowed_namespaces = ["{team}"]',
    ]
    cfg = write(tmp_path, repo, a, app, agent=unique("cn-agent"))
    runner = AppsAgent(cfg)
    e2e.at_end(runner.close)
    result = runner.reconcile()["tenant"]
    assert result.failure is not None and result.failure.reason is FailureReason.SCOPE, result.failure
    assert result.failure.scope is ScopeRule.NAMESPACE
    assert f"create_namespace: namespace {outside} is not created: not in allowed_namespaces" in (
        result.failure.message
    )
    assert not result.results, "nothing applied or pruned"
    assert namespace_of(a, outside) is None
    assert kubectl(a.kubeconfig, "get", "configmap", "c", "-n", team, "--ignore-not-found").strip() == ""


def test_a_namespace_the_render_declares_is_an_ordinary_member_and_not_labelled_as_created(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("declared")
    docs = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n"
    docs += f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: {ns}\ndata: {{k: v}}\n"
    repo = make_repo(tmp_path, {"apps/a/all.yaml": docs})
    app = ['name = "own"', 'paths = ["apps/a"]', "create_namespace = true", f'default_namespace = "{ns}"']
    cfg = write(tmp_path, repo, a, app, agent=unique("cn-agent"))
    runner = AppsAgent(cfg)
    e2e.at_end(runner.close)
    result = runner.reconcile()["own"]
    assert result.ok, result.failure
    live = namespace_of(a, ns)
    assert live is not None and CREATED_BY not in (live["metadata"].get("labels") or {})
    assert ObjectKey("", "Namespace", "", ns) in members(cfg, a, "own")


def test_without_create_namespace_nothing_is_created_and_the_objects_fail_naming_the_namespace(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("absent")
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata: {k: v}\n"
    repo = make_repo(tmp_path, {"apps/a/cm.yaml": cm})
    app = ['name = "plain"', 'paths = ["apps/a"]', f'default_namespace = "{ns}"']
    runner = AppsAgent(write(tmp_path, repo, a, app, agent=unique("cn-agent")))
    e2e.at_end(runner.close)
    result = runner.reconcile()["plain"]
    (failed,) = [r for r in result.results if r.outcome is Outcome.FAILED]
    assert failed.status == 404 and ns in failed.message and namespace_of(a, ns) is None
