"""The sources' latest revisions, as the daemon's polls and the receiver's pushes find them.

``SourcePoller`` polls one source (or every source) of a ``SourceSet`` and keeps each
source's last revision (kept in force while its polls fail, with why they fail) and whether
every source was polled once (``/readyz``). Each source polls once at a time: its job's polls
and those pushes ask for (``request``) wait for each other, and pushes during a poll add up
to one more (``coalesce.PollState``). A new revision is handed to ``on_moved``, which
triggers the clusters with an app on that source. Owned by ``scheduler.Daemon``, which runs
its source jobs and replaces its sources on a config reload (``replace``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from agent.model import Revision
from agent.run.coalesce import PollState
from agent.run.server import Metrics
from agent.source.sources import SourceSet

__all__ = ["SourcePoller"]

log = structlog.get_logger("gitops_agent.scheduler")


class SourcePoller:
    """Polls the sources and keeps what they delivered."""

    def __init__(
        self,
        sources: SourceSet,
        metrics: Metrics,
        *,
        on_moved: Callable[[set[str]], None],
        stopping: Callable[[], bool],
        attach: Callable[[str, Revision], Revision] | None = None,
    ) -> None:
        self.sources = sources
        #: Pins the repository charts of a source's apps on its new revision (``ChartPolls.attach``):
        #: a newly published chart version moves the source as a new commit would.
        self.attach = attach
        self.metrics = metrics
        self._on_moved = on_moved
        self._stopping = stopping
        #: Source name → the last revision it delivered (kept while its polls fail).
        self.revisions: dict[str, Revision] = {}
        #: Source name → why its last poll failed.
        self.errors: dict[str, str] = {}
        #: Every source was polled once (delivered or failed).
        self.attempted = False
        self._polled: set[str] = set()
        #: Guards the sources, what they delivered and which were polled.
        self._lock = threading.Lock()
        #: Guards the poll locks (one per source) and the pushes' states.
        self._push_lock = threading.Lock()
        self._poll_locks: dict[str, threading.Lock] = {}
        self._pushes: dict[str, PollState] = {}

    def latest(self) -> tuple[dict[str, Revision], set[str]]:
        """Every source's latest revision, and the sources heard of (polled or delivered)."""
        with self._lock:
            return dict(self.revisions), self._polled | self.revisions.keys()

    def heads(self) -> tuple[dict[str, str], dict[str, str]]:
        """Source → the sha of its latest revision; source → why its last poll failed."""
        with self._lock:
            return {n: r.sha for n, r in self.revisions.items()}, dict(self.errors)

    def shas(self, names: Iterable[str]) -> dict[str, str | None]:
        """Source → the sha of its latest revision (None: none yet), for ``names``."""
        with self._lock:
            return {n: (r.sha if (r := self.revisions.get(n)) else None) for n in names}

    def to_json(self) -> list[dict[str, Any]]:
        """``/status``'s ``sources``: each source's masked URL, ref, revision and error."""
        out = []
        for name in self.sources.names:
            src, rev = self.sources.source(name), self.revisions.get(name)
            out.append(
                {
                    "name": name,
                    "url": src.masked_url,
                    "ref": src.config.ref,
                    "revision": rev.sha if rev else None,
                    "error": self.errors.get(name),
                }
            )
        return out

    def request(self, names: Iterable[str], why: str) -> None:
        """Poll ``names`` now, each on a thread of its own (the receiver's pushes): while a poll of
        a source runs, any number of further requests add up to one more poll after it."""
        for name in names:
            with self._push_lock:
                if self._stopping():
                    return
                state, start = self._pushes.get(name, PollState()).push()
                self._pushes[name] = state
            if not start:
                continue
            log.info("poll requested", source=name, why=why)
            threading.Thread(target=self._push_loop, args=(name,), name=f"push-{name}", daemon=True).start()

    def _push_loop(self, name: str) -> None:
        while True:
            with self._push_lock:
                state, again = self._pushes.get(name, PollState()).next(stopping=self._stopping())
                self._pushes[name] = state
            if not again:
                return
            try:
                if name in self.sources.names:
                    self.poll(name)
            except Exception as e:  # a bad poll must not end the pushes of this source
                log.exception("requested poll crashed", source=name, error=str(e))

    def poll(self, name: str | None = None) -> None:
        """Poll one source (every source when ``name`` is None); a new revision goes to
        ``on_moved``. A failed source keeps its last revision. One poll of a source at a time:
        its job's and the ones pushes request wait for each other."""
        if name is None:
            self._poll(None)
            return
        with self._push_lock:
            lock = self._poll_locks.setdefault(name, threading.Lock())
        with lock:
            self._poll(name)

    def _poll(self, name: str | None) -> None:
        sources = self.sources
        t0 = time.monotonic()
        result = sources.poll(None if name is None else [name])
        attach = self.attach
        charted = {
            o.name: attach(o.name, o.revision) for o in result.outcomes if o.revision is not None and attach
        }
        elapsed = time.monotonic() - t0
        moved: set[str] = set()
        with self._lock:
            if sources is not self.sources:
                return  # a reload replaced the sources meanwhile; the new set's jobs poll them now
            for o in result.outcomes:
                self._polled.add(o.name)
                self.metrics.fetch_duration.labels(o.name).observe(elapsed)
                if o.revision is None:
                    self.metrics.fetch_failures.labels(o.name).inc()
                    self.errors[o.name] = str(o)
                    log.error(
                        "source poll failed; last good revision stays in force",
                        source=o.name,
                        error=str(o.error),
                    )
                    continue
                self.metrics.fetch_success.labels(o.name).set(time.time())
                self.errors.pop(o.name, None)
                previous, revision = self.revisions.get(o.name), charted.get(o.name, o.revision)
                if previous is None or (previous.sha, previous.charts) != (revision.sha, revision.charts):
                    self.revisions[o.name] = revision
                    moved.add(o.name)
                    log.info(
                        "new revision", source=o.name, revision=o.revision.short, subject=o.revision.subject
                    )
            self.attempted = self.attempted or set(sources.names) <= self._polled
        self._on_moved(moved)

    def replace(self, fresh: SourceSet) -> None:
        """Poll ``fresh`` from now on. A source whose settings changed keeps its last revision
        in force until the new settings deliver one (as after a failed poll); a source no app
        uses any more is forgotten."""
        with self._lock:
            gone = set(self.sources.names) - set(fresh.names)
            old, self.sources = self.sources, fresh
            old.close()  # its Git workers: a poll of the old set still running fails, unread
            for name in gone:
                self.revisions.pop(name, None)
                self.metrics.remove_source(name)
            self.errors.clear()  # about the old settings; the first polls tell anew

    def close(self) -> None:
        self.sources.close()
