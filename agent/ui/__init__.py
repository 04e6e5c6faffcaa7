"""The read-only status page: records of each app (``records``), their HTML (``render``), and who
may read them (``auth``). Pure; ``agent.run.statuspage`` serves it."""
