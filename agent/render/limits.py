"""The memory bound of render children, called by ``agent.render.renderer``.

A kustomization or chart from Git can make its tool allocate without end (a YAML alias bomb,
Helm's ``repeat``); without a bound one commit gets the agent's Pod OOM-killed, and it renders
the same commit again after each restart. So:

* every child (kustomize, helm, sops) runs with ``RLIMIT_DATA`` = ``render_memory`` and a
  sampler that kills it past 7/8 of it (``agent.render.process``; the Pod can neither create
  cgroups nor rely on ``GOMEMLIMIT``, a soft target, which only paces a Go child's collector at
  4/5 of the bound); one stopped so is a ``RenderProblem`` with ``limit = RenderLimit.MEMORY``,
  naming the file;
* children start only as far as their limits plus the agent's own resident memory fit under the
  container's memory limit (its cgroup's ``memory.max``); one child may always run;
* ``MemoryFailures`` keeps such failures per (revision, render spec), so the revision is not
  rendered again; other render errors stay uncached (a missing binary may be fixed).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from agent.errors import RenderError, RenderLimit, RenderProblem
from agent.render.process import Runner, RunResult, run_subprocess
from agent.render.tools import is_dir, walk_entries

_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
#: A cgroup v1 "limit" this large means none.
_UNLIMITED = 1 << 60


def container_memory() -> int | None:
    """The container's memory limit in bytes (cgroup v2, else v1); None where there is none."""
    for path in _CGROUP_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text().strip()
            if text == "max":
                return None
            value = int(text)
            return value if value < _UNLIMITED else None
    return None


def agent_rss() -> int:
    """The agent's resident memory now, in bytes."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


class ChildBudget:
    """How many render children run at once: their limits plus the agent's RSS within ``limit``."""

    def __init__(self, limit: int | None, rss: Callable[[], int] = agent_rss) -> None:
        self.limit = limit
        self.rss = rss
        self._held = 0
        self._running = 0
        self._cond = threading.Condition()

    def fits(self, memory: int) -> bool:
        """Whether a child limited to ``memory`` bytes may start now."""
        if self._running == 0 or self.limit is None:
            return True  # one child always runs: a render must be possible at all
        return self.rss() + self._held + memory <= self.limit

    @contextlib.contextmanager
    def hold(self, memory: int) -> Iterator[None]:
        """Wait until a child limited to ``memory`` bytes fits, and count it while it runs."""
        with self._cond:
            self._cond.wait_for(lambda: self.fits(memory))
            self._held += memory
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= memory
                self._running -= 1
                self._cond.notify_all()


#: The agent's one budget: every render of the process shares the container.
BUDGET = ChildBudget(container_memory())


def bounded_runner(memory: int, budget: ChildBudget = BUDGET) -> Runner:
    """The real runner, each child limited to ``memory`` bytes and started within ``budget``."""

    def run(
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
        max_output: int,
        stdin: bytes | None = None,
        then: Sequence[str] | None = None,
    ) -> RunResult:
        with budget.hold(memory):
            return run_subprocess(
                argv,
                cwd=cwd,
                env=env,
                timeout=timeout,
                max_output=max_output,
                stdin=stdin,
                memory=memory,
                then=then,
            )

    return run


def input_problems(
    paths: Iterable[Path], shown: Callable[[Path], str], *, max_total: int, max_file: int
) -> list[RenderProblem]:
    """The files a tool will read under ``paths`` (a chart, its values files), bounded as the plain
    walk's are: ``max_file`` for one, ``max_total`` in all; the first file past a bound is named."""
    total = 0
    for root in paths:
        files = (e for e in walk_entries(root) if not is_dir(e)) if root.is_dir() else [root]
        for f in files:
            size = f.stat().st_size if f.is_file() else 0
            total += size
            if size > max_file:
                return [RenderProblem(shown(Path(f)), f"file is {size} bytes, over the limit of {max_file}")]
            if total > max_total:
                return [
                    RenderProblem(
                        shown(Path(f)), f"the files this render reads exceed the limit of {max_total} bytes"
                    )
                ]
    return []


def hit_memory_limit(error: RenderError) -> bool:
    return any(p.limit is RenderLimit.MEMORY for p in error.problems)


class MemoryFailures:
    """Renders that failed at the memory limit, by (revision, spec key): never re-run, bounded."""

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self._errors: OrderedDict[Hashable, RenderError] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> RenderError | None:
        with self._lock:
            return self._errors.get(key)

    def remember(self, key: Hashable, error: RenderError) -> None:
        """Keep ``error`` when it is a memory-limit failure (others are not kept)."""
        if not hit_memory_limit(error):
            return
        with self._lock:
            self._errors[key] = error
            while len(self._errors) > self.max_entries:
                self._errors.popitem(last=False)
