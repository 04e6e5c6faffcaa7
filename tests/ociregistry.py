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
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.dev.ociregistry import Registry as DevRegistry
from agent.render.binaries import go_tool, tool
from agent.render.tools import helm_env
from tests.chartrepo import make_chart


def built_tool(name: str) -> Path:
    """A TEST_TOOL_ binary, or the test fails naming the command that builds it."""
    found = go_tool(name)
    if found is None:
        pytest.fail(f"{name} is not built: run scripts/install-go-tools {name}", pytrace=False)
    return found


class Registry(DevRegistry):
    """The loopback registry of ``agent.dev.ociregistry``, with charts made by ``make_chart`` and
    cosign signatures."""

    @contextmanager
    def serve(
        self, *, username: str = "", password: str = "", cert: tuple[Path, Path, Path] | None = None
    ) -> Iterator[Registry]:
        built_tool("registry")  # missing: the test fails naming the command that builds it
        with super().serve(username=username, password=password, cert=cert):
            yield self

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
        return self.push_archive(out / f"{name}-{version}.tgz")

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
