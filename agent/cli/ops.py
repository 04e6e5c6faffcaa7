"""Operator commands: ``suspend``, ``resume``, ``sync`` and ``status`` (click).

Registered on ``gitops-agent`` by ``agent.cli``. ``suspend``/``resume`` write
the ``gitops-agent.io/suspended`` annotation on the cluster's ApplySet parent
(in that cluster), so the state survives agent restarts and replica
changes: every pass reads it first and, while it is set, changes nothing
there. ``sync`` asks the running agent (``POST /sync?cluster=NAME`` on
``[agent] listen``; ``--force-window``: ``&force_window=true``, one pass through a closed change
window) for a pass now; when no agent answers there it runs one
pass itself (taking the cluster's Lease first when Leases are configured).
``status`` prints the per-cluster table of the running agent's ``/status``. ``sync``, ``resume``
and ``status`` send ``[agent] ui_token_file``'s token, which the agent asks for (``/sync``
always, ``/status`` when one is configured).
Only what reaches a cluster from this process needs its kubeconfig to exist
(``cli_common.require_access``): ``status`` and a ``sync`` the agent takes
work from a machine without them.
Exit codes as ``cli``: 0 ok, 1 failed, 2 bad input or configuration.
"""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import click

from agent.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    app_label,
    configure_logging,
    held_prunes,
    load,
    poll_sources,
    require_access,
    select_apps,
)
from agent.cli.output import JSON, TABLE, output_option, results_json, to_json
from agent.config.types import AppConfig, ClusterConfig, Config
from agent.errors import AgentError, ApiError, ConfigError

_config = click.option(
    "--config", "config_file", required=True, type=click.Path(dir_okay=False), help="Agent config (TOML)."
)
_cluster = click.option("--cluster", "cluster_name", required=True, help="Cluster name from the config.")
_app = click.option(
    "--app", "app_name", default=None, help="App of that cluster (default: its only app, or every app)."
)


def agent_url(cfg: Config) -> str:
    """Where the running agent listens; a wildcard bind is reached on loopback."""
    if not cfg.agent.listen:
        return ""
    host, _, port = cfg.agent.listen.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def agent_token(cfg: Config) -> str:
    """The token ``/sync`` and ``/status`` ask for (``[agent] ui_token_file``); "" when this
    machine cannot read it (the agent then refuses, and the command says what to do)."""
    from agent.run.statuspage import ui_token

    try:
        return ui_token(cfg.agent)
    except ConfigError:
        return ""


def _call(url: str, method: str = "GET", timeout: float = 10.0, token: str = "") -> tuple[int, Any]:
    """(status, decoded JSON) from the agent; raises ``OSError`` when nothing answers."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"error": body.decode(errors="replace")}


# -- suspend / resume -------------------------------------------------------------


def set_suspended(cfg: Config, cluster: ClusterConfig, suspended: bool, app: AppConfig | None = None) -> str:
    """Write (or remove) the annotation on ``app``'s ApplySet parent (default: the cluster entry's
    own app); returns what happened."""
    from agent.apply.inventory import InventoryStore, parent_name
    from agent.kube.client import KubeClient
    from agent.model import SUSPENDED

    client = KubeClient.from_config(cluster)
    try:
        implicit = app is None or app.implicit
        store = InventoryStore(
            client,
            name=parent_name(cfg.agent.name, app.name if app else cluster.name, implicit=implicit),
            namespace=cfg.agent.namespace,
            field_manager=cfg.field_manager(cluster),
            agent=cfg.agent.name,
        )
        try:
            store.set_annotation(SUSPENDED, "true" if suspended else None)
        except ApiError as e:
            if e.status != 404:
                raise
            if not suspended:
                return "not suspended (the agent never wrote to this app's inventory)"
            # No parent yet: create it empty, with the annotation, before any agent applies anything.
            store.ensure_namespace()
            store.write([], extra_annotations={SUSPENDED: "true"})
        return "suspended" if suspended else "resumed"
    finally:
        client.close()


def _several(command: str, cluster_name: str, apps: tuple[AppConfig, ...], app_name: str | None) -> None:
    """Say on stderr that no --app on a cluster of several apps means every one of them."""
    if app_name is None and len(apps) > 1:
        names = ", ".join(a.name for a in apps)
        click.echo(f"{command}: no --app given: acting on every app of {cluster_name} ({names})", err=True)


def _suspend_or_resume(config_file: str, cluster_name: str, app_name: str | None, suspended: bool) -> None:
    cfg = load(config_file, [cluster_name], access=True)
    configure_logging(cfg)
    command = "suspend" if suspended else "resume"
    apps = select_apps(cfg, cluster_name, app_name, command=command)
    _several(command, cluster_name, apps, app_name)
    cluster = cfg.cluster(cluster_name)
    failed = False
    for app in apps:
        where = app_label(cluster_name, app)
        try:
            said = set_suspended(cfg, cluster, suspended, app)
        except AgentError as e:
            click.echo(f"{where}: {e}", err=True)
            failed = True
            continue
        click.echo(f"{where}: {said}")
    url = agent_url(cfg)
    if url and not suspended and not failed:
        # The running agent picks the change up at its next pass; ask for that pass now.
        with contextlib.suppress(OSError):
            _call(f"{url}/sync?{_query(cluster_name, app_name)}", "POST", timeout=3.0, token=agent_token(cfg))
    if failed:
        sys.exit(EXIT_FAILED)


def _query(cluster_name: str, app_name: str | None) -> str:
    query = {"cluster": cluster_name, **({"app": app_name} if app_name else {})}
    return urllib.parse.urlencode(query)


@click.command("suspend")
@_config
@_cluster
@_app
def suspend(config_file: str, cluster_name: str, app_name: str | None) -> None:
    """Stop changing anything in an app (or every app of a cluster) until `resume`; survives restarts."""
    _suspend_or_resume(config_file, cluster_name, app_name, True)


@click.command("resume")
@_config
@_cluster
@_app
def resume(config_file: str, cluster_name: str, app_name: str | None) -> None:
    """Undo `suspend` and ask the running agent for a pass now."""
    _suspend_or_resume(config_file, cluster_name, app_name, False)


# -- sync -------------------------------------------------------------------------


@click.command("sync")
@_config
@_cluster
@_app
@click.option("--local", is_flag=True, help="Do not ask a running agent: run the pass in this process.")
@click.option(
    "--force-window",
    is_flag=True,
    help="Write in this one pass although a change window ([[windows]]) is closed (recorded in its result).",
)
@output_option("json: the agent's answer, or (a pass here) {results: [...]} as run --once -o json.")
def sync(
    config_file: str, cluster_name: str, app_name: str | None, local: bool, force_window: bool, output: str
) -> None:
    """Reconcile an app (or every app of a cluster) now: via the running agent, or one pass here."""
    cfg = load(config_file, [cluster_name])
    configure_logging(cfg)
    apps = select_apps(cfg, cluster_name, app_name, command="sync")
    _several("sync", cluster_name, apps, app_name)
    url = agent_url(cfg)
    if url and not local:
        query = _query(cluster_name, app_name) + ("&force_window=true" if force_window else "")
        try:
            code, body = _call(f"{url}/sync?{query}", "POST", token=agent_token(cfg))
        except OSError:
            click.echo(f"no agent answers at {url}; running one pass here", err=True)
        else:
            if code == 202:
                once = "; it overrides a closed change window once" if force_window else ""
                when = body["next_run"]
                said = f"{cluster_name}: pass requested from the running agent (next run {when}){once}"
                click.echo(to_json({"cluster": cluster_name, **body}) if output == JSON else said)
                return
            click.echo(f"{cluster_name}: agent at {url} refused: {body.get('error', body)}", err=True)
            if code in (401, 403):
                click.echo(
                    "the agent's /sync needs the token of [agent] ui_token_file; "
                    "`gitops-agent sync --local` runs the pass here instead",
                    err=True,
                )
            sys.exit(EXIT_FAILED)
    # The running agent reaches the cluster with its own files; a pass here needs them (and the
    # management cluster's, for the Lease).
    require_access(cfg, [cluster_name], management=True)
    sys.exit(_one_pass(cfg, cluster_name, apps, output, force_window=force_window))


def _one_pass(
    cfg: Config,
    cluster_name: str,
    apps: tuple[AppConfig, ...],
    output: str = TABLE,
    *,
    force_window: bool = False,
) -> int:
    from agent.report.summary import format_summary
    from agent.run.fleet import Fleet
    from agent.run.lease import LeaseManager, acquire_once
    from agent.run.lease_settings import lease_settings, management_client

    lm: LeaseManager | None = None
    # The gate reads ``lm`` at each write: the Lease is taken below, before any pass.
    fleet = Fleet(cfg, fence=lambda name: lm.may_write(name) if lm else None)
    try:
        settings = lease_settings(cfg)
        if settings.enabled:  # never a second writer next to a replica that holds the cluster
            lm = acquire_once(
                management_client(settings), settings, agent=cfg.agent.name, cluster=cluster_name
            )
        revisions = poll_sources(cfg, apps)
        if force_window:
            fleet.force_window(cluster_name, [a.name for a in apps])
        results = fleet.run_apps(cluster_name, revisions, apps=[a.name for a in apps])
    except AgentError as e:
        click.echo(f"{cluster_name}: {e}", err=True)
        return EXIT_FAILED
    finally:
        if lm is not None:
            lm.stop(release=True)
        fleet.close()
    click.echo(to_json(results_json(results)) if output == JSON else format_summary(results))
    held = held_prunes(results)
    return 0 if all(r.ok for r in results) and not held else EXIT_FAILED


# -- status -----------------------------------------------------------------------


def format_status(doc: dict[str, Any]) -> str:
    """The table of ``/status``: one row per (cluster, app); the APP column once an app is not a
    cluster entry's own (named after the entry)."""
    entries = doc.get("clusters", [])
    apps = any(c.get("app", c["cluster"]) != c["cluster"] for c in entries)
    healths = any(c.get("health") for c in entries)
    head = ("CLUSTER", *(("APP",) if apps else ()), "STATE", *(("HEALTH",) if healths else ()))
    head = (*head, "REVISION", "LAST SUCCESS", "FAILURES")
    head = (*head, "NEXT RUN", "HOLDER")
    rows = [head]
    errors = []
    for c in entries:
        where = c["cluster"] if c.get("app", c["cluster"]) == c["cluster"] else f"{c['cluster']}/{c['app']}"
        rows.append(
            (
                c["cluster"],
                *((c.get("app", c["cluster"]),) if apps else ()),
                c.get("state", ""),
                *(((c.get("health") or {}).get("state") or "-",) if healths else ()),
                (c.get("revision") or "-")[:12],
                (c.get("last_success_at") or "-")[:19],
                str(c.get("consecutive_failures", 0)),
                (c.get("next_run") or "-")[:19],
                c.get("holder") or "-",
            )
        )
        if c.get("error"):
            errors.append(f"  {where}: {c['error'].splitlines()[0]}")
        elif c.get("prune_refused"):
            errors.append(f"  {where}: prune refused: {c['prune_refused'].splitlines()[0]}")
        elif c.get("waiting_on"):
            errors.append(f"  {where}: waiting on {', '.join(c['waiting_on'])}")
        if pin := c.get("pin"):
            bad = (pin.get("bad") or "?")[:12]
            errors.append(f"  {where}: rolled back: pinned to {pin['revision'][:12]} (from {bad})")
        for conflict in c.get("conflicts") or []:
            errors.append(f"  {where}: conflict: {conflict}")
        for y in c.get("yields") or []:  # as `run --once` lists them: never a silent yield
            via = y.get("subresource") or y.get("operation")
            errors.append(f"  {where}: {y['object']}: yielded: {y['path']} kept by {y['manager']} ({via})")
        for d in c.get("drift") or []:  # drift = "report": who changed what, when
            what = d["path"] or "deleted"
            who = f" by {d['manager']} ({d['operation']}) at {d['time']}" if d.get("manager") else ""
            errors.append(f"  {where}: {d['object']}: drift {d['fate']}: {what}{who}")
        health = c.get("health") or {}
        if health and health.get("state") != "Current":
            blocker = f"; {health['blocker']}" if health.get("blocker") else ""
            errors.append(f"  {where}: health {health['state']}: {health.get('message', '')}{blocker}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    rev = (doc.get("revision") or "none")[:12]
    top = f"agent {doc.get('agent', '')} at revision {rev}"
    if doc.get("replica"):
        top += f" (replica {doc['replica']})"
    for key in ("source_error", "config_error"):
        if doc.get(key):
            top += f"\n{key.replace('_', ' ')}: {doc[key]}"
    return "\n".join([top, *lines, *errors])


@click.command("status")
@_config
@click.option(
    "-o",
    "--output",
    type=click.Choice(("table", "json")),
    default="table",
    show_default=True,
    help="json: the raw /status document.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as -o json (kept for scripts).")
def status(config_file: str, output: str, as_json: bool) -> None:
    """Per-cluster state of the running agent (its /status endpoint)."""
    cfg = load(config_file)  # only asks the running agent: no cluster access needed
    configure_logging(cfg)
    url = agent_url(cfg)
    if not url:
        click.echo("config error: [agent] listen is empty; the agent serves no status", err=True)
        sys.exit(EXIT_USAGE)
    try:
        code, doc = _call(f"{url}/status", token=agent_token(cfg))
    except OSError as e:
        click.echo(f"no agent answers at {url}: {e}", err=True)
        sys.exit(EXIT_FAILED)
    if code != 200:
        click.echo(f"agent at {url} answered HTTP {code}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(json.dumps(doc, indent=2) if as_json or output == "json" else format_status(doc))
