"""Cluster-access files are checked by the commands that reach clusters, and only by them.

A CI runner renders and diffs offline with the production config, whose
kubeconfig files (each cluster's, ``[agent] management_kubeconfig``) exist only
where the agent runs: ``load_config`` accepts it, ``render`` and ``diff
--offline`` work; ``run``, live ``diff``, ``prune approve``, ``suspend``,
``resume``, ``sync`` and ``takeover`` still stop with exit 2 naming the key
and the file before anything is touched.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from agent.cli.main import main
from agent.config.load import check_access, load_config
from agent.errors import ConfigError
from agent.run.fleet import Fleet
from agent.run.scheduler import Daemon, DaemonOptions
from tests.agentkit import Repo, make_repo
from tests.daemonkit import NO_LEASES

FILES = {
    "clusters/prod/app.yaml": """
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: settings, namespace: shop}
        data: {greeting: hello}
        """
}


def production_config(tmp_path: Path, repo: Repo, *, kubeconfig: str = "") -> Path:
    """A config as written for the agent's Pod: neither kubeconfig exists on this machine."""
    p = tmp_path / "agent.toml"
    p.write_text(
        f"""
[agent]
cache_dir = "{tmp_path / "cache"}"
listen = ""
management_kubeconfig = "/etc/gitops-agent/management.kubeconfig"

[source]
url = "{repo.path}"

[[clusters]]
name = "prod"
kubeconfig = "{kubeconfig or "/etc/gitops-agent/prod.kubeconfig"}"
path = "clusters/prod"
"""
    )
    return p


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_load_config_accepts_absent_kubeconfigs_and_check_access_names_each_key_and_file(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path, FILES)
    cfg = load_config(production_config(tmp_path, repo))
    assert cfg.clusters[0].kubeconfig == "/etc/gitops-agent/prod.kubeconfig"
    with pytest.raises(ConfigError) as err:
        check_access(cfg)
    assert str(err.value) == (
        f"{cfg.file}: clusters[0].kubeconfig: file not found: /etc/gitops-agent/prod.kubeconfig"
    )
    check_access(cfg, ["elsewhere"], management=False)  # only the clusters a command reaches

    present = tmp_path / "prod.kubeconfig"
    present.write_text("apiVersion: v1\nkind: Config\n")
    cfg = load_config(production_config(tmp_path, repo, kubeconfig="prod.kubeconfig"))
    check_access(cfg, management=False)
    with pytest.raises(ConfigError) as err:
        check_access(cfg)
    assert str(err.value) == (
        f"{cfg.file}: agent.management_kubeconfig: file not found: /etc/gitops-agent/management.kubeconfig"
    )


def test_render_and_offline_diff_work_with_a_config_whose_kubeconfigs_are_absent(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, FILES)
    # (`name: n` would read as false, as Kubernetes reads YAML: a name is a string.)
    namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-n\n"
    base = repo.commit({**FILES, "clusters/prod/ns.yaml": namespace})
    config = str(production_config(tmp_path, repo))

    rendered = cli("render", "--config", config, "--cluster", "prod")
    assert rendered.exit_code == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", "settings"),
        ("Namespace", "team-n"),
    ]

    head = repo.commit(FILES, "drop the namespace")
    offline = cli(
        "diff", "--offline", "--repo", str(repo.path), "--base", base, "--head", head,
        "--config", config, "--format", "json",
    )  # fmt: skip
    assert offline.exit_code == 1, offline.stderr
    report = json.loads(offline.stdout)
    assert [o["action"] for o in report["clusters"][0]["apps"][0]["objects"]] == ["prune"]


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--once"],
        ["diff"],
        ["prune", "approve", "--cluster", "prod", "--digest", "abc123"],
        ["suspend", "--cluster", "prod"],
        ["resume", "--cluster", "prod"],
        ["sync", "--local", "--cluster", "prod"],
        ["takeover", "--cluster", "prod"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_commands_that_reach_the_cluster_exit_2_naming_the_missing_kubeconfig(
    tmp_path: Path, command: list[str]
) -> None:
    config = str(production_config(tmp_path, make_repo(tmp_path, FILES)))
    out = cli(*command, "--config", config)
    assert out.exit_code == 2, out.output
    assert out.stdout == ""
    assert out.stderr == (
        f"config error: {config}: clusters[0].kubeconfig: file not found: /etc/gitops-agent/prod.kubeconfig\n"
    )


def test_the_daemon_exits_2_naming_an_absent_management_kubeconfig(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, FILES)
    (tmp_path / "prod.kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    config = str(production_config(tmp_path, repo, kubeconfig="prod.kubeconfig"))
    out = cli("run", "--config", config)
    assert out.exit_code == 2, out.output
    assert (
        "agent.management_kubeconfig: file not found: /etc/gitops-agent/management.kubeconfig" in out.stderr
    )


def test_a_reloaded_config_naming_an_absent_kubeconfig_is_refused_and_the_running_one_stays(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path, FILES)
    (tmp_path / "prod.kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    path = production_config(tmp_path, repo, kubeconfig="prod.kubeconfig")
    path.write_text(path.read_text().replace("management_kubeconfig", "# management_kubeconfig"))
    cfg = load_config(path)
    daemon = Daemon(cfg, None, partial(Fleet, emit_events=False), DaemonOptions(leases=NO_LEASES))
    try:
        path.write_text(
            path.read_text() + '\n[[clusters]]\nname = "new"\nkubeconfig = "gone.kubeconfig"\npath = "x"\n'
        )
        daemon.check_reload()
        assert f"clusters[1].kubeconfig: file not found: {tmp_path / 'gone.kubeconfig'}" in (
            daemon.config_error or ""
        )
        assert daemon.fleet.names() == ["prod"]
    finally:
        daemon.fleet.close()
