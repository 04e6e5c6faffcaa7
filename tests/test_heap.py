"""``agent.run.heap``: the C heap settings of ``gitops-agent run`` (fewer arenas, a fixed mmap threshold).

Each case runs in a child interpreter: the settings last for the life of a process.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
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


def test_run_tunes_the_c_heap_on_glibc() -> None:
    assert _tuned() == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"]


def test_a_heap_setting_the_operator_gave_is_left_to_glibc() -> None:
    assert _tuned(MALLOC_ARENA_MAX="4") == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
