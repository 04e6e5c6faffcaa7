"""Load and validate the agent's TOML configuration into the typed ``Config``.

Called by the CLI before anything touches a cluster. Every problem raises one
``ConfigError`` naming the key path (``clusters[1].kubeconfig: file not found:
...``); unknown keys are errors so that a typo never silently falls back to a
default (the defaults are the types', in ``agent.config.types``, beside what each
key accepts). Each table has its reader: ``agent_settings`` (``[agent]``),
``sources``, ``settings`` (``[defaults]``), ``clusters``, ``app_entries``
(``[[apps]]``), ``conflict_rules``, ``health_checks``, ``ignore_rules``, ``notify`` and ``windows``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.config import notify
from agent.config.agent_settings import agent_settings
from agent.config.app_entries import apps
from agent.config.apps import check_apps
from agent.config.chart_repositories import helm_repositories
from agent.config.clusters import clusters
from agent.config.conflict_rules import conflict_rules
from agent.config.health_checks import health_checks
from agent.config.ignore_rules import ignore_rules
from agent.config.settings import SETTING_KEYS, cluster_settings
from agent.config.sources import sources
from agent.config.tomlreader import TableReader, too_deep
from agent.config.types import AGENT_DEFAULTS, CLUSTER_DEFAULTS, DEFAULT_CONFLICT_RULES, Config
from agent.config.windows import windows
from agent.errors import ConfigError

#: Arrays and inline tables a config may nest (``tomlreader.too_deep``); a config needs a few.
MAX_TOML_NESTING = 32


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, parse and validate a config file; raises ``ConfigError``."""
    file = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError("", "config file not found", file=file) from None
    except OSError as e:
        raise ConfigError("", f"cannot read config file: {e.strerror}", file=file) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("", "config file is not UTF-8 text", file=file) from None
    if (at := too_deep(text, MAX_TOML_NESTING)) is not None:
        where = f"(at line {at[0]}, column {at[1]})"
        message = (
            f"invalid TOML: arrays or inline tables nested more than {MAX_TOML_NESTING} levels deep {where}"
        )
        raise ConfigError("", message, file=file)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("", f"invalid TOML: {e}", file=file) from None
    return parse_config(data, file=file, base_dir=Path(path).resolve().parent)


def parse_config(data: dict[str, Any], *, file: str = "", base_dir: Path | None = None) -> Config:
    base_dir = base_dir or Path.cwd()
    top = TableReader(data, "", file)
    agent_table = top.sub("agent")
    agent = agent_settings(agent_table, base_dir) if agent_table else AGENT_DEFAULTS
    named_sources = sources(top, base_dir)
    defaults = CLUSTER_DEFAULTS
    if (d := top.sub("defaults")) is not None:
        defaults = cluster_settings(d, defaults, base_dir)
        d.finish()
    entries = clusters(top, defaults, base_dir)
    rules = DEFAULT_CONFLICT_RULES
    if (rules_raw := top.get("conflict_rules", list)) is not None:
        rules = conflict_rules(rules_raw, "conflict_rules", file)
    checks = health_checks(top.get("health_checks", list) or [], "health_checks", file)
    ignore = ignore_rules(top.get("ignore", list) or [], "ignore", file)
    placed = apps(top, entries, named_sources, rules, checks, base_dir, ignore=ignore)
    sinks = notify.notifications(top)
    alert_settings = notify.alerts(top)
    receiver = notify.receiver(top, agent.listen)
    hooks = notify.receivers(top, named_sources, receiver)
    change_windows = windows(top.get("windows", list) or [], "windows", file)
    chart_repos = helm_repositories(top.get("helm_repositories", list) or [], "helm_repositories", file)
    # Before the apps are checked together: `[[app]]` is a typo, not a cluster serving no app.
    top.finish()
    check_apps(placed, entries, file=file)
    return Config(
        agent=agent,
        source=named_sources[0].config,
        clusters=tuple(entries),
        conflict_rules=rules,
        health_checks=checks,
        file=file,
        sources=named_sources,
        apps=tuple(p.app for p in placed),
        notifications=sinks,
        alerts=alert_settings,
        receiver=receiver,
        receivers=hooks,
        windows=change_windows,
        ignore=ignore,
        helm_repositories=chart_repos,
    )


def check_access(config: Config, clusters: Iterable[str] | None = None, *, management: bool = True) -> None:
    """The files a command needs to reach clusters exist; raises ``ConfigError`` naming the key.

    Checks the kubeconfig of each cluster in ``clusters`` (all when None) and, with
    ``management``, ``[agent] management_kubeconfig``. Kept out of ``load_config`` so
    that commands that never connect (``render``, ``diff --offline``) work with the
    production config on a machine without these files, such as a CI runner.
    """
    wanted = None if clusters is None else set(clusters)
    for i, c in enumerate(config.clusters):
        if (wanted is None or c.name in wanted) and not c.in_cluster and not os.path.isfile(c.kubeconfig):
            raise ConfigError(
                f"clusters[{i}].kubeconfig", f"file not found: {c.kubeconfig}", file=config.file
            )
    path = config.agent.management_kubeconfig
    if management and path and not os.path.isfile(path):
        raise ConfigError("agent.management_kubeconfig", f"file not found: {path}", file=config.file)


def setting_keys() -> set[str]:
    """Keys a `[defaults]` table accepts (used by the docs test)."""
    return set(SETTING_KEYS)
