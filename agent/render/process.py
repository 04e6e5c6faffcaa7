"""The render tools' runner (called by ``agent.render.tools``, ``kustomize``, ``sops``, ``limits``):
one command, or two in a pipe, bounded in time, output and memory.

Every child runs in its own process group (a timeout kills what it started too), with a
deadline, a cap on its standard output, and, where a memory bound is given, ``RLIMIT_DATA``
set by ``prlimit(2)`` as soon as it started (before it reads any input: the tools are Go
programs still in their runtime's start-up then) and a sampler of its resident memory. The
limit used to be set in the child before its ``exec``, by a ``preexec_fn`` (CPython then forks
instead of using vfork: ~18 ms a child for a 330 MB agent) and later by krender as a launcher
(one more program start, ~3 ms, before the tool's own).
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

_STDERR_KEEP = 8 * 1024


@dataclass(frozen=True)
class RunResult:
    """What a tool run produced; ``stdout`` is at most the cap (``truncated`` says it was hit)."""

    returncode: int
    stdout: bytes
    stderr: bytes = b""
    timed_out: bool = False
    truncated: bool = False
    #: Largest resident set the process reached, in bytes, as sampled (0: not measured: no limit).
    peak_rss: int = 0
    #: It ran under a memory limit and its runtime reported running out of memory (or it was
    #: killed by the kernel for it): ``agent.render.limits`` turns this into a render error.
    out_of_memory: bool = False


class Runner(Protocol):
    """Runs one command; must honour ``timeout`` (seconds) and ``max_output`` (stdout bytes).

    ``stdin``: bytes written to the command's standard input (``sops`` reads ciphertext there,
    so that no file is written); ``None``: no input. ``then``: a second command reading the
    first's standard output (``run_subprocess``); a runner that cannot pipe returns the first's.
    """

    def __call__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
        max_output: int,
        stdin: bytes | None = None,
        then: Sequence[str] | None = None,
    ) -> RunResult: ...


def run_subprocess(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    max_output: int,
    stdin: bytes | None = None,
    memory: int | None = None,
    then: Sequence[str] | None = None,
) -> RunResult:
    """The real ``Runner``: kills the whole process group on timeout or when stdout passes the cap.

    ``memory``: each child's bound in bytes. It runs with that ``RLIMIT_DATA`` (heap and private
    mappings; an address-space limit would kill Go programs at start-up, which reserve far more
    than they use). The kernel does not count a writable mapping laid over a reserved range,
    which is how Go maps a large allocation (one 900 MB string passes the limit in one step), so
    the runner also samples the children's resident memory and kills them past ``_WATCHDOG`` of it.

    ``then``: a second command, started with the first, reading its standard output as it is
    written (``helm template | krender -helm-output``: the second's start costs nothing). The
    result's ``stdout`` is the second's; its exit code the first's where that failed, else the
    second's; ``stderr`` the first's, then the second's; memory the sum of both.
    """
    procs = _start(argv, then, cwd=cwd, env=env, stdin=stdin, memory=memory)
    first, last = procs[0], procs[-1]
    assert last.stdout is not None
    out, errs = bytearray(), [bytearray() for _ in procs]
    head = bytearray()
    timed_out = truncated = over = False
    peak = _sample(procs) if memory is not None else 0
    deadline = sampled = time.monotonic()
    deadline += timeout
    pending = memoryview(stdin or b"")
    with selectors.DefaultSelector() as sel:
        sel.register(last.stdout, selectors.EVENT_READ, out)
        for p, err in zip(procs, errs, strict=True):
            assert p.stderr is not None
            sel.register(p.stderr, selectors.EVENT_READ, err)
        if first.stdin is not None:
            # Written as the command reads, beside its output: a full pipe never deadlocks.
            os.set_blocking(first.stdin.fileno(), False)
            sel.register(first.stdin, selectors.EVENT_WRITE, None)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            # Sampled while they run: a child's own high-water mark is gone once it exits.
            events = sel.select(left if memory is None else min(left, _SAMPLE))
            if memory is not None and (now := time.monotonic()) - sampled >= _SAMPLE:
                sampled = now  # not at every chunk read: a megabyte of output is sixteen of them
                if (peak := max(peak, _sample(procs))) > _WATCHDOG * memory:
                    over = True
                    break
            for key, _ in events:
                if key.data is None:
                    pending = _feed(key, pending, sel)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf: bytearray = key.data
                buf += chunk
                if buf is not out and len(head) < _STDERR_KEEP:  # a runtime's fatal error comes first
                    head += chunk[: _STDERR_KEEP - len(head)]
                if buf is not out and len(buf) > 2 * _STDERR_KEEP:
                    del buf[: len(buf) - _STDERR_KEEP]
            if len(out) > max_output:
                truncated = True
                del out[max_output:]
                break
    if first.stdin is not None and not first.stdin.closed:
        with contextlib.suppress(OSError):
            first.stdin.close()
    if timed_out or truncated or over:
        _kill(procs)
    peak = max(peak, _sample(procs)) if memory is not None else 0
    codes = []
    for p in procs:
        try:
            codes.append(_wait(p, max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            # Output closed early but the process lingers past the deadline.
            _kill(procs)
            codes.append(p.wait())
            timed_out = True
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
    code = next((c for c in codes if c != 0), 0)
    stderr = b"".join(bytes(e[-_STDERR_KEEP:]) for e in errs)[-_STDERR_KEEP:]
    oom = over or (
        memory is not None
        and code != 0
        and not (timed_out or truncated)
        and _out_of_memory(code, bytes(head), peak, memory)
    )
    return RunResult(code, bytes(out), stderr, timed_out, truncated, peak, oom)


def _start(
    argv: Sequence[str],
    then: Sequence[str] | None,
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: bytes | None,
    memory: int | None,
) -> list[subprocess.Popen[bytes]]:
    """The command (and ``then``, reading its output through a pipe), each started in a process
    group of its own and limited to ``memory``; on any failure nothing is left running."""
    procs: list[subprocess.Popen[bytes]] = []
    env = _go_runtime(env, memory)
    pipe = os.pipe() if then is not None else None
    try:
        procs.append(
            subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE if pipe is None else pipe[1],
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        )
        if then is not None and pipe is not None:
            procs.append(
                subprocess.Popen(
                    list(then),
                    cwd=cwd,
                    env=dict(env),
                    stdin=pipe[0],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            )
        if memory is not None:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):  # exited already: nothing to bound
                    resource.prlimit(p.pid, resource.RLIMIT_DATA, (memory, memory))
    except BaseException:
        _kill(procs)
        for p in procs:
            p.wait()
        raise
    finally:
        for fd in pipe or ():
            os.close(fd)
    return procs


#: Go's collector for a render child (helm, kustomize, sops): a tool run is a batch of tens of
#: milliseconds, during which collecting at every doubling of the heap is wasted work (helm on
#: cert-manager's chart: 3.5% of its run; its peak 72 MB instead of 61). The soft limit makes it
#: collect as often as it must to stay under the sampler's kill line, which stays the bound; set
#: lower (half the bound), a YAML alias bomb behind kustomize crawled at the soft limit, the
#: collector running without end, until the render's timeout (1 run in 3).
_GOGC = "400"
_SOFT_LIMIT = 0.8


def _go_runtime(env: Mapping[str, str], memory: int | None) -> Mapping[str, str]:
    """``env`` with Go's collector set for a short run under ``memory`` (what it sets itself is kept)."""
    if memory is None:
        return env
    return {"GOGC": _GOGC, "GOMEMLIMIT": str(int(memory * _SOFT_LIMIT)), **env}


def _kill(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill each child's process group (with what it started)."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """``proc.wait(timeout)`` without its polling (sleeps of 0.5 ms, 1 ms, 2 ms...: a millisecond or
    two of every tool run after its output closed): a pidfd wakes this wait when it exits."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # exited and reaped already, or a kernel without pidfds
        return proc.wait(timeout=timeout)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait()


#: Seconds between two samples of a limited child's memory, and the share of its limit at which
#: the sampler kills it: a child filling memory as fast as it can (~5 GB/s) stays under its limit.
_SAMPLE = 0.01
_WATCHDOG = 0.875


def _sample(procs: Sequence[subprocess.Popen[bytes]]) -> int:
    return sum(_hwm(p.pid) for p in procs)


def _hwm(pid: int) -> int:
    """The peak resident memory (``VmHWM``, bytes) of the program ``pid`` runs; 0 once it exited.

    Not ``wait4``'s ``ru_maxrss``: Linux carries into it the memory of the process that forked
    the child (the agent's own), so a small child of a large agent would seem large.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


#: How the runtimes of the render tools say an allocation failed: Go's fatal errors (kustomize,
#: helm, sops) and C's/Python's (test programs). Read only from a child we limited.
_OOM_MARKERS = (b"out of memory", b"cannot allocate memory", b"Cannot allocate memory", b"MemoryError")
#: Go's collector may also crash outright when the kernel refuses it memory (a SIGSEGV in the
#: runtime, exit 2): a failed child whose sampled peak came this close to its limit ran out of it.
_NEAR_LIMIT = 0.75
#: How such a crash starts when the refused allocation is one large step (Helm's ``repeat``:
#: 8 runs in 20 with ``GOGC=400``, none with the default): a fault in the runtime itself. A Go
#: program's own nil dereference reads "panic: runtime error: ..." instead.
_RUNTIME_FAULT = b"SIGSEGV: segmentation violation"


def _out_of_memory(code: int, stderr_head: bytes, peak: int, limit: int) -> bool:
    return (
        code == -signal.SIGKILL
        or peak >= _NEAR_LIMIT * limit
        or any(m in stderr_head for m in _OOM_MARKERS)
        or stderr_head.startswith(_RUNTIME_FAULT)
    )


def _feed(key: selectors.SelectorKey, pending: memoryview, sel: selectors.BaseSelector) -> memoryview:
    """Write what the command's stdin takes now; close it when all is written or it stopped reading."""
    try:
        written = os.write(key.fd, pending[:65536])
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        written = len(pending)  # the command exited without reading it all: its exit code says why
    pending = pending[written:]
    if not pending:
        sel.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]
    return pending
