"""The agent's HTTP endpoints and Prometheus metrics.

``/healthz`` fails only when the agent's own loop is stuck (the scheduler has
not ticked for a while) — never because a cluster is failing (invariant 7:
cluster failures show in ``/status``, metrics and logs, not as a restart
loop). ``/readyz`` is ready once the config is loaded and the first source
fetch was attempted. ``/metrics`` is Prometheus text; ``/status`` is JSON.
Started by ``Daemon``; the recording helpers are called by ``Fleet``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from agent.model import ClusterResult, Outcome

STUCK_AFTER = 120.0  # seconds without a scheduler tick before /healthz fails


class Metrics:
    """Per-cluster series, in a registry of their own (tests create many agents in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.duration = Histogram(
            "gitops_agent_reconcile_duration_seconds",
            "Duration of one reconcile pass.",
            ["cluster"],
            registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.results = Counter(
            "gitops_agent_reconcile_total", "Reconcile passes by result.", ["cluster", "result"], registry=r
        )
        self.last_success = Gauge(
            "gitops_agent_last_success_timestamp_seconds",
            "Unix time of the last successful pass.",
            ["cluster"],
            registry=r,
        )
        self.revision = Gauge(
            "gitops_agent_last_success_revision_info",
            "Revision of the last successful pass (value 1).",
            ["cluster", "revision"],
            registry=r,
        )
        self.objects = Gauge(
            "gitops_agent_objects", "Objects by outcome in the last pass.", ["cluster", "outcome"], registry=r
        )
        self.fetch_duration = Histogram(
            "gitops_agent_source_fetch_duration_seconds", "Duration of one source poll.", registry=r
        )
        self.fetch_failures = Counter(
            "gitops_agent_source_failures_total", "Failed source polls.", registry=r
        )

    def record(self, result: ClusterResult) -> None:
        c = result.cluster
        if result.started and result.finished:
            self.duration.labels(c).observe((result.finished - result.started).total_seconds())
        self.results.labels(c, "success" if result.ok else "failure").inc()
        for outcome in Outcome:
            self.objects.labels(c, outcome.value).set(result.count(outcome))
        if result.ok:
            self.last_success.labels(c).set(time.time())
            self.revision.clear()  # one series per cluster: drop the previous revision's
            self.revision.labels(c, result.revision).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthServer:
    """Serves the endpoints on a thread; ``state`` callbacks come from the daemon."""

    def __init__(
        self,
        listen: str,
        *,
        metrics: Metrics,
        last_tick: Callable[[], float],
        ready: Callable[[], bool],
        status: Callable[[], dict[str, Any]],
        stuck_after: float = STUCK_AFTER,
    ) -> None:
        host, _, port = listen.rpartition(":")
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, ctype, body = outer.respond(self.path.split("?")[0])
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # probes every few seconds: not worth a log line
                pass

        self.metrics = metrics
        self._last_tick = last_tick
        self._ready = ready
        self._status = status
        self.stuck_after = stuck_after
        self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="health", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def respond(self, path: str) -> tuple[int, str, bytes]:
        if path == "/healthz":
            age = time.monotonic() - self._last_tick()
            if age > self.stuck_after:
                return 503, "text/plain", f"scheduler stuck: no tick for {age:.0f}s\n".encode()
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            return (
                (200, "text/plain", b"ok\n")
                if self._ready()
                else (503, "text/plain", b"not ready: first source fetch pending\n")
            )
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self.metrics.render()
        if path == "/status":
            return 200, "application/json", json.dumps(self._status(), indent=2).encode()
        return 404, "text/plain", b"not found\n"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
