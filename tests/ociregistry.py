"""A real OCI registry on loopback for the chart tests: the CNCF distribution registry
(``TEST_TOOL_registry``, built by scripts/install-go-tools), its config file and storage in a
temporary directory, on a free port, optionally with htpasswd basic auth and TLS from a local CA.
Charts go in with the pinned `helm push`; cosign (``TEST_TOOL_cosign``) signs them with a local
key, no transparency log. A missing binary fails the test (it never skips)."""

from __future__ import annotations

import base64
import http.server
import json
import os
import secrets
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest

from agent.render.binaries import go_tool, tool
from agent.render.tools import helm_env
from tests.chartrepo import make_chart


def built_tool(name: str) -> Path:
    """A TEST_TOOL_ binary, or the test fails naming the command that builds it."""
    found = go_tool(name)
    if found is None:
        pytest.fail(f"{name} is not built: run scripts/install-go-tools {name}", pytrace=False)
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Registry:
    """A distribution registry's files under ``root``; ``serve`` runs it, ``push`` adds charts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.home = root / "helm-home"
        self.home.mkdir(exist_ok=True)
        self.src = root / "src"
        self.host = ""
        self.username = self.password = ""
        self.ca_file: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``oci://`` prefix the charts are pushed under (``<host>/charts``)."""
        return f"oci://{self.host}/charts"

    @contextmanager
    def serve(
        self, *, username: str = "", password: str = "", cert: tuple[Path, Path, Path] | None = None
    ) -> Iterator[Registry]:
        """Run the registry until the block ends; ``cert`` is (CA, serving cert, serving key)."""
        binary = built_tool("registry")
        self.username, self.password = username, password
        self.ca_file = cert[0] if cert else None
        lines = [
            "version: 0.1",
            "log:\n  level: warn\n  accesslog:\n    disabled: true",
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'storage'}",
            "  delete:\n    enabled: true",
            "http:",
            "  addr: 127.0.0.1:{port}",
            "  secret: test-only-secret",
        ]
        if cert:
            lines.append(f"  tls:\n    certificate: {cert[1]}\n    key: {cert[2]}")
        if username:
            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
            (self.root / "htpasswd").write_text(f"{username}:{hashed}\n")
            lines.append(f"auth:\n  htpasswd:\n    realm: charts\n    path: {self.root / 'htpasswd'}")
        log = self.root / "registry.log"
        for _ in range(5):  # a port taken between choosing and binding: choose again
            port = _free_port()
            config = self.root / "config.yml"
            config.write_text("\n".join(lines).replace("{port}", str(port)) + "\n")
            with open(log, "wb") as out:
                self._process = subprocess.Popen(
                    [str(binary), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT
                )
            self.host = f"127.0.0.1:{port}"
            if self._ready():
                break
            self._stop()
        else:
            pytest.fail(f"the registry did not start:\n{log.read_text()[-2000:]}", pytrace=False)
        try:
            yield self
        finally:
            self._stop()

    def _ready(self) -> bool:
        scheme = "https" if self.ca_file else "http"
        ctx = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{scheme}://{self.host}/v2/", timeout=1, context=ctx):
                    return True
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def _stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def _tls_flags(self) -> list[str]:
        return ["--ca-file", str(self.ca_file)] if self.ca_file else ["--plain-http"]

    def push(self, name: str, version: str, *, data: str = "hello") -> str:
        """Package a chart version with `helm package` and `helm push` it; its manifest digest."""
        chart = make_chart(self.src, f"{name}", version, data=data)
        out = self.src / "packages"
        subprocess.run(
            [str(tool("helm")), "package", str(chart), "--destination", str(out)],
            check=True,
            capture_output=True,
            env=helm_env(self.home),
        )
        creds = ["--username", self.username, "--password", self.password] if self.username else []
        done = subprocess.run(
            [
                str(tool("helm")),
                "push",
                str(out / f"{name}-{version}.tgz"),
                self.url,
                *self._tls_flags(),
                *creds,
            ],
            check=True,
            capture_output=True,
            text=True,
            env=helm_env(self.home),
        )
        digest = next(
            line.split()[-1] for line in (done.stdout + done.stderr).splitlines() if "Digest:" in line
        )
        return digest

    def sign(self, name: str, digest: str, key: Path, password: str = "") -> None:
        """`cosign sign --key` the chart's manifest, offline (no transparency log upload)."""
        env = {**os.environ, "COSIGN_PASSWORD": password, "HOME": str(self.home)}
        if self.ca_file:
            env["SSL_CERT_FILE"] = str(self.ca_file)
        creds = (
            ["--registry-username", self.username, "--registry-password", self.password]
            if self.username
            else []
        )
        subprocess.run(
            [
                str(built_tool("cosign")),
                "sign",
                "--key",
                str(key),
                "--tlog-upload=false",
                "--yes",
                *([] if self.ca_file else ["--allow-http-registry", "--allow-insecure-registry"]),
                *creds,
                f"{self.host}/charts/{name}@{digest}",
            ],
            check=True,
            capture_output=True,
            env=env,
            timeout=120,
        )


def cosign_key_pair(directory: Path, password: str = "") -> tuple[Path, Path]:
    """(private key, public key) made by `cosign generate-key-pair` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(built_tool("cosign")), "generate-key-pair"],
        cwd=directory,
        check=True,
        capture_output=True,
        env={**os.environ, "COSIGN_PASSWORD": password, "HOME": str(directory)},
        timeout=120,
    )
    return directory / "cosign.key", directory / "cosign.pub"


class TokenGate:
    """A bearer-token front for a registry, as Docker Hub or GHCR answer: ``/token`` hands a
    token for basic credentials (the registry's ``service`` and ``scope`` logged), every other
    request needs it (else ``401`` with a ``Bearer`` challenge) and is passed to the registry."""

    def __init__(self, registry: Registry, username: str, password: str) -> None:
        self.registry = registry
        self.expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.issued = "token-" + secrets.token_hex(8)
        self.host = ""
        #: (path without query, status) of every request answered.
        self.log: list[tuple[str, int]] = []

    @property
    def url(self) -> str:
        return f"oci://{self.host}/charts"

    @contextmanager
    def serve(self) -> Iterator[TokenGate]:
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                gate.log.append((self.path.split("?")[0], status))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path.startswith("/token?"):
                    if self.headers.get("Authorization") != gate.expected:
                        self.answer(401, b"{}", {})
                        return
                    token = json.dumps({"token": gate.issued, "expires_in": 300}).encode()
                    self.answer(200, token, {"Content-Type": "application/json"})
                    return
                if self.headers.get("Authorization") != f"Bearer {gate.issued}":
                    challenge = (
                        f'Bearer realm="http://{gate.host}/token",service="gate",'
                        f'scope="repository:charts/web:pull"'
                    )
                    self.answer(401, b"{}", {"WWW-Authenticate": challenge})
                    return
                ask = urllib.request.Request(
                    f"http://{gate.registry.host}{self.path}",
                    method=self.command,
                    headers={"Accept": self.headers.get("Accept", "*/*")},
                )
                try:
                    with urllib.request.urlopen(ask, timeout=10) as resp:
                        status, headers, body = resp.status, resp.headers, resp.read()
                except urllib.error.HTTPError as e:
                    status, headers, body = e.code, e.headers, e.read()
                kept = ("Content-Type", "Docker-Content-Digest", "Link")
                self.answer(status, body, {k: headers[k] for k in kept if k in headers})

            do_HEAD = do_GET

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
