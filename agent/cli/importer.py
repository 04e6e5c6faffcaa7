"""``gitops-agent import --from flux|argocd PATH``: a repository's Flux or Argo CD objects as an
agent config on standard output, what could not be carried over as comments in it, logs on
standard error.

A click command registered by ``agent/cli/main.py``. Reads files only (``agent.imports``); the
config it prints is parsed with the agent's own loader and a config that does not load is said so
on standard error (exit 1). Exit 2: PATH is not a directory, or holds none of the tool's objects.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import click

from agent.cli.common import EXIT_FAILED, EXIT_USAGE
from agent.config.load import parse_config
from agent.errors import ConfigError
from agent.imports.argocd import import_argocd
from agent.imports.flux import import_flux
from agent.imports.model import Tool
from agent.imports.toml_text import toml_text


@click.command("import")
@click.option(
    "--from",
    "tool",
    required=True,
    type=click.Choice([t.value for t in Tool]),
    help="The tool whose objects PATH holds.",
)
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--cluster",
    "cluster",
    default="",
    help="Name of the cluster the tool runs in (Flux: with clusters/NAME/, only that one).",
)
@click.option(
    "--kubeconfig",
    "kubeconfig",
    default="",
    help="Kubeconfig of every cluster entry (default: a placeholder).",
)
def import_command(tool: str, path: str, cluster: str, kubeconfig: str) -> None:
    """Print an agent config equivalent to PATH's Flux or Argo CD objects (a checked-out repository)."""
    root = Path(path).resolve()
    reader = import_flux if Tool(tool) is Tool.FLUX else import_argocd
    imported = reader(root, cluster=cluster, kubeconfig=kubeconfig)
    for warning in imported.warnings:
        click.echo(f"import: {warning}", err=True)
    if not imported.apps:
        click.echo(f"import: no {tool} apps found under {path}", err=True)
        sys.exit(EXIT_USAGE)
    text = toml_text(imported, path=path)
    click.echo(text, nl=False)
    click.echo(
        f"import: {len(imported.apps)} app(s); {text.count('# not carried over:')} field(s) not carried over",
        err=True,
    )
    try:
        parse_config(tomllib.loads(text), file="<import>", base_dir=Path.cwd())
    except ConfigError as e:
        click.echo(f"import: the config does not load with this agent: {e}", err=True)
        sys.exit(EXIT_FAILED)
