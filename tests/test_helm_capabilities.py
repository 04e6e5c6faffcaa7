"""Helm renders for the Kubernetes release the objects go to, never for Helm's v1.20.0 default.

A pass tells Helm its cluster's version and served API versions from the first render (a chart
with a ``kubeVersion`` constraint, as ingress-nginx, cert-manager and kyverno have, fails
against a default); without a cluster (``render``, ``diff --offline``) charts render for the
cluster's ``kubernetes_version``, else ``KUBERNETES_VERSION`` of tools/versions.env, and the
command says which. And the pinned helm itself assumes the release of its own client-go, as
Helm's Makefile builds it (scripts/install-control-plane, tools/helm-k8s-ldflags).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pygit2
import pytest
from click.testing import CliRunner

from agent.cli.diff import diff
from agent.cli.main import main
from agent.model import parse_release
from agent.render.binaries import tool
from tests.agentkit import E2E, make_repo, outcomes, write_config
from tests.clusters import ClusterPool, kubectl

ROOT = Path(__file__).resolve().parents[1]

#: A kubeconfig whose server is a closed port: nothing here may need it.
NOWHERE = """apiVersion: v1
kind: Config
clusters: [{name: x, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: x, user: {token: unused}}]
contexts: [{name: x, context: {cluster: x, user: x}}]
current-context: x
"""


def pinned() -> str:
    """``KUBERNETES_VERSION`` of tools/versions.env: the release of the local API servers too."""
    text = (ROOT / "tools" / "versions.env").read_text()
    found = re.search(r"^KUBERNETES_VERSION=(\S+)$", text, re.M)
    assert found, "tools/versions.env pins no KUBERNETES_VERSION"
    return found.group(1)


def chart(ns: str, greeting: str = "hello", *, constrained: bool = True) -> dict[str, str]:
    """A chart telling what it was told; ``constrained``: it renders only for the pinned release
    or later (newer than any Helm default)."""
    major, minor = parse_release(pinned())
    constraint = f'kubeVersion: ">= {major}.{minor}.0-0"\n' if constrained else ""
    return {
        "chart/Chart.yaml": f"apiVersion: v2\nname: told\nversion: 0.1.0\n{constraint}",
        "chart/values.yaml": f"ns: {ns}\ngreeting: {greeting}\n",
        "chart/templates/told.yaml": (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: told\n  namespace: {{ .Values.ns }}\n"
            "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
            "  greeting: {{ .Values.greeting | quote }}\n"
            '  {{- if .Capabilities.APIVersions.Has "apps/v1/Deployment" }}\n  apps: served\n  {{- end }}\n'
        ),
    }


def test_the_pinned_helm_assumes_the_kubernetes_release_of_its_client_go_not_v1_20(tmp_path: Path) -> None:
    helm = tool("helm")
    # What the binary was built from (its build info), as Helm's Makefile reads its go.mod.
    info = subprocess.run(["go", "version", "-m", str(helm)], capture_output=True, text=True, check=True)
    found = re.search(r"^\s*dep\s+k8s\.io/client-go\s+v0\.(\d+)\.\d+", info.stdout, re.M)
    assert found, info.stdout[-2000:]
    for name, text in chart("x", constrained=False).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    out = subprocess.run(
        [str(helm), "template", "r", str(tmp_path / "chart")], capture_output=True, text=True, check=True
    )
    assert f'kube: "v1.{found.group(1)}.0"' in out.stdout, out.stdout


@pytest.mark.cluster
def test_a_pass_renders_a_chart_with_a_kube_version_constraint_for_its_cluster_from_the_first_render(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("told")
    nsdoc = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
    repo = make_repo(tmp_path, {**chart(ns), "clusters/pool-a/ns.yaml": nsdoc})
    cfg = write_config(tmp_path, repo, {"pool-a": a}, paths={"pool-a": ["clusters/pool-a", "chart"]})
    result = e2e.agent(cfg).reconcile()["pool-a"]
    assert result.ok, (result.error, outcomes(result))
    told = json.loads(kubectl(a.kubeconfig, "get", "configmap", "told", "-n", ns, "-o", "json"))["data"]
    server = json.loads(kubectl(a.kubeconfig, "version", "-o", "json"))["serverVersion"]["gitVersion"]
    assert told == {"kube": server, "greeting": "hello", "apps": "served"}


def _render(tmp_path: Path, defaults: str = "", *, constrained: bool = True) -> tuple[int, str, str]:
    repo = make_repo(tmp_path, chart("shop", constrained=constrained))
    (tmp_path / "nowhere.kubeconfig").write_text(NOWHERE)
    cfg = write_config(
        tmp_path,
        repo,
        {"prod": tmp_path / "nowhere.kubeconfig"},
        paths={"prod": ["chart"]},
        defaults=defaults,
    )
    result = CliRunner().invoke(main, ["render", "--config", cfg.file, "--cluster", "prod"])
    return result.exit_code, result.stdout, result.stderr


def test_render_of_a_helm_app_needs_no_cluster_and_says_it_rendered_for_the_pinned_release(
    tmp_path: Path,
) -> None:
    code, out, err = _render(tmp_path, constrained=False)  # a chart any release renders: no cluster asked
    assert code == 0, err
    assert f"kube: {pinned()}" in out, out
    assert f"Helm charts rendered for Kubernetes {pinned()} (KUBERNETES_VERSION of tools/versions.env" in err
    assert "Helm charts" not in out, "standard output holds only the rendered stream"


def test_render_of_a_helm_app_uses_the_clusters_kubernetes_version_and_names_it(tmp_path: Path) -> None:
    major, minor = parse_release(pinned())
    code, out, err = _render(tmp_path, defaults=f'kubernetes_version = "{major}.{minor + 1}"')
    assert code == 0, err
    assert f"kube: v{major}.{minor + 1}.0" in out, out
    assert f"rendered for Kubernetes v{major}.{minor + 1}.0 (kubernetes_version of cluster 'prod')" in err


def test_diff_offline_without_a_version_renders_charts_for_the_pinned_release_and_shows_a_values_change(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path, chart("shop"))
    base = str(pygit2.Repository(str(repo.path)).head.target)
    head = repo.commit(chart("shop", greeting="bonjour"), "values change")
    (tmp_path / "nowhere.kubeconfig").write_text(NOWHERE)
    cfg = write_config(tmp_path, repo, {"prod": tmp_path / "nowhere.kubeconfig"}, paths={"prod": ["chart"]})
    args = ["--offline", "--config", cfg.file, "--repo", str(repo.path), "--base", base, "--head", head]
    result = CliRunner().invoke(diff, [*args, "--format", "json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    (app,) = doc["clusters"][0]["apps"]
    assert not app.get("error"), app
    (changed,) = app["objects"]
    assert changed["key"] == "ConfigMap/shop/told" and changed["action"] == "update", changed
    assert any(f"Helm charts rendered for Kubernetes {pinned()}" in n for n in app["notes"]), app


def test_the_pinned_release_an_installed_agent_reads_from_its_api_table_is_the_one_of_versions_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.plan import release

    monkeypatch.setattr(release, "VERSIONS_ENV", tmp_path / "absent")  # as installed: no tools/
    release.pinned_version.cache_clear()
    try:
        assert release.pinned_version() == pinned()
    finally:
        release.pinned_version.cache_clear()
