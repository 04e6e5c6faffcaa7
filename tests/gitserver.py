"""Real Git servers on loopback for the source-stage tests, and helpers to make repositories.

* ``GitHttpServer``: a small ``http.server`` that runs ``git http-backend`` as a
  CGI program behind HTTP basic auth and logs every request, so tests can see
  exactly what a poll cost (``info/refs`` = ls-remote, ``POST git-upload-pack``
  = fetch).
* ``HangingServer``: accepts TCP connections and never answers (timeouts).
* ``SshServer``: a throw-away ``sshd`` on 127.0.0.1 with its own host key and
  authorized key, serving repositories by absolute path.
* ``Origin``: a bare "remote" repository plus a work tree that pushes to it,
  driven with the ``git`` CLI (test setup only; the agent itself uses pygit2).

Fixtures are defined here and imported by name into the test modules that use
them (``from gitserver import origin_fixture``, registered as ``origin``); each one stops what it started.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.config.types import SourceAuth, SourceConfig, SourceVerify
from agent.source.git import GitSource
from benchmarks.githttp import read_body, run_backend
from tests.waiting import wait_for

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Ada Author",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada Author",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
}


def git(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run the git CLI for test setup; raises with stderr on failure."""
    full_env = {**os.environ, **GIT_ENV, "GIT_CONFIG_GLOBAL": os.devnull, **(env or {})}
    out = subprocess.run(["git", *args], cwd=cwd, env=full_env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {out.stderr}")
    return out.stdout.strip()


@dataclass
class Origin:
    """A bare repository (``bare``) and a work tree (``work``) whose pushes update it."""

    root: Path
    name: str = "origin.git"
    signing: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.bare = self.root / self.name
        self.work = self.root / (self.name.removesuffix(".git") + "-work")
        git("init", "-q", "--bare", "-b", "main", str(self.bare), cwd=self.root)
        git("init", "-q", "-b", "main", str(self.work), cwd=self.root)
        git("remote", "add", "origin", str(self.bare), cwd=self.work)

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def commit(
        self,
        files: dict[str, str | None],
        message: str = "change",
        *,
        push: bool = True,
        sign: bool = False,
        env: dict[str, str] | None = None,
    ) -> str:
        """Write (or delete, with ``None``) files, commit, push; returns the new SHA."""
        for rel, content in files.items():
            path = self.work / rel
            if content is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        git("add", "-A", cwd=self.work)
        flags = [*self.signing, "commit", "-S"] if sign else ["commit"]
        git(*flags, "-q", "--allow-empty", "-m", message, cwd=self.work, env=env)
        if push:
            self.push()
        return self.head()

    def symlink(self, rel: str, target: str, message: str = "add link") -> str:
        path = self.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
        return self.commit({}, message)

    def head(self) -> str:
        return git("rev-parse", "HEAD", cwd=self.work)

    def push(self, *refs: str, force: bool = False) -> None:
        git("push", "-q", *(["--force"] if force else []), "origin", *(refs or ("main",)), cwd=self.work)

    def tag(self, name: str, *, annotated: bool = True, ref: str = "HEAD", force: bool = False) -> None:
        args = ["tag", *(["-f"] if force else []), *(["-a", "-m", name] if annotated else []), name, ref]
        git(*args, cwd=self.work)
        self.push(f"refs/tags/{name}", force=force)

    def rewrite(self, files: dict[str, str], message: str) -> str:
        """Replace the last commit (amend) and force-push: history is rewritten."""
        for rel, content in files.items():
            (self.work / rel).write_text(content)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "--amend", "-m", message, cwd=self.work)
        self.push(force=True)
        return self.head()


# ---------------------------------------------------------------------------
# HTTP


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    user: str
    status: int


class GitHttpServer:
    """``git http-backend`` behind basic auth on 127.0.0.1; ``requests`` logs every request."""

    def __init__(self, root: Path, users: dict[str, str]) -> None:
        self.root = root
        self.users = users
        self.requests: list[Request] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.handle(self)

            def do_POST(self) -> None:
                server.handle(self)

            def log_message(self, format: str, *args: object) -> None:  # quiet: the log is `requests`
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, repo: str = "origin.git") -> str:
        return f"http://127.0.0.1:{self.port}/{repo}"

    def fetches(self) -> list[Request]:
        """Requests that transfer objects (a fetch), as opposed to ref advertisements (ls-remote)."""
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/git-upload-pack")]

    def start(self) -> GitHttpServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Idempotent: tests stop the server to make it unreachable; the fixture stops it again."""
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join(timeout=10)
        self.httpd.server_close()

    def _authorized(self, header: str | None) -> str | None:
        if not self.users:
            return ""
        if not header or not header.startswith("Basic "):
            return None
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return user if self.users.get(user) == password else None

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        path, _, query = h.path.partition("?")
        body = read_body(h)
        user = self._authorized(h.headers.get("Authorization"))
        if user is None:
            self.requests.append(Request(h.command, path, query, "", 401))
            h.send_response(401)
            h.send_header("WWW-Authenticate", 'Basic realm="git"')
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        reply = run_backend(h, str(self.root), body, user=user)
        self.requests.append(Request(h.command, path, query, user, reply.status))
        reply.send(h)


class HangingServer:
    """Accepts connections on 127.0.0.1 and never sends a byte (a hung Git host)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.held.append(conn)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.sock.close()


def free_port() -> int:
    """A port nothing listens on (bound then released): connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------
# SSH


class SshServer:
    """A loopback ``sshd`` (pubkey auth only) with a fresh host key; ``stop`` kills it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        self.host_key = root / "host_ed25519"
        self.client_key = root / "client_ed25519"
        for key in (self.host_key, self.client_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        shutil.copyfile(f"{self.client_key}.pub", root / "authorized_keys")
        config = root / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\nPidFile {root}/sshd.pid\n"
            f"AuthorizedKeysFile {root}/authorized_keys\nStrictModes no\nUsePAM no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\nLogLevel ERROR\n"
            f"SetEnv PATH={os.environ['PATH']}\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        self.proc = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait()

    def _wait(self) -> None:
        def listening() -> bool:
            if self.proc.poll() is not None:
                stderr = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"sshd exited: {stderr}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                return False
            return True

        try:
            wait_for("sshd to listen", listening, 10, interval=0.05)
        except AssertionError:
            self.stop()
            raise RuntimeError("sshd did not start listening") from None

    def known_hosts_line(self) -> str:
        public = Path(f"{self.host_key}.pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {public[0]} {public[1]}\n"

    def url(self, bare: Path) -> str:
        return f"ssh://{os.environ.get('USER', 'root')}@127.0.0.1:{self.port}{bare}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


# ---------------------------------------------------------------------------
# The agent side


@dataclass
class RecordingLog:
    """A structlog-shaped logger that keeps every event for assertions."""

    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def debug(self, event: str, **kw: Any) -> None:
        self.events.append(("debug", event, kw))

    def info(self, event: str, **kw: Any) -> None:
        self.events.append(("info", event, kw))

    def warning(self, event: str, **kw: Any) -> None:
        self.events.append(("warning", event, kw))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for _, name, kw in self.events if name == event]

    def text(self) -> str:
        return "\n".join(f"{level} {name} {kw!r}" for level, name, kw in self.events)


def make_source(
    url: str, cache: Path, *, auth: SourceAuth | None = None, verify: SourceVerify | None = None, **kw: Any
) -> tuple[GitSource, RecordingLog]:
    config = SourceConfig(url=url, **{"branch": "main", "timeout": 20.0, **kw})
    config = replace(config, auth=auth or SourceAuth(), verify=verify or SourceVerify())
    log = RecordingLog()
    return GitSource(config, cache, log=log), log


# ---------------------------------------------------------------------------
# Fixtures

USERS = {"alice": "s3cret-Pa55word"}


@pytest.fixture(name="origin")
def origin_fixture(tmp_path: Path) -> Origin:
    """A bare repository with one commit on ``main`` (served by file://, HTTP and SSH fixtures)."""
    repo = Origin(tmp_path / "srv")
    repo.commit({"apps/app.yaml": "kind: ConfigMap\n", "README.md": "hello\n"}, "first commit")
    return repo


@pytest.fixture(name="http_server")
def http_server_fixture(origin: Origin) -> Iterator[GitHttpServer]:
    """``origin.git`` over HTTP with basic auth (user ``alice``, password ``USERS['alice']``)."""
    server = GitHttpServer(origin.root, USERS).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="hanging_server")
def hanging_server_fixture() -> Iterator[HangingServer]:
    server = HangingServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="ssh_server")
def ssh_server_fixture(tmp_path: Path) -> Iterator[SshServer]:
    if not Path("/usr/sbin/sshd").exists():
        pytest.fail("sshd is not installed (scripts/bootstrap --test installs openssh-server)")
    server = SshServer(tmp_path / "sshd")
    try:
        yield server
    finally:
        server.stop()
