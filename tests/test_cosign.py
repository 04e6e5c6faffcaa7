"""The pure check of a cosign signature (``agent.source.cosign.check``): an ECDSA P-256
signature over the simple-signing payload, and the payload naming the chart's manifest."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from agent.source.cosign import check, signature_tag

MANIFEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def payload(digest: str) -> bytes:
    body = {
        "critical": {
            "identity": {"docker-reference": "127.0.0.1:5000/charts/web"},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    return json.dumps(body).encode()


def sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> str:
    return base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()


KEY = ec.generate_private_key(ec.SECP256R1())


def test_a_signature_of_the_manifest_by_the_key_checks_out() -> None:
    assert check(pem(KEY), MANIFEST, payload(MANIFEST), sign(KEY, payload(MANIFEST))) == ""
    assert signature_tag(MANIFEST) == "sha256-" + "ab" * 32 + ".sig"


@pytest.mark.parametrize(
    ("public", "signed_for", "signature", "why"),
    [
        (pem(ec.generate_private_key(ec.SECP256R1())), MANIFEST, None, "does not verify"),
        (pem(KEY), OTHER, None, "not the chart's manifest"),
        (pem(KEY), MANIFEST, "not base64!", "not base64"),
        (pem(KEY), MANIFEST, base64.b64encode(b"garbage").decode(), "does not verify"),
        (pem(ec.generate_private_key(ec.SECP384R1())), MANIFEST, None, "not an ECDSA P-256 key"),
        (pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)), MANIFEST, None, "P-256"),
        (b"-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n", MANIFEST, None, "not a PEM"),
    ],
)
def test_a_signature_that_does_not_check_out_says_why(
    public: bytes, signed_for: str, signature: str | None, why: str
) -> None:
    body = payload(signed_for)
    assert why in check(public, MANIFEST, body, signature or sign(KEY, body))


def test_a_payload_without_a_manifest_digest_is_refused_even_when_signed() -> None:
    body = b'{"critical": {}}'
    assert "names no manifest digest" in check(pem(KEY), MANIFEST, body, sign(KEY, body))
