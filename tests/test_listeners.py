"""The hardened listeners (``agent/run/listener.py``, ``agent/run/server.py``), on loopback, no cluster.

Who may act: ``POST /sync`` needs the token (refused on loopback too when none is configured),
``/status`` needs it when one is; a ``Host`` that is not ours (DNS rebinding) and a cross-site
``Origin`` on a write are refused. Slow clients: connections trickling their headers or body are
closed at the total deadline, however steadily they trickle, while ``/healthz`` keeps answering.
Forced passes are paced per app (``agent/run/synclimit.py``). docs/safety.md, "Threat model".
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from agent.cli import ops as cli_ops
from agent.config.load import load_config
from agent.run.listener import Limits, allowed_hosts, cross_site, host_allowed
from agent.run.receiver import Receiver
from agent.run.server import HealthServer, Metrics
from agent.run.synclimit import ForcedSyncs

TOKEN = "the-ui-token"


def _server(token: str = "", limits: Limits | None = None, **kw: Any) -> HealthServer:
    synced: list[str] = []

    def sync(name: str, app: str | None = None) -> tuple[int, dict[str, Any]]:
        synced.append(name)
        return 202, {"cluster": name, "next_run": "now"}

    server = HealthServer(
        "127.0.0.1:0",
        metrics=Metrics(),
        last_tick=time.monotonic,
        ready=lambda: None,
        status=lambda: {"clusters": []},
        sync=sync,
        token=token,
        limits=limits,
        **kw,
    )
    server.synced = synced  # type: ignore[attr-defined]
    return server


@pytest.fixture
def with_token() -> Iterator[HealthServer]:
    s = _server(TOKEN, allowed=allowed_hosts("https://gitops.example.com", ["agent.internal"]))
    s.start()
    yield s
    s.stop()


@pytest.fixture
def without_token() -> Iterator[HealthServer]:
    s = _server("")
    s.start()
    yield s
    s.stop()


def call(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_an_unauthenticated_sync_is_refused_and_without_a_token_configured_sync_is_off_even_on_loopback(
    with_token: HealthServer, without_token: HealthServer
) -> None:
    code, body = call(without_token.port, "POST", "/sync?cluster=east", bearer("anything"))
    assert code == 403 and b"ui_token_file" in body and b"--local" in body
    assert call(with_token.port, "POST", "/sync?cluster=east")[0] == 401
    assert call(with_token.port, "POST", "/sync?cluster=east", bearer("wrong"))[0] == 401
    assert without_token.synced == [] and with_token.synced == []  # type: ignore[attr-defined]
    assert call(with_token.port, "POST", "/sync?cluster=east", bearer())[0] == 202
    assert with_token.synced == ["east"]  # type: ignore[attr-defined]


def test_status_needs_the_token_when_one_is_configured_and_the_probes_and_metrics_stay_open(
    with_token: HealthServer, without_token: HealthServer
) -> None:
    assert call(with_token.port, "GET", "/status")[0] == 401
    assert call(with_token.port, "GET", "/status", bearer())[0] == 200
    assert call(without_token.port, "GET", "/status")[0] == 200
    for path in ("/healthz", "/readyz", "/metrics"):
        assert call(with_token.port, "GET", path)[0] == 200, path


@pytest.mark.parametrize(
    ("host", "code"),
    [
        ("rebound.attacker.example", 421),
        ("rebound.attacker.example:8080", 421),
        ("gitops.example.com.evil.example", 421),
        ("127.0.0.1:8080", 200),
        ("[::1]:8080", 200),
        ("10.1.2.3", 200),
        ("localhost:8080", 200),
        ("gitops.example.com", 200),
        ("GITOPS.example.com:443", 200),
        ("agent.internal", 200),
    ],
)
def test_every_request_naming_a_host_not_ours_is_refused(
    with_token: HealthServer, host: str, code: int
) -> None:
    assert call(with_token.port, "GET", "/status", {"Host": host, **bearer()})[0] == code


def test_a_cross_site_write_is_refused_even_with_the_token(with_token: HealthServer) -> None:
    host = {"Host": f"127.0.0.1:{with_token.port}"}
    for origin in ("https://evil.example", "file://", f"http://localhost:{with_token.port}"):
        assert (
            call(with_token.port, "POST", "/sync?cluster=east", {**host, **bearer(), "Origin": origin})[0]
            == 403
        )
    for site in ("cross-site", "same-site"):
        fetch = {**host, **bearer(), "Origin": "null", "Sec-Fetch-Site": site}
        assert call(with_token.port, "POST", "/sync?cluster=east", fetch)[0] == 403
    assert with_token.synced == []  # type: ignore[attr-defined]
    same = {**host, **bearer(), "Origin": f"http://127.0.0.1:{with_token.port}"}
    assert call(with_token.port, "POST", "/sync?cluster=east", same)[0] == 202
    # What our own sign-in form sends (the page's Referrer-Policy is no-referrer).
    ours = {**host, **bearer(), "Origin": "null", "Sec-Fetch-Site": "same-origin"}
    assert call(with_token.port, "POST", "/sync?cluster=east", ours)[0] == 202


def test_hosts_and_origins_are_compared_without_port_case_or_brackets() -> None:
    allowed = allowed_hosts("https://gitops.example.com/", ["Agent.Internal."])
    assert allowed == {"localhost", "gitops.example.com", "agent.internal"}
    assert host_allowed("AGENT.internal:80", allowed) and host_allowed("[fe80::1]", allowed)
    assert not host_allowed("", allowed) and not host_allowed("agent.internal.evil", allowed)
    assert not cross_site("http://127.0.0.1:8080", "127.0.0.1:8080")
    assert not cross_site("https://gitops.example.com", "gitops.example.com")
    assert cross_site("https://gitops.example.com", "gitops.example.com:80")
    assert not cross_site("null", "gitops.example.com", "same-origin")
    assert cross_site("null", "gitops.example.com", "cross-site")


SLOW = Limits(header_timeout=2.0, body_timeout=2.0, max_connections=100, threads=2, max_body_bytes=65536)


def _trickle(port: int, first: bytes, drip: bytes, closed_at: list[float], start: float) -> None:
    """Send ``first``, then ``drip`` one byte every 0.2 s (forever, as Slowloris does), noting
    when the server closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(first)
        s.settimeout(0.2)
        for i in range(200):
            try:
                if s.recv(1024) == b"":
                    break
            except TimeoutError:
                pass
            except OSError:
                break
            try:
                s.sendall(drip[i % len(drip) : i % len(drip) + 1])
            except OSError:
                break
        closed_at.append(time.monotonic() - start)


@pytest.mark.parametrize(
    ("what", "first", "drip"),
    [
        ("headers", b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-Slow: a\r\n"),
        ("body", b"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 60000\r\n\r\n", b"a"),
    ],
)
def test_twenty_slow_connections_are_dropped_at_the_deadline_while_healthz_keeps_answering(
    what: str, first: bytes, drip: bytes
) -> None:
    server = _server(TOKEN, limits=SLOW)
    server.start()
    try:
        start = time.monotonic()
        closed_at: list[float] = []
        threads = [
            threading.Thread(target=_trickle, args=(server.port, first, drip, closed_at, start), daemon=True)
            for _ in range(20)
        ]
        for t in threads:
            t.start()
        answered = 0
        while len(closed_at) < 20 and time.monotonic() - start < 8:
            began = time.monotonic()
            assert call(server.port, "GET", "/healthz")[0] == 200
            assert time.monotonic() - began < 1.0, "/healthz waited behind the slow clients"
            answered += 1
            time.sleep(0.1)
        for t in threads:
            t.join(5)
        assert len(closed_at) == 20, f"{20 - len(closed_at)} slow connections still open"
        # Closed at the 2 s deadline (checked every 0.25 s), not after the client stopped.
        assert max(closed_at) < SLOW.header_timeout + 1.0, closed_at
        assert min(closed_at) >= SLOW.header_timeout - 0.1, closed_at
        assert answered >= 5
        spread = f"{min(closed_at):.2f}-{max(closed_at):.2f} s"
        print(f"\nMEASURED 20 slow {what}: closed after {spread}; /healthz answered {answered}x meanwhile")
    finally:
        server.stop()


def test_a_keep_alive_connection_serves_requests_back_to_back_and_closes_when_idle() -> None:
    server = _server(TOKEN, limits=SLOW)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for _ in range(3):
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() == b"ok\n"
        sock = conn.sock
        assert sock is not None
        sock.settimeout(5)
        start = time.monotonic()
        assert sock.recv(1) == b""  # the server closed it
        assert time.monotonic() - start < SLOW.header_timeout + 1.0
        conn.close()
    finally:
        server.stop()


def test_forced_passes_are_paced_per_app_and_a_cluster_wide_one_counts_for_each_app() -> None:
    now = [100.0]
    syncs = ForcedSyncs(clock=lambda: now[0])
    assert syncs.take("east", "shop", 10) is None
    assert syncs.take("east", "shop", 10) == pytest.approx(10)
    assert syncs.take("east", "db", 10) is None  # another app: its own pace
    assert syncs.take("east", "", 10) == pytest.approx(10)  # every app: waits for the latest
    now[0] += 10.5
    assert syncs.take("east", "", 10) is None
    assert syncs.take("east", "shop", 10) == pytest.approx(10)  # the cluster-wide one included it
    assert syncs.take("west", "", 10) is None


def _half_closed(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got


def test_a_client_that_half_closes_gets_its_answer_and_a_short_body_is_answered_400(
    without_token: HealthServer,
) -> None:
    whole = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    assert _half_closed(without_token.port, whole).startswith(b"HTTP/1.1 200 ")
    short = b"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\ntoken"
    assert _half_closed(without_token.port, short).startswith(b"HTTP/1.1 400 ")


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    """A receiver with one GitHub hook and 2 s deadlines, on loopback (no daemon: pushes are noted)."""
    (tmp_path / "hook").write_text("hook-secret\n")
    (tmp_path / "kubeconfig").write_text("")
    cfg = load_config(_config(tmp_path))
    r = Receiver(cfg, on_push=lambda sources, why: None, registry=CollectorRegistry(), sources=dict)
    r.start()
    yield r
    r.stop()


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(
        f"""
[agent]
listen = ""
header_timeout = "2s"
allowed_hosts = ["hooks.example.com"]

[receiver]
listen = "127.0.0.1:0"
read_timeout = "2s"

[[receivers]]
name = "github"
kind = "github"
secret_file = "{tmp_path / "hook"}"
rate_limit = 1
burst = 1

[source]
url = "{tmp_path}"

[[clusters]]
name = "c"
kubeconfig = "kubeconfig"
path = "c"
"""
    )
    return path


def test_the_receiver_refuses_a_host_not_ours_and_unsigned_requests_never_use_up_the_hooks_limit(
    receiver: Receiver,
) -> None:
    push = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "d-1", "Content-Type": "application/json"}
    port = receiver.port
    assert call_body(port, "/hook/github", b"{}", {**push, "Host": "rebound.attacker.example"})[0] == 421
    for _ in range(5):  # the hook allows one request a minute: unsigned ones are not charged
        assert call_body(port, "/hook/github", b"{}", {**push, "X-Hub-Signature-256": "sha256=00"})[0] == 401
    sig = "sha256=" + hmac.new(b"hook-secret", b"{}", hashlib.sha256).hexdigest()
    ping = {**push, "X-GitHub-Event": "ping", "X-Hub-Signature-256": sig}
    assert call_body(port, "/hook/github", b"{}", ping)[0] == 200
    assert call_body(port, "/hook/github", b"{}", {**ping, "X-GitHub-Delivery": "d-2"})[0] == 429


@pytest.mark.parametrize(
    ("first", "drip"),
    [
        (b"POST /hook/github HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-Slow: a\r\n"),
        (b"POST /hook/github HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 60000\r\n\r\n", b"{"),
    ],
    ids=["headers", "body"],
)
def test_the_receiver_drops_slow_connections_at_its_deadlines(
    receiver: Receiver, first: bytes, drip: bytes
) -> None:
    start = time.monotonic()
    closed_at: list[float] = []
    threads = [
        threading.Thread(target=_trickle, args=(receiver.port, first, drip, closed_at, start), daemon=True)
        for _ in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(closed_at) == 20 and max(closed_at) < 3.0, closed_at


def call_body(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_gitops_agent_sync_sends_the_token_and_a_refusal_points_at_local(
    tmp_path: Path, with_token: HealthServer, without_token: HealthServer
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    for server, token_line, code in ((with_token, 'ui_token_file = "token"', 0), (without_token, "", 1)):
        path = tmp_path / f"agent-{server.port}.toml"
        path.write_text(
            f'[agent]\nlisten = "127.0.0.1:{server.port}"\n{token_line}\n[source]\nurl = "{tmp_path}"\n'
            '[[clusters]]\nname = "east"\nkubeconfig = "kubeconfig"\npath = "east"\n'
        )
        out = CliRunner().invoke(cli_ops.sync, ["--config", str(path), "--cluster", "east"])
        assert out.exit_code == code, out.output
    assert with_token.synced == ["east"] and without_token.synced == []  # type: ignore[attr-defined]
    assert "sync --local" in out.output and "403" not in out.output
