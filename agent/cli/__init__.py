"""The ``gitops-agent`` command line."""
