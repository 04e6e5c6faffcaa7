"""The long-lived Git worker of a source: reused across polls, killed on a hang, replaced when it dies.

Real servers on loopback (``tests/gitserver.py``): a local origin, ``git http-backend`` behind
basic auth, and a server that accepts connections and never answers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from gitserver import (  # noqa: F401  (fixtures)
    USERS,
    GitHttpServer,
    HangingServer,
    Origin,
    hanging_server_fixture,
    http_server_fixture,
    make_source,
    origin_fixture,
)

from agent.config.types import SourceAuth
from agent.errors import SourceError
from agent.source.sources import SourceSet
from tests.waiting import wait_for


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: only its parent's wait is missing.
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"


def _git_children_started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record every ``agent.source.remote`` process the agent starts from now on."""
    started: list[list[str]] = []
    real = subprocess.Popen

    def recording(args: Any, *a: Any, **kw: Any) -> Any:
        if isinstance(args, list) and "agent.source.remote" in args:
            started.append([str(x) for x in args])
        return real(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", recording)
    return started


def test_polls_of_a_source_reuse_one_git_process(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _git_children_started(monkeypatch)
    source, _ = make_source(origin.url, tmp_path / "cache")
    source.poll()
    source.poll()  # nothing new: ls-remote only
    origin.commit({"apps/b.yaml": "b: 1\n"}, "second")
    assert source.poll().sha == origin.head()  # ls-remote and fetch
    assert len(started) == 1
    assert source.worker_pid is not None


def test_credentials_reach_the_worker_neither_by_argv_nor_by_environment(
    http_server: GitHttpServer, tmp_path: Path
) -> None:
    secret = tmp_path / "password"
    secret.write_text(USERS["alice"])
    source, _ = make_source(
        http_server.url(), tmp_path / "cache", auth=SourceAuth(username="alice", password_file=str(secret))
    )
    source.poll()
    pid = source.worker_pid
    assert pid is not None
    for part in ("cmdline", "environ"):
        assert USERS["alice"].encode() not in Path(f"/proc/{pid}/{part}").read_bytes()


def test_a_hung_server_kills_the_worker_and_the_next_poll_starts_a_fresh_one(
    hanging_server: HangingServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _git_children_started(monkeypatch)
    source, _ = make_source(f"http://127.0.0.1:{hanging_server.port}/repo.git", tmp_path / "cache", timeout=1)
    pids = []
    for _ in range(2):
        begun = time.monotonic()
        with pytest.raises(SourceError, match=r"timed out|cannot reach") as err:
            source.poll()
        assert err.value.retryable
        assert time.monotonic() - begun < 5
        assert source.worker_pid is None
        pids.append(len(started))
    assert pids == [1, 2]


def test_a_worker_killed_mid_poll_fails_that_poll_with_a_source_error(
    hanging_server: HangingServer, tmp_path: Path
) -> None:
    source, _ = make_source(
        f"http://127.0.0.1:{hanging_server.port}/repo.git", tmp_path / "cache", timeout=60
    )
    outcome: list[BaseException | None] = []

    def poll() -> None:
        try:
            source.poll()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=poll, daemon=True)
    begun = time.monotonic()
    thread.start()
    wait_for("the worker to connect to the hung server", lambda: hanging_server.held, timeout=30)
    pid = source.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=30)
    assert outcome and isinstance(outcome[0], SourceError), outcome
    assert "killed by signal 9" in str(outcome[0]) and outcome[0].retryable
    assert time.monotonic() - begun < 30  # long before the 60 s timeout
    assert not _alive(pid) and source.worker_pid is None


def test_a_worker_that_died_while_idle_is_replaced_without_failing_the_poll(
    origin: Origin, tmp_path: Path
) -> None:
    source, _ = make_source(origin.url, tmp_path / "cache")
    source.poll()
    pid = source.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for("the worker to die", lambda: not _alive(pid), timeout=10, interval=0.05)
    origin.commit({"apps/b.yaml": "b: 1\n"}, "second")
    assert source.poll().sha == origin.head()
    assert source.worker_pid not in (None, pid)


def test_closing_a_source_set_stops_its_workers(origin: Origin, tmp_path: Path) -> None:
    source, _ = make_source(origin.url, tmp_path / "cache")
    sources = SourceSet({"default": source})
    assert sources.poll().ok
    pid = source.worker_pid
    assert pid is not None
    sources.close()
    assert not _alive(pid) and source.worker_pid is None
