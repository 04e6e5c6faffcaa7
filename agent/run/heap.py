"""Tune the C heap (glibc malloc) for a process that lists large pages on many threads at once.

Called once by ``gitops-agent run`` before any pass starts a thread. Two glibc defaults cost a
pass serving several clusters a third of its peak RSS (measured: 10,000 objects x 3 clusters,
262 MB -> 233 MB; benchmarks/README.md):

* the mmap threshold grows to the largest block ever freed, so after the first LIST page
  (~0.6 MB of text) every later page is carved from a heap, where freed pages stay resident
  between live objects; a fixed threshold keeps each page in its own mapping, returned on free;
* each thread that meets a locked heap gets an arena of its own (up to 8 per core), and every
  arena keeps its own free memory; two are enough for threads that mostly wait on the network
  or hold the GIL.

Elsewhere (musl, macOS) there is no ``mallopt`` and nothing changes. ``MALLOC_*`` variables
set by the operator win: a setting found in the environment is left to glibc.

``tune_collector`` sets Python's cycle collector for the same process: see ``GC_THRESHOLD0``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

#: ``mallopt`` parameters (glibc ``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

#: Blocks this large or larger get their own mapping: LIST pages, response bodies, big strings.
MMAP_THRESHOLD = 128 * 1024
#: Free memory at a heap's top beyond this is returned at once.
TRIM_THRESHOLD = 128 * 1024
ARENA_MAX = 2
#: Container allocations (net of frees) between young collections; CPython's default is 700. A
#: pass allocates millions of short-lived dicts and lists that reference counting frees, and at
#: 700 an initial apply of 5,000 objects ran ~530 young collections, each walking every young
#: survivor (the objects of the pass in flight): ~6% of its client CPU (benchmarks/README.md).
#: Cyclic garbage waits longer for its collection, a few MB at most.
GC_THRESHOLD0 = 20_000

_SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENA_MAX),
)


def tune() -> list[str]:
    """Apply the settings glibc accepts; returns the names of those set (empty elsewhere)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return []
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = []
    for env, param, value in _SETTINGS:
        if env not in os.environ and mallopt(param, value) == 1:
            done.append(env)
    return done


def tune_collector() -> None:
    """Fewer young collections (``GC_THRESHOLD0``), and none walks what was loaded at start.

    ``gc.freeze`` moves every object alive now (modules, configuration) to a generation no
    collection visits: they live as long as the process, so walking them found nothing.
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, older, oldest)
