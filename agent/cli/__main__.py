"""``python -m agent.cli``: the same command as the ``gitops-agent`` script, by the same name
(so its usage lines and shell completion (``_GITOPS_AGENT_COMPLETE``) read as the script's)."""

from agent.cli.completion import COMPLETE_VAR, PROG
from agent.cli.main import main

main(prog_name=PROG, complete_var=COMPLETE_VAR)
