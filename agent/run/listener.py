"""HTTP serving for the agent's listeners (``[agent] listen``, ``[receiver] listen``): waitress, with
total deadlines, and the ``Host``/``Origin`` guard both listeners answer behind.

waitress reads requests on one event loop, so a client that sends slowly costs a socket, not a
thread; complete requests go to a bounded pool of worker threads, and it stops accepting at a
connection cap. Its own timeout (``channel_timeout``) is an idle one, which a client trickling a
byte a second resets forever (Slowloris), so each connection here carries two total deadlines,
checked every quarter second on the loop: a request's headers must have arrived
``header_timeout`` seconds after the connection opened or its previous answer was sent, and its
body ``body_timeout`` seconds after its headers; a connection past either is closed.

``admit``, when given, sees each request's line and headers before a byte of its body is read
and either refuses it (an ``Early`` answer; the connection is closed after it) or admits it with
a callback run once the request is over, however it ends (the receiver's in-flight slots).

Started by ``server.HealthServer`` and ``receiver.Receiver``.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import create_server
from waitress.utilities import BadRequest, Error, RequestEntityTooLarge

#: WSGI's types, as far as the agent uses them.
Environ = dict[str, Any]
StartResponse = Callable[[str, list[tuple[str, str]]], Any]
App = Callable[[Environ, StartResponse], Iterable[bytes]]

_TICK = 0.25  # seconds between deadline checks


@dataclass(frozen=True)
class Limits:
    """What one listener allows a client (``[agent]``'s listener keys)."""

    header_timeout: float
    body_timeout: float
    max_connections: int
    threads: int
    max_body_bytes: int
    max_header_bytes: int = 65536


@dataclass(frozen=True)
class Early:
    """An answer given from the request's headers alone, before its body is read."""

    code: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


#: (method, target, headers by upper-case WSGI-less name, chunked) → an answer, or the callback
#: to run when the admitted request is over.
Admit = Callable[[str, str, Mapping[str, str], bool], "Early | Callable[[], None]"]


class _EarlyError(Error):  # type: ignore[misc]
    """waitress answers a request whose ``error`` is set with ``to_response``: ours is ``Early``."""

    def __init__(self, early: Early) -> None:
        super().__init__("")
        self.early = early
        self.code = early.code

    def to_response(self, ident: str | None = None) -> tuple[str, list[tuple[str, str]], bytes]:
        e = self.early
        return status_line(e.code), [("Content-Type", e.content_type), *e.headers], e.body


class _Parser(HTTPRequestParser):  # type: ignore[misc]
    """waitress's parser, asking ``admit`` once the headers are in."""

    error: Any

    def __init__(self, adj: Any, *, admit: Admit | None) -> None:
        super().__init__(adj)
        self._admit = admit
        self._asked = False
        self._release: Callable[[], None] | None = None

    def received(self, data: bytes) -> int:
        n: int = super().received(data)
        # waitress's own refusal of a large Content-Length comes first; ``admit`` answers it instead.
        mine = not self.error or isinstance(self.error, RequestEntityTooLarge)
        if self.headers_finished and not self._asked and self._admit is not None and mine:
            self._asked = True
            answer = self._admit(self.command, self.request_uri, dict(self.headers), bool(self.chunked))
            if isinstance(answer, Early):
                self.error = _EarlyError(answer)
                self.completed = True
                self.expect_continue = False  # no "100 Continue" for a body never read
            else:
                self._release = answer
        return n

    def close(self) -> None:
        super().close()
        release, self._release = self._release, None
        if release is not None:
            release()


class _Channel(HTTPChannel):  # type: ignore[misc]
    """One connection, with the times its deadlines count from."""

    request: Any

    def __init__(self, server: Any, sock: Any, addr: Any, adj: Any, map: Any = None) -> None:
        super().__init__(server, sock, addr, adj, map=map)
        self.parser_class = functools.partial(_Parser, admit=server.admit)
        #: When it began waiting for a request's headers (opened, or its last answer served).
        self.waiting_since = time.monotonic()
        #: When the current request's headers were complete (its body's deadline counts from it).
        self.body_since: float | None = None

    def handle_read(self) -> None:
        """waitress's, except at end of input: a client that half-closes after a body shorter
        than its ``Content-Length`` is answered 400, not dropped without a word."""
        try:
            data = self.socket.recv(self.adj.recv_bytes)
        except BlockingIOError:
            return
        except OSError:
            self.handle_close()
            return
        if data:
            self.last_activity = time.time()
            self.received(data)
        elif not self._short_body():
            self.handle_close()

    def _short_body(self) -> bool:
        with self.requests_lock:
            request = self.request
            if request is None or not request.headers_finished or request.completed or self.requests:
                return False
            request.error = BadRequest("body shorter than Content-Length")
            request.completed = True
            self.request = None
            self.requests.append(request)
        self.server.add_task(self)
        return True

    def received(self, data: bytes) -> bool:
        ok: bool = super().received(data)
        request = self.request
        if request is None:
            self.body_since = None
        elif request.headers_finished and self.body_since is None:
            self.body_since = time.monotonic()
        return ok

    def service(self) -> None:
        super().service()
        self.waiting_since = time.monotonic()

    def handle_close(self) -> None:
        if self.request is not None:  # cut off mid-request: its admission ends here
            self.request.close()
            self.request = None
        super().handle_close()

    def overdue(self, now: float, limits: Limits) -> bool:
        if self.requests:  # being answered: the worker's time is not the client's
            return False
        if self.body_since is not None:
            return now - self.body_since > limits.body_timeout
        return now - self.waiting_since > limits.header_timeout


def status_line(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"{code} Unknown"


class Listener:
    """One listening socket served by waitress on a thread of its own."""

    def __init__(self, listen: str, app: App, limits: Limits, *, name: str, admit: Admit | None = None):
        host, _, port = listen.rpartition(":")
        self.limits = limits
        self.name = name
        self._map: dict[int, Any] = {}
        self.server = create_server(
            app,
            map=self._map,
            host=(host or "0.0.0.0").strip("[]"),
            port=int(port),
            threads=limits.threads,
            connection_limit=limits.max_connections,
            # The deadlines above close idle connections sooner; this is waitress's own backstop.
            channel_timeout=int(max(limits.header_timeout, limits.body_timeout)) + 60,
            max_request_header_size=limits.max_header_bytes,
            max_request_body_size=limits.max_body_bytes + 1,  # waitress refuses from this size on
            ident="gitops-agent",
            expose_tracebacks=False,
            log_socket_errors=False,
        )
        self.server.channel_class = _Channel
        self.server.admit = admit
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.effective_port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.ident is None:
            self._close()
            return
        with contextlib.suppress(OSError):  # the loop saw the flag first and closed the trigger
            self.server.pull_trigger()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                wasyncore.loop(timeout=_TICK, map=self._map, use_poll=True, count=1)
                self._expire(time.monotonic())
        finally:
            self._close()

    def _expire(self, now: float) -> None:
        for channel in list(self.server.active_channels.values()):
            if isinstance(channel, _Channel) and not channel.will_close and channel.overdue(now, self.limits):
                channel.will_close = True

    def _close(self) -> None:
        self.server.task_dispatcher.shutdown(timeout=2)
        wasyncore.close_all(self._map)


# -- Host and Origin ------------------------------------------------------------------------


def host_of(value: str) -> str:
    """The host of a ``Host`` header or URL authority, lower-case, without port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else ""
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        value = host
    return value.rstrip(".")


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def allowed_hosts(public_url: str, extra: Iterable[str]) -> frozenset[str]:
    """The names a listener answers to besides IP literals: ``localhost``, the host of
    ``public_url`` and ``[agent] allowed_hosts``."""
    names = {"localhost", *(host_of(h) for h in extra)}
    if public_url:
        names.add(host_of(urlsplit(public_url).netloc))
    return frozenset(n for n in names if n)


def host_allowed(header: str, allowed: frozenset[str]) -> bool:
    """Whether a request's ``Host`` is ours: a name bound to an attacker's address (DNS rebinding)
    reaches the listener with that name, never with an IP literal or a name we were given."""
    host = host_of(header)
    return bool(host) and (is_ip(host) or host in allowed)


def cross_site(origin: str, host: str, fetch_site: str = "") -> bool:
    """Whether a write comes from another site: the browser says so (``Sec-Fetch-Site`` other
    than ``same-origin`` or ``none``), or its ``Origin`` names another authority than the
    ``Host`` it was sent to. ``Origin: null`` alone decides nothing: our own pages send it
    (``Referrer-Policy: no-referrer`` makes a browser's form POST say ``null``)."""
    if fetch_site and fetch_site.strip().lower() not in ("same-origin", "none"):
        return True
    origin = origin.strip()
    if not origin or origin == "null":
        return False
    url = urlsplit(origin)
    if url.scheme not in ("http", "https") or not url.netloc:
        return True
    default = "443" if url.scheme == "https" else "80"
    theirs = url.netloc.lower() if ":" in url.netloc.rsplit("]", 1)[-1] else f"{url.netloc.lower()}:{default}"
    ours = host.strip().lower()
    if ":" not in ours.rsplit("]", 1)[-1]:
        ours = f"{ours}:{default}"
    return theirs != ours


def headers_of(environ: Environ) -> dict[str, str]:
    """A WSGI request's headers by their usual names (``Authorization``, ``X-Github-Event``)."""
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            out[key[5:].replace("_", "-").title()] = str(value)
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            out[key.replace("_", "-").title()] = str(value)
    return out


def guard(app: App, allowed: frozenset[str]) -> App:
    """``app`` behind the ``Host`` check (421) and, on writes, the ``Origin`` check (403)."""

    def guarded(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        host = str(environ.get("HTTP_HOST", ""))
        why = ""
        code = 421
        if not host_allowed(host, allowed):
            why = f"host {host_of(host)[:100]!r} is not one this agent answers to ([agent] allowed_hosts)"
        elif environ.get("REQUEST_METHOD") not in ("GET", "HEAD") and cross_site(
            str(environ.get("HTTP_ORIGIN", "")), host, str(environ.get("HTTP_SEC_FETCH_SITE", ""))
        ):
            code, why = 403, "cross-site request refused"
        if not why:
            return app(environ, start_response)
        body = (why + "\n").encode()
        start_response(
            status_line(code),
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return guarded
