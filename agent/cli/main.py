"""The ``gitops-agent`` command line (click).

Commands are thin: they load the config (exit 2 on any config error, before
any cluster is touched), build the stages and print results. Exit codes:
0 success, 1 some cluster or object failed, 2 bad input or configuration.
Standard output holds only a command's product (YAML, a report, a table); the
group sets up logging on stderr for every command (``cli_common``).
"""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from types import ModuleType

import click

from agent import __version__
from agent.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    configure_logging,
    held_prunes,
    load,
    poll_sources,
    resolve_app,
    select_apps,
)
from agent.cli.output import JSON, TABLE, output_option, results_json, to_json
from agent.config.types import LogFormat, LogLevel, choices
from agent.errors import (
    AgentError,
    ChartError,
    ChartProblem,
    ConfigError,
    LocalClusterError,
    RenderError,
    SourceError,
)
from agent.model import HealthState
from agent.report.summary import format_summary

_LOG_FORMATS = click.Choice(choices(LogFormat))
_LOG_LEVELS = click.Choice(choices(LogLevel))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gitops-agent")
@click.option(
    "--log-format", type=_LOG_FORMATS, default=None, help="Logs (on stderr) of any command; default [agent]."
)
@click.option("--log-level", type=_LOG_LEVELS, default=None, help="Of any command; default [agent].")
def main(log_format: str | None, log_level: str | None) -> None:
    """Pull-based GitOps agent: render Git per cluster, diff by field owner, apply with server-side apply."""
    # Before the command runs, so nothing it logs can reach stdout; commands refine the
    # settings from their config (`configure_logging` reads these flags back from the root).
    configure_logging()


# -- run ------------------------------------------------------------------------


@main.command()
@click.option(
    "--config", "config_file", required=True, type=click.Path(dir_okay=False), help="Agent config (TOML)."
)
@click.option(
    "--once",
    is_flag=True,
    help="One pass over every cluster (and the rollouts of apps with wait), then exit "
    "(0 all ok, 1 any failed, any rollout Failed or any prune held by the mass-deletion brake).",
)
@click.option("--dry-run", is_flag=True, help="With --once: every write sent with dryRun=All.")
@click.option("--cluster", "clusters", multiple=True, help="With --once: only these clusters (repeatable).")
@click.option("--log-format", type=_LOG_FORMATS, default=None)
@click.option("--log-level", type=_LOG_LEVELS, default=None)
@output_option("With --once: json, each (cluster, app) as a /status row of that pass.")
def run(
    config_file: str,
    once: bool,
    dry_run: bool,
    clusters: tuple[str, ...],
    log_format: str | None,
    log_level: str | None,
    output: str,
) -> None:
    """Reconcile every configured cluster from Git (forever, or --once)."""
    from agent.kube.connection import install_credential_patch
    from agent.run import heap
    from agent.run.fleet import Fleet
    from agent.run.scheduler import Daemon

    heap.tune()  # before any pass starts a thread (each may get an arena of its own)
    heap.tune_collector()
    install_credential_patch()  # before clusters load their credentials on threads of their own

    if not once and (dry_run or clusters or output != TABLE):
        # The daemon reconciles every configured cluster for real: running it with a flag it
        # would ignore must not write where the user asked for a dry run or a subset.
        flags = (("--dry-run", dry_run), ("--cluster", bool(clusters)), ("-o", output != TABLE))
        given = " and ".join(f for f, on in flags if on)
        raise click.UsageError(f"{given} apply to one pass: add --once (the daemon honours neither)")
    # One pass takes no Lease; the daemon does (from the management cluster).
    cfg = load(config_file, clusters, access=True, management=not once)
    configure_logging(cfg, log_format=log_format, log_level=log_level)
    if not once:
        from agent.source.sources import SourceSet

        # The daemon builds its fleet; the factory builds the sources anew when a config
        # reload changes them.
        try:  # a notification or receiver secret that cannot be read: exit 2 naming its key
            daemon = Daemon(cfg, SourceSet.from_config(cfg), Fleet, source_factory=SourceSet.from_config)
        except ConfigError as e:
            click.echo(f"config error: {e}", err=True)
            sys.exit(EXIT_USAGE)
        daemon.run_forever()
        return
    fleet = Fleet(cfg)
    # Each source once; a failing one fails its own apps (typed: source) and the others proceed.
    chosen = [a for a in cfg.apps if not clusters or a.cluster in clusters]
    revisions = poll_sources(cfg, chosen)
    results = fleet.reconcile_all(revisions, dry_run=dry_run, only=clusters or None)
    if not dry_run:  # apps with `wait`: until their rollouts end (each within its health_timeout)
        results = fleet.health.settle(revisions, results, threading.Event())
    health = fleet.health.latest()
    click.echo(to_json(results_json(results, health)) if output == JSON else format_summary(results, health))
    fleet.close()
    degraded = any(h.state is HealthState.FAILED for h in health.values())
    held = held_prunes(results)
    sys.exit(0 if all(r.ok for r in results) and not degraded and not held else EXIT_FAILED)


# -- render ---------------------------------------------------------------------


@main.command("render")
@click.option("--config", "config_file", required=True, type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_name", required=True, help="Cluster whose desired state to print.")
@click.option("--app", "app_name", default=None, help="App of that cluster (required when it has several).")
@click.option(
    "--revision", default=None, help="Ref or commit of the app's source (default: its configured ref)."
)
@click.option(
    "--path",
    "tree",
    default=None,
    type=click.Path(file_okay=False, exists=True),
    help="Root of a local checkout to render instead of fetching (e.g. a PR's working tree).",
)
@click.option(
    "--show-secrets",
    is_flag=True,
    help="Print the values decrypted from SOPS files (masked as *** unless given).",
)
def render_cmd(
    config_file: str,
    cluster_name: str,
    app_name: str | None,
    revision: str | None,
    tree: str | None,
    show_secrets: bool,
) -> None:
    """Print the rendered YAML stream of one app (deterministic; needs no cluster access, unless
    the app's decryption key is a Secret in its cluster). Charts are rendered for the cluster's
    kubernetes_version, else the pinned release; which one is said on standard error."""
    from contextlib import nullcontext
    from dataclasses import replace

    from agent.plan.masking import mask_decrypted
    from agent.plan.release import render_release
    from agent.reconcile.charts import chart_key, fetch_chart, with_pin
    from agent.reconcile.stages import ClusterStages
    from agent.render.renderer import dump_stream, render, rendered_for
    from agent.source.checkout import reading

    cfg = load(config_file, [cluster_name])
    configure_logging(cfg)
    if revision and tree:
        raise click.UsageError("give --revision or --path, not both")
    (app,) = select_apps(cfg, cluster_name, app_name, command="render", one=True)
    stages = ClusterStages(cfg, cfg.cluster(cluster_name))
    try:
        if tree:
            root, sha = Path(tree).resolve(), ""
            pin = fetch_chart(cfg, app, root)
        else:
            rev = resolve_app(cfg, app, revision)
            root, sha = rev.tree, rev.sha
            pin = rev.chart(*chart_key(app.helm)) if app.helm is not None and app.helm.chart else None
        # No cluster is asked: charts are rendered for the configured or pinned release.
        release = render_release(cfg.cluster(cluster_name))
        spec = replace(stages.spec_for(app), capabilities=None, kube_version=release.kube_version)
        # The chart fetched from its repository, or a chart in Git with its dependencies fetched.
        if app.helm is not None and (app.helm.repository or pin is not None):
            if pin is None or not pin.version or pin.error:
                why = pin.error if pin is not None and pin.error else "it was not fetched"
                problem = ChartProblem.UNREACHABLE if app.helm.repository else ChartProblem.DEPENDENCY
                raise ChartError(problem, why, url=app.helm.repository)
            spec = with_pin(spec, app, pin)
        with reading(root) if sha else nullcontext(root):
            desired = render(root, spec, revision=sha)
        if rendered_for(desired) is not None:
            click.echo(f"{app.name}: {release.describe()}", err=True)
    except RenderError as e:
        click.echo(str(e), err=True)
        sys.exit(EXIT_USAGE)
    except SourceError as e:
        click.echo(f"source error: {e}", err=True)
        sys.exit(EXIT_FAILED)
    except AgentError as e:  # the cluster holding the app's key Secret could not be read
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_FAILED)
    finally:
        stages.close()
    if not show_secrets:
        masked = tuple(replace(o, manifest=mask_decrypted(o.manifest)) for o in desired.objects)
        desired = replace(desired, objects=masked)
    click.echo(dump_stream(desired), nl=False)


# -- prune ----------------------------------------------------------------------


@main.group("prune")
def prune_group() -> None:
    """Operator decisions about deletions the agent refused on its own."""


@prune_group.command("approve")
@click.option("--config", "config_file", required=True, type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_name", required=True)
@click.option("--app", "app_name", default=None, help="App of that cluster (required when it has several).")
@click.option(
    "--digest", required=True, help="The digest the mass-deletion brake reported for the exact prune set."
)
def prune_approve(config_file: str, cluster_name: str, app_name: str | None, digest: str) -> None:
    """Approve one exact prune set that the mass-deletion brake stopped (any change to the set voids it)."""
    from agent.apply.inventory import InventoryStore
    from agent.model import PRUNE_APPROVAL
    from agent.reconcile.reconciler import ClusterReconciler

    cfg = load(config_file, [cluster_name], access=True)
    configure_logging(cfg)
    cluster = cfg.cluster(cluster_name)
    if not digest.isalnum():
        raise click.BadParameter("a digest is hexadecimal, as printed by the refusal", param_hint="--digest")
    (app,) = select_apps(cfg, cluster_name, app_name, command="prune approve", one=True)
    where = (
        f"cluster {cluster_name}" if app.name == cluster_name else f"app {app.name} on cluster {cluster_name}"
    )
    rec = ClusterReconciler(cfg, cluster)
    try:
        store: InventoryStore = rec.store_for(rec.parent_of(app.name))
        inventory = store.load()
        if not inventory.exists:
            click.echo(f"{where} has no inventory yet: nothing to approve", err=True)
            sys.exit(EXIT_FAILED)
        held = inventory.held_digest
        if held and held != digest:
            click.echo(
                f"prune approve: the brake holds prune set {held} for {where}, not {digest}: nothing approved"
                " (did the set change since that digest was printed? read it again from the last pass)",
                err=True,
            )
            sys.exit(EXIT_USAGE)
        store.set_annotation(PRUNE_APPROVAL, digest)
    except AgentError as e:
        click.echo(f"prune approve: {e}", err=True)
        sys.exit(EXIT_FAILED)
    finally:
        rec.close()
    if held:
        click.echo(f"approved prune set {digest} for {where}; the next pass deletes exactly that set")
    else:  # approving ahead, e.g. from a pull request's diff report
        click.echo(
            f"approved prune set {digest} for {where}; no set is held now: a pass deletes it only if its"
            " prune set has exactly this digest"
        )


# -- local control plane --------------------------------------------------------


@main.group("local-cluster")
def local_cluster() -> None:
    """A real local control plane (etcd, kube-apiserver, kube-controller-manager) for tests and demos.

    With simulated Pods (the default of ``start``), kube-scheduler and kwok run beside them.
    """


_state_dir = click.option(
    "--state-dir",
    default="~/.cache/gitops-agent/clusters",
    show_default=True,
    help="Where certificates, data pointers, logs and kubeconfigs live.",
)


def _dev(module: str) -> ModuleType:
    """A development tool (local control planes, the demo), which the container image leaves out."""
    try:
        return importlib.import_module(f"agent.dev.{module}")
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("agent.dev"):
            raise
        click.echo(
            "local-cluster and demo are development tools and are not part of this installation "
            "(the container image leaves agent/dev out): run them from a checkout (scripts/bootstrap)",
            err=True,
        )
        sys.exit(EXIT_USAGE)


@local_cluster.command("start")
@click.option("--name", required=True)
@_state_dir
@click.option(
    "--pods/--no-pods",
    default=None,
    help="Simulated Pods: kube-scheduler and kwok's fake Nodes run them (images tagged :fail fail). "
    "Default: as NAME last ran; a new cluster runs them.",
)
def lc_start(name: str, state_dir: str, pods: bool | None) -> None:
    """Start NAME (a restart if it ran before); prints the admin kubeconfig path last."""
    localcluster = _dev("localcluster")
    state = Path(state_dir).expanduser()
    try:
        if pods is None and not localcluster.ran_before(name, state):
            pods = True
        lc = localcluster.start(name, state, pods=pods)
    except LocalClusterError as e:
        click.echo(f"local-cluster: {e}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(str(lc.kubeconfig))


@local_cluster.command("stop")
@click.option("--name", required=True)
@_state_dir
def lc_stop(name: str, state_dir: str) -> None:
    """Stop NAME (thawing it first if frozen); deletes nothing."""
    localcluster = _dev("localcluster")
    try:
        localcluster.stop(name, Path(state_dir).expanduser())
    except LocalClusterError as e:
        click.echo(f"local-cluster: {e}", err=True)
        sys.exit(EXIT_FAILED)


@local_cluster.command("token")
@click.option("--name", required=True)
@_state_dir
@click.option(
    "--service-account", required=True, help="NAMESPACE/NAME of the ServiceAccount (created if missing)."
)
def lc_token(name: str, state_dir: str, service_account: str) -> None:
    """Print the path of a kubeconfig that authenticates with a (revocable) ServiceAccount token."""
    localcluster = _dev("localcluster")
    if service_account.count("/") != 1:
        raise click.BadParameter("expected NAMESPACE/NAME", param_hint="--service-account")
    try:
        path = localcluster.token(name, Path(state_dir).expanduser(), service_account)
    except LocalClusterError as e:
        click.echo(f"local-cluster: {e}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(str(path))


# -- demo -----------------------------------------------------------------------


@main.command()
@click.option("--state-dir", default="~/.cache/gitops-agent/demo", show_default=True)
@click.option("--keep", is_flag=True, help="Leave the two clusters running afterwards.")
def demo(state_dir: str, keep: bool) -> None:
    """Two local clusters, a sample repo, a reconcile, a new commit, another reconcile."""
    demo_mod = _dev("demo")
    configure_logging(quiet=True)
    try:
        ok = demo_mod.run_demo(Path(state_dir).expanduser(), keep=keep, echo=click.echo)
    except AgentError as e:
        click.echo(f"demo failed: {e}", err=True)
        sys.exit(EXIT_FAILED)
    sys.exit(0 if ok else EXIT_FAILED)


# -- commands defined next to the stage they drive --------------------------------

from agent.cli.completion import completion  # noqa: E402 (registered after `main` exists)
from agent.cli.diff import diff  # noqa: E402
from agent.cli.events import events  # noqa: E402
from agent.cli.helmtest import helm_test  # noqa: E402
from agent.cli.history import history, rollback  # noqa: E402
from agent.cli.importer import import_command  # noqa: E402
from agent.cli.ops import resume, status, suspend, sync  # noqa: E402
from agent.cli.takeover import takeover  # noqa: E402
from agent.cli.tree import tree  # noqa: E402
from agent.cli.wait import wait  # noqa: E402

for _command in (
    diff,
    takeover,
    suspend,
    resume,
    sync,
    status,
    completion,
    history,
    rollback,
    events,
    tree,
    wait,
    import_command,
    helm_test,
):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
