"""What every ``gitops-agent`` command shares: its config, its exit codes, its logs on stderr.

Used by ``agent.cli`` and the command modules it registers (``cli_diff``,
``cli_ops``, ``cli_takeover``). A config error exits 2 before anything is
touched; only commands that reach clusters ask for ``access`` (the kubeconfig
files exist, ``config.check_access``), so ``render`` and ``diff --offline``
work with a production config on a machine without them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from agent import logs
from agent.config.load import check_access, load_config
from agent.config.types import AGENT_DEFAULTS, Config, LogLevel
from agent.errors import ConfigError

EXIT_FAILED = 1
EXIT_USAGE = 2


def load(
    config_file: str,
    clusters: Sequence[str] = (),
    *,
    access: bool = False,
    management: bool = False,
) -> Config:
    """The config, with ``clusters`` known and, with ``access``, their kubeconfigs present.

    ``clusters`` empty with ``access``: every cluster's kubeconfig is checked; ``management``
    adds ``[agent] management_kubeconfig`` (commands that take Leases).
    """
    try:
        cfg = load_config(config_file)
        for name in clusters:
            cfg.cluster(name)
    except ConfigError as e:
        _config_error(e)
    if access:
        require_access(cfg, clusters, management=management)
    return cfg


def require_access(cfg: Config, clusters: Sequence[str] = (), *, management: bool = False) -> None:
    """Exit 2 naming the key and the file unless the files that reach ``clusters`` (all if empty) exist."""
    try:
        check_access(cfg, clusters or None, management=management)
    except ConfigError as e:
        _config_error(e)


def _config_error(e: ConfigError) -> NoReturn:
    click.echo(f"config error: {e}", err=True)
    sys.exit(EXIT_USAGE)


def configure_logging(
    cfg: Config | None = None,
    *,
    log_format: str | None = None,
    log_level: str | None = None,
    quiet: bool = False,
) -> None:
    """Logs on stderr, each setting from the first source that has it.

    The command's own flag (``run --log-level``), the group's
    (``gitops-agent --log-level debug render ...``), ``quiet`` (warnings only, for
    commands whose stderr shows progress), the config's ``[agent]``, the defaults.
    """
    ctx = click.get_current_context(silent=True)
    given = ctx.find_root().params if ctx is not None else {}
    agent = cfg.agent if cfg is not None else AGENT_DEFAULTS
    fmt = log_format or given.get("log_format") or agent.log_format
    level = log_level or given.get("log_level") or (LogLevel.WARNING if quiet else None) or agent.log_level
    logs.configure(fmt, level)
