"""Benchmark 5: Git polls on a repository of 10,000 commits and 5,000 files, agent versus git itself.

Called by ``benchmarks.__main__`` (``python -m benchmarks git``).

The repository is generated with ``git fast-import`` (one commit adding every file, then one
commit changing one file each) and served three ways: as a local path, by ``git daemon`` on
loopback (``git://``: the smart protocol, where the server's ``upload-pack`` builds the pack),
and by ``git http-backend`` behind a loopback HTTP server in a process of its own
(``benchmarks.githttp``: Git's smart HTTP, as behind an HTTPS remote). The agent is
``agent.source.GitSource`` (``poll``: ls-remote through the source's long-lived Git worker,
fetch only when the ref moved, then an atomic checkout of the new commit); the peers are plain
``git clone`` / ``git ls-remote`` / ``git fetch`` in a clone of their own. The first clone is
measured over every transport, and shallow (``shallow = true``: depth 1) over ``git://``; polls
run over ``git://`` and over HTTP with the default (full) clone. Each "one new commit" step
first commits once to the source, then both fetch that same commit. The first
``keep_checkouts + 1`` new commits of each transport are a row of their own (no old checkout
is surplus yet, so each writes its whole tree); the measured ones after them are the steady
state of a running agent, where the oldest checkout is recycled into the new one.

Targets (issue 26): a poll with no new commit <= 1.5x ``git ls-remote``, one new commit <= 2x
``git fetch``, each over the same transport.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import harness as h

FILES = 5000
COMMITS = 10000
IDLE_TARGET = 1.5  # x git ls-remote
NEW_COMMIT_TARGET = 2.0  # x git fetch


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
        h.end_process(proc, timeout=5, terminate=True)


@contextlib.contextmanager
def http_backend(base: Path) -> Iterator[str]:
    """``git http-backend`` serving ``base`` over HTTP on loopback; yields its ``http://`` base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.githttp", str(base)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the Git HTTP server did not start (exit {proc.poll()})")
        yield f"http://127.0.0.1:{port}"
    finally:
        h.end_process(proc, timeout=5, terminate=True)


def _timed(step: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = step()
    return time.perf_counter() - t0, value


def _seconds(step: Any) -> float:
    return _timed(step)[0]


def run(root: Path, reps: int = 5) -> dict[str, Any]:
    base = root / "git-served"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    src = base / "src.git"
    made = generate(src, FILES, COMMITS)
    with daemon(base) as served, http_backend(base) as web:
        urls = {"git://": f"{served}/src.git", "http://": f"{web}/src.git"}
        return _run(root, src, urls, made, reps)


def _run(root: Path, src: Path, urls: dict[str, str], made: float, reps: int) -> dict[str, Any]:
    from agent.config.types import SourceConfig
    from agent.source.git import GitSource

    count = int(_git("rev-list", "--count", "main", cwd=src))
    files = len(_git("ls-tree", "-r", "--name-only", "main", cwd=src).splitlines())
    out: dict[str, Any] = {
        "commits": count,
        "files": files,
        "generate_seconds": round(made, 2),
        "transport": "git daemon on loopback (git://) and git http-backend behind a loopback HTTP "
        "server (http://); first clone also from a local path",
        "rows": [],
    }
    for d in ("git-cache-local", "git-peer-local", "git-cache-shallow", "git-peer-shallow"):
        shutil.rmtree(root / d, ignore_errors=True)

    # Local path: libgit2's local transport packs the objects itself; git clone --no-local runs the
    # pack protocol (not hard links to the source), as close to it as git gets.
    local = GitSource(SourceConfig(url=str(src), branch="main"), root / "git-cache-local")
    agent_local = _seconds(local.poll)
    local.close()
    peer_local = _seconds(
        lambda: _git("clone", "-q", "--bare", "--no-local", str(src), str(root / "git-peer-local"))
    )
    out["rows"].append(
        _row("initial clone (+checkout), local path", [agent_local], [peer_local], "git clone --no-local")
    )
    sources: dict[str, GitSource] = {}
    peers: dict[str, Path] = {}
    for i, (transport, url) in enumerate(urls.items()):
        for d in (f"git-cache-{i}", f"git-peer-{i}"):
            shutil.rmtree(root / d, ignore_errors=True)
        sources[transport] = GitSource(SourceConfig(url=url, branch="main"), root / f"git-cache-{i}")
        agent_clone, first = _timed(sources[transport].poll)
        peers[transport] = root / f"git-peer-{i}"
        peer_clone = _seconds(lambda: _git("clone", "-q", "--bare", url, str(peers[transport])))  # noqa: B023
        out["rows"].append(
            _row(f"initial clone (+checkout), {transport}", [agent_clone], [peer_clone], "git clone --bare")
        )
        if transport == "git://":
            out["first_revision"] = first.sha
            config = SourceConfig(url=url, branch="main", shallow=True)
            shallow = GitSource(config, root / "git-cache-shallow")
            agent_shallow = _seconds(shallow.poll)
            shallow.close()
            peer_shallow = _seconds(
                lambda: _git("clone", "-q", "--bare", "--depth", "1", url, str(root / "git-peer-shallow"))  # noqa: B023
            )
            out["rows"].append(
                _row(
                    f"initial clone (+checkout), {transport}, shallow",
                    [agent_shallow],
                    [peer_shallow],
                    "git clone --bare --depth 1",
                )
            )
    commits = iter(range(10**6))
    for transport, url in urls.items():
        source, peer = sources[transport], peers[transport]
        out["rows"] += _polls(root, src, transport, url, source, peer, commits, reps=reps)
        out.setdefault("agent_fetches", {})[transport] = source.fetch_count
        out.setdefault("worker_starts", {})[transport] = source.worker_starts
        source.close()
    for row in out["rows"]:
        print(
            f"git {row['metric']:<62} time x{row['time_ratio']!s:<7} agent {row['agent_seconds']:7.3f}s"
            f"  |  {row['peer_name']:<28} {row['peer_seconds']:7.3f}s"
            + (f"  {row['target']}: {'met' if row['met'] else 'MISSED'}" if "met" in row else ""),
            flush=True,
        )
    return out


def _polls(
    root: Path,
    src: Path,
    transport: str,
    url: str,
    source: Any,
    peer: Path,
    commits: Iterator[int],
    *,
    reps: int,
) -> list[dict[str, Any]]:
    """The poll rows of one transport: no new commit, then new commits (cold, then steady)."""

    def git_fetch() -> float:
        return _seconds(lambda: _git("fetch", "-q", "origin", "+refs/heads/main:refs/heads/main", cwd=peer))

    def new_commit() -> tuple[float, float, float]:
        sha = add_commit(src, next(commits))
        agent = _seconds(source.poll)
        if source.last_good is None or source.last_good.sha != sha:
            raise RuntimeError("the agent did not deliver the new commit")
        fetched = git_fetch()
        tree = root / "git-peer-tree"
        tree.mkdir()
        t = time.perf_counter()
        archive = subprocess.run(["git", "archive", "main"], cwd=peer, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        exported = fetched + time.perf_counter() - t
        shutil.rmtree(tree)
        return agent, fetched, exported

    idle_agent = [_seconds(source.poll) for _ in range(reps)]
    idle_lsremote = [_seconds(lambda: _git("ls-remote", url, cwd=peer)) for _ in range(reps)]
    idle_fetch = [git_fetch() for _ in range(reps)]
    cold = [new_commit() for _ in range(source.config.keep_checkouts + 1)]
    warm = [new_commit() for _ in range(reps)]
    new = f"poll, one new commit, {transport}"
    return [
        _row(f"poll, no new commit, {transport}", idle_agent, idle_lsremote, "git ls-remote", IDLE_TARGET),
        _row(f"poll, no new commit, {transport}", idle_agent, idle_fetch, "git fetch"),
        _row(f"{new}, no checkout to recycle", [c[0] for c in cold], [c[1] for c in cold], "git fetch"),
        _row(new, [w[0] for w in warm], [w[1] for w in warm], "git fetch", NEW_COMMIT_TARGET),
        _row(new, [w[0] for w in warm], [w[2] for w in warm], "git fetch + full tree export"),
    ]


def _row(
    metric: str, agent: list[float], peer: list[float], peer_name: str, target: float | None = None
) -> dict[str, Any]:
    a, p = h.median(agent), h.median(peer)
    row: dict[str, Any] = {
        "metric": metric,
        "agent_seconds": round(a, 4),
        "peer_name": peer_name,
        "peer_seconds": round(p, 4),
        "time_ratio": h.ratio(a, p),
        "agent_runs": [round(x, 4) for x in agent],
        "peer_runs": [round(x, 4) for x in peer],
    }
    if target is not None:
        row["target_ratio"] = target
        row["target"] = f"<= {target:g}x {peer_name}"
        row["met"] = a <= target * p
    return row
