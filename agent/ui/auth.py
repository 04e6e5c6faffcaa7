"""Who may read the status page: open on loopback, a token anywhere else.

Pure. A ``listen`` on a loopback address serves the page to whoever can reach it (that machine's
users), unless a token is configured; on any other address (the in-cluster default listens on
all, for the probes) the page needs the token, and is off without one. A browser signs in once
(``POST /ui/login``) and keeps an HttpOnly, SameSite=Strict cookie whose value is an HMAC of the
token, so the token itself is never stored in the browser and changing it signs everyone out;
scripts send ``Authorization: Bearer <token>``. Comparisons are constant-time.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

COOKIE = "gitops_agent_ui"
_SESSION = b"gitops-agent status page session v1"


class Access(enum.StrEnum):
    """How the page answers on this listen address with this token."""

    #: Loopback and no token: anyone on the machine.
    OPEN = "open"
    #: A token is configured: only with it (cookie or bearer).
    TOKEN = "token"
    #: Not loopback and no token: the page is off (the probes and /metrics are not).
    OFF = "off"


def is_loopback(host: str) -> bool:
    """``127.0.0.1``, ``::1``, ``localhost``; an empty host means every address, so not loopback."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def access(listen: str, token: str) -> Access:
    if token:
        return Access.TOKEN
    host = listen.rpartition(":")[0]
    return Access.OPEN if is_loopback(host) else Access.OFF


def session(token: str) -> str:
    """The cookie value a sign-in with ``token`` gets."""
    return hmac.new(token.encode(), _SESSION, hashlib.sha256).hexdigest()


def set_cookie(token: str) -> str:
    """The ``Set-Cookie`` header of a sign-in (no ``Secure``: the agent itself speaks plain HTTP;
    put TLS in front of it, docs/status-page.md)."""
    return f"{COOKIE}={session(token)}; Path=/ui; HttpOnly; SameSite=Strict"


def clear_cookie() -> str:
    return f"{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"


def token_matches(token: str, offered: str) -> bool:
    return bool(token) and hmac.compare_digest(token.encode(), offered.encode())


def authorized(token: str, *, cookie: str | None, authorization: str | None) -> bool:
    """Whether a request carries the token: a sign-in cookie or ``Authorization: Bearer``."""
    if not token:
        return False
    if authorization and authorization.startswith("Bearer "):
        return token_matches(token, authorization.removeprefix("Bearer ").strip())
    if cookie:
        try:
            jar = SimpleCookie(cookie)
        except CookieError:
            return False
        morsel = jar.get(COOKIE)
        return morsel is not None and hmac.compare_digest(morsel.value.encode(), session(token).encode())
    return False


def safe_next(target: str) -> str:
    """Where to go after signing in: a page of ours, never another site (``//evil``, ``https://``),
    and never a control character: ``next`` ends up in the ``Location`` header, where a CR/LF would
    start a header of the sender's choosing (or a backslash a path some browsers read as ``//``)."""
    if any(c < " " or c in "\x7f\\" for c in target):
        return "/ui/"
    url = urlsplit(target)
    if url.scheme or url.netloc or not url.path.startswith("/ui") or target.startswith("//"):
        return "/ui/"
    return target
