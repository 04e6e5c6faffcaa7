"""``gitops-agent wait``: until the running agent shows an app synced or healthy, for CI pipelines.

Polls the agent's ``GET /status`` (with ``[agent] ui_token_file``'s token, or ``--token-file``'s)
every ``POLL_FIRST`` seconds, doubling up to ``POLL_MAX``, and asks ``run.wait_for`` what each
answer says; progress goes to standard error, and standard output gets one line (or one JSON
document) when it ends. Without ``--config``, ``--url`` says where the agent listens.

Exit codes (Argo CD's ``app wait`` and ``kubectl wait`` in one): 0 reached; 1 failed at that
revision (its pass failed or was refused, its prune is held by the brake, its rollout Failed);
2 timed out, or bad input (an unknown cluster or app, a bad duration or revision, no agent
address, a token the agent refuses, an app whose health is never read).
"""

from __future__ import annotations

import sys
import time
from typing import Any, NoReturn

import click

from agent.cli.common import EXIT_FAILED, EXIT_USAGE, configure_logging, load, positive_duration, select_apps
from agent.cli.ops import _call, agent_token, agent_url
from agent.cli.output import JSON, output_option, to_json
from agent.config.types import Config
from agent.run.wait_for import SHA, Goal, Verdict, answer

#: Seconds between two reads of ``/status``: the first, and the most (never a busy loop).
POLL_FIRST = 0.5
POLL_MAX = 5.0
_EXIT = {Verdict.REACHED: 0, Verdict.FAILED: EXIT_FAILED, Verdict.UNANSWERABLE: EXIT_USAGE}


def _usage(message: str) -> NoReturn:
    click.echo(f"wait: {message}", err=True)
    sys.exit(EXIT_USAGE)


def _revision(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    if value is None:
        return ""
    if not SHA.match(value.lower()):
        raise click.BadParameter(f"a commit SHA (7 to 40 hexadecimal digits), got {value!r}")
    return value.lower()


def _where(cfg: Config | None, url: str | None, token_file: str | None) -> tuple[str, str]:
    """(the agent's address, its token) from the flags, else the config."""
    token = ""
    if token_file:
        try:
            with open(token_file) as f:
                token = f.read().strip()
        except OSError as e:
            _usage(f"--token-file: cannot read {token_file}: {e}")
        if not token:
            _usage(f"--token-file: {token_file} is empty")
    if cfg is None:
        if not url:
            _usage("give --url (where the agent listens) or --config")
        return url.rstrip("/"), token
    return (url or agent_url(cfg)).rstrip("/"), token or agent_token(cfg)


def _finish(
    output: str, where: dict[str, str], result: str, message: str, revision: str, waited: float
) -> None:
    if output == JSON:
        click.echo(
            to_json(
                {
                    **where,
                    "result": result,
                    "revision": revision,
                    "message": message,
                    "waited_seconds": round(waited, 1),
                }
            )
        )
    else:
        cluster, app = where["cluster"], where["app"]
        click.echo(f"{cluster if app in ('', cluster) else f'{cluster}/{app}'}: {message}")


@click.command("wait")
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Agent config (TOML): where the agent listens, its token, its apps.",
)
@click.option("--cluster", "cluster_name", required=True, help="Cluster name.")
@click.option("--app", "app_name", default=None, help="App of that cluster (default: its only app).")
@click.option(
    "--for",
    "goal",
    required=True,
    type=click.Choice([g.value for g in Goal]),
    help="synced: its pass succeeded at the revision; healthy: and its rollout is Current.",
)
@click.option(
    "--revision",
    default=None,
    callback=_revision,
    help="Commit SHA to wait for (default: the latest of the app's source).",
)
@click.option(
    "--timeout",
    default="5m",
    show_default=True,
    callback=positive_duration,
    help="Give up (exit 2) after this long.",
)
@click.option("--url", default=None, help="The agent's address (default: [agent] listen of --config).")
@click.option(
    "--token-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="The agent's UI token (default: [agent] ui_token_file).",
)
@output_option("json: {cluster, app, for, result, revision, message, waited_seconds}.")
def wait(
    config_file: str | None,
    cluster_name: str,
    app_name: str | None,
    goal: str,
    revision: str,
    timeout: float,
    url: str | None,
    token_file: str | None,
    output: str,
) -> None:
    """Wait until the running agent shows an app synced or healthy (exit 0), failed (1) or not in time (2)."""
    cfg = load(config_file, [cluster_name]) if config_file is not None else None
    configure_logging(cfg)
    if cfg is not None:
        (app,) = select_apps(cfg, cluster_name, app_name, command="wait", one=True)
        app_name = app.name
    base, token = _where(cfg, url, token_file)
    if not base:
        _usage("[agent] listen is empty: the agent serves no /status (give --url)")
    started = time.monotonic()
    deadline = started + timeout
    delay, said = POLL_FIRST, ""
    while True:
        doc = _status(base, token)
        if isinstance(doc, dict):
            app_name = app_name or _default_app(doc, cluster_name)
            got = answer(doc, cluster_name, app_name, Goal(goal), revision)
            where = {"cluster": cluster_name, "app": app_name, "for": goal}
            if got.verdict is not Verdict.PENDING:
                _finish(
                    output, where, got.verdict.value, got.message, got.revision, time.monotonic() - started
                )
                sys.exit(_EXIT[got.verdict])
            last = got.message
        else:
            last = doc
        if last != said:
            click.echo(f"wait: {cluster_name}/{app_name or '?'}: {last}", err=True)
            said = last
        left = deadline - time.monotonic()
        if left <= 0:
            where = {"cluster": cluster_name, "app": app_name or "", "for": goal}
            _finish(output, where, "timed-out", f"timed out after {timeout:g}s: {last}", revision, timeout)
            sys.exit(EXIT_USAGE)
        time.sleep(min(delay, left))
        delay = min(delay * 2, POLL_MAX)


def _status(base: str, token: str) -> dict[str, Any] | str:
    """The agent's ``/status``, or why there was none (said, and asked again)."""
    try:
        code, doc = _call(f"{base}/status", token=token, timeout=10.0)
    except OSError as e:
        return f"no agent answers at {base}: {e}"
    if code in (401, 403):
        _usage(
            f"the agent at {base} refused /status (HTTP {code}): "
            "give its [agent] ui_token_file's token (--token-file)"
        )
    if code != 200 or not isinstance(doc, dict):
        return f"the agent at {base} answered HTTP {code}"
    return doc


def _default_app(doc: dict[str, Any], cluster: str) -> str:
    """The cluster's only app; "" when the agent serves no such cluster (``answer`` says so)."""
    apps = [str(r.get("app", cluster)) for r in doc.get("clusters") or [] if r.get("cluster") == cluster]
    if len(apps) > 1:
        _usage(f"cluster {cluster!r} has several apps ({', '.join(apps)}): name one with --app")
    return apps[0] if apps else ""
