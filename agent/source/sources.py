"""Every named source the apps of a config render from: one ``GitSource`` each, polled together.

Built with ``SourceSet.from_config`` by the daemon (one poll job per source, and a new set
when a config reload changes the sources) and by commands that need the revisions of
several apps. A source no app uses is never contacted. Each source is polled once per
``poll`` however many apps use it, on a thread of its own and under its own deadline, so a
source that fails or hangs never stops or delays another's revision beyond that deadline
(``SourcePoll`` holds each source's revision or its ``SourceError``). Two sources on one URL
share the cache repository; ``GitSource`` makes them take turns in it (``repo_lock``) and
gives each its own checkouts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog

from agent.config.types import AppConfig, Config, NamedSource
from agent.errors import ConfigError, SourceError
from agent.model import Revision
from agent.source.git import GitSource, Logger

__all__ = ["POLL_STEPS", "SourceOutcome", "SourcePoll", "SourceSet"]

#: A poll is awaited at most this many times the source's ``timeout``: each step it may
#: take (ls-remote, fetch, a full fetch for a pinned commit, signature verification) is
#: bounded by ``timeout`` on its own, and the whole poll by their sum.
POLL_STEPS = 4


@dataclass(frozen=True)
class SourceOutcome:
    """What one poll of one source gave: its revision, or why there is none this time."""

    name: str
    revision: Revision | None = None
    error: SourceError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def __str__(self) -> str:
        if self.error is not None:
            return f"source {self.name!r}: {self.error}"
        return f"source {self.name!r}: {self.revision.short if self.revision else '-'}"


@dataclass(frozen=True)
class SourcePoll:
    """One ``SourceSet.poll``: an outcome per polled source, in config order."""

    outcomes: tuple[SourceOutcome, ...]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outcomes)

    @property
    def revisions(self) -> dict[str, Revision]:
        """Source name → the revision this poll delivered (failed sources left out)."""
        return {o.name: o.revision for o in self.outcomes if o.revision is not None}

    @property
    def errors(self) -> dict[str, SourceError]:
        """Source name → why this poll delivered nothing for it."""
        return {o.name: o.error for o in self.outcomes if o.error is not None}

    def __getitem__(self, name: str) -> SourceOutcome:
        for o in self.outcomes:
            if o.name == name:
                return o
        raise KeyError(f"source {name!r} was not polled (polled: {', '.join(self.names) or 'none'})")


class _Inflight:
    """One running ``GitSource.poll`` on its own thread; a later call may join it."""

    def __init__(self, name: str, source: GitSource, deadline: float, log: Logger) -> None:
        self.name = name
        self.source = source
        self.started = time.monotonic()
        self.deadline = deadline
        self.revision: Revision | None = None
        self.error: SourceError | None = None
        self.done = threading.Event()
        self._log = log
        thread = threading.Thread(target=self._run, name=f"source-poll-{name}", daemon=True)
        thread.start()

    def _run(self) -> None:
        try:
            self.revision = self.source.poll()
        except SourceError as e:
            self.error = e
        except BaseException as e:
            # A bug or a disk error in one source's poll is that source's failure, not the set's.
            self._log.warning(
                "source.poll_crashed", source=self.name, error=f"{type(e).__name__}: {e}", exc_info=True
            )
            self.error = SourceError(f"internal error: {type(e).__name__}: {e}", url=self.source.masked_url)
            if not isinstance(e, Exception):
                raise
        finally:
            self.done.set()

    def outcome(self) -> SourceOutcome:
        """Wait until the poll ends or its deadline passes, whichever is first."""
        left = self.started + self.deadline - time.monotonic()
        if not self.done.wait(max(0.0, left)):
            error = SourceError(
                f"poll did not finish within {self.deadline:g}s ({POLL_STEPS} x its timeout); "
                "it goes on in the background and is joined by the next poll",
                url=self.source.masked_url,
            )
            return SourceOutcome(self.name, error=error)
        return SourceOutcome(self.name, revision=self.revision, error=self.error)


class SourceSet:
    """The sources some app uses, by name; see the module docstring."""

    def __init__(self, sources: Mapping[str, GitSource], *, log: Logger | None = None) -> None:
        self._sources = dict(sources)
        self._log: Logger = log or structlog.get_logger("agent.source")
        self._mutex = threading.Lock()
        self._inflight: dict[str, _Inflight] = {}

    @classmethod
    def from_config(cls, config: Config, *, log: Logger | None = None) -> SourceSet:
        """One ``GitSource`` per source an app of ``config`` uses, all cached under ``[agent] cache_dir``."""
        base: Logger = log or structlog.get_logger("agent.source")
        used = {a.source for a in config.apps}
        sources: dict[str, GitSource] = {}
        for named in config.sources:
            if named.name not in used:
                base.debug("source.unused", source=named.name, reason="no app uses it: never polled")
                continue
            # A structlog logger names the source in every line; a test's recorder is used as is.
            bind = getattr(base, "bind", None)
            source_log: Logger = bind(source=named.name) if callable(bind) else base
            sources[named.name] = GitSource.from_config(config, named.name, log=source_log)
        return cls(sources, log=base)

    @staticmethod
    def wanted(config: Config) -> tuple[NamedSource, ...]:
        """The sources ``from_config`` would poll: a reload that changes these needs a new set."""
        used = {a.source for a in config.apps}
        return tuple(s for s in config.sources if s.name in used)

    @property
    def names(self) -> tuple[str, ...]:
        """The polled sources, in config order (`default` first when an app uses it)."""
        return tuple(self._sources)

    def source(self, name: str) -> GitSource:
        """The ``GitSource`` of one polled source; ``ConfigError`` naming the polled ones."""
        try:
            return self._sources[name]
        except KeyError:
            have = ", ".join(self._sources) or "none"
            raise ConfigError(
                "sources", f"no source named {name!r} is used by any app (polled: {have})"
            ) from None

    def deadline(self, name: str) -> float:
        """Seconds one poll of ``name`` is awaited before it is reported as timed out."""
        return POLL_STEPS * self.source(name).config.timeout

    def poll(self, names: Iterable[str] | None = None) -> SourcePoll:
        """Poll ``names`` (default: every source) at once, each on its own thread.

        Each source is asked once per call; a source whose previous poll still runs is not
        asked again: that poll is joined. Never raises for a source's failure: its outcome
        carries the ``SourceError`` and the others' revisions are delivered all the same.
        """
        wanted = list(dict.fromkeys(self.names if names is None else names))
        for name in wanted:
            self.source(name)  # an unknown name is bad input: refused before any thread starts
        with self._mutex:
            running = []
            for name in wanted:
                current = self._inflight.get(name)
                if current is None or current.done.is_set():
                    current = _Inflight(name, self._sources[name], self.deadline(name), self._log)
                    self._inflight[name] = current
                running.append(current)
        return SourcePoll(tuple(inflight.outcome() for inflight in running))

    def close(self) -> None:
        """Stop every source's Git worker process: the set is replaced or the agent stops."""
        for source in self._sources.values():
            source.close()

    def last_good(self, name: str) -> Revision | None:
        """The last revision ``name`` delivered (kept while later polls fail), or ``None``."""
        return self.source(name).last_good

    def revision_for(self, app: AppConfig) -> Revision | None:
        """The revision ``app`` renders from: its source's last good one."""
        return self.last_good(app.source)

    def resolve(self, name: str, ref: str) -> Revision:
        """A branch, tag or commit of source ``name`` (CLI ``--revision``). Raises ``SourceError``."""
        return self.source(name).resolve(ref)
