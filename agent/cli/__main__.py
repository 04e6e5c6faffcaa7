"""``python -m agent.cli``: the same command line as the ``gitops-agent`` entry point."""

from agent.cli.main import main

main()
