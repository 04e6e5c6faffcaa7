"""Why a pass wrote nothing for a change window: ``WindowHold`` (``WindowReason``).

Decided by ``plan.windows`` where the windows are known, carried on the app's ``ClusterResult``
(state ``window``), read by ``/status``, the status page, metrics and the CLI.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class WindowReason(enum.StrEnum):
    """Why writes are closed for an app now."""

    #: A deny window that matches the app is open (a deny window always wins).
    DENY = "deny"
    #: Allow windows match the app and none of them is open.
    OUTSIDE_ALLOW = "outside-allow"


@dataclass(frozen=True)
class WindowHold:
    """A change window closed an app's writes: ``reason`` and ``window`` for machines, ``message``
    for people (which window, until when)."""

    reason: WindowReason
    #: The window that holds it: the open deny window, or the allow window that opens next.
    window: str
    message: str
    #: What waits for it, as planned: objects to create or update (not yet confirmed with the
    #: server's dry-run) and objects to prune.
    changes: int = 0
    prunes: int = 0
    #: ``sync --force-window`` overrode it for one pass: the writes went ahead.
    forced: bool = False
