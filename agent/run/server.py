"""The agent's HTTP endpoints and Prometheus metrics.

``/healthz`` fails only when the agent's own loop is stuck (the scheduler or
the lease loop has not ticked for ``stuck_after`` seconds) — never because a
cluster is failing (docs/safety.md rule 7: cluster failures show in ``/status``,
metrics, Events and logs, not as a restart loop). ``/readyz`` is ready once
the config is loaded and every source was polled once, and not while
shutting down. ``/metrics`` is Prometheus text; ``/status`` is JSON (what
``gitops-agent status`` prints); ``POST /sync?cluster=NAME[&app=APP]`` asks for a pass
now (``gitops-agent sync``); ``/`` and ``/ui/...`` are the read-only status page
(``statuspage.StatusPage``). Started by ``scheduler.Daemon``; the recording
helpers are called by ``scheduler.Fleet``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from agent.config.types import AGENT_DEFAULTS
from agent.model import ClusterResult, HealthState, Note, Outcome, PassState, PruneReason
from agent.run.statuspage import Response, StatusPage, with_security_headers

STUCK_AFTER = AGENT_DEFAULTS.stuck_after  # seconds without a scheduler tick before /healthz fails


def classify(result: ClusterResult) -> str:
    """The ``reason`` label of a failed pass (``FailureReason``: ``timeout``, ``unauthorized``, ...)."""
    reason = result.reason
    return reason.value if reason is not None else ""


def pass_result(result: ClusterResult) -> str:
    """The ``result`` label of a pass: ``success``, ``failure``, or ``waiting`` (on a dependency)."""
    if not result.ok:
        return "failure"
    return "waiting" if result.state is PassState.WAITING else "success"


def conflicting(result: ClusterResult) -> int:
    """Objects left unchanged because every differing field was yielded to its owner."""
    return sum(1 for r in result.results if r.note is Note.YIELDED)


class Metrics:
    """Per-app series (``cluster``, ``app``; a cluster entry's own app is named after it),
    per-cluster ones (schedule, lease) and per-source ones (``source``), in a registry of their
    own (tests create many agents in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        c = ["cluster", "app"]
        self.duration = Histogram(
            "gitops_agent_reconcile_duration_seconds",
            "Duration of one reconcile pass.",
            c,
            registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.results = Counter(
            "gitops_agent_reconcile_total",
            "Reconcile passes by result (success, failure, waiting).",
            [*c, "result"],
            registry=r,
        )
        self.errors = Counter(
            "gitops_agent_reconcile_errors_total",
            "Failed passes by reason (timeout, unauthorized, tls, unreachable, render, fenced, ...).",
            [*c, "reason"],
            registry=r,
        )
        self.last_success = Gauge(
            "gitops_agent_last_success_timestamp_seconds",
            "Unix time of the last successful pass.",
            c,
            registry=r,
        )
        self.revision = Gauge(
            "gitops_agent_last_success_revision_info",
            "Revision of the last successful pass (value 1).",
            [*c, "revision"],
            registry=r,
        )
        self.objects = Gauge(
            "gitops_agent_objects", "Objects by outcome in the last pass.", [*c, "outcome"], registry=r
        )
        self.objects_total = Counter(
            "gitops_agent_object_outcomes_total",
            "Objects by outcome, summed over passes.",
            [*c, "outcome"],
            registry=r,
        )
        self.failures = Gauge(
            "gitops_agent_cluster_consecutive_failures",
            "Failed passes since the last success.",
            c,
            registry=r,
        )
        self.next_run = Gauge(
            "gitops_agent_cluster_next_run_timestamp_seconds",
            "Unix time of the cluster's next scheduled pass.",
            ["cluster"],
            registry=r,
        )
        self.suspended = Gauge(
            "gitops_agent_cluster_suspended", "1 while the app is suspended.", c, registry=r
        )
        self.prune_held = Gauge(
            "gitops_agent_prune_held",
            "1 while the mass-deletion brake holds the app's prune set, waiting for its approval.",
            c,
            registry=r,
        )
        self.lease_held = Gauge(
            "gitops_agent_lease_held",
            "1 while this replica holds the cluster's Lease (writes).",
            ["cluster"],
            registry=r,
        )
        self.health = Gauge(
            "gitops_agent_app_health",
            "1 for the app's health state (Current, InProgress, Failed, ...) as its wait last read it.",
            [*c, "state"],
            registry=r,
        )
        self.cluster_health = Gauge(
            "gitops_agent_cluster_health",
            "1 for the cluster's health state: its least healthy app's.",
            ["cluster", "state"],
            registry=r,
        )
        self.health_reads = Counter(
            "gitops_agent_health_requests_total",
            "Requests made to read health during waits (LISTs of followed kinds and children).",
            c,
            registry=r,
        )
        s = ["source"]
        self.fetch_duration = Histogram(
            "gitops_agent_source_fetch_duration_seconds", "Duration of one source poll.", s, registry=r
        )
        self.fetch_failures = Counter(
            "gitops_agent_source_failures_total", "Failed source polls.", s, registry=r
        )
        self.fetch_success = Gauge(
            "gitops_agent_source_last_success_timestamp_seconds",
            "Unix time of the last good poll.",
            s,
            registry=r,
        )
        self.tick = Gauge(
            "gitops_agent_scheduler_last_tick_timestamp_seconds",
            "Unix time of the scheduler's last tick.",
            registry=r,
        )
        self.reloads = Counter(
            "gitops_agent_config_reloads_total", "Config reloads by result.", ["result"], registry=r
        )
        self._revisions: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def record(self, result: ClusterResult) -> None:
        c = (result.cluster, result.app or result.cluster)
        if result.started and result.finished:
            self.duration.labels(*c).observe((result.finished - result.started).total_seconds())
        self.results.labels(*c, pass_result(result)).inc()
        if not result.ok:
            self.errors.labels(*c, classify(result)).inc()
        counts = {o.value: result.count(o) for o in Outcome}
        counts["conflicting"] = conflicting(result)
        for outcome, n in counts.items():
            self.objects.labels(*c, outcome).set(n)
            if n:
                self.objects_total.labels(*c, outcome).inc(n)
        if result.failure is None:  # a pass that failed earlier never reached its prune: unknown
            held = result.prune_refusal is not None and result.prune_refusal.reason is PruneReason.BRAKE
            self.prune_held.labels(*c).set(1 if held else 0)
        if result.state is PassState.OK:
            self.last_success.labels(*c).set(time.time())
            with self._lock:  # one revision series per app: drop this app's previous one
                old = self._revisions.get(c)
                if old is not None and old != result.revision:
                    self.revision.remove(*c, old)
                self._revisions[c] = result.revision
            self.revision.labels(*c, result.revision).set(1)

    def cluster_state(
        self,
        cluster: str,
        *,
        failures: int,
        next_run: float | None,
        suspended: bool,
        app: str | None = None,
    ) -> None:
        """An app's failures and suspension (``app``: the cluster entry's own app by default) and
        the cluster's next pass."""
        self.app_state(cluster, app or cluster, failures=failures, suspended=suspended)
        self.next_run_at(cluster, next_run)

    def app_state(self, cluster: str, app: str, *, failures: int, suspended: bool) -> None:
        self.failures.labels(cluster, app).set(failures)
        self.suspended.labels(cluster, app).set(1 if suspended else 0)

    def app_health(self, cluster: str, app: str, state: HealthState, cluster_state: HealthState) -> None:
        """The app's health state and its cluster's (one series per state, 1 for the current one)."""
        for s in HealthState:
            self.health.labels(cluster, app, s.value).set(1 if s is state else 0)
            self.cluster_health.labels(cluster, s.value).set(1 if s is cluster_state else 0)

    def next_run_at(self, cluster: str, when: float | None) -> None:
        self.next_run.labels(cluster).set(when or 0)

    def remove_app(self, cluster: str, app: str) -> None:
        """Forget an app removed from the config (nothing of it is deleted in the cluster)."""
        self._remove(lambda labels: labels[:2] == (cluster, app))
        with self._lock:
            self._revisions.pop((cluster, app), None)

    def remove(self, cluster: str) -> None:
        """Forget a cluster removed from the config: its series disappear from /metrics."""
        self._remove(lambda labels: labels[0] == cluster)
        with self._lock:
            for key in [k for k in self._revisions if k[0] == cluster]:
                del self._revisions[key]

    def _remove(self, match: Callable[[tuple[str, ...]], bool]) -> None:
        for metric in (
            self.duration,
            self.results,
            self.errors,
            self.last_success,
            self.revision,
            self.objects,
            self.objects_total,
            self.failures,
            self.health,
            self.health_reads,
            self.next_run,
            self.suspended,
            self.prune_held,
            self.lease_held,
            self.cluster_health,
        ):
            # prometheus_client has no "remove by one label"; walk the children it knows.
            for labels in list(metric._metrics):
                if labels and match(tuple(labels)):
                    metric.remove(*labels)

    def remove_source(self, source: str) -> None:
        """Forget a source no app uses any more (a config reload): its series disappear."""
        for metric in (self.fetch_duration, self.fetch_failures, self.fetch_success):
            if (source,) in metric._metrics:
                metric.remove(source)

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
        ready: Callable[[], str | None],
        status: Callable[[], dict[str, Any]],
        sync: Callable[..., tuple[int, dict[str, Any]]] | None = None,
        stuck_after: float = STUCK_AFTER,
        page: StatusPage | None = None,
    ) -> None:
        host, _, port = listen.rpartition(":")
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _page(self, method: str) -> bool:
                """Answer a status page request (``/``, ``/ui...``); False for the other endpoints."""
                path = self.path.split("?")[0]
                if outer.page is None or not (path == "/" or path == "/ui" or path.startswith("/ui/")):
                    return False
                try:
                    length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024)
                except ValueError:  # "abc", "5, 5": answered, not a traceback and a dropped connection
                    self._send(400, "text/plain", b"bad Content-Length\n")
                    return True
                body = self.rfile.read(length) if method == "POST" and length > 0 else b""
                headers = {k: v for k, v in self.headers.items()}
                answer: Response = outer.page.handle(method, self.path, headers, body)
                self.send_response(answer.code)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                for key, value in with_security_headers(answer):
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(answer.body)
                return True

            def do_GET(self) -> None:
                if not self._page("GET"):
                    self._send(*outer.respond(self.path.split("?")[0]))

            def do_POST(self) -> None:
                if not self._page("POST"):
                    self._send(*outer.post(self.path))

            def log_message(self, *args: Any) -> None:  # probes every few seconds: not worth a log line
                pass

        self.metrics = metrics
        self._last_tick = last_tick
        self._ready = ready
        self._status = status
        self._sync = sync
        self.page = page
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
                return 503, "text/plain", f"agent loop stuck: no tick for {age:.0f}s\n".encode()
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            why = self._ready()
            if why is None:
                return 200, "text/plain", b"ok\n"
            return 503, "text/plain", f"not ready: {why}\n".encode()
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self.metrics.render()
        if path == "/status":
            return 200, "application/json", json.dumps(self._status(), indent=2).encode()
        return 404, "text/plain", b"not found\n"

    def post(self, target: str) -> tuple[int, str, bytes]:
        url = urlsplit(target)
        if url.path != "/sync" or self._sync is None:
            return 404, "text/plain", b"not found\n"
        query = parse_qs(url.query)
        cluster = (query.get("cluster") or [""])[0]
        if not cluster:
            return 400, "application/json", b'{"error": "cluster=NAME is required"}\n'
        apps = query.get("app")
        # ``app`` only when asked: a handler of clusters alone keeps working.
        code, body = self._sync(cluster, apps[0]) if apps else self._sync(cluster)
        return code, "application/json", json.dumps(body).encode()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
