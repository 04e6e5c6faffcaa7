"""Fail closed on render (docs/safety.md rule 2), at the reconcile level and through the CLI.

Every malformed-input case of ``test_render_malformed`` is run through a whole
``ClusterReconciler`` pass whose cluster client fails the test if it is even
created: a render error must end the pass before any request — nothing
applied, nothing pruned, the error naming the file. A chart is the exception: it is
rendered with the cluster's capabilities from the first try, so its pass reads the
cluster's version and discovery (on a real API server), and nothing else.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.config.load import parse_config
from agent.config.types import ClusterConfig, ClusterSettings, Config, SourceConfig
from agent.kube.client import KubeClient
from agent.model import Revision
from agent.reconcile.reconciler import ClusterReconciler
from agent.render.binaries import tool
from tests.clusters import ClusterPool
from tests.test_render_malformed import CASES, CM, Case, _write


def _config(case: Case, tmp_path: Path, *, kubeconfig: bool = True) -> Config:
    if kubeconfig:  # else the test put a real cluster's there
        (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    cfg = parse_config(
        {
            "source": {"url": "unused"},
            "clusters": [{"name": "c", "kubeconfig": "kc", "paths": ["good", *case.paths]}],
        },
        base_dir=tmp_path,
    )
    cluster = cfg.clusters[0]
    patched = ClusterConfig(
        name=cluster.name,
        paths=cluster.paths,
        settings=ClusterSettings(),
        kubeconfig=cluster.kubeconfig,
        vars=dict(case.vars),
        helm=case.helm,
    )
    return Config(agent=cfg.agent, source=SourceConfig(url="unused"), clusters=(patched,))


def _no_client(cluster: ClusterConfig) -> object:
    raise AssertionError(f"a cluster client was created for {cluster.name} despite a render error")


#: Charts are told the cluster's capabilities from their first render (a kubeVersion constraint
#: fails against Helm's default), so a chart's render asks the cluster before it can fail.
CHARTS = [c for c in CASES if "helm" in c.tools]
OTHERS = [c for c in CASES if "helm" not in c.tools]


def _repo(case: Case, tmp_path: Path) -> Path:
    for name in case.tools:
        tool(name)
    repo = tmp_path / "repo"
    repo.mkdir()
    _write(repo, {"good/cm.yaml": CM.format(name="good"), **case.files})
    if case.setup is not None:
        case.setup(repo)
    return repo


@pytest.mark.parametrize("case", OTHERS, ids=[c.id for c in OTHERS])
def test_fail_closed_every_malformed_input_ends_the_pass_before_any_request(
    case: Case, tmp_path: Path
) -> None:
    repo = _repo(case, tmp_path)
    cfg = _config(case, tmp_path)
    rec = ClusterReconciler(cfg, cfg.clusters[0], client_factory=_no_client)  # type: ignore[arg-type]
    result = rec.reconcile(Revision(sha="f" * 40, ref="test", tree=repo))
    assert result.results == []  # nothing applied, nothing pruned
    assert result.error and case.fragment in result.error and case.file in result.error


class Reads(KubeClient):
    """The agent's client, noting each request it sends (instrumentation, not a fake)."""

    sent: list[tuple[str, str]]

    def request_bytes(self, method: str, path: str, **options: Any) -> bytes:
        self.__dict__.setdefault("sent", []).append((method, path))
        return super().request_bytes(method, path, **options)


@pytest.mark.cluster
@pytest.mark.parametrize("case", CHARTS, ids=[c.id for c in CHARTS])
def test_fail_closed_a_chart_that_fails_asks_only_for_the_clusters_capabilities_and_writes_nothing(
    case: Case, tmp_path: Path, cluster_pool: ClusterPool
) -> None:
    repo = _repo(case, tmp_path)
    shutil.copy(cluster_pool["pool-a"].kubeconfig, tmp_path / "kc")
    cfg = _config(case, tmp_path, kubeconfig=False)
    clients: list[Reads] = []

    def reads(cluster: ClusterConfig) -> KubeClient:
        clients.append(Reads.from_config(cluster))  # type: ignore[arg-type]
        return clients[-1]

    rec = ClusterReconciler(cfg, cfg.clusters[0], client_factory=reads)
    try:
        result = rec.reconcile(Revision(sha="f" * 40, ref="test", tree=repo))
    finally:
        rec.close()
    assert result.results == []  # nothing applied, nothing pruned
    assert result.error and case.fragment in result.error and case.file in result.error
    sent = [s for c in clients for s in c.__dict__.get("sent", [])]
    assert ("GET", "/version") in sent, sent  # its version asked, for the chart
    assert all(method == "GET" and path.startswith(("/version", "/api")) for method, path in sent), sent


def test_render_command_prints_a_deterministic_stream_and_exits_2_on_a_render_error(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write(repo, {"clusters/c/b.yaml": CM.format(name="b"), "clusters/c/a.yaml": CM.format(name="a")})
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[source]\nurl = "{repo}"\n\n[[clusters]]\nname = "c"\nkubeconfig = "kc"\npath = "clusters/c"\n'
    )
    argv = [
        sys.executable,
        "-m",
        "agent.cli",
        "render",
        "--config",
        str(config),
        "--cluster",
        "c",
        "--path",
        str(repo),
    ]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert first.stdout.index("name: a") < first.stdout.index("name: b")
    (repo / "clusters/c/broken.yaml").write_text("kind: [\n")
    broken = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert broken.returncode == 2 and "clusters/c/broken.yaml" in broken.stderr and broken.stdout == ""
