"""The webhook receiver: ``POST /hook/<name>`` from Git hosts, on a listener of its own.

It faces the Git host (its own Service in ``manifests/``), so nothing else is served there:
``/metrics``, ``/status`` and ``/sync`` stay on ``[agent] listen``. ``scheduler.Daemon`` starts it
when ``[receiver] listen`` is set. Each request, in this order (``webhooks`` decides each step):

1. the hook's and the global rate limits (429, with ``Retry-After``), at most ``max_in_flight``
   requests at once (503);
2. ``Content-Length`` required (411) and at most ``max_body_bytes`` (413): checked before a byte of
   the body is read, and the connection closed without reading it;
3. the body read within ``read_timeout``, then verified (401) with the current or previous secret;
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from agent.config.types import Config, HookConfig, ReceiverSettings
from agent.errors import ConfigError
from agent.notify.secrets import Masker, Secret
from agent.run import webhooks
from agent.run.webhooks import EventKind, Rejection, Verdict

log = structlog.get_logger("gitops_agent.receiver")

PREFIX = "/hook/"


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
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = self.settings.read_timeout  # a client that trickles its request is cut off

            def do_POST(self) -> None:
                outer.handle(self)

            def do_GET(self) -> None:
                outer.reply(self, "", 405 if self.path.startswith(PREFIX) else 404, {"error": "POST only"})

            def log_message(self, *args: Any) -> None:  # each request is logged by handle()
                pass

        host, _, port = self.settings.listen.rpartition(":")
        self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="receiver", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- one request ------------------------------------------------------------------

    def reply(
        self,
        h: BaseHTTPRequestHandler,
        hook: str,
        code: int,
        doc: dict[str, Any],
        *,
        close: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        body = (json.dumps(doc) + "\n").encode()
        if hook:
            self.metrics.requests.labels(hook, str(code)).inc()
            counts = self.counts.setdefault(hook, {})
            counts[code] = counts.get(code, 0) + 1
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if close:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()
        h.wfile.write(body)

    def _reject(self, h: BaseHTTPRequestHandler, hook: str, v: Verdict, **kw: Any) -> None:
        code = v.rejection.value if v.rejection else 400
        log.info("webhook refused", receiver=hook or None, code=code, why=self.masker.scrub(v.why))
        self.reply(h, hook, code, {"error": self.masker.scrub(v.why)}, **kw)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        name = path[len(PREFIX) :] if path.startswith(PREFIX) else ""
        hook = self.hooks.get(name)
        if hook is None:
            self._reject(h, "", Verdict(Rejection.NOT_FOUND, f"no receiver at {path[:100]!r}"), close=True)
            return
        if not self._slots.acquire(blocking=False):
            busy = Verdict(Rejection.BUSY, "too many requests in flight")
            self._reject(h, name, busy, close=True, headers={"Retry-After": "1"})
            return
        try:
            self._handle(h, hook)
        finally:
            self._slots.release()

    def _handle(self, h: BaseHTTPRequestHandler, hook: _Hook) -> None:
        s, cfg = self.settings, hook.cfg
        for bucket, scope in ((hook.bucket, f"receiver {cfg.name}"), (self.bucket, "all receivers")):
            wait = bucket.take()
            if wait is not None:
                retry = str(max(1, round(wait)))
                throttled = Verdict(Rejection.THROTTLED, f"rate limit of {scope}")
                self._reject(h, cfg.name, throttled, close=True, headers={"Retry-After": retry})
                return
        raw_length = h.headers.get("Content-Length")
        if raw_length is None:
            self._reject(
                h, cfg.name, Verdict(Rejection.LENGTH_REQUIRED, "Content-Length required"), close=True
            )
            return
        try:
            length = int(raw_length)
            if length < 0:
                raise ValueError
        except ValueError:
            self._reject(h, cfg.name, Verdict(Rejection.BAD_REQUEST, "bad Content-Length"), close=True)
            return
        if length > s.max_body_bytes:
            why = f"body of {length} bytes is over max_body_bytes ({s.max_body_bytes})"
            self._reject(h, cfg.name, Verdict(Rejection.TOO_LARGE, why), close=True)
            return
        try:
            body = h.rfile.read(length)
        except OSError:  # timed out or cut off: nothing to answer
            h.close_connection = True
            return
        if len(body) != length:
            self._reject(
                h, cfg.name, Verdict(Rejection.BAD_REQUEST, "body shorter than Content-Length"), close=True
            )
            return
        headers = {k: v for k, v in h.headers.items()}
        try:
            keys = hook.keys()
        except ConfigError as e:  # the secret's file went away: refuse, and say why in the log
            log.error("webhook secret unreadable", receiver=cfg.name, error=self.masker.scrub(str(e)))
            self._reject(h, cfg.name, Verdict(Rejection.UNSIGNED, "receiver secret unavailable"))
            return
        verdict = webhooks.verify(
            cfg.kind, headers, body, keys, allow_sha1=cfg.allow_sha1, tolerance=s.timestamp_tolerance
        )
        if verdict.rejection is not None:
            self._reject(h, cfg.name, verdict)
            return
        delivery = webhooks.delivery_id(cfg.kind, headers)
        if not delivery:
            self._reject(h, cfg.name, Verdict(Rejection.BAD_REQUEST, "no delivery id"))
            return
        if not self.replays.first(f"{cfg.name}/{delivery}"):
            self._reject(h, cfg.name, Verdict(Rejection.REPLAY, f"delivery {delivery[:64]} already received"))
            return
        event = webhooks.event_kind(cfg.kind, headers)
        if event is EventKind.PING:
            self.reply(h, cfg.name, 200, {"result": "pong"})
            return
        if event is EventKind.OTHER:
            self.reply(h, cfg.name, 200, {"result": "ignored", "why": "not a push event"})
            return
        try:
            push = webhooks.parse(cfg.kind, body)
        except ValueError as e:
            self._reject(h, cfg.name, Verdict(Rejection.BAD_REQUEST, str(e)))
            return
        everything = dict(self.sources())
        candidates = {n: src for n, src in everything.items() if not cfg.sources or n in cfg.sources}
        names = webhooks.concerned(push, candidates)
        if not names:
            why = "the push concerns no source of this receiver (another repository, branch or tag)"
            log.info("webhook ignored", receiver=cfg.name, ref=push.ref[:200], delivery=delivery[:64])
            self.reply(h, cfg.name, 200, {"result": "ignored", "why": why})
            return
        log.info("webhook push", receiver=cfg.name, ref=push.ref[:200], sources=names, delivery=delivery[:64])
        self.on_push(names, f"push to {push.ref[:200]} ({cfg.name})")
        self.reply(h, cfg.name, 202, {"result": "accepted", "sources": names})

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
