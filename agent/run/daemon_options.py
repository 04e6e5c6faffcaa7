"""How the daemon is timed: its tick, stuck and shutdown bounds, backoff, reloads, Leases.

Built from ``[agent]`` by ``from_config`` (the defaults are the config types'); the daemon
(``run.scheduler``) and the tests that need a faster clock take one.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.types import AGENT_DEFAULTS, SCHEDULE_JITTER, SCHEDULER_TICK, Config
from agent.run.lease_settings import LeaseSettings


@dataclass(frozen=True)
class DaemonOptions:
    """Timing of the daemon; ``from_config`` reads the ``[agent]`` keys when they exist."""

    #: Seconds between scheduler ticks; ``/healthz`` fails after ``stuck_after`` without one.
    tick: float = SCHEDULER_TICK
    stuck_after: float = AGENT_DEFAULTS.stuck_after
    #: Seconds SIGTERM waits for running passes before abandoning them.
    grace: float = AGENT_DEFAULTS.shutdown_grace
    backoff_base: float = AGENT_DEFAULTS.backoff_base
    backoff_cap: float = AGENT_DEFAULTS.backoff_cap
    #: Fraction of the interval (and of a backoff delay) added at random.
    jitter: float = SCHEDULE_JITTER
    #: Seconds between checks of the config file for changes (0: never reload).
    reload_interval: float = AGENT_DEFAULTS.reload_interval
    #: None: decided from the config (``lease_settings.lease_settings``).
    leases: LeaseSettings | None = None

    @classmethod
    def from_config(cls, config: Config) -> DaemonOptions:
        a = config.agent
        return cls(
            stuck_after=a.stuck_after,
            grace=a.shutdown_grace,
            backoff_base=a.backoff_base,
            backoff_cap=a.backoff_cap,
            reload_interval=a.reload_interval,
        )
