"""HMAC signatures of webhook bodies, sent (webhook sink) and checked (the receiver's hooks).

Pure. Flux's scheme, ``X-Signature: sha256=<hex of HMAC-SHA256(key, body)>``, lets existing
receivers verify our events; the timestamped one (``X-Gitops-Timestamp`` and ``X-Gitops-Signature:
sha256=<hex of HMAC-SHA256(key, "<timestamp>." + body)>``) also lets a receiver refuse a replay. All
comparisons are constant-time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

#: Flux's header (notification-controller's generic-hmac provider).
SIGNATURE = "X-Signature"
TIMESTAMP = "X-Gitops-Timestamp"
TIMESTAMPED_SIGNATURE = "X-Gitops-Signature"
DELIVERY = "X-Gitops-Delivery"


def hexdigest(key: bytes, body: bytes, algorithm: str = "sha256") -> str:
    return hmac.new(key, body, getattr(hashlib, algorithm)).hexdigest()


def body_signature(key: bytes, body: bytes) -> str:
    """``sha256=<hex>``: the value of ``X-Signature`` (and GitHub's ``X-Hub-Signature-256``)."""
    return f"sha256={hexdigest(key, body)}"


def timestamped_signature(key: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` over ``"<timestamp>." + body``: the value of ``X-Gitops-Signature``."""
    return f"sha256={hexdigest(key, timestamp.encode() + b'.' + body)}"


def matches(header: str, expected: Iterable[str]) -> bool:
    """Whether ``header`` equals one of ``expected``, each compared in constant time (all of them,
    so the time does not tell which key matched)."""
    given = header.strip().encode()
    found = False
    for e in expected:
        found |= hmac.compare_digest(given, e.encode())
    return found
