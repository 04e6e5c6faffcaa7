"""Whether an app's rollback pin holds in a pass: pure.

``gitops-agent rollback`` writes a ``Pin`` on the app's ApplySet parent: the commit to render
instead of the source's, and the bad revision it rolled back from. ``ClusterPipeline`` reads it
with the parents and asks here what the pass does: render the pinned commit (``HOLD``) while
the source still delivers the bad or the pinned revision, or is unknown; resume the source
(``CLEAR``) once it delivers any other commit, a fix landed after the bad one. A pin without a
bad revision (written by hand) holds until ``rollback --clear``: when in doubt, keep it.
"""

from __future__ import annotations

from enum import StrEnum

from agent.model import Pin

__all__ = ["PinAction", "cleared_message", "decide"]


class PinAction(StrEnum):
    NONE = "none"
    HOLD = "hold"
    CLEAR = "clear"


def decide(pin: Pin | None, followed: str | None) -> PinAction:
    """What a pass does with ``pin`` while the app's source delivers ``followed`` (None: nothing yet)."""
    if pin is None:
        return PinAction.NONE
    if followed is None or not pin.bad or followed in (pin.revision, pin.bad):
        return PinAction.HOLD
    return PinAction.CLEAR


def cleared_message(pin: Pin, followed: str) -> str:
    """What the log, ``/status`` and the page say of a pin the pass cleared."""
    return (
        f"rollback pin to {pin.revision[:12]} cleared: the source moved from the bad revision "
        f"{pin.bad[:12]} to {followed[:12]}; auto-sync resumed"
    )
