"""Credentials of one local control plane (see ``agent.dev.localcluster``, its only caller).

Certificates and keys (``ensure_pki``), kubeconfigs (``write_kubeconfig``),
ServiceAccount tokens (``service_account_token``, ``delete_service_account``)
and the small HTTPS client that authenticates with them (``https``).

``ensure_pki(directory)`` creates, once, everything a local cluster needs to
serve TLS and authenticate its users, and returns the same files on every
later call, so a restarted cluster keeps its identity and the tokens it
issued stay valid:

- a CA (``ca.crt``/``ca.key``) that signs everything below and is the
  apiserver's ``--client-ca-file``;
- the apiserver serving certificate (SAN 127.0.0.1, ::1, localhost and the
  in-cluster ``kubernetes.default.svc`` names);
- client certificates for the admin (``O=system:masters``) and for
  kube-controller-manager;
- the ServiceAccount token signing key pair (``sa.key``/``sa.pub``).
"""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.errors import LocalClusterError

# Long enough that a state directory never outlives its certificates in practice.
_VALIDITY = datetime.timedelta(days=3650)
_SERVING_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
# 10.0.0.1 is the first address of --service-cluster-ip-range: the `kubernetes` Service's IP.
_SERVING_IPS = ("127.0.0.1", "::1", "10.0.0.1")

_PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class Pki:
    """Paths of one cluster's certificates and keys (PEM files)."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def controller_manager_cert(self) -> Path:
        return self.directory / "controller-manager.crt"

    @property
    def controller_manager_key(self) -> Path:
        return self.directory / "controller-manager.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    def complete(self) -> bool:
        files = (
            self.ca_cert,
            self.ca_key,
            self.serving_cert,
            self.serving_key,
            self.admin_cert,
            self.admin_key,
            self.controller_manager_cert,
            self.controller_manager_key,
            self.sa_key,
            self.sa_pub,
        )
        return all(f.is_file() for f in files)


def ensure_pki(directory: Path, *, cluster_name: str) -> Pki:
    """Create the cluster's PKI under ``directory`` unless it is already complete; return its paths.

    A half-written PKI (a crash mid-way) is regenerated whole: certificates
    signed by a CA that no longer exists would be useless.
    """
    pki = Pki(directory)
    if pki.complete():
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_key = _ec_key()
    ca_cert = _ca_certificate(ca_key, f"gitops-agent local CA ({cluster_name})")
    _write_pair(pki.ca_cert, pki.ca_key, ca_cert, ca_key)
    _issue(pki.serving_cert, pki.serving_key, ca_cert, ca_key, cn="kube-apiserver", server=True)
    _issue(pki.admin_cert, pki.admin_key, ca_cert, ca_key, cn="gitops-agent-admin", org="system:masters")
    # Controllers run with this identity (--use-service-account-credentials=false), so it needs
    # every right the garbage collector and namespace controller use: system:masters is the simple way.
    _issue(
        pki.controller_manager_cert,
        pki.controller_manager_key,
        ca_cert,
        ca_key,
        cn="system:kube-controller-manager",
        org="system:masters",
    )
    # RSA because RS256 is the ServiceAccount token algorithm every client and verifier supports.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def ensure_client_cert(pki: Pki, stem: str, *, cn: str, org: str | None = None) -> tuple[Path, Path]:
    """``STEM.crt``/``STEM.key``: a client certificate for ``cn`` signed by the cluster's CA, made once.

    For identities only some clusters use (the simulated kubelets' components): issued when first
    needed, so a PKI made before they existed is extended, not regenerated.
    """
    cert_path, key_path = pki.directory / f"{stem}.crt", pki.directory / f"{stem}.key"
    if cert_path.is_file() and key_path.is_file():
        return cert_path, key_path
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise LocalClusterError(f"{pki.ca_key}: expected the EC key this module writes")
    _issue(cert_path, key_path, ca_cert, ca_key, cn=cn, org=org)
    return cert_path, key_path


def _ec_key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys are generated in microseconds; RSA would add ~100 ms per certificate to a cold start.
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        # Back-dated a little so a clock that differs by seconds between processes never rejects it.
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _ca_certificate(key: ec.EllipticCurvePrivateKey, cn: str) -> x509.Certificate:
    name = _name(cn)
    return (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )


def _issue(
    cert_path: Path,
    key_path: Path,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    cn: str,
    org: str | None = None,
    server: bool = False,
) -> None:
    key = _ec_key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(_name(cn, org), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        # Python 3.13's default TLS verification (VERIFY_X509_STRICT) requires the AKI.
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in _SERVING_DNS]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVING_IPS]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    _write_pair(cert_path, key_path, builder.sign(ca_key, hashes.SHA256()), key)


def _write_pair(cert_path: Path, key_path: Path, cert: x509.Certificate, key: _PrivateKey) -> None:
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: _PrivateKey) -> None:
    write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def write_kubeconfig(
    path: Path, cluster: str, server: str, ca_cert: Path, user: str, credentials: Mapping[str, Any]
) -> None:
    """Write a one-context kubeconfig (context and cluster named ``cluster``) readable only by us."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": cluster, "cluster": {"server": server, "certificate-authority-data": b64(ca_cert)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }
    write_private(path, yaml.safe_dump(config, sort_keys=False).encode())


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` with mode 0600, atomically: a reader never sees half a file, and the path stays."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


# ---------------------------------------------------------------- ServiceAccount tokens and HTTPS


@dataclass(frozen=True)
class Endpoint:
    """A running apiserver on 127.0.0.1 and the PKI to reach it with."""

    cluster: str
    port: int
    pki: Pki


def split_service_account(service_account: str) -> tuple[str, str]:
    ns, sep, sa = service_account.partition("/")
    if not sep or not ns or not sa or "/" in sa:
        raise LocalClusterError(f"service account {service_account!r}: expected NAMESPACE/NAME")
    return ns, sa


def service_account_token(
    endpoint: Endpoint, ns: str, sa: str, *, cluster_role: str | None, lifetime_seconds: int
) -> str:
    """A bound token (TokenRequest API) for ``ns/sa``, creating the namespace, account and binding."""
    _ensure(endpoint, "/api/v1/namespaces", "Namespace", {"metadata": {"name": ns}})
    _ensure(
        endpoint, f"/api/v1/namespaces/{ns}/serviceaccounts", "ServiceAccount", {"metadata": {"name": sa}}
    )
    if cluster_role is not None:
        rbac = "rbac.authorization.k8s.io"
        _ensure(
            endpoint,
            f"/apis/{rbac}/v1/clusterrolebindings",
            "ClusterRoleBinding",
            {
                "apiVersion": f"{rbac}/v1",
                "metadata": {"name": f"gitops-agent-local:{ns}:{sa}:{cluster_role}"},
                "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": cluster_role},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
            },
        )
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": lifetime_seconds},
    }
    code, body = https(endpoint, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", request)
    if code != 201:
        raise LocalClusterError(f"{endpoint.cluster}: TokenRequest for {ns}/{sa} failed: HTTP {code}: {body}")
    token: str = body["status"]["token"]
    return token


def delete_service_account(
    endpoint: Endpoint, ns: str, sa: str, bearer: str | None, *, timeout: float
) -> None:
    """Delete ``ns/sa`` and wait until ``bearer`` (one of its tokens) is refused with 401.

    The wait is needed: the apiserver caches successful token authentications for ~10 s.
    """
    code, body = https(endpoint, "DELETE", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}")
    if code not in (200, 404):
        raise LocalClusterError(f"{endpoint.cluster}: deleting ServiceAccount {ns}/{sa}: HTTP {code}: {body}")
    deadline = time.monotonic() + timeout
    while bearer is not None and https(endpoint, "GET", "/api", admin=False, token=bearer)[0] != 401:
        if time.monotonic() > deadline:
            raise LocalClusterError(f"{endpoint.cluster}: {ns}/{sa}'s token still valid {timeout:.0f}s later")
        time.sleep(0.2)


def _ensure(endpoint: Endpoint, collection: str, kind: str, obj: dict[str, Any]) -> None:
    manifest = {"apiVersion": "v1", "kind": kind, **obj}
    code, body = https(endpoint, "POST", collection, manifest)
    if code not in (201, 409):  # 409: it exists already, which is all we need
        what = f"{kind} {obj['metadata']['name']}"
        raise LocalClusterError(f"{endpoint.cluster}: creating {what} failed: HTTP {code}: {body}")


def https(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: Any = None,
    *,
    admin: bool = True,
    token: str | None = None,
    timeout: float = 10.0,
) -> tuple[int, Any]:
    """One request: (status, JSON-decoded body or text). ``admin`` presents the system:masters cert.

    Raises ``OSError`` (``TimeoutError`` included) when nothing answers.
    """
    context = ssl.create_default_context(cafile=str(endpoint.pki.ca_cert))
    if admin:
        context.load_cert_chain(str(endpoint.pki.admin_cert), str(endpoint.pki.admin_key))
    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPSConnection("127.0.0.1", endpoint.port, context=context, timeout=timeout)
    try:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        raw = response.read().decode(errors="replace")
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw
