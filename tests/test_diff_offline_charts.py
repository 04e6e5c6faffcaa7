"""`gitops-agent diff --offline` of a chart `version` change: each Git revision is rendered with
the chart version it resolves to, from a real chart repository on loopback (no cluster: the
kubeconfig points nowhere), and the report lists the objects the new version changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pygit2
from click.testing import CliRunner

from agent.cli.diff import diff
from tests.agentkit import config_head, make_repo, unique
from tests.chartrepo import ChartRepo
from tests.test_diff_offline import NOWHERE

DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: "nginx:IMAGE"}]
"""


def publish_web(repo: ChartRepo, version: str, image: str) -> None:
    chart = repo.src / f"web-{version}" / "web"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(f"apiVersion: v2\nname: web\nversion: {version}\n")
    (chart / "templates" / "deployment.yaml").write_text(DEPLOYMENT.replace("IMAGE", image))
    (chart / "templates" / "settings.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {greeting: hello}\n"
    )
    repo.helm("package", str(chart), "--destination", str(repo.root))
    repo.index()


def site(url: str, version: str) -> dict[str, str]:
    return {
        "charts/site/Chart.yaml": (
            "apiVersion: v2\nname: site\nversion: 0.1.0\ndependencies:\n"
            f"  - name: web\n    version: {version}\n    repository: {url}\n"
        )
    }


def test_a_chart_version_change_is_reported_as_the_objects_it_changes(tmp_path: Path) -> None:
    charts = ChartRepo(tmp_path / "charts")
    publish_web(charts, "1.0.0", "1.27")
    publish_web(charts, "1.1.0", "1.28")
    (tmp_path / "nowhere").write_text(NOWHERE)
    with charts.serve():
        git = make_repo(tmp_path, site(charts.url, "1.0.0"))
        base = str(pygit2.Repository(str(git.path)).head.target)
        git.commit(site(charts.url, "1.1.0"), "web 1.1.0")  # nothing else changes in Git
        lines = config_head(tmp_path, git, unique("agent"))
        lines += [
            "[[clusters]]",
            'name = "alpha"',
            f'kubeconfig = "{tmp_path / "nowhere"}"',
            'path = "charts/site"',
            "[clusters.helm]",
            'chart = "charts/site"',
            'namespace = "shop"',
        ]
        (tmp_path / "agent.toml").write_text("\n".join(lines))
        args = ["--offline", "--repo", str(git.path), "--base", base, "--head", "main"]
        result = CliRunner().invoke(
            diff,
            [*args, "--config", str(tmp_path / "agent.toml"), "--format", "json"],
            catch_exceptions=False,
        )
    assert result.exit_code == 1, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    (cluster,) = doc["clusters"]
    (app,) = cluster["apps"]
    assert app["error"] is None
    (changed,) = app["objects"]  # the ConfigMap is the same in both versions: unchanged
    assert (changed["kind"], changed["name"], changed["action"]) == ("Deployment", "web", "update")
    assert "-" in changed["diff"] and "nginx:1.27" in changed["diff"] and "nginx:1.28" in changed["diff"]
    (note,) = [n for n in app["notes"] if n.startswith("chart ")]
    assert "with web@1.0.0 (sha256:" in note and "→ charts/site@0.1.0" in note and "with web@1.1.0" in note
