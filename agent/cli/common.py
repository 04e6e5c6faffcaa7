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
from agent.config.tomlreader import parse_duration
from agent.config.types import AGENT_DEFAULTS, AppConfig, Config, LogLevel
from agent.errors import ConfigError
from agent.model import ClusterResult, PruneReason, Revision

EXIT_FAILED = 1
EXIT_USAGE = 2


def held_prunes(results: Sequence[ClusterResult]) -> bool:
    """Whether the mass-deletion brake held any app's deletions: each is named on stderr with the
    exact ``prune approve`` command (its message), and the command exits 1, not 0."""
    held = [r for r in results if r.prune_refusal is not None and r.prune_refusal.reason is PruneReason.BRAKE]
    for r in held:
        assert r.prune_refusal is not None
        click.echo(f"{r.cluster}/{r.app or r.cluster}: {r.prune_refusal.message}", err=True)
    return bool(held)


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


def select_apps(
    cfg: Config, cluster: str, app: str | None, *, command: str, one: bool = False
) -> tuple[AppConfig, ...]:
    """The apps ``--cluster C [--app A]`` names; exit 2 before anything is touched when it names none.

    Without ``--app``, a cluster with one app means that app (every config before apps); with
    several, commands that act on each in turn (``one=False``: suspend, resume, sync) get them
    all, and those that must not guess (``one=True``: prune approve, takeover, render) refuse.
    """
    apps = cfg.apps_of(cfg.cluster(cluster).name)
    names = ", ".join(a.name for a in apps) or "none"
    if app is not None:
        chosen = tuple(a for a in apps if a.name == app)
        if not chosen:
            _usage(f"{command}: --app: cluster {cluster!r} has no app named {app!r} (its apps: {names})")
        return chosen
    if one and len(apps) > 1:
        _usage(f"{command}: cluster {cluster!r} has several apps ({names}): name one with --app")
    return apps


def app_label(cluster: str, app: AppConfig) -> str:
    """How output names one app: the cluster alone for its own app, else ``cluster/app``."""
    return cluster if app.name == cluster else f"{cluster}/{app.name}"


def positive_duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """A click callback: ``value`` ("30s", "5m") in seconds, more than 0."""
    try:
        seconds = parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    if seconds <= 0:
        raise click.BadParameter(f"must be more than 0, got {value!r}")
    return seconds


def _usage(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(EXIT_USAGE)


def poll_sources(cfg: Config, apps: Sequence[AppConfig] | None = None) -> dict[str, Revision]:
    """Each source ``apps`` use (all used ones when None) polled once: name → its revision.

    A failing source is said on stderr and left out: its apps then fail with a typed source
    failure in the pass, while the others proceed.
    """
    from agent.reconcile.charts import ChartPolls
    from agent.source.sources import SourceSet

    names = None if apps is None else list(dict.fromkeys(a.source for a in apps))
    polled = SourceSet.from_config(cfg).poll(names)
    for name, error in polled.errors.items():
        click.echo(f"source error: source {name!r}: {error}", err=True)
    charts = ChartPolls(cfg)  # each app's repository chart, pinned as the daemon's poll pins it
    return {name: charts.attach(name, revision) for name, revision in polled.revisions.items()}


def resolve_app(cfg: Config, app: AppConfig, revision: str | None) -> Revision:
    """``app``'s source at ``--revision`` (a ref or commit of that source), or its configured ref
    now. Raises ``SourceError``."""
    from agent.reconcile.charts import ChartPolls
    from agent.source.sources import SourceSet

    sources = SourceSet.from_config(cfg)
    found = sources.resolve(app.source, revision) if revision else sources.source(app.source).poll()
    return ChartPolls(cfg).attach(app.source, found)
