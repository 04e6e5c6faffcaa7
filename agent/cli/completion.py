"""``gitops-agent completion bash|zsh|fish``: the shell's completion script, on standard output.

Click completes commands, options and choices itself when the shell calls the program back
with ``_GITOPS_AGENT_COMPLETE`` set; this command only prints the script that does so, as
``kubectl completion`` and ``flux completion`` do, so users add one line to their shell's rc
file (``source <(gitops-agent completion bash)``).
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

SHELLS = ("bash", "zsh", "fish")
PROG = "gitops-agent"
COMPLETE_VAR = "_GITOPS_AGENT_COMPLETE"


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script of SHELL (bash, zsh or fish).

    \b
    bash:  source <(gitops-agent completion bash)      (in ~/.bashrc)
    zsh:   source <(gitops-agent completion zsh)       (in ~/.zshrc)
    fish:  gitops-agent completion fish > ~/.config/fish/completions/gitops-agent.fish
    """
    cls = get_completion_class(shell)
    if cls is None:  # pragma: no cover (click ships all three)
        raise click.UsageError(f"no completion for {shell}")
    root = ctx.find_root().command
    click.echo(cls(root, {}, PROG, COMPLETE_VAR).source())
