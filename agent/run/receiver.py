"""The webhook receiver: ``POST /hook/<name>`` from Git hosts, on a listener of its own.

It faces the Git host (its own Service in ``manifests/``), so nothing else is served there:
``/metrics``, ``/status`` and ``/sync`` stay on ``[agent] listen``. ``scheduler.Daemon`` starts it
when ``[receiver] listen`` is set; ``listener.Listener`` serves it (headers within
``[agent] header_timeout``, the body within ``read_timeout``, both totals). Each request, in
this order (``webhooks`` decides each step):

1. before a byte of the body is read, from the request line and headers alone (``admit``):
   a ``Host`` of ours (421); ``POST /hook/<name>`` of a known hook (404, 405); the global rate
   limit (429, with ``Retry-After``) and at most ``max_in_flight`` requests at once (503);
   ``Content-Length`` required (411) and at most ``max_body_bytes`` (413). Each of these answers
   closes the connection;
2. the body read, then verified (401) with the current or previous secret;
3. only then the hook's own rate limit (429): unsigned requests never use up a hook's limit;
4. the delivery id required (400) and never seen before (409);
5. parsed; a ping answers 200, other events 200 ``ignored``; a push concerning no source (another
   repository, branch or tag) 200 ``ignored``; otherwise ``on_push(sources)`` and 202.

The handler never calls Kubernetes nor Git: ``on_push`` marks the sources for a poll, which the
daemon runs on the source's own job, coalesced with any other.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from agent.config.types import Config, HookConfig, ReceiverSettings
from agent.errors import ConfigError
from agent.notify.secrets import Masker, Secret
from agent.run import webhooks
from agent.run.listener import (
    Early,
    Environ,
    Limits,
    Listener,
    StartResponse,
    allowed_hosts,
    guard,
    headers_of,
    host_allowed,
    status_line,
)
from agent.run.webhooks import EventKind, Rejection, Verdict

log = structlog.get_logger("gitops_agent.receiver")

PREFIX = "/hook/"

#: (status code, JSON document, extra headers) of one answer.
Answer = tuple[int, dict[str, Any], tuple[tuple[str, str], ...]]


class ReceiverMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gitops_agent_webhook_requests_total",
            "Webhook requests by receiver and HTTP status answered (202: a poll was asked for).",
            ["receiver", "code"],
            registry=registry,
        )


class _Hook:
    def __init__(self, cfg: HookConfig, index: int, masker: Masker, file: str) -> None:
        self.cfg = cfg
        prefix = f"receivers[{index}]"

        def key(stem: str, ref: Any) -> str:
            return f"{prefix}.{stem}_{'file' if ref.file else 'env'}"

        self.secrets = [
            Secret(ref, key(stem, ref), masker, file=file)
            for stem, ref in (("secret", cfg.secret), ("previous_secret", cfg.previous_secret))
            if ref
        ]
        self.bucket = webhooks.TokenBucket(cfg.rate_limit, cfg.burst)

    def keys(self) -> list[str]:
        return [s.get() for s in self.secrets]


class Receiver:
    """The listener and its hooks; ``on_push(sources, why)`` asks for a poll of those sources."""

    def __init__(
        self,
        config: Config,
        *,
        on_push: Callable[[list[str], str], None],
        registry: CollectorRegistry,
        sources: Callable[[], Mapping[str, Any]],
    ) -> None:
        self.settings: ReceiverSettings = config.receiver
        self.masker = Masker()
        self.hooks = {h.name: _Hook(h, i, self.masker, config.file) for i, h in enumerate(config.receivers)}
        for h in self.hooks.values():
            h.keys()  # a secret that cannot be read stops the agent now (exit 2), naming its key
        self.on_push = on_push
        #: Source name → SourceConfig of the running config.
        self.sources = sources
        self.metrics = ReceiverMetrics(registry)
        self.bucket = webhooks.TokenBucket(self.settings.rate_limit, self.settings.burst)
        self.replays = webhooks.ReplayCache(self.settings.replay_window)
        self._slots = threading.BoundedSemaphore(self.settings.max_in_flight)
        self.counts: dict[str, dict[int, int]] = {n: {} for n in self.hooks}
        self._lock = threading.Lock()
        a = config.agent
        self.allowed = allowed_hosts(a.public_url, a.allowed_hosts)
        limits = Limits(
            header_timeout=a.header_timeout,
            body_timeout=self.settings.read_timeout,
            max_connections=a.max_connections,
            threads=a.http_threads,
            max_body_bytes=self.settings.max_body_bytes,
        )
        self.listener = Listener(
            self.settings.listen, guard(self.app, self.allowed), limits, name="receiver", admit=self.admit
        )

    @property
    def port(self) -> int:
        return self.listener.port

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()

    # -- one request ------------------------------------------------------------------

    def _count(self, hook: str, code: int) -> None:
        if hook:
            self.metrics.requests.labels(hook, str(code)).inc()
            with self._lock:
                counts = self.counts.setdefault(hook, {})
                counts[code] = counts.get(code, 0) + 1

    def _refusal(self, hook: str, v: Verdict, headers: tuple[tuple[str, str], ...] = ()) -> Early:
        code = v.rejection.value if v.rejection else 400
        why = self.masker.scrub(v.why)
        log.info("webhook refused", receiver=hook or None, code=code, why=why)
        self._count(hook, code)
        return Early(code, "application/json", (json.dumps({"error": why}) + "\n").encode(), headers)

    def admit(
        self, method: str, target: str, headers: Mapping[str, str], chunked: bool
    ) -> Early | Callable[[], None]:
        """Step 1 of the module docstring: refuse from the headers, or take an in-flight slot."""
        host = headers.get("HOST", "")
        if not host_allowed(host, self.allowed):
            return Early(421, "text/plain; charset=utf-8", b"host not allowed ([agent] allowed_hosts)\n")
        path = target.split("?", 1)[0]
        name = path[len(PREFIX) :] if path.startswith(PREFIX) else ""
        if name not in self.hooks:
            return self._refusal("", Verdict(Rejection.NOT_FOUND, f"no receiver at {path[:100]!r}"))
        if method != "POST":
            return Early(405, "application/json", b'{"error": "POST only"}\n', (("Allow", "POST"),))
        wait = self.bucket.take()
        if wait is not None:
            retry = (("Retry-After", str(max(1, round(wait)))),)
            return self._refusal(name, Verdict(Rejection.THROTTLED, "rate limit of all receivers"), retry)
        raw_length = headers.get("CONTENT_LENGTH")
        if raw_length is None or chunked:
            return self._refusal(name, Verdict(Rejection.LENGTH_REQUIRED, "Content-Length required"))
        try:
            length = int(raw_length)
        except ValueError:
            return self._refusal(name, Verdict(Rejection.BAD_REQUEST, "bad Content-Length"))
        if length > self.settings.max_body_bytes:
            why = f"body of {length} bytes is over max_body_bytes ({self.settings.max_body_bytes})"
            return self._refusal(name, Verdict(Rejection.TOO_LARGE, why))
        if not self._slots.acquire(blocking=False):
            busy = Verdict(Rejection.BUSY, "too many requests in flight")
            return self._refusal(name, busy, (("Retry-After", "1"),))
        return self._slots.release

    def app(self, environ: Environ, start_response: StartResponse) -> list[bytes]:
        """Steps 2-5, on an admitted request whose body waitress has read in full."""
        path = str(environ.get("REQUEST_URI") or "/").split("?", 1)[0]
        hook = self.hooks[path[len(PREFIX) :]]
        body = environ["wsgi.input"].read()
        code, doc, extra = self._handle(hook, headers_of(environ), body)
        self._count(hook.cfg.name, code)
        raw = (json.dumps(doc) + "\n").encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(raw))), *extra]
        start_response(status_line(code), headers)
        return [raw]

    def _reject(self, hook: str, v: Verdict, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
        code = v.rejection.value if v.rejection else 400
        log.info("webhook refused", receiver=hook, code=code, why=self.masker.scrub(v.why))
        return code, {"error": self.masker.scrub(v.why)}, headers

    def _handle(self, hook: _Hook, headers: Mapping[str, str], body: bytes) -> Answer:
        cfg = hook.cfg
        try:
            keys = hook.keys()
        except ConfigError as e:  # the secret's file went away: refuse, and say why in the log
            log.error("webhook secret unreadable", receiver=cfg.name, error=self.masker.scrub(str(e)))
            return self._reject(cfg.name, Verdict(Rejection.UNSIGNED, "receiver secret unavailable"))
        tolerance = self.settings.timestamp_tolerance
        verdict = webhooks.verify(
            cfg.kind, headers, body, keys, allow_sha1=cfg.allow_sha1, tolerance=tolerance
        )
        if verdict.rejection is not None:
            return self._reject(cfg.name, verdict)
        wait = hook.bucket.take()  # charged only now: an unsigned request never uses it up
        if wait is not None:
            retry = (("Retry-After", str(max(1, round(wait)))),)
            return self._reject(
                cfg.name, Verdict(Rejection.THROTTLED, f"rate limit of receiver {cfg.name}"), retry
            )
        delivery = webhooks.delivery_id(cfg.kind, headers)
        if not delivery:
            return self._reject(cfg.name, Verdict(Rejection.BAD_REQUEST, "no delivery id"))
        if not self.replays.first(f"{cfg.name}/{delivery}"):
            return self._reject(
                cfg.name, Verdict(Rejection.REPLAY, f"delivery {delivery[:64]} already received")
            )
        event = webhooks.event_kind(cfg.kind, headers)
        if event is EventKind.PING:
            return 200, {"result": "pong"}, ()
        if event is EventKind.OTHER:
            return 200, {"result": "ignored", "why": "not a push event"}, ()
        try:
            push = webhooks.parse(cfg.kind, body)
        except ValueError as e:
            return self._reject(cfg.name, Verdict(Rejection.BAD_REQUEST, str(e)))
        everything = dict(self.sources())
        candidates = {n: src for n, src in everything.items() if not cfg.sources or n in cfg.sources}
        names = webhooks.concerned(push, candidates)
        if not names:
            why = "the push concerns no source of this receiver (another repository, branch or tag)"
            log.info("webhook ignored", receiver=cfg.name, ref=push.ref[:200], delivery=delivery[:64])
            return 200, {"result": "ignored", "why": why}, ()
        log.info("webhook push", receiver=cfg.name, ref=push.ref[:200], sources=names, delivery=delivery[:64])
        self.on_push(names, f"push to {push.ref[:200]} ({cfg.name})")
        return 202, {"result": "accepted", "sources": names}, ()

    def to_json(self) -> dict[str, Any]:
        """``/status``'s ``receiver``: each hook's answers by status code (no secrets)."""
        return {
            "listen": self.settings.listen,
            "receivers": [
                {
                    "name": n,
                    "kind": h.cfg.kind.value,
                    "answers": {str(c): k for c, k in sorted(self.counts.get(n, {}).items())},
                }
                for n, h in self.hooks.items()
            ],
        }
