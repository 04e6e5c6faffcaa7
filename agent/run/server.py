"""The agent's HTTP endpoints and Prometheus metrics.

``/healthz`` fails only when the agent's own loop is stuck (the scheduler or
the lease loop has not ticked for ``stuck_after`` seconds) — never because a
cluster is failing (docs/safety.md rule 7: cluster failures show in ``/status``,
metrics, Events and logs, not as a restart loop). ``/readyz`` is ready once
the config is loaded and every source was polled once, and not while
shutting down. ``/metrics`` is Prometheus text; ``/status`` is JSON (what
``gitops-agent status`` prints); ``POST /sync?cluster=NAME[&app=APP][&force_window=true]`` asks
for a pass now, overriding a closed change window once with ``force_window``
(``gitops-agent sync``; it needs the token, ``HealthServer``); ``/`` and ``/ui/...`` are the
read-only status page (``statuspage.StatusPage``). Started by ``scheduler.Daemon``; the recording
helpers are called by ``scheduler.Fleet``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
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

from agent.config.types import AGENT_DEFAULTS, AgentSettings
from agent.model import ClusterResult, HealthState, Note, Outcome, PassState, PruneReason, drifted_objects
from agent.run.listener import Environ, Limits, Listener, StartResponse, guard, headers_of, status_line
from agent.run.statuspage import Response, StatusPage, with_security_headers
from agent.ui import auth

STUCK_AFTER = AGENT_DEFAULTS.stuck_after  # seconds without a scheduler tick before /healthz fails


def classify(result: ClusterResult) -> str:
    """The ``reason`` label of a failed pass (``FailureReason``: ``timeout``, ``unauthorized``, ...)."""
    reason = result.reason
    return reason.value if reason is not None else ""


def pass_result(result: ClusterResult) -> str:
    """The ``result`` label of a pass: ``success``, ``failure``, or ``waiting`` (on a dependency)."""
    if not result.ok:
        return "failure"
    return "waiting" if result.state in (PassState.WAITING, PassState.SYNCING) else "success"


def conflicting(result: ClusterResult) -> int:
    """Objects left unchanged because every differing field was yielded to its owner."""
    return sum(1 for r in result.results if r.note is Note.YIELDED)


class Metrics:
    """Per-app series (``cluster``, ``app``; a cluster entry's own app is named after it),
    per-cluster ones (schedule, lease) and per-source ones (``source``), in a registry of their
    own (tests create many agents in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # In this order in ``/metrics``: the passes', the apps' and clusters' state, the sources'.
        self._pass_series(self.registry)
        self._state_series(self.registry)
        self._source_series(self.registry)
        self._revisions: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def _pass_series(self, r: CollectorRegistry) -> None:
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

    def _state_series(self, r: CollectorRegistry) -> None:
        c = ["cluster", "app"]
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
        self.drift = Gauge(
            "gitops_agent_drift_objects",
            'Objects with drift the last pass reported and left (drift = "report").',
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

    def _source_series(self, r: CollectorRegistry) -> None:
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
            self.drift.labels(*c).set(drifted_objects(result.drift_reported))
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
            self.drift,
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
    """Serves the endpoints (``listener.Listener``); ``state`` callbacks come from the daemon.

    ``token`` (``[agent] ui_token_file``) guards what acts or tells: ``POST /sync`` needs it as
    ``Authorization: Bearer`` (401 without it) and is refused (403) on every address when none is
    configured, loopback included: a pass per request, past the backoff, is not for whoever can
    reach the port. ``/status`` needs it (bearer or the page's cookie) when one is configured.
    The probes and ``/metrics`` stay open for the kubelet and Prometheus."""

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
        token: str = "",
        limits: Limits | None = None,
        allowed: frozenset[str] = frozenset({"localhost"}),
    ) -> None:
        self.metrics = metrics
        self._last_tick = last_tick
        self._ready = ready
        self._status = status
        self._sync = sync
        self.page = page
        self.stuck_after = stuck_after
        self._token = token
        self.listener = Listener(
            listen, guard(self.app, allowed), limits or main_limits(AGENT_DEFAULTS), name="health"
        )

    @property
    def port(self) -> int:
        return self.listener.port

    def app(self, environ: Environ, start_response: StartResponse) -> list[bytes]:
        """The WSGI application: one answer per request."""
        answer = self.answer(environ)
        headers = [("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body)))]
        start_response(status_line(answer.code), headers + list(answer.headers))
        return [answer.body]

    def answer(self, environ: Environ) -> Response:
        method = str(environ.get("REQUEST_METHOD", ""))
        target = str(environ.get("REQUEST_URI") or "/")
        headers = headers_of(environ)
        path = urlsplit(target).path
        if method not in ("GET", "POST"):
            return Response(501, TEXT, b"not implemented\n")
        if self.page is not None and (path in ("/", "/ui") or path.startswith("/ui/")):
            body = environ["wsgi.input"].read() if method == "POST" else b""
            page = self.page.handle(method, target, headers, body)
            return Response(page.code, page.content_type, page.body, with_security_headers(page))
        if method == "GET":
            return self.respond(path, headers)
        return self.post(target, headers)

    def _authorized(self, headers: Mapping[str, str], *, cookie: bool) -> bool:
        return auth.authorized(
            self._token,
            cookie=headers.get("Cookie") if cookie else None,
            authorization=headers.get("Authorization"),
        )

    def respond(self, path: str, headers: Mapping[str, str] | None = None) -> Response:
        if path == "/healthz":
            age = time.monotonic() - self._last_tick()
            if age > self.stuck_after:
                return Response(503, TEXT, f"agent loop stuck: no tick for {age:.0f}s\n".encode())
            return Response(200, TEXT, b"ok\n")
        if path == "/readyz":
            why = self._ready()
            if why is None:
                return Response(200, TEXT, b"ok\n")
            return Response(503, TEXT, f"not ready: {why}\n".encode())
        if path == "/metrics":
            return Response(200, CONTENT_TYPE_LATEST, self.metrics.render())
        if path == "/status":
            if self._token and not self._authorized(headers or {}, cookie=True):
                return _json(401, {"error": "/status needs the token of [agent] ui_token_file"}, BEARER)
            return Response(200, JSON, json.dumps(self._status(), indent=2).encode())
        return Response(404, TEXT, b"not found\n")

    def post(self, target: str, headers: Mapping[str, str] | None = None) -> Response:
        url = urlsplit(target)
        if url.path != "/sync" or self._sync is None:
            return Response(404, TEXT, b"not found\n")
        if not self._token:
            why = "POST /sync needs [agent] ui_token_file (a token); or run `gitops-agent sync --local`"
            return _json(403, {"error": why})
        if not self._authorized(headers or {}, cookie=False):
            return _json(
                401, {"error": "POST /sync needs Authorization: Bearer <[agent] ui_token_file>"}, BEARER
            )
        query = parse_qs(url.query)
        cluster = (query.get("cluster") or [""])[0]
        if not cluster:
            return _json(400, {"error": "cluster=NAME is required"})
        apps = query.get("app")
        force = (query.get("force_window") or [""])[0]
        if force not in ("", "true", "1"):
            return _json(400, {"error": f"force_window takes true or 1, got {force!r}"})
        # ``app`` and ``force_window`` only when asked: a handler of clusters alone keeps working.
        extra: dict[str, Any] = {"force_window": True} if force else {}
        code, body = self._sync(cluster, apps[0], **extra) if apps else self._sync(cluster, **extra)
        retry = body.get("retry_after") if code == 429 else None
        return _json(code, body, (("Retry-After", str(retry)),) if retry else ())

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()


TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
BEARER = (("WWW-Authenticate", 'Bearer realm="gitops-agent"'),)


def _json(code: int, doc: dict[str, Any], headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(code, JSON, (json.dumps(doc) + "\n").encode(), headers)


def main_limits(a: AgentSettings) -> Limits:
    """The main listener's limits from ``[agent]`` (its bodies are the page's small forms)."""
    return Limits(
        header_timeout=a.header_timeout,
        body_timeout=a.body_timeout,
        max_connections=a.max_connections,
        threads=a.http_threads,
        max_body_bytes=64 * 1024,
    )
