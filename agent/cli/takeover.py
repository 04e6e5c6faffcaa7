"""``gitops-agent takeover``: move Git-declared fields from leftover field managers to ours.

A click command (registered by ``agent/cli/main.py`` with
``main.add_command(takeover)``). Dry run by default: it prints, per object,
which Git-declared paths would move from which manager and why that manager
counts as a leftover; ``--apply`` does it (``agent.reconcile.takeover``). Exit codes as
the rest of the CLI: 0 ok, 1 a cluster or object failed, 2 bad input.
"""

from __future__ import annotations

import sys

import click

from agent.cli.common import EXIT_FAILED, configure_logging, load, resolve_app, select_apps
from agent.errors import AgentError
from agent.model import Outcome


@click.command("takeover")
@click.option(
    "--config", "config_file", required=True, type=click.Path(dir_okay=False), help="Agent config (TOML)."
)
@click.option("--cluster", "cluster_name", required=True, help="The cluster to clean up.")
@click.option("--app", "app_name", default=None, help="App of that cluster (required when it has several).")
@click.option(
    "--manager",
    "managers",
    multiple=True,
    help="Take over from this manager (glob, repeatable) instead of the detected leftovers.",
)
@click.option("--apply", "do_apply", is_flag=True, help="Do it (default: only show what would move).")
def takeover(
    config_file: str, cluster_name: str, app_name: str | None, managers: tuple[str, ...], do_apply: bool
) -> None:
    """Show (or with --apply do) the hand-over of Git-declared fields from leftover managers to ours."""
    from agent.reconcile.reconciler import ClusterReconciler
    from agent.reconcile.takeover import describe, run_takeover

    cfg = load(config_file, [cluster_name], access=True)
    configure_logging(cfg)
    cluster = cfg.cluster(cluster_name)
    (app,) = select_apps(cfg, cluster_name, app_name, command="takeover", one=True)
    reconciler = ClusterReconciler(cfg, cluster)
    try:
        revision = resolve_app(cfg, app, None)
        plan, results = run_takeover(reconciler, revision, managers, apply=do_apply, app=app)
    except AgentError as e:
        click.echo(f"takeover failed: {e}", err=True)
        sys.exit(EXIT_FAILED)
    finally:
        reconciler.close()
    click.echo("\n".join(describe(plan, applied=do_apply)))
    for r in results:
        click.echo(f"{r.outcome.value:<10} {r.key}: {r.message}")
    sys.exit(EXIT_FAILED if any(r.outcome is Outcome.FAILED for r in results) else 0)
