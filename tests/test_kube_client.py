"""The cluster client's HTTP behaviour: 429 with Retry-After, and transport failures as ApiError.

Throttling is HTTP, not Kubernetes semantics, so a plain loopback server that
answers 429 stands in for an overloaded API server here; everything that is a
Kubernetes behaviour is tested against real API servers elsewhere.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.dev.pki import write_kubeconfig
from agent.errors import ApiError
from agent.kube.client import KubeClient
from agent.kube.connection import credential_patch_installed, install_credential_patch

ROOT = Path(__file__).resolve().parent.parent


class Throttling:
    """Answers 429 (Retry-After: 1) to the first ``throttle`` requests, then 200 with a JSON body."""

    def __init__(self, throttle: int) -> None:
        self.throttle = throttle
        self.times: list[float] = []
        #: Each request's ``Impersonate-User`` ("": none).
        self.users: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.times.append(time.monotonic())
                outer.users.append(self.headers.get("Impersonate-User") or "")
                if len(outer.times) <= outer.throttle:
                    body = json.dumps({"kind": "Status", "reason": "TooManyRequests", "message": "slow down"})
                    self.send_response(429)
                    self.send_header("Retry-After", "1")
                else:
                    body = json.dumps({"gitVersion": "v1.35.4"})
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def throttled(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Throttling, KubeClient]]:
    server = Throttling(request.param)
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": server.url}}],
                "users": [{"name": "t", "user": {"token": "x"}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            }
        )
    )
    client = KubeClient.connect("throttled", kubeconfig=str(kubeconfig), request_timeout=5)
    yield server, client
    client.close()
    server.server.shutdown()
    server.server.server_close()


@pytest.mark.parametrize("throttled", [2], indirect=True)
def test_429_is_retried_after_the_servers_retry_after(throttled: tuple[Throttling, KubeClient]) -> None:
    server, client = throttled
    assert client.server_version() == "v1.35.4"
    assert len(server.times) == 3
    gaps = [b - a for a, b in zip(server.times, server.times[1:], strict=False)]
    assert all(g >= 0.9 for g in gaps), gaps


@pytest.mark.parametrize("throttled", [100], indirect=True)
def test_429_retries_are_bounded_and_end_in_an_api_error_carrying_retry_after(
    throttled: tuple[Throttling, KubeClient],
) -> None:
    server, client = throttled
    with pytest.raises(ApiError) as caught:
        client.server_version()
    assert caught.value.status == 429 and caught.value.retry_after == 1.0 and caught.value.retryable
    assert len(server.times) == 4  # the first try and three retries


@pytest.mark.parametrize("throttled", [0], indirect=True)
def test_a_view_acting_as_a_service_account_shares_the_connection_and_asks_the_version_as_the_agent(
    throttled: tuple[Throttling, KubeClient],
) -> None:
    server, client = throttled
    tenant = client.impersonating("team-a/deployer")
    assert tenant.connection is client.connection and tenant.impersonating("") is not tenant
    assert client.impersonating("") is client and tenant.impersonating("team-a/deployer") is tenant
    tenant.request("GET", "/apis")
    assert tenant.server_version() == "v1.35.4"  # the agent's read, cached for the client and its views
    assert client.server_version() == "v1.35.4"
    assert server.users == ["system:serviceaccount:team-a:deployer", ""]
    tenant.close()  # a view closes nothing: the agent's client still works
    client.request("GET", "/version")
    assert server.users[-1] == ""


@pytest.mark.parametrize("throttled", [0], indirect=True)
def test_the_request_count_of_a_client_and_its_views_is_exact_across_threads(
    throttled: tuple[Throttling, KubeClient],
) -> None:
    _, client = throttled
    views = [client, client.impersonating("a/one"), client.impersonating("b/two")]

    def send(view: KubeClient) -> None:
        for _ in range(20):
            view.request("GET", "/version")

    workers = [threading.Thread(target=send, args=(views[i % 3],)) for i in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert client.requests == 120 and all(v.requests == 120 for v in views)


_PATCH_STATE = """
import json
from kubernetes.config import kube_config
import agent.cli.main, agent.kube.client, agent.run.fleet  # everything a command imports
from agent.kube.connection import credential_patch_installed, install_credential_patch
imported = credential_patch_installed()
install_credential_patch()
installed = kube_config._create_temp_file_with_content
install_credential_patch()
once = kube_config._create_temp_file_with_content is installed
print(json.dumps([imported, credential_patch_installed(), once]))
"""


def test_the_credential_patch_is_a_start_up_step_installed_once_not_an_import_side_effect() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PATCH_STATE],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    imported, installed, once = json.loads(out.stdout)
    assert not imported, "importing the agent patched the official client"
    assert installed and once, "installing twice wrapped the loader twice"


def test_connecting_installs_the_credential_patch_before_loading_credentials(tmp_path: Path) -> None:
    cert = f"-----BEGIN CERTIFICATE-----\n{os.urandom(16).hex()}\n-----END CERTIFICATE-----\n"
    kubeconfig = _kubeconfig_with_client_certificate(tmp_path / "kubeconfig", cert)
    script = (
        "from agent.kube.client import KubeClient\n"
        "from agent.kube.connection import credential_patch_installed\n"
        "before = credential_patch_installed()\n"
        f"KubeClient.connect('c', kubeconfig={str(kubeconfig)!r}).close()\n"
        "print(before, credential_patch_installed())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.stdout.split() == ["False", "True"]
    install_credential_patch()  # and in this process too: idempotent whatever ran before
    assert credential_patch_installed()


def test_a_closed_port_is_a_status_0_api_error_saying_connection_refused(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "t", "user": {"token": "x"}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            }
        )
    )
    client = KubeClient.connect("gone", kubeconfig=str(kubeconfig))
    with pytest.raises(ApiError) as caught:
        client.server_version()
    client.close()
    assert caught.value.status == 0 and "connection refused" in str(caught.value)


def test_warning_headers_are_read_one_text_each_with_escaped_quotes_kept() -> None:
    from agent.kube.status import warnings

    values = ['299 - "policy/v1beta1 PodDisruptionBudget is deprecated"', '299 - "a \\"q\\" b", 299 - "two"']
    assert warnings(values) == ["policy/v1beta1 PodDisruptionBudget is deprecated", 'a "q" b', "two"]
    assert warnings(['299 - "two"']) == ["two"] and warnings([]) == []


def _kubeconfig(path: Path, credentials: dict[str, Any]) -> Path:
    ca = path.with_suffix(".ca")
    ca.write_text("-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n")
    write_kubeconfig(path, "c", "https://127.0.0.1:1", ca, "u", credentials)
    return path


def _kubeconfig_with_client_certificate(path: Path, cert: str) -> Path:
    data = base64.b64encode(cert.encode()).decode()
    return _kubeconfig(path, {"client-certificate-data": data, "client-key-data": data})


def _certificate_files_read_by_clients_loading_at_once(kubeconfig: Path, threads: int) -> list[str]:
    start = threading.Barrier(threads)
    seen: list[str] = []

    def load() -> None:
        start.wait()
        client = KubeClient.connect("c", kubeconfig=str(kubeconfig))
        seen.append(Path(client.api.configuration.cert_file).read_text())  # what TLS setup reads next
        client.close()

    workers = [threading.Thread(target=load) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return seen


def test_clients_loading_one_certificate_at_once_each_get_the_whole_certificate_file(tmp_path: Path) -> None:
    """One cluster reached by two URLs loads the same client certificate on two threads at once.

    The official loader writes embedded certificates to cached files; its cache names a file before
    the file is written, so a concurrent load could get an empty one and fail TLS with "PEM lib".
    """
    threads = 8
    for round_ in range(40):
        # Fresh content every round: the loader's cache is keyed by content, so each round races anew.
        cert = f"-----BEGIN CERTIFICATE-----\n{round_} {os.urandom(4096).hex()}\n-----END CERTIFICATE-----\n"
        kubeconfig = _kubeconfig_with_client_certificate(tmp_path / f"kubeconfig-{round_}", cert)
        seen = _certificate_files_read_by_clients_loading_at_once(kubeconfig, threads)
        assert seen == [cert] * threads, f"round {round_}: a client read a partly written certificate file"


def test_one_clusters_slow_exec_plugin_does_not_hold_up_another_clusters_credentials(tmp_path: Path) -> None:
    """Loading runs exec plugins (cloud token helpers, often seconds); only the file step is shared."""
    release = tmp_path / "release"
    plugin = tmp_path / "token-helper"
    api_version = "client.authentication.k8s.io/v1"
    credential = {"apiVersion": api_version, "kind": "ExecCredential", "status": {"token": "t"}}
    plugin.write_text(
        f"#!/bin/sh\nwhile [ ! -e '{release}' ]; do sleep 0.05; done\necho '{json.dumps(credential)}'\n"
    )
    plugin.chmod(0o755)
    exec_user = {"exec": {"apiVersion": api_version, "command": str(plugin)}}
    slow = _kubeconfig(tmp_path / "kubeconfig-slow", exec_user)
    cert = f"-----BEGIN CERTIFICATE-----\n{os.urandom(64).hex()}\n-----END CERTIFICATE-----\n"
    fast = _kubeconfig_with_client_certificate(tmp_path / "kubeconfig-fast", cert)
    loaded: dict[str, KubeClient] = {}

    def connect(name: str, kubeconfig: Path) -> None:
        loaded[name] = KubeClient.connect(name, kubeconfig=str(kubeconfig))

    waiting = threading.Thread(target=connect, args=("slow", slow))
    waiting.start()
    try:
        other = threading.Thread(target=connect, args=("fast", fast))
        other.start()
        other.join(timeout=30)  # a bound only for a regression: this takes milliseconds
        assert "fast" in loaded, "a cluster's credentials waited for another cluster's exec plugin"
        assert Path(loaded["fast"].api.configuration.cert_file).read_text() == cert
        assert waiting.is_alive(), "the plugin returned before it was released: the test proved nothing"
    finally:
        release.touch()
        waiting.join()
        other.join()
    assert loaded["slow"].api.configuration.api_key["BearerToken"] == "Bearer t"
    for client in loaded.values():
        client.close()
