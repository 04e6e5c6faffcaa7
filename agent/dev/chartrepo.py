"""A Helm chart repository on loopback, as a team serves one: charts packaged with the pinned
``helm package``, indexed with ``helm repo index``, served over HTTP (optionally with basic auth,
or TLS from a local CA) with an ETag on every file, so a poll of an unchanged ``index.yaml`` is one
request that downloads nothing. ``gitops-agent demo`` installs its third app from one; the tests'
repositories (``tests/chartrepo.py``) are this server too.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.render.binaries import tool
from agent.render.tools import helm_env, load_chart_yaml

#: (method, path, status, had an Authorization header) of one request the server answered.
Request = tuple[str, str, int, bool]


class ChartRepository:
    """A directory of packaged charts and its index; ``serve`` puts it on loopback."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.home = root.parent / f"{root.name}-home"  # helm's own cache and config, not the user's
        self.home.mkdir(exist_ok=True)
        self.log: list[Request] = []
        self.url = ""

    def helm(self, *args: str) -> None:
        subprocess.run([str(tool("helm")), *args], check=True, capture_output=True, env=helm_env(self.home))

    def package(self, chart: Path, version: str) -> Path:
        """Package the chart directory as ``version`` and index the repository again."""
        self.helm("package", str(chart), "--destination", str(self.root), "--version", version)
        self.index()
        return self.root / f"{_chart_name(chart)}-{version}.tgz"

    def index(self) -> None:
        self.helm("repo", "index", str(self.root))

    @contextmanager
    def serve(
        self, *, username: str = "", password: str = "", cert: tuple[Path, Path] | None = None
    ) -> Iterator[ChartRepository]:
        """Serve the directory on a free loopback port until the block ends; ``url`` says where."""
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, username, password))
        scheme = "http"
        if cert is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, name="chart-repository", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


def _chart_name(chart: Path) -> str:
    meta = load_chart_yaml((chart / "Chart.yaml").read_text())
    return str(meta["name"]) if isinstance(meta, dict) and meta.get("name") else chart.name


def _handler(repo: ChartRepository, username: str, password: str) -> type[http.server.BaseHTTPRequestHandler]:
    expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # the log list holds what was asked; stderr stays the caller's

        def answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            repo.log.append(("GET", self.path, status, "Authorization" in self.headers))
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if username and self.headers.get("Authorization") != expected:
                self.answer(401, b"unauthorized", {"WWW-Authenticate": 'Basic realm="charts"'})
                return
            path = repo.root / self.path.lstrip("/").split("?")[0]
            if not path.is_file() or repo.root.resolve() not in path.resolve().parents:
                self.answer(404)
                return
            body = path.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            if self.headers.get("If-None-Match") == etag:
                self.answer(304, b"", {"ETag": etag})
                return
            self.answer(200, body, {"ETag": etag})

    return Handler
