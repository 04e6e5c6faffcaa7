"""Real HTTP servers on loopback standing for Slack, a generic webhook receiver and the GitHub and
GitLab APIs (no tests of its own), and helpers to add notification settings to a test config.

``Sink`` records every request (method, path, headers, JSON body, when it arrived) and answers as
told: ``ok`` (201), ``fail`` (500), or ``hang`` (never answers until the sink stops: the agent's
timeout ends each attempt). ``wait_for`` in ``tests/waiting.py`` waits for what it records.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent.config.load import load_config
from agent.config.types import Config


@dataclass(frozen=True)
class Received:
    """One request as the server read it; ``headers`` by lower-case name (HTTP's are case-blind)."""

    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    at: float

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


class Sink:
    """An HTTP server on 127.0.0.1 recording requests; ``mode`` = ``ok`` | ``fail`` | ``hang``."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with outer._lock:
                    outer.received.append(
                        Received(
                            "POST",
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            raw,
                            time.monotonic(),
                        )
                    )
                if outer.mode == "hang":
                    outer._release.wait(60)
                    return
                code = 500 if outer.mode == "fail" else 201
                body = b'{"ok": true}' if code == 201 else b'{"message": "boom"}'
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def requests(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def events(self) -> list[dict[str, Any]]:
        """The JSON bodies received, in order."""
        return [r.json for r in self.requests()]

    def stop(self) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def secret_file(directory: Path, name: str, value: str) -> Path:
    p = directory / name
    p.write_text(value + "\n")
    return p


def add_lines(cfg: Config, text: str, *, agent_lines: str = "") -> Config:
    """``cfg`` with ``text`` (tables) appended and ``agent_lines`` added to ``[agent]``, reloaded."""
    path = Path(cfg.file)
    body = path.read_text()
    if agent_lines:
        body = body.replace("[agent]\n", f"[agent]\n{agent_lines}\n", 1)
    path.write_text(body + "\n" + text + "\n")
    return load_config(path)


def stamp(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(notification, reason, cluster/app) of each Flux-shaped event."""
    return [
        (
            e["metadata"]["notification"],
            e["reason"],
            f"{e['involvedObject']['namespace']}/{e['involvedObject']['name']}",
        )
        for e in events
    ]
