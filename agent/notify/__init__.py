"""Events out: alerts and commit statuses for each (cluster, app), sent to ``[[notifications]]`` sinks.

Between ``run`` (which feeds it pass results and health readings) and ``report``: ``policy`` decides
what to send (pure, edge-triggered), ``store`` keeps that state where it survives restarts and
replicas, ``sinks`` and ``delivery`` send it without ever holding up a pass, ``notifier`` ties them
together. See docs/notifications.md.
"""
