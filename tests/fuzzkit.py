"""What the fuzz tests share: their Hypothesis settings and the time and memory bounds of an example.

CI runs the ``fuzz`` profile: derandomized (the same examples on every run, so a failure
reproduces), no example database, example counts as each test sets them. ``HYPOTHESIS_PROFILE=long``
runs twenty times as many, from random seeds (a failure prints the blob that replays it with
``@reproduce_failure``). The bounds are checked by the tests themselves rather than with
Hypothesis's ``deadline``: a deadline that a loaded CI machine misses once is reported as a flaky
test, while a bound ten times above the usual cost only fails on a real blow-up.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings

_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    # No "explain" phase: it traces every line run (sys.settrace), minutes for one large example.
    "phases": (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
}
settings.register_profile("fuzz", derandomize=True, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("fuzz-long", derandomize=False, **_COMMON)  # type: ignore[arg-type]

#: ``HYPOTHESIS_PROFILE=long`` (or ``fuzz-long``): twenty times the examples, random seeds.
LONG = os.environ.get("HYPOTHESIS_PROFILE", "") in ("long", "fuzz-long")
SCALE = 20 if LONG else 1


def fuzz_settings(examples: int) -> settings:
    """The profile's settings with ``examples`` examples (times ``SCALE``)."""
    return settings(settings.get_profile("fuzz-long" if LONG else "fuzz"), max_examples=examples * SCALE)


@dataclass
class Usage:
    """What one example cost: wall seconds and the peak of Python allocations (bytes)."""

    seconds: float = 0.0
    peak: int = 0


@contextmanager
def bounded(what: str, *, seconds: float, peak_bytes: int, trace: bool = True) -> Iterator[Usage]:
    """Fail if the block takes longer than ``seconds`` or allocates more than ``peak_bytes`` at once.

    ``trace``: the peak is ``tracemalloc``'s (Python allocations, the agent's own, unmoved by what
    other tests hold), which makes allocation-heavy code several times slower; without it, the
    growth of the process's peak RSS (``ru_maxrss``) during the block, for the large examples.
    """
    usage = Usage()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        yield usage
    finally:
        usage.seconds = time.perf_counter() - t0
        if trace:
            usage.peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        else:
            usage.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    assert usage.seconds <= seconds, f"{what}: took {usage.seconds:.1f} s (bound {seconds:g} s)"
    peak, bound = usage.peak >> 20, peak_bytes >> 20
    assert usage.peak <= peak_bytes, f"{what}: peak allocation {peak} MiB (bound {bound} MiB)"


class _Finaliser:
    """Cyclic garbage whose finaliser notes the stack room left, then leaves garbage like itself."""

    live = False
    least = 0

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        frame, depth = sys._getframe(), 0
        while frame is not None:
            frame, depth = frame.f_back, depth + 1
        _Finaliser.least = min(_Finaliser.least, sys.getrecursionlimit() - depth)
        if _Finaliser.live:
            _Finaliser()


@contextmanager
def collections_everywhere() -> Iterator[type[_Finaliser]]:
    """Run the cycle collector, and a finaliser, at almost every allocation of the block.

    Yields the probe: its ``least`` is the fewest frames the finaliser had to spare before
    Python's recursion limit, wherever the block was when a collection came. A parser that
    recursed up to that limit left none (a finaliser there failed, "Exception ignored in").
    """
    threshold = gc.get_threshold()
    _Finaliser.live, _Finaliser.least = True, sys.getrecursionlimit()
    _Finaliser()
    gc.set_threshold(1, 1, 1)
    try:
        yield _Finaliser
    finally:
        gc.set_threshold(*threshold)
        _Finaliser.live = False
        gc.collect()
