"""The documented configuration cannot drift from the loader, and the docs point at real things.

- Every key the loader accepts (found by watching it read a config that has every table)
  is in ``docs/configuration.md`` and in ``config.example.toml``, and nothing else is.
- Each default written there is the loader's: setting a key to its documented default
  must give exactly the same ``Config`` as leaving it out.
- ``config.example.toml`` loads, and runs against two real local clusters once its
  URL, kubeconfigs and cache are swapped for local ones.
- Relative links resolve; the ``gitops-agent`` command lines in the docs parse with the CLI.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from agent.cli.main import main
from agent.config import load as config_mod
from agent.config.load import parse_config
from agent.config.tomlreader import TableReader
from agent.config.types import Config
from agent.errors import ConfigError
from tests.agentkit import E2E, make_repo, unique
from tests.clusters import ClusterPool, kubectl

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "configuration.md"
EXAMPLE = ROOT / "config.example.toml"
#: Keys whose default is a rule, not a value (documented in words).
NOT_A_VALUE = {
    ("source", "url"),
    ("clusters", "name"),
    ("clusters", "path"),
    ("clusters", "paths"),
    ("clusters", "kubeconfig"),
    ("clusters.helm", "chart"),
    ("clusters.helm", "release_name"),
    ("helm_repositories", "url"),
    ("defaults", "max_prune"),
    ("defaults", "substitute"),
    ("conflict_rules", "manager"),
    ("conflict_rules", "action"),
    ("sources", "name"),
    ("apps", "name"),
    ("apps", "cluster"),
    ("apps", "clusters"),
    ("apps", "path"),
    ("apps", "paths"),
    ("health_checks", "api_version"),
    ("health_checks", "kind"),
    ("health_checks", "current"),
    ("health_checks", "in_progress"),
    ("health_checks", "failed"),
    ("notifications", "name"),
    ("notifications", "kind"),
    ("notifications", "url"),
    ("receiver", "listen"),
    ("receivers", "name"),
    ("receivers", "kind"),
    ("receivers", "secret_file"),
    ("receivers", "secret_env"),
    ("windows", "schedule"),
    ("windows", "duration"),
    ("windows", "kind"),
    ("windows", "name"),
    ("ignore", "selector"),  # unset: every object (an empty selector is refused)
    ("ignore", "json_pointers"),  # a rule needs one of the three: their defaults are together
    ("ignore", "paths"),
    ("ignore", "managers"),
}
#: Tables that take the keys of another, which the reference documents once, in a sentence
#: naming both: a `[[sources]]` entry is a `[source]` with a name, and so on.
MIRRORS = {
    "sources": "source",
    "sources.auth": "source.auth",
    "sources.verify": "source.verify",
    "apps.helm": "clusters.helm",
    "apps.conflict_rules": "conflict_rules",
    "apps.health_checks": "health_checks",
    "apps.ignore": "ignore",
    "clusters.decryption": "defaults.decryption",
    "apps.decryption": "defaults.decryption",
}
#: Sections of the example whose values must be the defaults (the others are illustrations).
DEFAULT_SECTIONS = ("agent", "source", "source.auth", "source.verify", "defaults", "defaults.decryption")
ILLUSTRATIVE = {("source", "url")}

Key = tuple[str, str]


def base_data(kubeconfig: Path) -> dict[str, Any]:
    """The smallest config with every table present, so the loader reads every key it knows."""
    return {
        "agent": {},
        "source": {"url": "https://git.example.com/fleet.git", "auth": {}, "verify": {}},
        "defaults": {"decryption": {}},
        "clusters": [
            {
                "name": "c",
                "kubeconfig": str(kubeconfig),
                "path": "p",
                "vars": {},
                "helm": {"chart": "chart"},
                "decryption": {},
            }
        ],
        "conflict_rules": [{"manager": "*", "action": "yield"}],
        "health_checks": [{"api_version": "example.com/v1", "kind": "Widget", "current": "true"}],
        "ignore": [{"json_pointers": ["/spec/replicas"]}],
        "sources": [{"name": "other", "url": "https://git.example.com/other.git", "auth": {}, "verify": {}}],
        "apps": [
            {
                "name": "app",
                "cluster": "c",
                "path": "q",
                "vars": {},
                "helm": {"chart": "chart"},
                "conflict_rules": [{"manager": "*", "action": "yield"}],
                "health_checks": [{"api_version": "example.com/v1", "kind": "Widget", "current": "true"}],
                "ignore": [{"json_pointers": ["/spec/replicas"]}],
                "decryption": {},
            }
        ],
        "notifications": [{"name": "n", "kind": "webhook", "url": "https://hooks.example.com/n"}],
        "alerts": {},
        "receiver": {"listen": "127.0.0.1:9090"},
        "receivers": [{"name": "h", "kind": "github", "secret_file": "/etc/hook-secret"}],
        "windows": [{"schedule": "0 22 * * *", "duration": "2h", "kind": "allow"}],
        "helm_repositories": [{"url": "https://charts.example.com"}],
    }


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\nkind: Config\n")
    return kc


def table(data: dict[str, Any], section: str) -> dict[str, Any]:
    node: Any = data
    for part in section.split("."):
        node = node[part]
        if isinstance(node, list):
            node = node[0]
    return node  # type: ignore[no-any-return]


def accepted_keys(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[set[Key], set[str]]:
    """(section, key) pairs the loader reads, and the sections (tables) among them."""
    seen: set[Key] = set()
    original = TableReader.get

    def spy(self: TableReader, name: str, *args: Any, **kwargs: Any) -> Any:
        seen.add((re.sub(r"\[\d+\]", "", self.path), name))
        return original(self, name, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(TableReader, "get", spy)
        parse_config(base_data(kubeconfig), base_dir=kubeconfig.parent)
    tables = {k for s, k in seen if s == ""}
    tables |= {"source.auth", "source.verify", "clusters.vars", "clusters.helm"}
    tables |= {
        "sources.auth",
        "sources.verify",
        "apps.vars",
        "apps.helm",
        "apps.conflict_rules",
        "apps.ignore",
    }
    tables |= {"apps.health_checks"}
    tables |= {"defaults.decryption", "clusters.decryption", "apps.decryption"}
    keys = {(s, k) for s, k in seen if f"{s}.{k}".strip(".") not in tables}
    return keys, tables


def documented_once(keys: set[Key]) -> set[Key]:
    """The accepted keys a reference lists in their own rows: not those said once for many.

    A `[[clusters]]` entry takes every `[defaults]` key and an `[[apps]]` entry the per-app
    ones (each a sentence); a mirror table takes the keys of the table it mirrors.
    """
    settings = {k for s, k in keys if s == "defaults"}
    return {
        (s, k)
        for s, k in keys
        if not (s in ("clusters", "apps") and k in settings)
        and not (s in MIRRORS and (MIRRORS[s], k) in keys)
    }


def app_settings_sentence() -> set[str]:
    """The `[defaults]` keys the reference says an `[[apps]]` entry may set."""
    m = re.search(
        r"An app may also set these keys of `\[defaults\]`[^:]*:(.*?);", REFERENCE.read_text(), re.S
    )
    assert m is not None, "the [[apps]] section no longer says which [defaults] keys an app may set"
    return set(re.findall(r"`([a-z_]+)`", m.group(1)))


def documented() -> dict[Key, str]:
    """(section, key) → default cell of the tables in docs/configuration.md."""
    rows: dict[Key, str] = {}
    section = ""
    for line in REFERENCE.read_text().splitlines():
        heading = re.match(r"^#+ `\[\[?([a-z_.]+)\]\]?`", line)
        if heading:
            section = heading.group(1)
        elif line.startswith("#"):
            section = ""
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if section and line.startswith("| `") and len(cells) == 3:
            rows[(section, cells[0].strip("`"))] = cells[1]
    return rows


def loads_same(kubeconfig: Path, section: str, key: str, value: Any) -> tuple[Config, Config]:
    data = base_data(kubeconfig)
    without = parse_config(data, base_dir=kubeconfig.parent)
    table(data, section)[key] = value
    return without, parse_config(data, base_dir=kubeconfig.parent)


def literal(cell: str) -> Any:
    m = re.fullmatch(r"`([^`]*)`", cell)
    if m is None:
        raise ValueError(cell)
    return tomllib.loads(f"v = {m.group(1)}")["v"]


def test_configuration_reference_lists_exactly_the_keys_the_loader_accepts(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, tables = accepted_keys(kubeconfig, monkeypatch)
    settings = {k for s, k in keys if s == "defaults"}
    assert set(documented()) == documented_once(keys)
    # A [[clusters]] entry takes every [defaults] key too; the reference says so once.
    text = REFERENCE.read_text()
    assert "may set any\nkey of `[defaults]`" in text
    # ... its tables (`decryption`) included, each documented as a table of its own.
    sub_tables = {t.partition(".")[2] for t in tables if t.startswith("defaults.")}
    assert settings | sub_tables == config_mod.setting_keys()
    # An [[apps]] entry takes some of them; the reference names exactly those.
    assert app_settings_sentence() == {k for s, k in keys if s == "apps" and k in settings}
    for table, mirrored in MIRRORS.items():
        both = rf"`\[\[?{re.escape(table)}\]\]?`.{{0,200}}?`\[\[?{re.escape(mirrored)}\]\]?`"
        assert re.search(both, text, re.S), f"the reference does not say [{table}] takes [{mirrored}]'s keys"


def test_configuration_reference_defaults_are_the_loaders(kubeconfig: Path) -> None:
    for (section, key), cell in sorted(documented().items()):
        if (section, key) in NOT_A_VALUE:
            with pytest.raises(ValueError):
                literal(cell)
            continue
        without, with_default = loads_same(kubeconfig, section, key, literal(cell))
        assert with_default == without, f"[{section}] {key}: documented default {cell} is not the loader's"


def test_documented_required_keys_are_required(kubeconfig: Path) -> None:
    required = (
        ("source", "url"),
        ("clusters", "name"),
        ("conflict_rules", "action"),
        ("sources", "name"),
        ("apps", "name"),
        ("apps", "cluster"),
        ("apps", "path"),
        ("windows", "schedule"),
        ("windows", "duration"),
        ("windows", "kind"),
    )
    for section, key in required:
        data = base_data(kubeconfig)
        del table(data, section)[key]
        with pytest.raises(ConfigError, match="required"):
            parse_config(data, base_dir=kubeconfig.parent)


def example_mentions() -> dict[Key, str | None]:
    """(section, key) → value as written (None when only mentioned in a comment)."""
    found: dict[Key, str | None] = {}
    section = ""
    for line in EXAMPLE.read_text().splitlines():
        header = re.match(r"^\s*#?\s*\[\[?([a-z_.]+)\]\]?\s*(#.*)?$", line)
        if header:
            section = header.group(1)
            continue
        setting = re.match(r"^([a-z_][a-z0-9_]*)\s*=\s*(.+?)\s*(#.*)?$", line)
        if setting:
            found[(section, setting.group(1))] = setting.group(2)
        for key in re.findall(r"(?:^|[#\s])([a-z_][a-z0-9_]*)\s*=", line):
            found.setdefault((section, key), None)
    return found


def test_example_config_mentions_every_key_with_its_default(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    keys, _ = accepted_keys(kubeconfig, monkeypatch)
    mentioned = example_mentions()
    expected = documented_once(keys)
    missing = expected - set(mentioned)
    assert not missing, f"config.example.toml does not mention: {sorted(missing)}"
    for (section, key), value in sorted(mentioned.items()):
        if section not in DEFAULT_SECTIONS or value is None or (section, key) in ILLUSTRATIVE:
            continue
        without, with_example = loads_same(kubeconfig, section, key, tomllib.loads(f"v = {value}")["v"])
        assert with_example == without, f"config.example.toml [{section}] {key} = {value} is not the default"
    # And it loads as it stands (its kubeconfig path does not exist here: point it at one).
    text = EXAMPLE.read_text().replace("/etc/gitops-agent/prod-eu.kubeconfig", str(kubeconfig))
    (tmp_path / "example.toml").write_text(text)
    cfg = config_mod.load_config(tmp_path / "example.toml")
    assert [c.name for c in cfg.clusters] == ["prod-eu", "mgmt"]


def test_example_config_apps_block_loads_when_uncommented(kubeconfig: Path, tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("/etc/gitops-agent/prod-eu.kubeconfig", str(kubeconfig))
    head, marker, block = text.partition("\n# Apps: ")
    assert marker, "config.example.toml no longer ends with its commented [[apps]] block"
    block = re.sub(r"(?m)^# (?=\[|[a-z_]+ = )", "", block)
    (tmp_path / "example.toml").write_text(head + marker + block)
    cfg = config_mod.load_config(tmp_path / "example.toml")
    assert [(a.name, a.source, a.depends_on) for a in cfg.apps_of("prod-eu")] == [
        ("prod-eu", "default", ()),
        ("infra", "default", ()),
        ("shop", "shop", ("infra",)),
    ]
    assert [s.name for s in cfg.sources] == ["default", "shop"]


# -- the example, run against real clusters ----------------------------------------


def adapt_example(tmp_path: Path, repo: Path, kubeconfigs: dict[str, Path], name: str) -> Path:
    """config.example.toml with only what points at remote things swapped for local ones."""
    text = EXAMPLE.read_text()
    swaps = {
        '\nname = "gitops-agent"': f'\nname = "{name}"',
        'cache_dir = "~/.cache/gitops-agent/work"': f'cache_dir = "{tmp_path / "cache"}"',
        'url = "https://git.example.com/platform/fleet.git"': f'url = "{repo}"',
        'kubeconfig = "/etc/gitops-agent/prod-eu.kubeconfig"': f'kubeconfig = "{kubeconfigs["prod-eu"]}"',
        "in_cluster = true": f'kubeconfig = "{kubeconfigs["mgmt"]}"',
    }
    for old, new in swaps.items():
        assert text.count(old) == 1, f"config.example.toml no longer has {old.strip()!r}"
        text = text.replace(old, new)
    path = tmp_path / "example.toml"
    path.write_text(text)
    return path


@pytest.mark.cluster
def test_example_config_runs_against_local_clusters(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("example")
    app = f"""
        apiVersion: v1
        kind: Namespace
        metadata:
          name: {ns}
        ---
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: where
          namespace: {ns}
        data:
          cluster: ${{CLUSTER}}
        """
    repo = make_repo(
        tmp_path,
        {
            "clusters/prod-eu/app.yaml": app + "  region: ${REGION}\n",
            "clusters/mgmt/app.yaml": app.replace("${CLUSTER}", "mgmt"),
        },
    )
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    cfg = adapt_example(
        tmp_path, repo.path, {"prod-eu": a.kubeconfig, "mgmt": b.kubeconfig}, unique("example")
    )
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--once", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:] if line.strip()}
    assert rows["prod-eu"][2] == rows["mgmt"][2] == "2", out.stdout  # both objects created
    got = kubectl(a.kubeconfig, "get", "configmap", "where", "-n", ns, "-o", "jsonpath={.data}")
    assert got == '{"cluster":"prod-eu","region":"eu-west-1"}'
    got = kubectl(b.kubeconfig, "get", "configmap", "where", "-n", ns, "-o", "jsonpath={.data.cluster}")
    assert got == "mgmt"


# -- the docs themselves -------------------------------------------------------------


def doc_files() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_relative_links_in_the_docs_resolve() -> None:
    broken = []
    for doc in [*doc_files(), ROOT / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} → {target}")
        for path in re.findall(r"`((?:agent|manifests|tools|scripts|tests)/[\w./-]*\w)`", doc.read_text()):
            if not (ROOT / path).exists():
                broken.append(f"{doc.relative_to(ROOT)} → {path}")
    assert not broken, broken


def command_lines() -> Iterator[tuple[Path, str]]:
    """``gitops-agent ...`` lines inside fenced code blocks of the docs this project owns."""
    for doc in (DOCS / "getting-started.md", DOCS / "self-management.md", DOCS / "architecture.md"):
        fenced = False
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
                fenced = not fenced
                continue
            command = line.split("#")[0].strip()
            if fenced and command.startswith("gitops-agent "):
                yield doc, command


def test_command_lines_in_the_docs_are_real_commands_and_options() -> None:
    checked = 0
    for doc, line in command_lines():
        words = [w for w in shlex.split(line.replace("\\", ""))[1:] if w]
        command: click.Command = main
        while isinstance(command, click.Group) and words and not words[0].startswith("-"):
            sub = command.commands.get(words[0])
            assert sub is not None, f"{doc.name}: {line}: no command {words[0]!r}"
            command, words = sub, words[1:]
        options = {o for p in command.params for o in getattr(p, "opts", [])}
        for w in words:
            if w.startswith("--"):
                assert w.split("=")[0] in options, f"{doc.name}: {line}: no option {w}"
        checked += 1
    assert checked >= 5


def test_the_architecture_code_map_names_every_module_and_the_layer_contract() -> None:
    """The newcomer's map names every module, and its layer table is the import contract."""
    text = (DOCS / "architecture.md").read_text()
    modules = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "agent").rglob("*.py") if p.name != "__init__.py"
    }
    named = set(re.findall(r"`(agent/[\w/]+\.py)`", text))
    assert modules - named == set(), "modules missing from the code map"
    assert named - modules == set(), "the code map names modules that do not exist"
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    table = re.search(r"## Code map.*?```\n(.*?)```", text, re.S)
    assert table is not None
    documented = [re.split(r"\s{2,}", line.strip())[0] for line in table.group(1).splitlines()]
    assert documented == contract["layers"]
