"""The long-running agent: one job per cluster, schedule, backoff, Leases, the HTTP server."""
