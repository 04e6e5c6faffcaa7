"""Desired state: plain YAML/JSON, kustomize, helm (pinned, sandboxed), ``${VAR}`` substitution."""
