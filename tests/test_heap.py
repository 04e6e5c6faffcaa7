"""``agent.run.heap``: the memory settings of ``gitops-agent run``: the C heap (fewer arenas, a fixed
mmap threshold) and the cycle collector (fewer young collections, start-up objects frozen).

Each case runs in a child interpreter: the settings last for the life of a process.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)

CHILD = "import json; from agent.run import heap; print(json.dumps(heap.tune()))"


def _tuned(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    names: list[str] = json.loads(out.stdout)
    return names


@glibc
def test_run_tunes_the_c_heap_on_glibc() -> None:
    assert _tuned() == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"]


@glibc
def test_a_heap_setting_the_operator_gave_is_left_to_glibc() -> None:
    assert _tuned(MALLOC_ARENA_MAX="4") == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]


COLLECTOR = (
    "import gc, json; from agent.run import heap; before = gc.get_threshold(); heap.tune_collector(); "
    "print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))"
)


def test_run_collects_young_objects_less_often_and_never_walks_start_up_objects() -> None:
    out = subprocess.run([sys.executable, "-c", COLLECTOR], capture_output=True, text=True, check=True)
    before, after, frozen = json.loads(out.stdout)
    from agent.run.heap import GC_THRESHOLD0

    assert after == [GC_THRESHOLD0, *before[1:]] and after[0] > before[0]
    assert frozen > 1000  # the interpreter and the agent's modules, loaded before the call
