"""``history`` and ``rollback``: an app's recent passes, and pinning it to an earlier commit (click).

``history`` reads the records the status page keeps (``run.record_store``: the management
cluster's ConfigMaps with Leases, else ``<cache_dir>/status/``), as the running agent does,
so it works from any machine with the agent's config: each pass's time, revision, trigger,
chart version, state and counts, newest first.

``rollback`` pins one app of one cluster to an earlier commit: the revision before the current
one in its history, or ``--to``. The commit comes from the source's cache alone (a kept
checkout, or the cached repository; ``source.pinned``), so it works with the Git server down.
It prints the live diff of that commit first (``report.diff``, the pass's own pipeline) and
writes the pin only with ``--yes``: annotations on the app's ApplySet parent naming the pinned
commit and the bad one (``gitops-agent.io/rollback-to``, ``rollback-from``). Every pass then
renders the pinned commit for that app, until its source delivers a commit other than both
(the pass clears the pin and says so) or ``rollback --clear``. The other apps follow their
sources throughout. Exit codes as ``cli``: 0 ok, 1 failed, 2 bad input.
"""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import UTC, datetime
from typing import Any, NoReturn

import click

from agent.cli.common import EXIT_FAILED, EXIT_USAGE, configure_logging, load, select_apps
from agent.cli.ops import _app, _call, _cluster, _config, _query, agent_token, agent_url
from agent.config.types import AppConfig, ClusterConfig, Config
from agent.errors import AgentError, ApiError
from agent.model import ROLLBACK_AT, ROLLBACK_FROM, ROLLBACK_TO, Pin

__all__ = ["history", "rollback"]


def _usage(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(EXIT_USAGE)


def _records(cfg: Config, cluster: str, app: str) -> Any:
    """The app's status record (``ui.records.AppRecord``), or None when none was kept."""
    from agent.run import record_store

    with record_store.opened(cfg) as store:
        return store.load(cluster, app)


# -- history ------------------------------------------------------------------------


def history_rows(record: Any) -> list[dict[str, Any]]:
    """The record's passes, newest first, as ``-o json`` prints them."""
    rows = []
    for h in reversed(record.history if record else ()):
        rows.append(
            {
                "at": h.at,
                "revision": h.revision,
                "subject": h.subject,
                "trigger": h.trigger,
                "chart": h.chart,
                "state": h.state,
                "seconds": h.seconds,
                "applied": h.applied,
                "pruned": h.pruned,
                "failed": h.failed,
                "rolled_back_from": h.pinned_from,
                "message": h.error or h.refused or h.note,
            }
        )
    return rows


def format_history(cluster: str, app: str, rows: list[dict[str, Any]], pin: tuple[str, str]) -> str:
    head = ("WHEN", "REVISION", "TRIGGER", "CHART", "STATE", "APPLIED", "PRUNED", "FAILED", "MESSAGE")
    table = [head]
    for r in rows:
        rev = r["revision"][:12] + (" (rollback)" if r["rolled_back_from"] else "")
        table.append(
            (
                r["at"][:19],
                rev or "-",
                r["trigger"] or "-",
                r["chart"] or "-",
                r["state"],
                str(r["applied"]),
                str(r["pruned"]),
                str(r["failed"]),
                (r["message"] or "").split("\n")[0][:100],
            )
        )
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)).rstrip() for t in table]
    top = f"app {app} on cluster {cluster}: {len(rows)} pass(es) recorded"
    if pin[0]:
        top += f"; rolled back: pinned to {pin[0][:12]} (from {pin[1][:12] or '?'})"
    return "\n".join([top, *lines])


@click.command("history")
@_config
@_cluster
@_app
@click.option("-o", "--output", type=click.Choice(("table", "json")), default="table", show_default=True)
def history(config_file: str, cluster_name: str, app_name: str | None, output: str) -> None:
    """An app's recent passes (newest first): revision, trigger, chart version, state, counts."""
    cfg = load(config_file, [cluster_name])
    configure_logging(cfg)
    app = select_apps(cfg, cluster_name, app_name, command="history", one=True)[0]
    try:
        record = _records(cfg, cluster_name, app.name)
    except AgentError as e:
        click.echo(f"history: the status records cannot be read: {e}", err=True)
        sys.exit(EXIT_FAILED)
    rows = history_rows(record)
    pin = (record.pin_revision, record.pin_bad) if record else ("", "")
    if output == "json":
        doc = {"cluster": cluster_name, "app": app.name, "pin": _pin_json(*pin), "passes": rows}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(format_history(cluster_name, app.name, rows, pin))


def _pin_json(revision: str, bad: str) -> dict[str, str] | None:
    return {"revision": revision, "bad": bad} if revision else None


# -- rollback -----------------------------------------------------------------------


def _parent(cfg: Config, cluster: ClusterConfig, app: AppConfig) -> Any:
    from agent.apply.inventory import InventoryStore, parent_name
    from agent.kube.client import KubeClient

    return InventoryStore(
        KubeClient.from_config(cluster),
        name=parent_name(cfg.agent.name, app.name, implicit=app.implicit),
        namespace=cfg.agent.namespace,
        field_manager=cfg.field_manager(cluster),
        agent=cfg.agent.name,
    )


def default_target(record: Any, avoid: set[str]) -> str:
    """The revision before the current one: the newest recorded pass that succeeded at a revision
    other than ``avoid`` (the bad and the pinned ones); "" when the history has none."""
    for h in reversed(record.history if record else ()):
        if h.revision and h.revision not in avoid and h.state == "ok":
            return str(h.revision)
    return ""


def _ask_for_pass(cfg: Config, cluster: str, app: str) -> None:
    """The running agent picks the pin up at the app's next pass; ask for that pass now."""
    if url := agent_url(cfg):
        with contextlib.suppress(OSError):
            _call(f"{url}/sync?{_query(cluster, app)}", "POST", timeout=3.0, token=agent_token(cfg))


@click.command("rollback")
@_config
@_cluster
@_app
@click.option("--to", "to", default=None, help="Commit SHA to pin (default: the one before the current).")
@click.option("--yes", is_flag=True, help="Pin it (without: print the diff only).")
@click.option("--clear", is_flag=True, help="Remove the pin: the app follows its source again.")
def rollback(
    config_file: str, cluster_name: str, app_name: str | None, to: str | None, yes: bool, clear: bool
) -> None:
    """Pin an app to an earlier commit (from the source's cache: works with Git down), diff first."""
    cfg = load(config_file, [cluster_name], access=True)
    configure_logging(cfg)
    app = select_apps(cfg, cluster_name, app_name, command="rollback", one=True)[0]
    if clear and to:
        _usage("rollback: --clear and --to exclude each other")
    cluster = cfg.cluster(cluster_name)
    where = f"app {app.name} on cluster {cluster_name}"
    store = _parent(cfg, cluster, app)
    try:
        sys.exit(
            _clear(cfg, store, where, cluster_name, app) if clear else _pin(cfg, store, where, app, to, yes)
        )
    finally:
        store.client.close()


def _clear(cfg: Config, store: Any, where: str, cluster: str, app: AppConfig) -> int:
    try:
        inv = store.load()
        if inv.pin is None:
            click.echo(f"{where}: not rolled back (no pin on its ApplySet parent): nothing to clear")
            return 0
        store.set_annotations({ROLLBACK_TO: None, ROLLBACK_FROM: None, ROLLBACK_AT: None})
    except AgentError as e:
        click.echo(f"rollback --clear: {where}: {e}", err=True)
        return EXIT_FAILED
    click.echo(f"{where}: pin to {inv.pin.revision[:12]} cleared; the app follows its source again")
    _ask_for_pass(cfg, cluster, app.name)
    return 0


def _pin(cfg: Config, store: Any, where: str, app: AppConfig, to: str | None, yes: bool) -> int:
    from agent.errors import SourceError
    from agent.report import format as render
    from agent.report.diff import run_live
    from agent.source.git import GitSource
    from agent.source.pinned import revision_at

    try:
        inv = store.load()
    except AgentError as e:
        click.echo(f"rollback: {where}: its ApplySet parent cannot be read: {e}", err=True)
        return EXIT_FAILED
    if not inv.exists:
        _usage(f"rollback: {where} was never applied (no ApplySet parent): nothing to roll back")
    try:
        record = _records(cfg, app.cluster, app.name)
    except AgentError as e:
        click.echo(f"rollback: the status records cannot be read ({e}); the history is unknown", err=True)
        record = None
    current: Pin | None = inv.pin
    last = record.history[-1] if record and record.history else None
    bad = current.bad if current else (last.pinned_from or last.revision) if last else ""
    wanted = to or default_target(record, {bad, current.revision if current else ""})
    if not wanted:
        passes = len(record.history) if record else 0
        _usage(
            f"rollback: {where}: no earlier successful revision in its history ({passes} pass(es) "
            "recorded): name the commit with --to SHA"
        )
    try:
        revision = revision_at(GitSource.from_config(cfg, app.source), wanted)
    except SourceError as e:
        _usage(f"rollback: --to {wanted}: {where}: {e}")
    if bad and revision.sha == bad:
        _usage(f"rollback: {where}: {revision.sha[:12]} is the bad revision itself: name an earlier one")
    report = run_live(cfg, {app.source: revision}, clusters=(app.cluster,), apps={app.cluster: [app]})
    click.echo(render.render_text(report), nl=False)
    failed = [a for c in report.clusters for a in c.apps if a.error]
    if failed:
        click.echo(f"rollback: not pinned: the diff of {revision.short} failed: {failed[0].error}", err=True)
        return EXIT_FAILED
    if not yes:
        click.echo(f"not pinned: run again with --yes to pin {where} to {revision.short}")
        return 0
    at = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        store.set_annotations({ROLLBACK_TO: revision.sha, ROLLBACK_FROM: bad, ROLLBACK_AT: at})
    except (ApiError, AgentError) as e:
        click.echo(f"rollback: {where}: pin not written: {e}", err=True)
        return EXIT_FAILED
    resume = f"a commit other than {bad[:12]} and {revision.short} lands" if bad else "never by itself"
    click.echo(
        f"{where}: pinned to {revision.short} ({revision.subject or 'no subject'}), rolled back from "
        f"{bad[:12] or 'an unknown revision'}; auto-sync resumes when {resume}, or with "
        f"`gitops-agent rollback --cluster {app.cluster} --app {app.name} --clear`"
    )
    _ask_for_pass(cfg, app.cluster, app.name)
    return 0
