"""Waiting for something to happen in a test: a condition polled until a deadline.

What a test waits for is a condition it can check (an object applied, a port listening, a
status reported), not a guessed number of seconds; ``wait_for`` returns as soon as it holds
and fails naming what never happened. A sleep that stays in a test lets time pass on purpose
(to show that nothing happens meanwhile) and says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, pred: Callable[[], T], timeout: float, interval: float = 0.2) -> T:
    """``pred()``'s first truthy answer within ``timeout`` seconds, asked every ``interval``."""
    end = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < end:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
