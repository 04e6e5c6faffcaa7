"""What the API server did in a namespace, in order: watches recorded from before the first write.

``creationTimestamp`` has a one-second resolution, too coarse to tell a wave from the next one
when Jobs complete in about a second. A watch started at the resourceVersion of a LIST misses
nothing that follows, and each event carries the resourceVersion of its write: ``WatchLog``
keeps them all, so a test can ask when an object was created, when it first met a condition
and when it was deleted, as positions in the server's own order.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agent.dev.layout import Paths
from agent.dev.process import LocalCluster, endpoint_of

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Event:
    """One watch event: ``type`` (ADDED, MODIFIED, DELETED) at resourceVersion ``rv``."""

    rv: int
    type: str
    kind: str
    name: str
    obj: Manifest


class WatchLog:
    """Watches of ``collections`` (API paths with ``{ns}``) in ``ns``, recorded until ``close``."""

    def __init__(self, cluster: LocalCluster, ns: str, collections: tuple[str, ...]) -> None:
        endpoint = endpoint_of(Paths.of(cluster.name, cluster.state_dir), cluster.ports)
        self._context = ssl.create_default_context(cafile=str(endpoint.pki.ca_cert))
        self._context.load_cert_chain(str(endpoint.pki.admin_cert), str(endpoint.pki.admin_key))
        self._port = endpoint.port
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._conns: list[http.client.HTTPSConnection] = []
        self._threads = [self._start(path.format(ns=ns)) for path in collections]

    def _connect(self) -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection("127.0.0.1", self._port, context=self._context, timeout=10)
        self._conns.append(conn)
        return conn

    def _start(self, path: str) -> threading.Thread:
        conn = self._connect()
        conn.request("GET", path, headers={"Accept": "application/json"})
        listing = json.loads(conn.getresponse().read())
        kind = listing["kind"].removesuffix("List")
        rv = listing["metadata"]["resourceVersion"]
        conn.request("GET", f"{path}?watch=1&resourceVersion={rv}&timeoutSeconds=600")
        response = conn.getresponse()
        assert response.status == 200, response.read()
        if conn.sock is not None:
            conn.sock.settimeout(None)  # a quiet namespace is no error; close() ends the stream
        thread = threading.Thread(target=self._read, args=(response, kind), daemon=True)
        thread.start()
        return thread

    def _read(self, response: http.client.HTTPResponse, kind: str) -> None:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            for line in iter(response.readline, b""):
                event = json.loads(line)
                obj = event["object"]
                if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                meta = obj["metadata"]
                seen = Event(int(meta["resourceVersion"]), event["type"], kind, meta["name"], obj)
                with self._lock:
                    self._events.append(seen)

    def close(self) -> None:
        # The readers end on the shut socket; the connections are closed once they have.
        for conn in self._conns:
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        for conn in self._conns:
            conn.close()

    def events(self) -> list[Event]:
        """Every event so far, in the server's order (resourceVersion)."""
        with self._lock:
            return sorted(self._events, key=lambda e: e.rv)

    def created(self, kind: str, name: str) -> int:
        """The resourceVersion ``kind/name`` was created at (its first ADDED event)."""
        return self.first(kind, name, lambda e: e.type == "ADDED")

    def first(self, kind: str, name: str, pred: Callable[[Event], bool]) -> int:
        """The resourceVersion of the first event of ``kind/name`` that meets ``pred``."""
        for e in self.events():
            if e.kind == kind and e.name == name and pred(e):
                return e.rv
        seen = [(e.type, e.kind, e.name) for e in self.events()]
        raise AssertionError(f"no such event of {kind}/{name}: {seen}")

    def names(self, kind: str, prefix: str = "") -> list[str]:
        """Names of the ``kind`` objects created, in creation order."""
        seen = [e.name for e in self.events() if e.kind == kind and e.type == "ADDED"]
        return [n for n in dict.fromkeys(seen) if n.startswith(prefix)]


@contextlib.contextmanager
def watching(cluster: LocalCluster, ns: str, collections: tuple[str, ...]) -> Iterator[WatchLog]:
    log = WatchLog(cluster, ns, collections)
    try:
        yield log
    finally:
        log.close()


def condition(type_: str) -> Callable[[Event], bool]:
    """An event whose object has condition ``type_`` True (a Job's Complete, a Deployment's Available)."""

    def met(e: Event) -> bool:
        conditions = (e.obj.get("status") or {}).get("conditions") or []
        return e.type != "DELETED" and any(c["type"] == type_ and c["status"] == "True" for c in conditions)

    return met


def ready(e: Event) -> bool:
    """A ReplicaSet event with every replica ready (the health rule's Current)."""
    status = e.obj.get("status") or {}
    want = (e.obj.get("spec") or {}).get("replicas", 1)
    counts = (status.get("readyReplicas", 0), status.get("availableReplicas", 0))
    return e.type != "DELETED" and min(counts) >= want
