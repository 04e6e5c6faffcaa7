"""Cosign signatures of OCI charts, checked offline against a public key.

Called by ``source.oci`` when a ``[[helm_repositories]]`` entry has ``verify = true``: `cosign sign
--key` stores, at tag ``sha256-<hex>.sig`` beside the chart, a layer whose bytes are a "simple
signing" JSON payload naming the signed manifest's digest, and whose annotation holds the
base64 ECDSA signature of those bytes. ``check`` is the pure part: the signature verifies with
the key (P-256, SHA-256), and the payload names the chart's manifest. No transparency log and
no certificate chain are consulted: the key is the trust, as `cosign verify --key
--insecure-ignore-tlog` has it.
"""

from __future__ import annotations

import base64
import binascii
import json

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["PAYLOAD_TYPE", "SIGNATURE_ANNOTATION", "check", "signature_tag"]

#: Media type of a signature layer (its bytes are the signed payload).
PAYLOAD_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
#: The layer annotation holding the base64 signature.
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"


def signature_tag(manifest_digest: str) -> str:
    """Where cosign puts the signatures of ``sha256:<hex>``: tag ``sha256-<hex>.sig``."""
    return manifest_digest.replace(":", "-", 1) + ".sig"


def check(public_key_pem: bytes, manifest_digest: str, payload: bytes, signature_b64: str) -> str:
    """ "" when ``signature_b64`` is the key's signature of ``payload`` and the payload names
    ``manifest_digest``; else what is wrong (never the key nor the signature)."""
    try:
        key = serialization.load_pem_public_key(public_key_pem)
    except (ValueError, TypeError):
        return "cosign_public_key_file is not a PEM public key"
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        return "cosign_public_key_file is not an ECDSA P-256 key"
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return "the signature is not base64"
    try:
        key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return "the signature does not verify with cosign_public_key_file"
    try:
        signed = json.loads(payload)["critical"]["image"]["docker-manifest-digest"]
    except (ValueError, KeyError, TypeError):
        return "the signed payload names no manifest digest"
    if signed != manifest_digest:
        return f"the signature is for {str(signed)[:19]}…, not the chart's manifest {manifest_digest[:19]}…"
    return ""
