"""A chart in Git whose dependency comes from a chart repository, on a real API server: the
source's poll fetches the dependency (as `helm dependency build` would) into a copy of the chart
in the cache, the render reads that copy without network, and the app applies; a newly published
version its constraint allows is a new revision of the app; a dependency the repository does not
have fails the app with reason `chart`, and nothing is applied or pruned."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from agent.cli.main import main
from agent.config.load import load_config
from agent.config.types import Config
from agent.model import FailureReason
from agent.reconcile.charts import of_app
from tests.agentkit import E2E, Repo, config_head, make_repo, unique
from tests.chartrepo import ChartRepo
from tests.clusters import ClusterPool, kubectl
from tests.test_charts_repository import Pass
from tests.test_diff_offline import NOWHERE


def chart_files(url: str, constraint: str) -> dict[str, str]:
    return {
        "charts/umbrella/Chart.yaml": (
            "apiVersion: v2\nname: umbrella\nversion: 0.1.0\ndependencies:\n"
            f"  - name: db\n    version: {constraint!r}\n    repository: {url}\n"
            "    condition: db.enabled\n"
        ),
        "charts/umbrella/values.yaml": "db:\n  enabled: true\n  greeting: from-umbrella\n",
        "charts/umbrella/templates/own.yaml": (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: umbrella-own\ndata:\n  owner: umbrella\n"
        ),
    }


def config(tmp_path: Path, git: Repo, kubeconfig: Path, ns: str) -> Config:
    lines = config_head(tmp_path, git, unique("agent"))
    lines += [
        "[[clusters]]",
        'name = "pool-a"',
        f'kubeconfig = "{kubeconfig}"',
        "",
        "[[apps]]",
        'name = "umbrella"',
        'cluster = "pool-a"',
        'path = "charts/umbrella"',
        f'default_namespace = "{ns}"',
        "[apps.helm]",
        'chart = "charts/umbrella"',
        f'namespace = "{ns}"',
    ]
    path = tmp_path / "agent.toml"
    path.write_text("\n".join(lines))
    return load_config(path)


def configmaps(kubeconfig: Path, ns: str) -> dict[str, dict[str, str]]:
    out = json.loads(kubectl(kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))
    return {
        i["metadata"]["name"]: i.get("data", {})
        for i in out["items"]
        if i["metadata"]["name"] != "kube-root-ca.crt"
    }


def test_a_chart_in_git_with_a_dependency_from_a_repository_renders_applies_and_fails_closed(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    cluster = cluster_pool["pool-a"]
    ns = e2e.namespace("deps")
    kubectl(cluster.kubeconfig, "create", "namespace", ns)
    charts = ChartRepo(tmp_path / "charts")
    charts.publish("db", "1.0.0")
    with charts.serve():
        git = make_repo(tmp_path, chart_files(charts.url, "1.x"))
        agent = Pass(config(tmp_path, git, cluster.kubeconfig, ns), e2e)
        first = agent.poll()
        (pin,) = first.charts
        assert pin.dependencies and pin.dependencies[0].startswith("db@1.0.0 (sha256:")
        result = agent.run(first)
        assert result.ok, result.error  # type: ignore[attr-defined]
        assert result.chart == str(pin) and "with db@1.0.0 (sha256:" in result.chart  # type: ignore[attr-defined]
        assert configmaps(cluster.kubeconfig, ns) == {
            "umbrella-own": {"owner": "umbrella"},
            "db": {"version": "1.0.0", "greeting": "from-umbrella", "replicas": "1"},
        }
        # Nothing was written into the checkout: the dependency lives in the cache's copy.
        assert not (first.tree / "charts/umbrella/charts").exists()

        # A version the constraint allows is published: a new revision of the app at the same commit.
        charts.publish("db", "1.1.0")
        newer = agent.poll()
        assert newer.sha == first.sha and of_app(newer, agent.app) != of_app(first, agent.app)
        assert agent.due(newer) == ("umbrella",)
        assert agent.run(newer).ok  # type: ignore[attr-defined]
        assert configmaps(cluster.kubeconfig, ns)["db"]["version"] == "1.1.0"

        # A commit asking for a version the repository does not have: the app fails closed.
        files = chart_files(charts.url, "2.x")
        files["charts/umbrella/templates/own.yaml"] = ""  # would prune umbrella-own if applied
        git.commit(files, "db 2.x")
        missing = agent.poll()
        failed = agent.run(missing)
    assert failed.reason is FailureReason.CHART  # type: ignore[attr-defined]
    assert "dependency 'db' of charts/umbrella" in failed.error and "'2.x'" in failed.error  # type: ignore[attr-defined]
    assert configmaps(cluster.kubeconfig, ns) == {
        "umbrella-own": {"owner": "umbrella"},
        "db": {"version": "1.1.0", "greeting": "from-umbrella", "replicas": "1"},
    }


def test_gitops_agent_render_renders_the_chart_with_its_fetched_dependency(tmp_path: Path) -> None:
    charts = ChartRepo(tmp_path / "charts")
    charts.publish("db", "1.0.0", data="rendered")
    (tmp_path / "nowhere").write_text(NOWHERE)
    with charts.serve():
        git = make_repo(tmp_path, chart_files(charts.url, "1.x"))
        config(tmp_path, git, tmp_path / "nowhere", "shop")
        args = [
            "render",
            "--config",
            str(tmp_path / "agent.toml"),
            "--cluster",
            "pool-a",
            "--app",
            "umbrella",
        ]
        result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "name: umbrella-own" in result.stdout and "greeting: from-umbrella" in result.stdout
