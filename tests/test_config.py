"""Config loading: defaults, the example file, and one clear error per kind of mistake."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agent.config.load import load_config
from agent.config.tomlreader import parse_duration
from agent.config.types import DEFAULT_CONFLICT_RULES, AgentSettings, ClusterSettings, ConflictRule
from agent.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, body: str) -> Path:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    p = tmp_path / "agent.toml"
    p.write_text(body)
    return p


GOOD = """
[source]
url = "https://git.example.com/fleet.git"

[[clusters]]
name = "a"
kubeconfig = "kc"
path = "clusters/a"
"""

#: docs/safety.md rule 5 and docs/configuration.md, in order: force over kubectl* writing through
#: `scale` (a hand `kubectl scale`); yield to anything else writing through `scale` (autoscalers)
#: and to kube-controller-manager; force over kubectl, kubectl-*, before-first-apply, velero*.
DOCUMENTED_CONFLICT_RULES = (
    ConflictRule(manager="kubectl*", operation="*", subresource="scale", action="force"),
    ConflictRule(manager="*", operation="*", subresource="scale", action="yield"),
    ConflictRule(manager="kube-controller-manager", operation="*", subresource="*", action="yield"),
    ConflictRule(manager="kubectl", operation="*", subresource="*", action="force"),
    ConflictRule(manager="kubectl-*", operation="*", subresource="*", action="force"),
    ConflictRule(manager="before-first-apply", operation="*", subresource="*", action="force"),
    ConflictRule(manager="velero*", operation="*", subresource="*", action="force"),
)


def test_minimal_config_gets_the_design_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD))
    s = cfg.clusters[0].settings
    assert cfg.agent.name == "gitops-agent" and cfg.agent.namespace == "gitops-agent"
    assert cfg.source.branch == "main" and cfg.source.poll_interval == 60
    assert (s.reconcile_interval, s.prune, s.allow_empty) == (300, True, False)
    assert (s.max_prune_fraction, s.brake_min_inventory, s.max_prune) == (0.5, 10, None)
    assert (s.adopt, s.default_namespace) == ("if-unowned", "default")
    assert (s.connect_timeout, s.request_timeout, s.pass_deadline) == (5, 30, 300)
    assert cfg.conflict_rules == DOCUMENTED_CONFLICT_RULES
    assert DEFAULT_CONFLICT_RULES == DOCUMENTED_CONFLICT_RULES, "the constant other tests plan with"
    assert cfg.field_manager(cfg.clusters[0]) == "gitops-agent"
    assert cfg.clusters[0].kubeconfig == str((tmp_path / "kc").resolve())


def test_cluster_overrides_defaults_table(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            GOOD.replace(
                "[[clusters]]", '[defaults]\nprune = false\nreconcile_interval = "1m"\n\n[[clusters]]'
            )
            + 'reconcile_interval = "30s"\n[clusters.vars]\nREGION = "eu"\nN = 3\n',
        )
    )
    c = cfg.clusters[0]
    assert c.settings.prune is False and c.settings.reconcile_interval == 30
    assert c.vars == {"REGION": "eu", "N": "3"}


def test_example_config_loads_and_documents_every_default(tmp_path: Path) -> None:
    text = (
        (ROOT / "config.example.toml")
        .read_text()
        .replace("/etc/gitops-agent/prod-eu.kubeconfig", str(tmp_path / "kc"))
    )
    cfg = load_config(write(tmp_path, text))
    assert [c.name for c in cfg.clusters] == ["prod-eu", "mgmt"]
    assert cfg.conflict_rules == DOCUMENTED_CONFLICT_RULES
    # The [defaults] table of the example states exactly the loader's defaults.
    mgmt = cfg.cluster("mgmt").settings
    assert mgmt == ClusterSettings()
    assert replace(cfg.agent, listen=AgentSettings().listen) == AgentSettings()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("[source]\nurl = 'x'\n", "clusters: required key is missing"),
        (GOOD + "\n[agent]\nnmae = 'x'\n", "agent.nmae: unknown key (did you mean 'name'?)"),
        (GOOD.replace('path = "clusters/a"', "path = 3"), "clusters[0].path: expected string, got integer"),
        (
            GOOD + '\n[[clusters]]\nname = "a"\nkubeconfig = "kc"\npath = "b"\n',
            "clusters[1].name: duplicate cluster name 'a' (also clusters[0])",
        ),
        (
            GOOD.replace(
                'url = "https://git.example.com/fleet.git"', 'url = "x"\npoll_interval = "5 minutes"'
            ),
            "source.poll_interval: invalid duration '5 minutes'",
        ),
        (
            GOOD + "\n[defaults]\nmax_prune_fraction = 1.5\n",
            "defaults.max_prune_fraction: must be in (0, 1], got 1.5",
        ),
        (
            GOOD + '\n[defaults]\nadopt = "sometimes"\n',
            "defaults.adopt: must be one of never, if-unowned, always; got 'sometimes'",
        ),
        (GOOD.replace('name = "a"', 'name = "Prod_EU"'), "clusters[0].name: must be a DNS label"),
        (
            GOOD.replace('path = "clusters/a"', 'path = "../outside"'),
            "clusters[0].path: must be a path inside the repository",
        ),
        (
            GOOD.replace('kubeconfig = "kc"', 'kubeconfig = "kc"\nin_cluster = true'),
            "clusters[0].kubeconfig: set either kubeconfig or in_cluster = true, not both",
        ),
        (
            GOOD.replace('kubeconfig = "kc"\n', ""),
            "clusters[0].kubeconfig: required key is missing (or set in_cluster = true)",
        ),
        (
            GOOD + '\n[[conflict_rules]]\nmanager = "x"\naction = "win"\n',
            "conflict_rules[0].action: must be force or yield, got 'win'",
        ),
        (
            GOOD.replace(
                'url = "https://git.example.com/fleet.git"', 'url = "u"\nbranch = "main"\ntag = "v1"'
            ),
            "source.tag: set only one of branch, tag, commit",
        ),
        (GOOD + "\n[defaults]\nprune = 1\n", "defaults.prune: expected boolean, got integer"),
        (
            GOOD + "\n[defaults]\nbrake_min_inventory = true\n",
            "defaults.brake_min_inventory: expected integer, got boolean",
        ),
        (GOOD + '\n[clusters.vars]\n"1BAD" = "x"\n', "clusters[0].vars.1BAD: variable names are letters"),
        (
            GOOD.replace("[source]", "[source]\ncommit = 'not-a-sha'"),
            "source.commit: must be a hexadecimal commit SHA",
        ),
        ("[source\nurl=1", "invalid TOML"),
        (GOOD + '\n[defaults]\nrequest_timeout = "0s"\n', "defaults.request_timeout: must be at least"),
        (
            GOOD.replace("[source]", "[agent]\nlisten = 'localhost'\n\n[source]"),
            "agent.listen: must be host:port",
        ),
        (
            GOOD.replace("[source]", "[agent]\nrenew_deadline = '20s'\n\n[source]"),
            "agent.renew_deadline: leases need",
        ),
        (
            GOOD.replace("[source]", "[agent]\nleases = 'maybe'\n\n[source]"),
            "agent.leases: must be auto, on or off",
        ),
    ],
)
def test_malformed_config_names_the_key(tmp_path: Path, body: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, body))
    assert expected in str(err.value)
    assert str(tmp_path / "agent.toml") in str(err.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("30s", 30), ("5m", 300), ("1h30m", 5400), ("1d", 86400)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "m5", "5 m", "1h-3m", "5mm"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_cli_exits_2_on_config_error_without_touching_a_cluster(tmp_path: Path) -> None:
    bad = write(tmp_path, GOOD.replace('kubeconfig = "kc"', 'kubeconfig = "gone"'))
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--once", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "clusters[0].kubeconfig: file not found" in out.stderr
