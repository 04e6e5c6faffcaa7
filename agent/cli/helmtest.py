"""``gitops-agent test``: run an app's Helm ``test`` hooks and say how each went.

A click command (registered by ``agent/cli/main.py``). It renders the app's revision (its
source's ref now, or ``--revision``) with its charts' tests, creates each ``test`` hook alone as
``helm test`` does, waits for it (``--timeout`` each) and prints a line per test
(``passed  Pod/shop/web-check: Succeeded``). A sync never runs them (``agent.reconcile.helm_tests``).
Exit codes as the rest of the CLI: 0 every test passed (or the app has none), 1 a test failed
or could not run, 2 bad input.
"""

from __future__ import annotations

import sys

import click

from agent.cli.common import (
    EXIT_FAILED,
    configure_logging,
    load,
    positive_duration,
    resolve_app,
    select_apps,
)
from agent.cli.output import JSON, output_option, to_json
from agent.errors import AgentError


@click.command("test")
@click.option(
    "--config", "config_file", required=True, type=click.Path(dir_okay=False), help="Agent config (TOML)."
)
@click.option("--cluster", "cluster_name", required=True, help="The cluster the app is installed on.")
@click.option("--app", "app_name", default=None, help="App of that cluster (required when it has several).")
@click.option("--revision", default=None, help="A ref or commit of the app's source (default: its ref now).")
@click.option(
    "--timeout",
    default="5m",
    callback=positive_duration,
    help="How long each test may run (Helm's default: 5m).",
)
@output_option()
def helm_test(
    config_file: str,
    cluster_name: str,
    app_name: str | None,
    revision: str | None,
    timeout: float,
    output: str,
) -> None:
    """Run the app's Helm test hooks (helm.sh/hook: test) on its cluster, as helm test does."""
    from agent.reconcile.helm_tests import run_tests
    from agent.reconcile.stages import ClusterStages

    cfg = load(config_file, [cluster_name], access=True)
    configure_logging(cfg)
    (app,) = select_apps(cfg, cluster_name, app_name, command="test", one=True)
    stages = ClusterStages(cfg, cfg.cluster(cluster_name))
    try:
        run = run_tests(stages, app, resolve_app(cfg, app, revision), timeout=timeout)
    except AgentError as e:
        click.echo(f"test failed: {e}", err=True)
        sys.exit(EXIT_FAILED)
    finally:
        stages.close()
    if output == JSON:
        click.echo(
            to_json(
                {
                    "app": run.app,
                    "revision": run.revision,
                    "ok": run.ok,
                    "error": run.error or None,
                    "tests": [
                        {"object": str(r.key), "result": r.outcome.value, "message": r.message}
                        for r in run.results
                    ],
                }
            )
        )
    else:
        for r in run.results:
            click.echo(f"{r.outcome.value:<7} {r.key}: {r.message}")
        if run.error:
            click.echo(f"test failed: {run.error}", err=True)
        elif not run.results:
            click.echo(f"{app.name}: no test hooks at {run.revision[:12]}")
    sys.exit(0 if run.ok else EXIT_FAILED)
