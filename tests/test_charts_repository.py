"""An app whose chart comes from a chart repository, on a real API server: installed at the newest
version its constraint allows, upgraded when a matching version is published and not when
another one is; a repository that is down, refuses the credentials or serves a tampered chart
fails the app with reason `chart`, and nothing is applied or pruned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from agent.config.load import load_config
from agent.config.types import Config
from agent.model import FailureReason, Revision
from agent.reconcile.charts import ChartPolls, of_app
from agent.run.due import DueReason, Timing
from agent.run.fleet import Fleet
from agent.source.git import GitSource
from tests.agentkit import E2E, Repo, config_head, make_repo, unique
from tests.chartrepo import ChartRepo
from tests.clusters import ClusterPool, kubectl

TIMING = Timing(1.0, 60.0, 0.0)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


def config(
    tmp_path: Path, git: Repo, kubeconfig: Path, ns: str, url: str, version: str, extra: str = ""
) -> Config:
    lines = config_head(tmp_path, git, unique("agent"))
    lines += [
        "[[clusters]]",
        'name = "pool-a"',
        f'kubeconfig = "{kubeconfig}"',
        "",
        "[[apps]]",
        'name = "web"',
        'cluster = "pool-a"',
        # No default_namespace: the chart's ConfigMap names none, and goes to the release's
        # namespace, as `helm install --namespace` puts it.
        "[apps.helm]",
        f'repository = "{url}"',
        'chart = "web"',
        f'version = "{version}"',
        f'namespace = "{ns}"',
        'values_files = ["values/web.yaml"]',
        "values = { replicas = 3 }",
        "",
        extra,
    ]
    path = tmp_path / "agent.toml"
    path.write_text("\n".join(lines))
    return load_config(path)


def configmap(kubeconfig: Path, ns: str) -> dict[str, str] | None:
    out = kubectl(kubeconfig, "get", "configmap", "web", "-n", ns, "-o", "json", "--ignore-not-found")
    return json.loads(out)["data"] if out.strip() else None


class Pass:
    """The daemon's steps for one cluster: poll the source, pin its charts, run the app."""

    def __init__(self, cfg: Config, e2e: E2E) -> None:
        self.source = GitSource.from_config(cfg)
        self.charts = ChartPolls(cfg, timeout=5)
        self.fleet = Fleet(cfg)
        e2e.at_end(self.fleet.close)
        e2e.at_end(self.source.close)
        self.app = cfg.apps[0]

    def poll(self) -> Revision:
        return self.charts.attach("default", self.source.poll())

    def due(self, revision: Revision) -> tuple[str, ...]:
        return self.fleet.schedule("pool-a", {"default": revision}, TIMING).due

    def run(self, revision: Revision) -> object:
        (result,) = self.fleet.run_apps("pool-a", {"default": revision})
        return result


def test_a_repository_chart_installs_at_its_constraint_and_follows_matching_versions_only(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    cluster = cluster_pool["pool-a"]
    ns = e2e.namespace("charts")
    kubectl(cluster.kubeconfig, "create", "namespace", ns)
    git = make_repo(tmp_path, {"values/web.yaml": "greeting: from-git\n"})
    charts = ChartRepo(tmp_path / "charts")
    for v in ("1.0.0", "1.1.0", "2.0.0"):
        charts.publish("web", v)
    with charts.serve():
        agent = Pass(config(tmp_path, git, cluster.kubeconfig, ns, charts.url, "1.x"), e2e)
        first = agent.poll()
        result = agent.run(first)
        assert result.ok, result.error  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns) == {
            "version": "1.1.0",
            "greeting": "from-git",
            "replicas": "3",
        }
        pin = first.charts[0]
        assert result.chart == str(pin) == f"web@1.1.0 (sha256:{pin.digest[:12]})"  # type: ignore[attr-defined]
        assert result.revision == first.sha  # type: ignore[attr-defined]
        assert agent.due(first) == ()

        # A version the constraint does not allow: the same revision of the app, nothing due.
        charts.publish("web", "2.1.0")
        unchanged = agent.poll()
        assert of_app(unchanged, agent.app) == of_app(first, agent.app)
        assert agent.due(unchanged) == ()

        # A matching version whose archive was tampered with after indexing: refused, 1.1.0 stays.
        archive = charts.publish("web", "1.2.0")
        ChartRepo(tmp_path / "evil").publish("web", "1.2.0", data="evil")
        archive.write_bytes((tmp_path / "evil" / "web-1.2.0.tgz").read_bytes())
        tampered = agent.poll()
        failed = agent.run(tampered)
        assert failed.reason is FailureReason.CHART and "digest" in failed.error  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns) == {
            "version": "1.1.0",
            "greeting": "from-git",
            "replicas": "3",
        }

        # The real 1.2.0: a new revision of the app at the same commit, due now, and rolled out.
        charts.publish("web", "1.2.0")
        upgraded = agent.poll()
        assert upgraded.sha == first.sha and of_app(upgraded, agent.app) != of_app(first, agent.app)
        decision = agent.fleet.schedule("pool-a", {"default": upgraded}, TIMING)
        assert decision.due == ("web",) and decision.apps[0].reason is DueReason.NEW_REVISION
        assert agent.run(upgraded).ok  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns)["version"] == "1.2.0"  # type: ignore[index]
        assert agent.due(upgraded) == ()
        charts.log.clear()
        agent.poll()  # unchanged: one conditional request for the index, no archive
        assert [(p, s) for _, p, s, _ in charts.log] == [("/index.yaml", 304)]

    # The repository is down: the app fails with reason `chart` naming it; nothing is pruned.
    down = agent.poll()
    result = agent.run(down)
    assert result.reason is FailureReason.CHART  # type: ignore[attr-defined]
    assert charts.url in result.error and "'1.x'" in result.error  # type: ignore[attr-defined]
    assert "unreachable" in result.error and "web@1.2.0" in result.error  # type: ignore[attr-defined]
    assert configmap(cluster.kubeconfig, ns)["version"] == "1.2.0"  # type: ignore[index]


def test_a_repository_refusing_the_credentials_fails_the_app_before_anything_is_applied(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    cluster = cluster_pool["pool-a"]
    ns = e2e.namespace("charts")
    kubectl(cluster.kubeconfig, "create", "namespace", ns)
    git = make_repo(tmp_path, {"values/web.yaml": "greeting: private\n"})
    charts = ChartRepo(tmp_path / "charts")
    charts.publish("web", "0.3.0")
    secret = tmp_path / "password"
    secret.write_text("wrong\n")
    with charts.serve(username="agent", password="s3cret"):
        entry = "\n".join(
            [
                "[[helm_repositories]]",
                f'url = "{charts.url}"',
                'username = "agent"',
                f'password_file = "{secret}"',
            ]
        )
        agent = Pass(config(tmp_path, git, cluster.kubeconfig, ns, charts.url, "", entry), e2e)
        refused = agent.run(agent.poll())
        assert refused.reason is FailureReason.CHART  # type: ignore[attr-defined]
        assert "unauthorized" in refused.error and "wrong" not in refused.error  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns) is None
        secret.write_text("s3cret\n")  # read at every fetch: no restart
        assert agent.run(agent.poll()).ok  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns) == {
            "version": "0.3.0",
            "greeting": "private",
            "replicas": "3",
        }


def test_render_prints_a_repository_chart_without_a_cluster_from_the_source_or_a_local_checkout(
    tmp_path: Path,
) -> None:
    git = make_repo(tmp_path, {"values/web.yaml": "greeting: from-git\n"})
    checkout = tmp_path / "checkout"
    (checkout / "values").mkdir(parents=True)
    (checkout / "values" / "web.yaml").write_text("greeting: from-a-pr\n")
    charts = ChartRepo(tmp_path / "charts")
    for v in ("1.0.0", "1.1.0", "2.0.0"):
        charts.publish("web", v)
    missing = tmp_path / "no-such.kubeconfig"  # never read: render asks no cluster
    with charts.serve():
        cfg = config(tmp_path, git, missing, "web-ns", charts.url, "1.x")
        args = ["render", "--config", str(tmp_path / "agent.toml"), "--cluster", "pool-a", "--app", "web"]
        from_source = cli(*args)
        from_checkout = cli(*args, "--path", str(checkout))
    assert cfg.apps[0].helm is not None
    assert from_source.returncode == 0, from_source.stderr
    (cm,) = list(yaml.safe_load_all(from_source.stdout))
    assert cm["data"] == {"version": "1.1.0", "greeting": "from-git", "replicas": "3"}
    assert from_checkout.returncode == 0, from_checkout.stderr
    assert yaml.safe_load(from_checkout.stdout)["data"]["greeting"] == "from-a-pr"
    # The repository is gone: the chart cannot be fetched, and render says where it looked.
    down = cli(*args)
    assert down.returncode == 1 and not down.stdout
    assert charts.url in down.stderr and "chart" in down.stderr
