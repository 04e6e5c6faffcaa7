"""A sink's redirect is a failure, never followed (``agent/notify/delivery.py``).

Real HTTP servers on loopback: a GitHub API stand-in that answers every commit status with a
redirect to another host (``localhost`` instead of ``127.0.0.1``), and that other host, which
records whatever reaches it. No cluster: delivery is the sink's own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.config.types import NotificationConfig, SecretRef, SinkKind
from agent.notify.delivery import Delivery, NotifyMetrics, Result
from agent.notify.policy import CommitState, StatusUpdate
from agent.notify.secrets import Masker
from agent.notify.sinks import Sink
from tests.waiting import wait_for

TOKEN = "ghp_the-sinks-own-token"


class _Server:
    """Answers every request with ``code`` (and ``Location: location``), recording each one."""

    def __init__(self, code: int, location: str = "") -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append((self.command, {k.lower(): v for k, v in self.headers.items()}))
                self.send_response(code)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def elsewhere() -> Iterator[_Server]:
    s = _Server(200)
    yield s
    s.stop()


def _delivery(api_url: str, token_file: Path) -> Delivery:
    cfg = NotificationConfig(
        name="github",
        kind=SinkKind.GITHUB,
        token=SecretRef(file=str(token_file)),
        api_url=api_url,
        repository="team/app",
        retries=0,
        timeout=5.0,
    )
    sink = Sink(
        cfg, 0, masker=Masker(), agent="gitops-agent", instance="i", public_url="", source_url=lambda c, a: ""
    )
    return Delivery(sink, NotifyMetrics(CollectorRegistry()))


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_commit_status_redirected_to_another_host_is_a_failure_and_its_token_never_leaves(
    tmp_path: Path, elsewhere: _Server, code: int
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    api = _Server(code, f"http://localhost:{elsewhere.port}/steal")
    delivery = _delivery(f"http://127.0.0.1:{api.port}", token_file)
    delivery.start()
    try:
        delivery.put(StatusUpdate("prod", "shop", "a" * 40, CommitState.SUCCESS, "applied", time.time()))
        wait_for("the status to be given up", lambda: delivery.idle() and sum(delivery.counts.values()), 10)
        assert delivery.counts[Result.FAILED] == 1 and delivery.counts[Result.SENT] == 0
        assert f"HTTP {code}" in delivery.last_error
        assert [m for m, _ in api.seen] == ["POST"]
        assert elsewhere.seen == []
    finally:
        delivery.stop()
        api.stop()
