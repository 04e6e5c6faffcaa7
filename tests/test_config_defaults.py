"""Each default and enum has one home, ``agent.config.types``, and the stages take theirs from it.

Copies drift: ``ApplyOptions.concurrency`` once said 4 where ``[defaults] concurrency`` said 8
(commit 59f4617). So the stages' option dataclasses and the module constants below hold no
literal default, only references into ``agent.config.types``, and each equals the setting it
stands for. The enums' spellings are the ones the loader accepts and the CLI offers, and the
Git source is built from a config in one place. ``tests/test_docs.py`` holds the other half:
docs/configuration.md and config.example.toml against these types.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import math
from enum import StrEnum
from pathlib import Path
from typing import Any

import click
import pytest

from agent.cli.main import main
from agent.config import types
from agent.config.load import parse_config
from agent.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
TYPES = "agent.config.types"

#: Where defaults live outside the config types: option dataclasses and module constants.
SUBJECTS = {
    "agent.apply.ssa": ("ApplyOptions",),
    "agent.apply.prune": ("PruneOptions",),
    "agent.plan.planner": ("PlanOptions",),
    "agent.run.lease_settings": ("LeaseSettings",),
    "agent.run.scheduler": ("DaemonOptions",),
    "agent.run.fleet": ("BACKOFF_BASE", "BACKOFF_CAP"),
    "agent.run.server": ("STUCK_AFTER",),
}

#: Defaults that are not settings: a mode of the call or "not given". Only None, True or False.
NOT_SETTINGS = {
    "ApplyOptions.dry_run",  # the caller's mode, never configured
    "PruneOptions.dry_run",
    "PlanOptions.schema",  # None: no OpenAPI index (conservative fallbacks)
    "PlanOptions.membership_label",  # None: the inventory is not known yet
    "PlanOptions.detail",  # the report's mode; the pass turns it off
    "PlanOptions.handover_from",  # None: no other app's set; the pass knows its apps
    "PlanOptions.protected",  # likewise
    "PlanOptions.set_owners",  # None: no app of this agent known by its set (refusals name the label)
    "PruneOptions.app",  # None: the cluster entry's own app
    "PruneOptions.scope",  # None: unrestricted (the pass gives each app its own)
    "PruneOptions.config_file",  # None: not known here (the brake's command says <file>)
    "PruneOptions.cluster",  # None: likewise (<name>)
    "PruneOptions.set_names",  # None: no app of this agent known by its set (holds name set ids)
    "LeaseSettings.enabled",  # decided by ``lease_settings`` from ``leases`` and where the agent runs
    "LeaseSettings.in_cluster",  # likewise
    "DaemonOptions.leases",  # None: decided from the config
}


def settings() -> dict[str, Any]:
    """Each default outside the config types → the config default it stands for."""
    a, c = types.AgentSettings(), types.ClusterSettings()
    return {
        "ApplyOptions.concurrency": c.concurrency,
        "ApplyOptions.crd_wait": types.CRD_WAIT,
        "ApplyOptions.conflict_retries": types.CONFLICT_RETRIES,
        "PruneOptions.enabled": c.prune,
        "PruneOptions.allow_empty": c.allow_empty,
        "PruneOptions.max_prune_fraction": c.max_prune_fraction,
        "PruneOptions.brake_min_inventory": c.brake_min_inventory,
        "PruneOptions.max_prune": c.max_prune,
        "PruneOptions.propagation": c.propagation_policy,
        "PlanOptions.adopt": c.adopt,
        "LeaseSettings.namespace": a.namespace,
        "LeaseSettings.identity": a.replica_id,
        "LeaseSettings.duration": math.ceil(a.lease_duration),
        "LeaseSettings.renew_deadline": a.renew_deadline,
        "LeaseSettings.retry_period": a.retry_period,
        "LeaseSettings.kubeconfig": a.management_kubeconfig,
        "LeaseSettings.context": a.management_context,
        "DaemonOptions.tick": types.SCHEDULER_TICK,
        "DaemonOptions.stuck_after": a.stuck_after,
        "DaemonOptions.grace": a.shutdown_grace,
        "DaemonOptions.backoff_base": a.backoff_base,
        "DaemonOptions.backoff_cap": a.backoff_cap,
        "DaemonOptions.jitter": types.SCHEDULE_JITTER,
        "DaemonOptions.reload_interval": a.reload_interval,
        "BACKOFF_BASE": a.backoff_base,
        "BACKOFF_CAP": a.backoff_cap,
        "STUCK_AFTER": a.stuck_after,
    }


def source_of(module: str) -> tuple[Path, ast.Module]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    path = Path(spec.origin)
    return path, ast.parse(path.read_text(), filename=str(path))


def defaults_in(module: str) -> dict[str, ast.expr]:
    """``Class.field`` or ``CONSTANT`` → its default as written, for the module's subjects."""
    _, tree = source_of(module)
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in SUBJECTS[module]:
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
                    found[f"{node.name}.{stmt.target.id}"] = stmt.value
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id in SUBJECTS[module]:
                    found[t.id] = node.value
    return found


def names_from_types(module: str) -> set[str]:
    """Names the module imports from ``agent.config.types``."""
    _, tree = source_of(module)
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == TYPES
        for alias in node.names
    }


def test_option_dataclasses_and_module_constants_hold_no_literal_defaults() -> None:
    wrong: list[str] = []
    seen: set[str] = set()
    for module in SUBJECTS:
        path, _ = source_of(module)
        imported = names_from_types(module)
        for name, expr in defaults_in(module).items():
            seen.add(name)
            where = f"{path.relative_to(ROOT)}:{expr.lineno} {name} = {ast.unparse(expr)}"
            if name in NOT_SETTINGS:
                if not (isinstance(expr, ast.Constant) and expr.value in (None, True, False)):
                    wrong.append(f"{where}: not a setting, so None, True or False only")
                continue
            literals = [n for n in ast.walk(expr) if isinstance(n, ast.Constant)]
            references = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} & imported
            if literals or not references:
                wrong.append(f"{where}: must be a reference to {TYPES}, not a literal")
            elif name not in settings():
                wrong.append(f"{where}: not in this test's table of settings")
    assert not wrong, "defaults outside agent.config.types:\n" + "\n".join(wrong)
    # The tables name real defaults (a field renamed or dropped must leave them too).
    assert (set(settings()) | NOT_SETTINGS) - seen == set()


def test_option_defaults_equal_the_settings_they_stand_for() -> None:
    expected = settings()
    for module, subjects in SUBJECTS.items():
        mod = importlib.import_module(module)
        for subject in subjects:
            value = getattr(mod, subject)
            if not dataclasses.is_dataclass(value):
                actual = {subject: value}
            else:
                actual = {
                    f"{subject}.{f.name}": f.default
                    for f in dataclasses.fields(value)
                    if f.default is not dataclasses.MISSING
                }
            for name, default in actual.items():
                if name in expected:
                    assert (type(default), default) == (type(expected[name]), expected[name]), name


#: Settings spelled by an enum: (table, key, enum).
ENUM_KEYS = (
    ("agent", "log_format", types.LogFormat),
    ("agent", "log_level", types.LogLevel),
    ("agent", "leases", types.Leases),
    ("defaults", "adopt", types.Adopt),
    ("defaults", "propagation_policy", types.PropagationPolicy),
)


def loaded(tmp_path: Path, table: str, key: str, value: str) -> Any:
    """``table.key = value`` through the loader, read back from the typed config."""
    data: dict[str, Any] = {
        "source": {"url": "https://git.example.com/fleet.git"},
        "clusters": [{"name": "c", "in_cluster": True, "path": "p"}],
        table: {key: value},
    }
    cfg = parse_config(data, base_dir=tmp_path)
    return getattr(cfg.agent if table == "agent" else cfg.clusters[0].settings, key)


@pytest.mark.parametrize(("table", "key", "kind"), ENUM_KEYS, ids=[k[1] for k in ENUM_KEYS])
def test_the_loader_accepts_exactly_the_enums_spellings_and_loads_their_members(
    tmp_path: Path, table: str, key: str, kind: type[StrEnum]
) -> None:
    for member in kind:
        assert loaded(tmp_path, table, key, member.value) is member
    with pytest.raises(ConfigError) as refused:
        loaded(tmp_path, table, key, "bogus")
    message = str(refused.value)
    assert f"{table}.{key}:" in message and all(m.value in message for m in kind), message


def test_the_cli_offers_exactly_the_log_formats_and_levels_the_config_accepts() -> None:
    offered = {p.name: p.type.choices for p in main.params if isinstance(p.type, click.Choice)}
    assert list(offered["log_format"]) == types.choices(types.LogFormat)
    assert list(offered["log_level"]) == types.choices(types.LogLevel)
    run = main.commands["run"]
    assert [list(p.type.choices) for p in run.params if isinstance(p.type, click.Choice)] == [
        types.choices(types.LogFormat),
        types.choices(types.LogLevel),
    ]


def test_the_git_source_of_a_config_is_built_only_by_its_factory() -> None:
    """``GitSource.from_config``; the offline diff's source is a ``--repo`` URL, not ``[source]``."""
    allowed = {"agent/source/git.py", "agent/report/diff_offline.py"}
    built: list[str] = []
    for path in sorted((ROOT / "agent").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "GitSource"
                and rel not in allowed
            ):
                built.append(f"{rel}:{node.lineno}")
    assert not built, f"GitSource(...) outside GitSource.from_config: {built}"
