"""What the webhook receiver decides about one request, without I/O: verification, parsing,
which sources a push concerns, rate limits and the replay cache.

Called by ``receiver.Receiver`` in this order, each step only after the previous one passed:
rate limits (``TokenBucket``), the body's size (from ``Content-Length``, before reading it),
``verify`` (HMAC-SHA256 or GitLab's token, constant-time, current and previous secret),
``ReplayCache`` (after verification, so unsigned requests cannot fill it), ``parse``, then
``concerned`` (a push to another repository, branch or tag concerns no source).
"""

from __future__ import annotations

import enum
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agent.config.types import HookKind, SourceConfig
from agent.notify import signing

#: Delivery ids remembered at most, whatever the window (the oldest forgotten first).
REPLAY_CAP = 100_000
_ZERO_SHA = re.compile(r"^0+$")


class Rejection(enum.Enum):
    """Why a request was refused, with its HTTP status."""

    NOT_FOUND = 404
    METHOD = 405
    UNSIGNED = 401
    LENGTH_REQUIRED = 411
    TOO_LARGE = 413
    BAD_REQUEST = 400
    REPLAY = 409
    THROTTLED = 429
    BUSY = 503


@dataclass(frozen=True)
class Verdict:
    """``None`` rejection: verified."""

    rejection: Rejection | None
    why: str = ""


OK = Verdict(None)


def _header(headers: Mapping[str, str], name: str) -> str:
    """A header's value, its name in any case (HTTP header names are case-insensitive)."""
    wanted = name.lower()
    return next((str(v) for k, v in headers.items() if k.lower() == wanted and v), "")


def delivery_id(kind: HookKind, headers: Mapping[str, str]) -> str:
    if kind is HookKind.GITHUB:
        return _header(headers, "X-GitHub-Delivery")
    if kind is HookKind.GITLAB:
        return _header(headers, "X-Gitlab-Event-UUID") or _header(headers, "Idempotency-Key")
    return _header(headers, signing.DELIVERY)


def verify(
    kind: HookKind,
    headers: Mapping[str, str],
    body: bytes,
    secrets: Iterable[str],
    *,
    allow_sha1: bool = False,
    now: float | None = None,
    tolerance: float = 300.0,
) -> Verdict:
    """Whether the request is signed with one of ``secrets`` (current and previous)."""
    keys = [s for s in secrets if s]
    if kind is HookKind.GITLAB:
        token = _header(headers, "X-Gitlab-Token")
        if not token:
            return Verdict(Rejection.UNSIGNED, "no X-Gitlab-Token")
        return OK if signing.matches(token, keys) else Verdict(Rejection.UNSIGNED, "wrong X-Gitlab-Token")
    if kind is HookKind.GITHUB:
        sig256 = _header(headers, "X-Hub-Signature-256")
        if sig256:
            expected = [signing.body_signature(k.encode(), body) for k in keys]
            return (
                OK
                if signing.matches(sig256, expected)
                else Verdict(Rejection.UNSIGNED, "wrong X-Hub-Signature-256")
            )
        sig1 = _header(headers, "X-Hub-Signature")
        if not sig1:
            return Verdict(Rejection.UNSIGNED, "no X-Hub-Signature-256")
        if not allow_sha1:
            return Verdict(
                Rejection.UNSIGNED, "SHA-1 signature (X-Hub-Signature) not accepted: allow_sha1 is false"
            )
        expected = [f"sha1={signing.hexdigest(k.encode(), body, 'sha1')}" for k in keys]
        return OK if signing.matches(sig1, expected) else Verdict(Rejection.UNSIGNED, "wrong X-Hub-Signature")
    ts = _header(headers, signing.TIMESTAMP)
    sig = _header(headers, signing.TIMESTAMPED_SIGNATURE)
    if not ts or not sig:
        return Verdict(Rejection.UNSIGNED, f"no {signing.TIMESTAMP} or {signing.TIMESTAMPED_SIGNATURE}")
    try:
        sent = float(ts)
    except ValueError:
        return Verdict(Rejection.UNSIGNED, f"{signing.TIMESTAMP} is not a Unix time")
    now = time.time() if now is None else now
    if abs(now - sent) > tolerance:
        return Verdict(Rejection.UNSIGNED, f"{signing.TIMESTAMP} is more than {tolerance:g}s from now")
    expected = [signing.timestamped_signature(k.encode(), ts, body) for k in keys]
    return (
        OK
        if signing.matches(sig, expected)
        else Verdict(Rejection.UNSIGNED, f"wrong {signing.TIMESTAMPED_SIGNATURE}")
    )


class EventKind(enum.Enum):
    PUSH = "push"
    PING = "ping"
    OTHER = "other"


@dataclass(frozen=True)
class Push:
    """A push as the Git host described it: the repository's URLs and the ref that moved."""

    repositories: tuple[str, ...]
    ref: str
    deleted: bool = False


def event_kind(kind: HookKind, headers: Mapping[str, str]) -> EventKind:
    if kind is HookKind.GITHUB:
        event = _header(headers, "X-GitHub-Event")
        return {"push": EventKind.PUSH, "ping": EventKind.PING}.get(event, EventKind.OTHER)
    if kind is HookKind.GITLAB:
        event = _header(headers, "X-Gitlab-Event")
        return EventKind.PUSH if event in ("Push Hook", "Tag Push Hook") else EventKind.OTHER
    return EventKind.PUSH


def _urls(obj: Any, keys: Iterable[str]) -> list[str]:
    if not isinstance(obj, dict):
        return []
    return [str(obj[k]) for k in keys if isinstance(obj.get(k), str) and obj[k]]


def parse(kind: HookKind, body: bytes) -> Push:
    """The push a verified body describes; ``ValueError`` saying what is missing."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise ValueError("body is not JSON") from None
    except RecursionError:  # a verified sender's body: no push nests this deep
        raise ValueError("body is JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise ValueError("body is not a JSON object")
    ref = doc.get("ref")
    if not isinstance(ref, str) or not ref:
        raise ValueError("no ref in the push")
    if kind is HookKind.GITHUB:
        repos = _urls(doc.get("repository"), ("clone_url", "ssh_url", "git_url", "html_url", "url"))
        deleted = doc.get("deleted") is True
    elif kind is HookKind.GITLAB:
        repos = _urls(doc.get("project"), ("git_http_url", "git_ssh_url", "web_url", "http_url", "ssh_url"))
        repos += _urls(doc.get("repository"), ("git_http_url", "git_ssh_url", "url", "homepage"))
        deleted = bool(_ZERO_SHA.match(str(doc.get("after") or "x")))
    else:
        repos = [doc["repository"]] if isinstance(doc.get("repository"), str) else []
        deleted = doc.get("deleted") is True
    if not repos:
        raise ValueError("no repository URL in the push")
    return Push(tuple(repos), ref, deleted)


def repo_identity(url: str) -> str:
    """A repository's identity across its URLs: host and path, without scheme, user, port and
    ``.git``, lower case (``https://github.com/Acme/Fleet.git`` = ``git@github.com:acme/fleet``)."""
    if "://" in url:
        u = urlsplit(url)
        host, path = (u.hostname or ""), u.path
    elif re.match(r"^[^/@]+@[^/:]+:", url):
        userhost, path = url.split(":", 1)
        host = userhost.rpartition("@")[2]
    else:
        host, path = "", url
    path = path.strip("/").removesuffix(".git").removesuffix("/")
    return f"{host.lower()}/{path.lower()}".lstrip("/")


def followed_ref(source: SourceConfig) -> str:
    """The full ref a source follows (a pinned commit follows none)."""
    if source.commit:
        return ""
    if source.tag:
        return f"refs/tags/{source.tag}"
    return f"refs/heads/{source.branch}"


def concerned(push: Push, sources: Mapping[str, SourceConfig]) -> list[str]:
    """The sources (by name) this push moves: same repository, the ref they follow."""
    if push.deleted:
        return []
    ids = {repo_identity(u) for u in push.repositories}
    return [
        name
        for name, src in sources.items()
        if repo_identity(src.url) in ids and followed_ref(src) == push.ref and push.ref
    ]


class TokenBucket:
    """``per_minute`` requests, ``burst`` at once; thread-safe."""

    def __init__(self, per_minute: int, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.tokens = float(burst)
        self.clock = clock
        self.at = clock()
        self._lock = threading.Lock()

    def take(self) -> float | None:
        """None when a request may go on; else seconds until it could."""
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                return None
            return (1 - self.tokens) / self.rate


class ReplayCache:
    """Delivery ids seen within ``window`` seconds (at most ``REPLAY_CAP``); thread-safe."""

    def __init__(
        self, window: float, clock: Callable[[], float] = time.monotonic, cap: int = REPLAY_CAP
    ) -> None:
        self.window = window
        self.clock = clock
        self.cap = cap
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first(self, key: str) -> bool:
        """Record ``key``; False when it was seen within the window (a replay)."""
        with self._lock:
            now = self.clock()
            while self._seen and (
                next(iter(self._seen.values())) <= now - self.window or len(self._seen) >= self.cap
            ):
                self._seen.popitem(last=False)
            if key in self._seen:
                return False
            self._seen[key] = now
            return True
