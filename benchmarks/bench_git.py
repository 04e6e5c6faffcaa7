"""Benchmark 5: Git polls on a repository of 10,000 commits and 5,000 files, agent versus ``git fetch``.

Called by ``benchmarks.__main__`` (``python -m benchmarks git``).

The repository is generated with ``git fast-import`` (one commit adding every file, then one
commit changing one file each) and served two ways: as a local path, and by ``git daemon`` on
loopback (``git://``: the smart protocol, where the server's ``upload-pack`` builds the pack, as
behind an HTTPS or SSH remote). The agent is ``agent.source.GitSource`` (``poll``: ls-remote in a
child process, fetch only when the ref moved, then an atomic checkout of the new commit); the peer
is plain ``git clone`` / ``git fetch`` in a clone of its own. The first clone is measured over both
transports, and shallow (``shallow = true``: depth 1) over ``git://``; polls run over ``git://``
with the default (full) clone. Each "one new commit" step first commits once to the source, then
both fetch that same commit.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import harness as h

FILES = 5000
COMMITS = 10000


def _git(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, check=True)
    return out.stdout.decode()


def _blob(text: str) -> bytes:
    data = text.encode()
    return b"data %d\n" % len(data) + data + b"\n"


def _commit_header(n: int) -> bytes:
    msg = f"commit {n}".encode()
    head = b"commit refs/heads/main\ncommitter Bench <bench@example.com> %d +0000\n" % (1_600_000_000 + n)
    return head + b"data %d\n%s\n" % (len(msg), msg)


def generate(path: Path, files: int, commits: int) -> float:
    """A bare repository with ``commits`` commits and ``files`` files; returns seconds taken."""
    t0 = time.perf_counter()
    _git("init", "--bare", "-q", "-b", "main", str(path))
    chunks: list[bytes] = [_commit_header(0)]
    for i in range(files):
        chunks.append(b"M 100644 inline " + f"dir{i // 100:02d}/file{i:05d}.yaml\n".encode())
        chunks.append(_blob(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: f{i}\ndata:\n  v: '0'\n"))
    for n in range(1, commits):
        i = (n * 7919) % files
        chunks.append(_commit_header(n))
        chunks.append(b"M 100644 inline " + f"dir{i // 100:02d}/file{i:05d}.yaml\n".encode())
        chunks.append(_blob(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: f{i}\ndata:\n  v: '{n}'\n"))
    _git("fast-import", "--quiet", cwd=path, stdin=b"".join(chunks))
    return time.perf_counter() - t0


def add_commit(path: Path, n: int) -> str:
    """One more commit on main of the bare repository ``path`` (through a fast-import of its own)."""
    stream = _commit_header(10**6 + n) + b"from refs/heads/main^0\n"
    stream += b"M 100644 inline new/file" + str(n).encode() + b".yaml\n" + _blob(f"n: {n}\n")
    _git("fast-import", "--quiet", cwd=path, stdin=stream)
    return _git("rev-parse", "refs/heads/main", cwd=path).strip()


@contextlib.contextmanager
def daemon(base: Path) -> Iterator[str]:
    """``git daemon`` serving the repositories under ``base`` on loopback; yields its ``git://`` base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            f"--base-path={base}",
            "--listen=127.0.0.1",
            f"--port={port}",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr and proc.poll() is not None else ""
                raise RuntimeError(f"git daemon did not start on 127.0.0.1:{port}: {err.strip()}")
            time.sleep(0.05)
        yield f"git://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _timed(step: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = step()
    return time.perf_counter() - t0, value


def run(root: Path, reps: int = 5) -> dict[str, Any]:
    base = root / "git-served"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    src = base / "src.git"
    made = generate(src, FILES, COMMITS)
    with daemon(base) as served:
        return _run(root, src, f"{served}/src.git", made, reps)


def _run(root: Path, src: Path, url: str, made: float, reps: int) -> dict[str, Any]:
    from agent.config.types import SourceConfig
    from agent.source.git import GitSource

    count = int(_git("rev-list", "--count", "main", cwd=src))
    files = len(_git("ls-tree", "-r", "--name-only", "main", cwd=src).splitlines())
    out: dict[str, Any] = {
        "commits": count,
        "files": files,
        "generate_seconds": round(made, 2),
        "transport": "git daemon on loopback (git://); first clone also from a local path",
        "rows": [],
    }
    for d in (
        "git-cache-local",
        "git-cache",
        "git-cache-shallow",
        "git-peer-local",
        "git-peer",
        "git-peer-shallow",
    ):
        shutil.rmtree(root / d, ignore_errors=True)

    # Local path: libgit2's local transport packs the objects itself; git clone --no-local runs the
    # pack protocol (not hard links to the source), as close to it as git gets.
    local = GitSource(SourceConfig(url=str(src), branch="main"), root / "git-cache-local")
    agent_local, _ = _timed(local.poll)
    peer_local, _ = _timed(
        lambda: _git("clone", "-q", "--bare", "--no-local", str(src), str(root / "git-peer-local"))
    )
    out["rows"].append(
        _row(
            "initial clone (+checkout), local path",
            [agent_local],
            [peer_local],
            "git clone --bare --no-local",
        )
    )
    source = GitSource(SourceConfig(url=url, branch="main"), root / "git-cache")
    agent_clone, first = _timed(source.poll)
    peer = root / "git-peer"
    peer_clone, _ = _timed(lambda: _git("clone", "-q", "--bare", url, str(peer)))
    out["rows"].append(
        _row("initial clone (+checkout), git://", [agent_clone], [peer_clone], "git clone --bare")
    )
    shallow = GitSource(SourceConfig(url=url, branch="main", shallow=True), root / "git-cache-shallow")
    agent_shallow, _ = _timed(shallow.poll)
    peer_shallow, _ = _timed(
        lambda: _git("clone", "-q", "--bare", "--depth", "1", url, str(root / "git-peer-shallow"))
    )
    out["rows"].append(
        _row(
            "initial clone (+checkout), git://, shallow",
            [agent_shallow],
            [peer_shallow],
            "git clone --bare --depth 1",
        )
    )

    def agent_poll() -> float:
        t = time.perf_counter()
        source.poll()
        return time.perf_counter() - t

    def git_fetch() -> float:
        t = time.perf_counter()
        _git("fetch", "-q", "origin", "+refs/heads/main:refs/heads/main", cwd=peer)
        return time.perf_counter() - t

    idle_agent = [agent_poll() for _ in range(reps)]
    idle_peer = [git_fetch() for _ in range(reps)]
    out["rows"].append(_row("poll, no new commit", idle_agent, idle_peer, "git fetch"))
    new_agent: list[float] = []
    new_peer: list[float] = []
    new_peer_tree: list[float] = []
    for i in range(reps):
        sha = add_commit(src, i)
        new_agent.append(agent_poll())
        if source.last_good is None or source.last_good.sha != sha:
            raise RuntimeError("the agent did not deliver the new commit")
        new_peer.append(git_fetch())
        t = time.perf_counter()
        tree = root / f"git-peer-tree-{i}"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", "main"], cwd=peer, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        new_peer_tree.append(new_peer[-1] + time.perf_counter() - t)
        shutil.rmtree(tree)
    out["rows"].append(_row("poll, one new commit", new_agent, new_peer, "git fetch"))
    out["rows"].append(_row("poll, one new commit", new_agent, new_peer_tree, "git fetch + full tree export"))
    out["agent_fetches"] = source.fetch_count
    out["first_revision"] = first.sha
    for row in out["rows"]:
        print(
            f"git {row['metric']:<44} time x{row['time_ratio']!s:<7} agent {row['agent_seconds']:7.3f}s"
            f"  |  {row['peer_name']:<16} {row['peer_seconds']:7.3f}s",
            flush=True,
        )
    return out


def _row(metric: str, agent: list[float], peer: list[float], peer_name: str) -> dict[str, Any]:
    a, p = h.median(agent), h.median(peer)
    return {
        "metric": metric,
        "agent_seconds": round(a, 4),
        "peer_name": peer_name,
        "peer_seconds": round(p, 4),
        "time_ratio": h.ratio(a, p),
        "agent_runs": [round(x, 4) for x in agent],
        "peer_runs": [round(x, 4) for x in peer],
    }
