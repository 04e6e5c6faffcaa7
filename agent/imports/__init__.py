"""``gitops-agent import``: a Flux or Argo CD repository's objects as an equivalent agent config.

Pure: reads YAML files (with the render stage's own YAML reading), never runs anything, never
touches a cluster; ``agent.cli.importer`` prints what ``toml_text`` writes.
"""
