"""``gitops-agent diff``: a multi-cluster, ownership-aware diff report (live or offline).

Registered on the main group by ``agent.cli`` (``main.add_command(diff)``).
Live mode (``--config``) renders a revision (``--revision``, default the
configured ref) or a local checkout (``--path``) and plans it against each
cluster (``agent.report.diff``); offline mode (``--offline --repo --base --head``)
compares two revisions' desired states without any cluster
(``agent.report.diff_offline``). The report goes to ``--output`` or stdout in the
chosen ``--format`` (``agent.report``).

Exit codes, as ``kubectl diff``: 0 no differences, 1 differences, 2 an error
(bad flags or config, an unreachable source, any cluster or object that
could not be planned; the report is still written when there is one).
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, NoReturn

import click

from agent.cli.common import configure_logging, load, select_apps
from agent.report.model import EXIT_ERROR, ClusterReport, Report

FORMATS = ("text", "markdown", "json")


class TerminalProgress:
    """One status line on a terminal while clusters are planned: ``planning 1/2: pool-a ✓ pool-b …``."""

    def __init__(self, stream: IO[str], names: list[str]) -> None:
        self.stream = stream
        self.state = dict.fromkeys(names, "…")
        self.lock = threading.Lock()

    def started(self, cluster: str) -> None:
        self._show()

    def finished(self, report: ClusterReport) -> None:
        with self.lock:
            self.state[report.name] = "✗" if report.error or report.errors else "✓"
        self._show()

    def _show(self) -> None:
        with self.lock:
            done = sum(1 for s in self.state.values() if s != "…")
            cells = " ".join(f"{n} {s}" for n, s in self.state.items())
            self.stream.write(f"\r\x1b[2Kplanning {done}/{len(self.state)}: {cells}")
            if done == len(self.state):
                self.stream.write("\n")
            self.stream.flush()


def _fail(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(EXIT_ERROR)


def _render(report: Report, fmt: str, max_size: int, color: bool) -> str:
    from agent.report import format as render

    if fmt == "json":
        return render.render_json(report)
    if fmt == "markdown":
        return render.render_markdown(report, max_size=max_size)
    return render.render_text(report, color=color)


@click.command("diff")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="Agent config (TOML).")
@click.option("--cluster", "clusters", multiple=True, help="Only these clusters (repeatable).")
@click.option(
    "--app", "app_names", multiple=True, help="Live: only these apps of the one --cluster (repeatable)."
)
@click.option(
    "--revision", default=None, help="Live: Git ref or commit to render (default: the configured ref)."
)
@click.option(
    "--path",
    "tree",
    default=None,
    type=click.Path(file_okay=False, exists=True),
    help="Live: root of a local checkout of the repository to render (e.g. the PR's working tree).",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--output", default=None, type=click.Path(dir_okay=False), help="Write the report here.")
@click.option(
    "--max-size",
    default=65536,
    show_default=True,
    type=click.IntRange(min=2048),
    help="Markdown: largest report in characters (details are truncated, never the summary).",
)
@click.option("--offline", is_flag=True, help="Compare two revisions' desired states; no cluster access.")
@click.option("--repo", default=None, help="Offline: repository URL or local path.")
@click.option("--base", "base_ref", default=None, help="Offline: the revision the change starts from.")
@click.option("--head", "head_ref", default=None, help="Offline: the revision with the change.")
@click.option(
    "--kubernetes-version",
    default=None,
    help="Offline: flag objects using API versions this Kubernetes release (1.NN) removes, and render "
    "Helm charts for it (default: each cluster's kubernetes_version).",
)
def diff(
    config_file: str | None,
    clusters: tuple[str, ...],
    app_names: tuple[str, ...],
    revision: str | None,
    tree: str | None,
    fmt: str,
    output: str | None,
    max_size: int,
    offline: bool,
    repo: str | None,
    base_ref: str | None,
    head_ref: str | None,
    kubernetes_version: str | None,
) -> None:
    """Report what a change would create, update, prune and conflict with, per cluster.

    Exit 0: no differences; 1: differences; 2: an error (the report still says where).
    """
    from agent.config.types import Config
    from agent.errors import SourceError

    if offline:
        if revision or tree:
            raise click.UsageError("--revision and --path are for live mode; offline takes --base and --head")
        missing = [f for f, v in (("--repo", repo), ("--base", base_ref), ("--head", head_ref)) if not v]
        if missing:
            raise click.UsageError(f"--offline needs {', '.join(missing)}")
    else:
        if repo or base_ref or head_ref:
            raise click.UsageError("--repo, --base and --head need --offline")
        if not config_file:
            raise click.UsageError("live mode needs --config (or use --offline --repo --base --head)")
        if revision and tree:
            raise click.UsageError("give --revision or --path, not both")
    if kubernetes_version is not None:
        from agent.model import parse_release

        if not offline:
            raise click.UsageError(
                "--kubernetes-version is for --offline (live mode checks each cluster's own "
                "versions and its kubernetes_version)"
            )
        try:
            parse_release(kubernetes_version)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--kubernetes-version") from None
    if app_names and (offline or len(clusters) != 1):
        raise click.UsageError("--app names apps of one cluster: give exactly one --cluster (live mode)")
    cfg: Config | None = None
    if config_file:
        # Offline mode never connects: a CI runner without the kubeconfigs the config names is fine.
        cfg = load(config_file, clusters, access=not offline)
    # Warnings only: stdout holds the report, stderr the progress line.
    configure_logging(cfg, quiet=True)
    apps = None
    if cfg is not None and app_names:  # an unknown app: exit 2 before any source or cluster is asked
        apps = {clusters[0]: [a for n in app_names for a in select_apps(cfg, clusters[0], n, command="diff")]}
    try:
        if offline:
            report = _offline(
                cfg, repo or "", base_ref or "", head_ref or "", clusters, kubernetes_version or ""
            )
        else:
            assert cfg is not None
            apps = None
            if app_names:
                apps = {
                    clusters[0]: [
                        a for n in app_names for a in select_apps(cfg, clusters[0], n, command="diff")
                    ]
                }
            report = _live(cfg, clusters, revision, tree, apps)
    except SourceError as e:
        _fail(f"source error: {e}")
    if not report.clusters:
        _fail("no clusters to report on" + (" (none matched --cluster)" if clusters else ""))
    to_file = output is not None
    color = not to_file and fmt == "text" and sys.stdout.isatty()
    text = _render(report, fmt, max_size, color)
    if output is not None:
        Path(output).write_text(text, encoding="utf-8")
    else:
        click.echo(text, nl=False, color=color)
    sys.exit(report.exit_code)


def _live(
    cfg: Any, clusters: tuple[str, ...], revision: str | None, tree: str | None, apps: Any = None
) -> Report:
    """Each app renders its own source's revision (``--revision``: a ref of each source it
    reports on), or the local checkout ``tree``."""
    from agent.errors import SourceError
    from agent.report.diff import run_live
    from agent.source.sources import SourceSet

    target: Any
    chosen = [a for a in cfg.apps if not clusters or a.cluster in clusters]
    if apps is not None:
        chosen = [a for v in apps.values() for a in v]
    if tree:
        target = Path(tree).resolve()
    else:
        sources = SourceSet.from_config(cfg)
        names = list(dict.fromkeys(a.source for a in chosen))
        if revision:
            target = {n: sources.resolve(n, revision) for n in names}
        else:
            polled = sources.poll(names)
            if polled.errors:
                raise SourceError("; ".join(f"source {n!r}: {e}" for n, e in polled.errors.items()))
            target = polled.revisions
            if len(names) == 1 and names[0] in target:
                target = target[names[0]] if all(a.implicit for a in chosen) else target
    names = [c.name for c in cfg.clusters if not clusters or c.name in clusters]
    progress = TerminalProgress(sys.stderr, names) if sys.stderr.isatty() else None
    return run_live(cfg, target, clusters=clusters, progress=progress, apps=apps)


def _offline(
    cfg: Any, repo: str, base_ref: str, head_ref: str, clusters: tuple[str, ...], kubernetes_version: str
) -> Report:
    from agent.report.diff_offline import run_offline
    from agent.source.git import cache_dir_for

    kw: dict[str, Any] = {"clusters": clusters, "kubernetes_version": kubernetes_version}
    if cfg is not None:
        return run_offline(repo, base_ref, head_ref, config=cfg, cache_dir=cache_dir_for(cfg), **kw)
    with tempfile.TemporaryDirectory(prefix="gitops-agent-diff-") as tmp:
        return run_offline(repo, base_ref, head_ref, config=None, cache_dir=Path(tmp), **kw)
