"""Development tooling: real local control planes and ``gitops-agent demo``."""
