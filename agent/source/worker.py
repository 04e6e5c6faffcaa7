"""A long-lived child process that answers JSON requests, one line each, under a deadline.

Used by ``agent.source.remote`` (one ``Worker`` per ``GitSource``) so that a poll pays a pipe
round trip instead of a Python start (about 0.13 s) while keeping what a child process per poll
gave: a request that overruns its deadline, however deep in C it is stuck, ends by killing the
child's whole process group (ssh helpers included), and the next request starts a fresh child.

The child first writes one line (any JSON object) to say it is ready, then reads one JSON
object per line on stdin and writes one per line on stdout; it exits when stdin closes, so it
never outlives the agent. Its start (a Python start, slow on a loaded machine) has a deadline of
its own, ``STARTUP``, so a request's deadline measures the request alone. Its stderr goes to a private
temporary file whose tail explains a crash. Requests are serialised: one at a time per worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import IO, Any

__all__ = ["STARTUP", "Worker", "WorkerDied", "WorkerTimeout"]

#: Seconds a new child has to say it is ready (at least the request's own timeout).
STARTUP = 30.0


class WorkerTimeout(Exception):
    """The child did not answer within the deadline; it has been killed."""


class WorkerDied(Exception):
    """The child exited (crashed or was killed) before answering; ``detail`` says how."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class Worker:
    """``python -m <module>`` started on first use and reused until it dies, hangs or is closed."""

    def __init__(self, module: str, env: dict[str, str]) -> None:
        self._argv = [sys.executable, "-m", module]
        self._env = env
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._buffer = b""
        self.started = 0  # how many children this worker has started (tests, benchmarks)

    @property
    def pid(self) -> int | None:
        """The running child's process id, ``None`` before the first request or after a kill."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def request(self, message: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """Send ``message`` and return the answer; ``WorkerTimeout`` / ``WorkerDied`` otherwise."""
        line = json.dumps(message).encode() + b"\n"
        with self._lock:
            proc = self._ready(timeout)
            deadline = time.monotonic() + timeout
            try:
                assert proc.stdin is not None
                proc.stdin.write(line)
                proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                # It died while idle (killed, out of memory): start one more, once.
                self._stop()
                proc = self._ready(timeout)
                deadline = time.monotonic() + timeout
                assert proc.stdin is not None
                try:
                    proc.stdin.write(line)
                    proc.stdin.flush()
                except (BrokenPipeError, ValueError):
                    raise self._died() from None
            answer = self._read_line(proc, deadline)
        try:
            parsed: dict[str, Any] = json.loads(answer)
        except ValueError:
            raise WorkerDied(f"unreadable answer: {answer[:200]!r}") from None
        return parsed

    def close(self) -> None:
        """Stop the child: ask it to exit (stdin closed) or, if a request is running, kill it."""
        if self._lock.acquire(blocking=False):
            try:
                self._stop(graceful=True)
            finally:
                self._lock.release()
        else:
            proc = self._proc
            if proc is not None and proc.returncode is None:
                _killpg(proc.pid)  # the running request ends with WorkerDied

    # -- internals (under self._lock) --------------------------------------------------

    def _ready(self, timeout: float) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        self._stop()
        self._stderr = tempfile.TemporaryFile(prefix="gitops-agent-worker-")  # noqa: SIM115 (lives with the child)
        proc = subprocess.Popen(
            self._argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self._env,
            start_new_session=True,  # its own process group, so a kill reaches ssh helpers too
            bufsize=0,
        )
        self._proc, self._buffer = proc, b""
        self.started += 1
        # Killed with the agent's objects too: a forgotten source leaves no process behind.
        self._finalizer = weakref.finalize(self, _reap, proc, self._stderr)
        self._read_line(proc, time.monotonic() + max(timeout, STARTUP))  # its "ready" line
        return proc

    def _read_line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self._stop()
                raise WorkerTimeout()
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise self._died()
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _died(self) -> WorkerDied:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            _killpg(proc.pid)  # before reaping it, while its group id cannot be reused
            proc.wait()
        code = proc.returncode if proc is not None else None
        tail = ""
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                size = self._stderr.seek(0, os.SEEK_END)
                self._stderr.seek(max(0, size - 500))
                tail = self._stderr.read().decode(errors="replace").strip()
        self._stop()
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return WorkerDied(f"{how}{': ' + tail if tail else ''}")

    def _stop(self, *, graceful: bool = False) -> None:
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            _reap(proc, self._stderr, graceful=graceful)
        elif self._stderr is not None:
            self._stderr.close()
        self._stderr = None
        self._buffer = b""


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _reap(proc: subprocess.Popen[bytes], stderr: IO[bytes] | None, *, graceful: bool = False) -> None:
    """End ``proc``: a closed stdin lets an idle child exit by itself; anything else is killed."""
    if graceful and proc.returncode is None and proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
    if proc.returncode is None:
        _killpg(proc.pid)  # the whole group, before reaping: its id cannot be reused until then
        proc.wait()
    for stream in (proc.stdin, proc.stdout, stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
