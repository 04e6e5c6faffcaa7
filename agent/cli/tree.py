"""``gitops-agent tree``: an app's objects with their owners' children and each one's health.

The objects are the app's inventory (its ApplySet parent's members, ``apply.inventory``), read
from its cluster with their children by ``ownerReferences`` (``reconcile.tree_read``) and
assessed as a wait assesses them (``report.tree``), like ``kubectl tree`` or
``argocd app resources``. It reads only; the app need not wait for its rollout.

Exit codes: 0 listed, 1 the cluster or some kind could not be read (what could be is still
listed, the rest named), 2 bad input or configuration.
"""

from __future__ import annotations

import sys

import click

from agent.cli.common import EXIT_FAILED, app_label, configure_logging, load, select_apps
from agent.cli.output import JSON, output_option, table, to_json
from agent.errors import AgentError


@click.command("tree")
@click.option(
    "--config", "config_file", required=True, type=click.Path(dir_okay=False), help="Agent config (TOML)."
)
@click.option("--cluster", "cluster_name", required=True, help="Cluster name from the config.")
@click.option("--app", "app_name", default=None, help="App of that cluster (required when it has several).")
@output_option("json: {cluster, app, inventory, objects: [{kind, ..., health, children}]}.")
def tree(config_file: str, cluster_name: str, app_name: str | None, output: str) -> None:
    """An app's objects, their children (ReplicaSets, Pods, Jobs) and each one's health."""
    from agent.apply.inventory import InventoryStore, parent_name
    from agent.kube.client import KubeClient
    from agent.reconcile import tree_read
    from agent.report.tree import build, format_tree

    cfg = load(config_file, [cluster_name], access=True)
    configure_logging(cfg)
    (app,) = select_apps(cfg, cluster_name, app_name, command="tree", one=True)
    cluster = cfg.cluster(cluster_name)
    name = parent_name(cfg.agent.name, app.name, implicit=app.implicit)
    client = KubeClient.from_config(cluster)
    try:
        store = InventoryStore(
            client, name=name, namespace=cfg.agent.namespace, field_manager=cfg.field_manager(cluster)
        )
        inventory = store.load()
        reading = tree_read.read(client, inventory)
    except AgentError as e:
        click.echo(f"tree: {app_label(cluster_name, app)}: {e}", err=True)
        sys.exit(EXIT_FAILED)
    finally:
        client.close()
    if not inventory.exists:
        click.echo(
            f"tree: {app_label(cluster_name, app)}: no inventory yet (the agent never applied it)", err=True
        )
    nodes = build(reading.members, reading.unread, reading.children, checks=app.health_checks)
    for where, why in sorted(reading.children_unread.items()):
        click.echo(f"tree: children {where} not read: {why}", err=True)
    if output == JSON:
        doc = {
            "cluster": cluster_name,
            "app": app.name,
            "inventory": f"{cfg.agent.namespace}/{name}",
            "objects": [n.to_json() for n in nodes],
        }
        click.echo(to_json(doc))
    else:
        click.echo("\n".join(table(format_tree(nodes))))
    if reading.unread or reading.children_unread:
        sys.exit(EXIT_FAILED)
