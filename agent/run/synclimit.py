"""Pacing of forced passes (``POST /sync``): at most one per app per ``[agent] sync_interval``.

Pure (the clock is passed in). ``scheduler.Daemon.sync`` asks it only when no forced pass of the
cluster is pending already: a request while one waits joins it and costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ForcedSyncs:
    """When each (cluster, app) was last forced; ``app`` "" stands for every app of the cluster."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}

    def take(self, cluster: str, app: str, interval: float) -> float | None:
        """None when a pass may be forced now (and counts it), else the seconds to wait."""
        now = self._clock()
        keys = [(cluster, app), (cluster, "")] if app else [(cluster, "")]
        keys += [k for k in self._last if k[0] == cluster and not app and k not in keys]
        wait = max((self._last[k] + interval - now for k in keys if k in self._last), default=0.0)
        if wait > 0:
            return wait
        self._last[(cluster, app)] = now
        return None
