"""Each default and enum has one home, ``agent.config``, and the stages take theirs from it.

Copies drift: ``ApplyOptions.concurrency`` once said 4 where ``[defaults] concurrency`` said 8
(commit 59f4617). So no module of ``agent/`` outside ``agent/config`` holds a literal default of
a setting: the test finds the subjects itself, by walking every module, so a new option lands
under it without anyone listing it. A subject is a field of an option dataclass (a dataclass
named ``*Options`` or ``*Settings``), any dataclass field named like a config key (``timeout``),
or a module constant named like a key of a number (``BACKOFF_CAP``). Each holds a reference into
``agent.config.types`` that equals the setting it stands for. The enums' spellings are the ones
the loader accepts and the CLI offers, and the Git source is built from a config in one place.
``tests/test_docs.py`` holds the other half: docs/configuration.md and config.example.toml
against these types.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import math
from collections.abc import Iterator
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
#: The home of settings, whose literals are the defaults.
HOME = ROOT / "agent" / "config"

#: The config's tables; a field or constant named like one of their keys that holds a value
#: (a number, a word, an enum member: not a table, list or flag) stands for that setting.
TABLES = (
    types.AgentSettings,
    types.ClusterSettings,
    types.SourceConfig,
    types.Decryption,
    types.NotificationConfig,
    types.AlertSettings,
    types.ReceiverSettings,
    types.HookConfig,
)


def _holds_a_value(default: Any) -> bool:
    return (isinstance(default, int | float | str) and not isinstance(default, bool)) and default != ""


CONFIG_KEYS = {f.name for table in TABLES for f in dataclasses.fields(table) if _holds_a_value(f.default)}
#: Keys of numbers: a module constant named like one stands for it (``LEASES`` is an API path).
NUMBER_KEYS = {
    f.name for table in TABLES for f in dataclasses.fields(table) if type(f.default) in (int, float)
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
    "PlanOptions.ignore",  # (): no ignore rules (the pass gives each app its own, from the config)
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
    """Defaults outside the config types whose name is not the setting's → the setting's default.

    A default spelled ``CLUSTER_DEFAULTS.concurrency`` on a field ``concurrency`` says itself
    what it stands for and needs no line here.
    """
    a, c = types.AgentSettings(), types.ClusterSettings()
    return {
        "ApplyOptions.crd_wait": types.CRD_WAIT,
        "ApplyOptions.conflict_retries": types.CONFLICT_RETRIES,
        "PruneOptions.enabled": c.prune,
        "PruneOptions.propagation": c.propagation_policy,
        "LeaseSettings.identity": a.replica_id,
        "LeaseSettings.duration": math.ceil(a.lease_duration),
        "LeaseSettings.kubeconfig": a.management_kubeconfig,
        "LeaseSettings.context": a.management_context,
        "DaemonOptions.tick": types.SCHEDULER_TICK,
        "DaemonOptions.grace": a.shutdown_grace,
        "DaemonOptions.jitter": types.SCHEDULE_JITTER,
        "RenderSpec.timeout": c.render_timeout,
    }


@dataclasses.dataclass(frozen=True)
class Default:
    """One default found in ``agent/``: ``Class.field`` or ``CONSTANT``, as written."""

    module: str
    name: str
    expr: ast.expr
    where: str
    #: Names the module imports from ``agent.config.types``.
    imported: frozenset[str]
    #: A field of an option dataclass (every default of one is a subject).
    option: bool

    @property
    def attribute(self) -> str:
        return self.name.rpartition(".")[2]


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Name) and target.id == "dataclass") or (
            isinstance(target, ast.Attribute) and target.attr == "dataclass"
        ):
            return True
    return False


def _empty(expr: ast.expr) -> bool:
    """``None``, a boolean, ``""``, ``()`` or an empty collection made per instance
    (``field(default_factory=list)``, a result's ``drift``): "not given", never a setting's value."""
    if isinstance(expr, ast.Constant):
        return expr.value is None or isinstance(expr.value, bool) or expr.value == ""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "field":
        factory = next((k.value for k in expr.keywords if k.arg == "default_factory"), None)
        return isinstance(factory, ast.Name) and factory.id in ("list", "dict", "set", "tuple")
    return isinstance(expr, ast.Tuple) and not expr.elts


def defaults() -> Iterator[Default]:
    """Every subject in ``agent/`` outside ``agent/config``: fields of option dataclasses, and
    dataclass fields and module constants named like a config key, that have a default."""
    for path in sorted((ROOT / "agent").rglob("*.py")):
        if HOME in path.parents:
            continue
        rel = path.relative_to(ROOT)
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(), filename=str(path))
        imported = frozenset(
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == TYPES
            for alias in node.names
        )
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name) and t.id.isupper() and t.id.lower().lstrip("_") in NUMBER_KEYS:
                        yield Default(module, t.id, node.value, f"{rel}:{node.lineno}", imported, False)
        for cls in ast.walk(tree):
            if not (isinstance(cls, ast.ClassDef) and _is_dataclass(cls)):
                continue
            option = cls.name.endswith(("Options", "Settings"))
            for stmt in cls.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.value is not None
                    and (option or stmt.target.id in CONFIG_KEYS)
                ):
                    yield Default(
                        module,
                        f"{cls.name}.{stmt.target.id}",
                        stmt.value,
                        f"{rel}:{stmt.lineno}",
                        imported,
                        option,
                    )


def test_the_walk_finds_the_option_dataclasses_and_the_constants_of_settings() -> None:
    """The walk is no opt-in list, but it must see what it guards (a broken walk passes all)."""
    found = {d.name.partition(".")[0] for d in defaults()}
    assert {"ApplyOptions", "PruneOptions", "PlanOptions", "LeaseSettings", "DaemonOptions"} <= found
    assert {"BACKOFF_BASE", "BACKOFF_CAP", "STUCK_AFTER"} <= found


def test_no_default_of_a_setting_outside_agent_config_is_a_literal() -> None:
    wrong: list[str] = []
    for d in defaults():
        shown = f"{d.where} {d.name} = {ast.unparse(d.expr)}"
        if d.name in NOT_SETTINGS:
            empty_tuple = isinstance(d.expr, ast.Tuple) and not d.expr.elts
            if (
                not (isinstance(d.expr, ast.Constant) and d.expr.value in (None, True, False))
                and not empty_tuple
            ):
                wrong.append(f"{shown}: not a setting, so None, True, False or () only")
            continue
        if not d.option and _empty(d.expr):
            continue  # a field named like a key but "not given" (a report's kubernetes_version = "")
        literals = [n for n in ast.walk(d.expr) if isinstance(n, ast.Constant)]
        references = {n.id for n in ast.walk(d.expr) if isinstance(n, ast.Name)} & d.imported
        if literals or not references:
            wrong.append(f"{shown}: must be a reference to {TYPES}, not a literal")
        elif d.name not in settings() and d.attribute.lower() not in _attributes(d.expr):
            wrong.append(f"{shown}: names another setting than its own; add it to this test's table")
    assert not wrong, "defaults outside agent.config:\n" + "\n".join(wrong)
    # The table names real defaults (a field renamed or dropped must leave it too).
    seen = {d.name for d in defaults()}
    assert (set(settings()) | NOT_SETTINGS) - seen == set()


def _attributes(expr: ast.expr) -> set[str]:
    """The attribute names an expression reads (``CLUSTER_DEFAULTS.concurrency`` → concurrency)."""
    return {n.attr for n in ast.walk(expr) if isinstance(n, ast.Attribute)} | {
        n.id.lower() for n in ast.walk(expr) if isinstance(n, ast.Name)
    }


def _value(d: Default) -> Any:
    owner, _, attribute = d.name.rpartition(".")
    mod = importlib.import_module(d.module)
    if not owner:
        return getattr(mod, attribute)
    field = next(f for f in dataclasses.fields(getattr(mod, owner)) if f.name == attribute)
    return field.default


def _standing_for(d: Default) -> Any:
    """The setting's default ``d`` stands for: the table's, else the one it names."""
    if d.name in settings():
        return settings()[d.name]
    key = d.attribute.lower()
    return next(f.default for table in TABLES for f in dataclasses.fields(table) if f.name == key)


def test_option_defaults_equal_the_settings_they_stand_for() -> None:
    for d in defaults():
        if d.name in NOT_SETTINGS or (not d.option and _empty(d.expr)):
            continue
        value, expected = _value(d), _standing_for(d)
        assert (type(value), value) == (type(expected), expected), d.name


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
    logs = [
        p for p in run.params if isinstance(p.type, click.Choice) and p.name in ("log_format", "log_level")
    ]
    assert [list(p.type.choices) for p in logs if isinstance(p.type, click.Choice)] == [
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
