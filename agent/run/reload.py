"""Config reload: whether the config file changed, its new contents checked, what takes effect.

``ConfigFile`` notices a change of the file (its mtime and size) and loads it, refusing a
cluster whose kubeconfig is gone now rather than at its next pass. ``carry_over`` keeps the
settings that only a restart changes (``[agent]``, notifications, alerts, receivers) from the
running config, with the warnings to log. ``scheduler.Daemon`` checks the file on its reload
job and applies the result (``Daemon.apply_config``).
"""

from __future__ import annotations

import os
from dataclasses import replace

from agent.config.load import check_access, load_config
from agent.config.types import Config

__all__ = ["RESTART_ONLY", "ConfigFile", "carry_over"]

#: Top-level sections a reload leaves as they were (besides ``[agent]``): they take a restart.
RESTART_ONLY = ("notifications", "alerts", "receiver", "receivers")


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        s = os.stat(path)
    except OSError:
        return None
    return s.st_mtime_ns, s.st_size


class ConfigFile:
    """The config file the agent runs from, and whether it changed since last read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp = _stamp(path)

    def changed(self) -> bool:
        """Whether the file changed since the last call (a file gone is no change)."""
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    def load(self) -> Config:
        """The file's config, checked; raises ``ConfigError``."""
        new = load_config(self.path)
        # A cluster whose kubeconfig is gone is refused now, not at its next pass; [agent]
        # (the management cluster) changes only with a restart.
        check_access(new, management=False)
        return new


def carry_over(old: Config, new: Config) -> tuple[Config, list[str]]:
    """``new`` with the settings only a restart changes taken from ``old``, and a warning for each
    kind that changed."""
    warnings = []
    if new.agent != old.agent:
        warnings.append("[agent] settings changed; they take effect after a restart")
        new = replace(new, agent=old.agent)
    if any(getattr(new, k) != getattr(old, k) for k in RESTART_ONLY):
        warnings.append(
            "[[notifications]], [alerts], [receiver] and [[receivers]] take effect after a restart"
        )
        new = replace(new, **{k: getattr(old, k) for k in RESTART_ONLY})
    return new, warnings
