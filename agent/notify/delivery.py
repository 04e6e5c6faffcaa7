"""Delivery to one sink: a bounded queue and a thread of its own, so a sink that hangs or fails
never slows a pass or another sink.

``notifier.Notifier`` puts messages (never blocks: when the queue is full the oldest message is
dropped and counted); the sink's thread sends them in order, each attempt bounded by the sink's
``timeout``, retrying a connection error, a timeout, 408, 429 or 5xx up to ``retries`` times with
doubling backoff, and giving up at once on other answers. A redirect is such an answer: it is
never followed, since following it would carry the sink's credentials (``Authorization``,
``PRIVATE-TOKEN``) to whatever host the ``Location`` names and turn the POST into a GET whose
200 was never a delivery. Every outcome is counted
(``gitops_agent_notifications_total{sink, result="sent|failed|dropped"}``) and logged by the
message's name, never its address; error texts are masked.
"""

from __future__ import annotations

import enum
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from agent.errors import ConfigError
from agent.notify.policy import Notice
from agent.notify.sinks import Message, Request, Sink

log = structlog.get_logger("gitops_agent.notify")


class Result(enum.StrEnum):
    """The ``result`` label of ``gitops_agent_notifications_total``."""

    SENT = "sent"
    FAILED = "failed"
    DROPPED = "dropped"


class NotifyMetrics:
    """The notification series, in the agent's registry (``server.Metrics.registry``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter(
            "gitops_agent_notifications_total",
            "Notifications by sink and result: sent, failed (after its retries), dropped (queue full).",
            ["sink", "result"],
            registry=registry,
        )
        self.attempts = Counter(
            "gitops_agent_notification_attempts_total",
            "HTTP requests made to sinks, retries included.",
            ["sink"],
            registry=registry,
        )
        self.queued = Gauge(
            "gitops_agent_notification_queue", "Messages waiting for their sink.", ["sink"], registry=registry
        )
        self.state_errors = Counter(
            "gitops_agent_notification_state_errors_total",
            "Notification state that could not be read or saved (nothing is sent without it).",
            registry=registry,
        )


class _Attempt(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    GIVE_UP = "give-up"


def _classify(e: BaseException) -> str:
    """Why a request failed, from the exception's type (its text may hold the address)."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "host not found"
    return type(reason).__name__


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Answers every 3xx with ``HTTPError`` (the module docstring says why)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class Delivery:
    """One sink's queue and sending thread."""

    def __init__(self, sink: Sink, metrics: NotifyMetrics) -> None:
        self.sink = sink
        self.metrics = metrics
        self.size = sink.cfg.queue_size
        self.queue: deque[Message] = deque()
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._busy = False
        self.counts = {r: 0 for r in Result}
        self.last_error = ""
        self._thread = threading.Thread(target=self._run, name=f"notify-{sink.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, m: Message) -> None:
        """Queue ``m``; never blocks (a full queue drops its oldest message)."""
        with self._cv:
            if len(self.queue) >= self.size:
                old = self.queue.popleft()
                self._count(Result.DROPPED)
                log.warning("notification dropped: sink queue full", sink=self.sink.name, message=_name(old))
            self.queue.append(m)
            self.metrics.queued.labels(self.sink.name).set(len(self.queue))
            self._cv.notify()

    def idle(self) -> bool:
        with self._cv:
            return not self.queue and not self._busy

    def stop(self, flush: float = 0.0) -> None:
        """Stop after at most ``flush`` seconds of sending what is queued."""
        end = time.monotonic() + flush
        while flush > 0 and not self.idle() and time.monotonic() < end:
            time.sleep(0.02)
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread.ident is not None:  # started
            self._thread.join(min(1.0, self.sink.cfg.timeout))

    def _count(self, r: Result) -> None:
        self.counts[r] += 1
        self.metrics.total.labels(self.sink.name, r.value).inc()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                while not self.queue and not self._stop.is_set():
                    self._cv.wait()
                if self._stop.is_set():
                    return
                m = self.queue.popleft()
                self._busy = True
                self.metrics.queued.labels(self.sink.name).set(len(self.queue))
            try:
                self._deliver(m)
            except Exception as e:  # the thread must outlive any one message
                log.exception("notification crashed", sink=self.sink.name, error=type(e).__name__)
            finally:
                with self._cv:
                    self._busy = False

    def _deliver(self, m: Message) -> None:
        sink, cfg = self.sink, self.sink.cfg
        try:
            req = sink.request(m)
        except (ConfigError, ValueError) as e:
            self._failed(_name(m), sink.masker.scrub(str(e)))
            return
        why = ""
        for attempt in range(cfg.retries + 1):
            if attempt and self._stop.wait(cfg.retry_backoff * 2 ** (attempt - 1)):
                break
            outcome, why = self._attempt(req)
            if outcome is _Attempt.OK:
                self._count(Result.SENT)
                log.info("notification sent", sink=sink.name, message=req.what, attempts=attempt + 1)
                return
            if outcome is _Attempt.GIVE_UP:
                break
        self._failed(req.what, why)

    def _failed(self, what: str, why: str) -> None:
        self._count(Result.FAILED)
        self.last_error = f"{what}: {why}"
        log.warning("notification failed", sink=self.sink.name, message=what, error=why)

    def _attempt(self, req: Request) -> tuple[_Attempt, str]:
        self.metrics.attempts.labels(self.sink.name).inc()
        r = urllib.request.Request(req.url, data=req.body, headers=req.headers, method=req.method)
        try:
            with _OPENER.open(r, timeout=self.sink.cfg.timeout) as resp:
                resp.read(65536)
            return _Attempt.OK, ""
        except urllib.error.HTTPError as e:
            retry = e.code in (408, 429) or e.code >= 500
            return (_Attempt.RETRY if retry else _Attempt.GIVE_UP), _classify(e)
        except (urllib.error.URLError, OSError) as e:
            return _Attempt.RETRY, _classify(e)

    def to_json(self) -> dict[str, Any]:
        with self._cv:
            queued = len(self.queue)
        return {
            "name": self.sink.name,
            "kind": self.sink.kind.value,
            "target": self.sink.target,
            "queued": queued,
            **{r.value: n for r, n in self.counts.items()},
            "last_error": self.sink.masker.scrub(self.last_error) or None,
        }


def _name(m: Message) -> str:
    if isinstance(m, Notice):
        return f"{m.kind.value} {m.reason} {m.cluster}/{m.app}"
    return f"status {m.state.value} {m.cluster}/{m.app}"
