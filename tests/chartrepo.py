"""A Helm chart repository on loopback: charts made with the pinned `helm package`, indexed with
`helm repo index`, served by a small HTTP server (optionally with basic auth, or TLS from a
local CA) that answers `index.yaml` with an ETag and logs every request it answers."""

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
from agent.render.tools import helm_env


def make_chart(src: Path, name: str, version: str, *, data: str = "hello") -> Path:
    """A chart directory whose one ConfigMap says its version and ``data``."""
    d = src / f"{name}-{version}" / name
    (d / "templates").mkdir(parents=True, exist_ok=True)
    (d / "Chart.yaml").write_text(f"apiVersion: v2\nname: {name}\nversion: {version}\n")
    (d / "values.yaml").write_text(f"greeting: {data}\nreplicas: 1\n")
    (d / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Chart.Name }}\n"
        "data:\n  version: {{ .Chart.Version | quote }}\n  greeting: {{ .Values.greeting | quote }}\n"
        "  replicas: {{ .Values.replicas | quote }}\n"
    )
    return d


class ChartRepo:
    """A directory of packaged charts and its index; ``serve`` puts it on loopback."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.src = root.parent / f"{root.name}-src"
        root.mkdir(parents=True, exist_ok=True)
        self.home = root.parent / f"{root.name}-home"
        self.home.mkdir(exist_ok=True)
        #: (method, path, status, had an Authorization header) of every request answered.
        self.log: list[tuple[str, str, int, bool]] = []
        self.url = ""
        self.username = ""
        self.password = ""

    def helm(self, *args: str) -> None:
        subprocess.run([str(tool("helm")), *args], check=True, capture_output=True, env=helm_env(self.home))

    def publish(self, name: str, version: str, *, data: str = "hello", sign: tuple[str, ...] = ()) -> Path:
        """Package a chart version into the repository and index it again; ``sign``: the
        arguments of `helm package --sign` (``tests.chartsign.SigningKey.args``)."""
        chart = make_chart(self.src, name, version, data=data)
        self.helm("package", str(chart), "--destination", str(self.root), *sign)
        self.index()
        return self.root / f"{name}-{version}.tgz"

    def index(self) -> None:
        self.helm("repo", "index", str(self.root))

    def digest(self, archive: Path) -> str:
        return hashlib.sha256(archive.read_bytes()).hexdigest()

    def requests(self, path_end: str) -> list[tuple[str, str, int, bool]]:
        return [r for r in self.log if r[1].endswith(path_end)]

    @contextmanager
    def serve(
        self, *, username: str = "", password: str = "", cert: tuple[Path, Path] | None = None
    ) -> Iterator[ChartRepo]:
        repo = self
        self.username, self.password = username, password
        expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

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
                if not path.is_file() or repo.root not in path.resolve().parents:
                    self.answer(404)
                    return
                body = path.read_bytes()
                etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                if self.headers.get("If-None-Match") == etag:
                    self.answer(304, b"", {"ETag": etag})
                    return
                self.answer(200, body, {"ETag": etag})

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if cert is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
