"""``gitops-agent events``: an app's Kubernetes Events and recent passes, newest first.

The Events are those the agent writes on each app's ApplySet parent (``report.events``: objects
that failed, were pruned or could not be read, a wait's end), read from the app's cluster; the
passes are the status page's records (``run.record_store``: files under ``<cache_dir>/status/``,
or ConfigMaps in the management cluster when Leases are on), which also keep Events the cluster
has expired. Without ``--app``, every app of the cluster. ``agent.ui.timeline`` merges them.

Exit codes: 0 listed, 1 something could not be read (what could be is still listed, the rest
named on standard error), 2 bad input or configuration.
"""

from __future__ import annotations

import sys

import click

from agent.cli.common import EXIT_FAILED, configure_logging, load, select_apps
from agent.cli.output import JSON, output_option, table, to_json
from agent.config.types import AppConfig, Config
from agent.errors import AgentError, ConfigError
from agent.ui.records import AppRecord
from agent.ui.timeline import Entry, stamp, timeline


def records_of(cfg: Config, cluster: str, apps: tuple[AppConfig, ...]) -> dict[str, AppRecord | None]:
    """Each app's record where the running agent keeps it (``record_store.opened``).

    Raises ``AgentError`` (the management cluster) or ``ConfigError`` (its settings)."""
    from agent.run import record_store

    with record_store.opened(cfg) as store:
        return {a.name: store.load(cluster, a.name) for a in apps}


def events_of(cfg: Config, cluster: str, apps: tuple[AppConfig, ...]) -> dict[str, list[dict[str, object]]]:
    """The Events on each app's ApplySet parent in its cluster. Raises ``AgentError``."""
    from agent.apply.inventory import parent_name
    from agent.kube.client import KubeClient
    from agent.report.events import events_for

    client = KubeClient.from_config(cfg.cluster(cluster))
    try:
        return {
            a.name: list(
                events_for(
                    client, cfg.agent.namespace, parent_name(cfg.agent.name, a.name, implicit=a.implicit)
                )
            )
            for a in apps
        }
    finally:
        client.close()


def format_events(entries: list[Entry]) -> str:
    rows = [("LAST SEEN", "APP", "KIND", "TYPE", "REASON", "REVISION", "MESSAGE")]
    for e in entries:
        count = f" (x{e.count})" if e.count > 1 else ""
        rows.append(
            (stamp(e.at) or "-", e.app, e.kind.value, e.type, e.reason, e.revision or "-", e.message + count)
        )
    return "\n".join(table(rows))


@click.command("events")
@click.option(
    "--config", "config_file", required=True, type=click.Path(dir_okay=False), help="Agent config (TOML)."
)
@click.option("--cluster", "cluster_name", required=True, help="Cluster name from the config.")
@click.option("--app", "app_name", default=None, help="App of that cluster (default: every app).")
@output_option("json: {cluster, apps, events: [...]}, newest first.")
def events(config_file: str, cluster_name: str, app_name: str | None, output: str) -> None:
    """The agent's Events on an app (or every app of a cluster) and its recent passes, newest first."""
    cfg = load(config_file, [cluster_name], access=True)
    configure_logging(cfg)
    apps = select_apps(cfg, cluster_name, app_name, command="events")
    failed = False
    found: dict[str, list[dict[str, object]]] = {}
    records: dict[str, AppRecord | None] = {}
    try:
        found = events_of(cfg, cluster_name, apps)
    except AgentError as e:
        click.echo(f"events: Events of {cluster_name} not read: {e}", err=True)
        failed = True
    try:
        records = records_of(cfg, cluster_name, apps)
    except (AgentError, ConfigError) as e:
        click.echo(f"events: pass records not read: {e}", err=True)
        failed = True
    if records and all(r is None for r in records.values()):
        click.echo(
            "events: no pass records for these apps (the running agent keeps them in its cache_dir, "
            "or in the management cluster with Leases)",
            err=True,
        )
    entries = timeline(found, records)
    if output == JSON:
        doc = {
            "cluster": cluster_name,
            "apps": [a.name for a in apps],
            "events": [e.to_json() for e in entries],
        }
        click.echo(to_json(doc))
    else:
        click.echo(format_events(entries))
    if failed:
        sys.exit(EXIT_FAILED)
