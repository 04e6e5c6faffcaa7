"""What a failed request means, read from what the server or the network said, never from its text.

``parse_status`` reads an error answer's ``Status`` (reason, message, details and causes);
``transport`` names why there was no answer at all, from the exception types urllib3, ssl and
the socket raised. ``agent.kube.client`` builds ``ApiError``s from both.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
from dataclasses import dataclass

import urllib3

from agent.errors import StatusCause, StatusDetails, Transport


def transport(e: BaseException) -> tuple[Transport, str]:
    """Why a request got no answer, from the types in the exception's chain, and what to tell a person.

    urllib3 wraps the socket's error (``NewConnectionError`` from ``ConnectionRefusedError``,
    ``ReadTimeoutError`` from ``TimeoutError``, ``SSLError`` from ``ssl.SSLError``).
    ``NewConnectionError`` subclasses ``ConnectTimeoutError``, so a
    connect timeout is that class exactly, or a bare socket timeout.
    """
    chain = _chain(e)

    def has(*types: type[BaseException]) -> bool:
        return any(isinstance(x, types) for x in chain)

    if has(ssl.SSLCertVerificationError):
        return Transport.TLS, "TLS certificate verification failed (wrong CA?)"
    if has(ssl.SSLError, urllib3.exceptions.SSLError):
        return Transport.TLS, _first_line(chain[-1])
    if has(urllib3.exceptions.ReadTimeoutError):
        return Transport.READ_TIMEOUT, "request timed out (no answer within the request timeout)"
    if has(urllib3.exceptions.NameResolutionError, socket.gaierror):
        return Transport.NO_SUCH_HOST, "host name does not resolve"
    if has(ConnectionRefusedError):
        return Transport.CONNECTION_REFUSED, "connection refused (is the API server running?)"
    connect_timeout = any(type(x) is urllib3.exceptions.ConnectTimeoutError for x in chain)
    if connect_timeout or has(TimeoutError):
        return Transport.CONNECT_TIMEOUT, "connection timed out"
    return Transport.BROKEN, _first_line(e)


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or while handling, outermost first."""
    out: list[BaseException] = []
    current: BaseException | None = e
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


@dataclass(frozen=True)
class ParsedStatus:
    """What an error answer said: ``reason``, ``message`` and, for a ``Status``, its ``details``."""

    reason: str
    message: str
    details: StatusDetails | None = None


def parse_status(raw: bytes, fallback: str) -> ParsedStatus:
    """Read an error answer's ``Status`` body; the HTTP reason phrase when it is not one.

    ``details`` only come from a ``kind: Status`` body: that is what tells the API server's own
    403 from a proxy's. Causes keep their raw ``type``/``field``/``message``: what they mean is
    the caller's to decide (``agent.plan.causes`` reads ``FieldManagerConflict``,
    ``StatusCause.immutable`` the validators' sentence).
    """
    try:
        doc = json.loads(raw)
    except (ValueError, TypeError):
        return ParsedStatus(fallback or "", raw[:300].decode("utf-8", "replace") if raw else fallback or "")
    if not isinstance(doc, dict):
        return ParsedStatus(fallback or "", str(doc)[:300])
    reason = str(doc.get("reason", fallback or ""))
    message = str(doc.get("message", "")) or (fallback or "")
    raw_details = doc.get("details")
    if doc.get("kind") != "Status" or not isinstance(raw_details, dict):
        return ParsedStatus(reason, message)
    causes = tuple(
        StatusCause(
            type=str(c.get("reason", "")), field=str(c.get("field", "")), message=str(c.get("message", ""))
        )
        for c in raw_details.get("causes") or ()
        if isinstance(c, dict)
    )
    details = StatusDetails(
        name=str(raw_details.get("name", "")),
        group=str(raw_details.get("group", "")),
        kind=str(raw_details.get("kind", "")),
        uid=str(raw_details.get("uid", "")),
        causes=causes,
    )
    return ParsedStatus(reason, message, details)


#: One warning of a ``Warning`` header (RFC 7234): ``299 - "text"`` (the text may escape quotes).
_WARNING = re.compile(r'\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')


def warnings(values: list[str]) -> list[str]:
    """The texts of ``Warning`` header values, in order, each once (a header may hold several)."""
    out: list[str] = []
    for value in values:
        for m in _WARNING.finditer(value):
            text = re.sub(r"\\(.)", r"\1", m.group(1))
            if text not in out:
                out.append(text)
    return out
