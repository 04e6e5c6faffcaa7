"""The agent's HTTP server (``agent/run/server.py``) without a cluster: liveness is the agent's.

``/healthz`` answers from the agent's own tick only (docs/safety.md rule 7); cluster
failures are metrics with per-cluster series that the Prometheus text parser reads;
``/readyz`` waits for the first source fetch; ``POST /sync`` reaches the
daemon's callback; backoff doubles to its cap and resets.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.errors import (
    AgentError,
    ApiError,
    ClusterError,
    ClusterRefused,
    RenderError,
    RenderProblem,
    StatusDetails,
    Transport,
)
from agent.model import ApplyResult, ClusterResult, Failure, FailureReason, ObjectKey, Outcome, Refusal
from agent.run.fleet import backoff_delay
from agent.run.server import HealthServer, Metrics, classify


def _result(
    cluster: str, *, failure: Failure | None = None, outcomes: tuple[Outcome, ...] = ()
) -> ClusterResult:
    start = datetime.now(UTC)
    return ClusterResult(
        cluster,
        "a" * 40,
        results=[ApplyResult(ObjectKey("", "ConfigMap", "ns", f"o{i}"), o) for i, o in enumerate(outcomes)],
        failure=failure,
        started=start,
        finished=start + timedelta(seconds=1.5),
    )


def _families(metrics: Metrics) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def test_metrics_parse_and_carry_a_series_per_cluster() -> None:
    m = Metrics()
    m.record(_result("east", outcomes=(Outcome.CREATED, Outcome.UNCHANGED, Outcome.PRUNED)))
    m.record(_result("west", failure=ApiError("west", 401, "Unauthorized", reason="Unauthorized").failure()))
    m.cluster_state("west", failures=1, next_run=time.time() + 10, suspended=False)
    fams = _families(m)
    for name in (
        "gitops_agent_reconcile_duration_seconds",
        "gitops_agent_reconcile",
        "gitops_agent_reconcile_errors",
        "gitops_agent_last_success_timestamp_seconds",
        "gitops_agent_last_success_revision_info",
        "gitops_agent_objects",
        "gitops_agent_cluster_consecutive_failures",
        "gitops_agent_source_fetch_duration_seconds",
        "gitops_agent_source_failures",
    ):
        assert name in fams, sorted(fams)
    samples = [s for f in fams.values() for s in f.samples]
    clusters = {s.labels.get("cluster") for s in samples} - {None}
    assert clusters == {"east", "west"}
    by = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
    # A result without an app is the cluster entry's own app, named after it.
    east, west = (("app", "east"), ("cluster", "east")), (("app", "west"), ("cluster", "west"))
    assert by[("gitops_agent_reconcile_total", (*east, ("result", "success")))] == 1
    assert by[("gitops_agent_reconcile_errors_total", (*west, ("reason", "unauthorized")))] == 1
    assert by[("gitops_agent_objects", (*east, ("outcome", "pruned")))] == 1
    assert by[("gitops_agent_reconcile_duration_seconds_sum", east)] == 1.5
    assert by[("gitops_agent_cluster_consecutive_failures", west)] == 1


def test_the_revision_series_of_one_cluster_never_drops_another_clusters() -> None:
    m = Metrics()
    m.record(_result("east"))
    west = _result("west")
    west.revision = "b" * 40
    m.record(west)
    m.record(_result("east"))
    info = [s for s in _families(m)["gitops_agent_last_success_revision_info"].samples]
    assert sorted(s.labels["cluster"] for s in info) == ["east", "west"]
    m.remove("east")
    assert 'cluster="east"' not in m.render().decode()
    assert 'cluster="west"' in m.render().decode()


def _transport(kind: Transport, said: str) -> ApiError:
    return ApiError("x", 0, said, verb="GET", target="/api", transport=kind)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            ApiError("x", 401, "Unauthorized", reason="Unauthorized", verb="GET", target="/api"),
            "unauthorized",
        ),
        (ApiError("x", 403, "Forbidden", reason="Forbidden"), "forbidden"),  # a proxy's: no Status details
        (_transport(Transport.TLS, "TLS certificate verification failed (wrong CA?)"), "tls"),
        (_transport(Transport.CONNECTION_REFUSED, "connection refused"), "unreachable"),
        (_transport(Transport.CONNECT_TIMEOUT, "connection timed out"), "unreachable"),
        (_transport(Transport.NO_SUCH_HOST, "host name does not resolve"), "unreachable"),
        (_transport(Transport.READ_TIMEOUT, "request timed out"), "timeout"),
        (ClusterError("x", "write refused: lease lost", failure_reason=FailureReason.FENCED), "fenced"),
        (
            ClusterError("x", "cannot load credentials: no file", failure_reason=FailureReason.CREDENTIALS),
            "credentials",
        ),
        (RenderError([RenderProblem("a.yaml", "bad", 3)], cluster="x"), "render"),
        (
            ClusterRefused("x", Refusal.SHARED_CLUSTER, "entries 'x' and 'y' reach the same cluster"),
            "refused",
        ),
        (ApiError("x", 500, "boom", reason="InternalError", details=StatusDetails()), "api"),
    ],
)
def test_each_failure_has_a_reason_label_from_the_errors_type_and_status(
    error: AgentError, reason: str
) -> None:
    assert classify(_result("x", failure=error.failure())) == reason


def test_a_pass_whose_objects_failed_is_labelled_objects_and_a_good_pass_has_no_label() -> None:
    assert classify(_result("x", outcomes=(Outcome.CREATED, Outcome.FAILED))) == "objects"
    assert classify(_result("x", outcomes=(Outcome.CREATED,))) == ""


def test_backoff_doubles_to_its_cap_and_is_zero_after_success() -> None:
    assert [backoff_delay(n, base=10, cap=600) for n in range(9)] == [0, 10, 20, 40, 80, 160, 320, 600, 600]


def _get(port: int, path: str, method: str = "GET", token: str = "") -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=b"" if method == "POST" else None,
        headers=headers,
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_liveness_healthz_fails_only_when_the_agents_own_tick_stops() -> None:
    tick = [time.monotonic()]
    ready: list[str | None] = ["first source fetch pending"]
    synced: list[str] = []

    def sync(name: str) -> tuple[int, dict[str, Any]]:
        synced.append(name)
        return (202, {"cluster": name}) if name == "east" else (404, {"error": "no such cluster"})

    m = Metrics()
    # Every cluster failing is not the agent being stuck.
    for _ in range(20):
        m.record(
            _result("east", failure=_transport(Transport.CONNECTION_REFUSED, "connection refused").failure())
        )
    server = HealthServer(
        "127.0.0.1:0",
        metrics=m,
        last_tick=lambda: tick[0],
        ready=lambda: ready[0],
        status=lambda: {"clusters": [{"cluster": "east", "state": "failed"}]},
        sync=sync,
        stuck_after=1.0,
        token="t0ken",
    )
    server.start()
    try:
        assert _get(server.port, "/healthz") == (200, "ok\n")
        assert _get(server.port, "/readyz")[0] == 503
        ready[0] = None
        assert _get(server.port, "/readyz")[0] == 200
        assert json.loads(_get(server.port, "/status", token="t0ken")[1])["clusters"][0]["state"] == "failed"
        assert _get(server.port, "/sync?cluster=east", "POST", "t0ken")[0] == 202
        assert _get(server.port, "/sync?cluster=nope", "POST", "t0ken")[0] == 404
        assert _get(server.port, "/sync", "POST", "t0ken")[0] == 400
        assert synced == ["east", "nope"]
        tick[0] = time.monotonic() - 5
        code, body = _get(server.port, "/healthz")
        assert code == 503 and "stuck" in body
    finally:
        server.stop()
