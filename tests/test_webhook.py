"""A mutating admission webhook does not make the agent fight it (issue 4; docs/safety.md rule 4).

A small HTTPS server on loopback (its own CA, made with ``cryptography``,
served from a thread) is registered with a real API server through a
``MutatingWebhookConfiguration`` (``clientConfig.url`` + ``caBundle``), scoped
by a ``namespaceSelector`` to this test's namespace so that the shared pool
cluster is otherwise untouched. Like a sidecar injector it adds a label and a
container to Deployments (and a label to ConfigMaps). After the agent's first
apply, further passes are no-ops: every outcome ``unchanged``, the webhook
receives no request carrying our field manager (every write of ours to those
objects would pass through it), and our managedFields entries keep their time.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import threading
from base64 import b64encode
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.model import Outcome
from tests.agentkit import E2E, make_repo, outcomes, unique, write_config
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster

SIDECAR = {"name": "mesh-proxy", "image": "registry.example/mesh-proxy:1.0", "args": ["--inbound", "8080"]}


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, Any] | None,
          *, ca: bool) -> x509.Certificate:  # fmt: skip
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pki(directory: Path) -> tuple[bytes, Path, Path]:
    """(CA bundle PEM, server cert file, server key file): a CA of our own and a cert for 127.0.0.1."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("webhook-test-ca", ca_key, None, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert("127.0.0.1", key, (ca.subject, ca_key), ca=False)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file


def _mutations(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """An injector's JSON patch: only what is missing, so a re-admitted object is left as it is."""
    ops: list[dict[str, Any]] = []
    labels = (obj.get("metadata") or {}).get("labels")
    if labels is None:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {"mesh": "injected"}})
    elif labels.get("mesh") != "injected":
        ops.append({"op": "add", "path": "/metadata/labels/mesh", "value": "injected"})
    if obj.get("kind") == "Deployment":
        containers = obj["spec"]["template"]["spec"]["containers"]
        if not any(c.get("name") == SIDECAR["name"] for c in containers):
            ops.append({"op": "add", "path": "/spec/template/spec/containers/-", "value": SIDECAR})
    return ops


class Injector:
    """The webhook: records each AdmissionReview (field manager, kind, operation) and mutates."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        request = body["request"]
        options = request.get("options") or {}
        with self.lock:
            self.seen.append(
                (str(options.get("fieldManager", "")), request["kind"]["kind"], request["operation"])
            )
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        ops = _mutations(request["object"])
        if ops:
            response |= {"patchType": "JSONPatch", "patch": b64encode(json.dumps(ops).encode()).decode()}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def calls_by(self, manager: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [s for s in self.seen if s[0] == manager]


@contextmanager
def serve(injector: Injector, cert: Path, key: Path) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            answer = json.dumps(injector.review(json.loads(raw))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="webhook", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _webhook_config(name: str, port: int, ca: bytes, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"{name}.injector.example.com",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/mutate",
                    "caBundle": b64encode(ca).decode(),
                },
                "rules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["deployments"],
                    },
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["configmaps"],
                    },
                ],
                "namespaceSelector": {"matchLabels": selector},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }


def _app(ns: str, selector: dict[str, str], greeting: str) -> dict[str, str]:
    (key, value), = selector.items()  # fmt: skip
    return {
        "clusters/pool-a/app.yaml": f"""
            apiVersion: v1
            kind: Namespace
            metadata:
              name: {ns}
              labels: {{{key}: {value}}}
            ---
            apiVersion: v1
            kind: ConfigMap
            metadata: {{name: settings, namespace: {ns}}}
            data: {{greeting: {greeting}}}
            ---
            apiVersion: apps/v1
            kind: Deployment
            metadata: {{name: web, namespace: {ns}, labels: {{app: web}}}}
            spec:
              replicas: 1
              selector: {{matchLabels: {{app: web}}}}
              template:
                metadata: {{labels: {{app: web}}}}
                spec:
                  containers:
                    - name: web
                      image: nginx:1.27
                      ports: [{{containerPort: 8080}}]
            """
    }


def _get(kubeconfig: Path, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))
    return result


def _our_entry_times(kubeconfig: Path, ns: str, manager: str) -> dict[str, str]:
    """When our field manager last wrote each object (its Apply entry's time)."""
    out = {}
    for kind in ("configmap/settings", "deployment/web"):
        entries = _get(kubeconfig, kind, "-n", ns, "--show-managed-fields")["metadata"]["managedFields"]
        out[kind] = next(e["time"] for e in entries if e["manager"] == manager and e["operation"] == "Apply")
    return out


def test_never_revert_a_mutating_webhook_later_passes_are_no_ops_with_zero_writes(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    cluster = cluster_pool["pool-a"]
    ns, name = e2e.namespace("webhook"), unique("injector")
    e2e.delete_after(cluster, "mutatingwebhookconfiguration", name)
    selector = {"gitops-agent-test/webhook": name}
    ca, cert, key = _pki(tmp_path)
    injector = Injector()
    repo = make_repo(tmp_path, _app(ns, selector, "hello"))
    config = write_config(tmp_path, repo, {"pool-a": cluster}, agent=unique("wh-agent"))
    manager = config.agent.name
    agent = e2e.agent(config)
    config_file = tmp_path / "webhook.json"
    with serve(injector, cert, key) as port:
        config_file.write_text(json.dumps(_webhook_config(name, port, ca, selector)))
        kubectl(cluster.kubeconfig, "apply", "--server-side", "-f", str(config_file))
        first = agent.reconcile()["pool-a"]
        assert first.ok, first.error
        assert first.count(Outcome.CREATED) == 3, outcomes(first)
        assert len(injector.calls_by(manager)) >= 2, injector.seen  # the webhook did mutate our writes
        deployment = _get(cluster.kubeconfig, "deployment/web", "-n", ns)
        assert deployment["metadata"]["labels"]["mesh"] == "injected"
        names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
        assert names == ["web", "mesh-proxy"]
        assert (
            _get(cluster.kubeconfig, "configmap/settings", "-n", ns)["metadata"]["labels"]["mesh"]
            == "injected"
        )

        written = len(injector.calls_by(manager))
        times = _our_entry_times(cluster.kubeconfig, ns, manager)
        generation = deployment["metadata"]["generation"]
        for _ in range(3):
            again = agent.reconcile()["pool-a"]
            assert again.ok, again.error
            assert set(outcomes(again).values()) == {"unchanged"}, outcomes(again)
        assert len(injector.calls_by(manager)) == written, "the agent wrote again: it fights the webhook"
        assert _our_entry_times(cluster.kubeconfig, ns, manager) == times
        assert _get(cluster.kubeconfig, "deployment/web", "-n", ns)["metadata"]["generation"] == generation

        # A Git change is applied; what the webhook added survives it, and calm returns.
        repo.commit(_app(ns, selector, "bonjour"), "new greeting")
        changed = agent.reconcile()["pool-a"]
        assert changed.ok and outcomes(changed)[f"ConfigMap/{ns}/settings"] == "configured"
        settings = _get(cluster.kubeconfig, "configmap/settings", "-n", ns)
        assert (
            settings["data"]["greeting"] == "bonjour" and settings["metadata"]["labels"]["mesh"] == "injected"
        )
        written = len(injector.calls_by(manager))
        calm = agent.reconcile()["pool-a"]
        assert set(outcomes(calm).values()) == {"unchanged"}, outcomes(calm)
        assert len(injector.calls_by(manager)) == written
        containers = _get(cluster.kubeconfig, "deployment/web", "-n", ns)["spec"]["template"]["spec"]
        assert [c["name"] for c in containers["containers"]] == ["web", "mesh-proxy"]
