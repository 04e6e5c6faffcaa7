"""What the chaos runner runs: three local clusters, a Git server, a TCP proxy and the agent daemon.

Called by ``benchmarks.chaos.runner`` (and the faults, which act on these parts). Every process
started here is stopped by ``World.close`` (the runner calls it in a ``finally``), and the
clusters are deleted whatever happened.

* Cluster ``chaos-a`` is reached with its admin kubeconfig, ``chaos-b`` with a ServiceAccount
  token (revocable: ``localcluster.revoke``), ``chaos-c`` through ``Proxy``, a TCP forwarder on
  loopback that can hang (accept and never answer) on request.
* Git is ``git daemon`` on a fixed loopback port serving a bare repository; the runner's own
  work tree commits and (force-)pushes to it.
* The agent is ``python -m agent.cli run --config ...`` as a subprocess, its HTTP listener on a
  free port; ``Watch`` polls its ``/healthz`` and samples its RSS and open fds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.dev import localcluster
from agent.dev.process import LocalCluster
from benchmarks.chaos import content

CLUSTERS = ("chaos-a", "chaos-b", "chaos-c")
TOKEN_CLUSTER = "chaos-b"
PROXIED_CLUSTER = "chaos-c"
SERVICE_ACCOUNT = "default/chaos-agent"
AGENT_NAME = "chaos"
#: The agent's timing: short, so a fault's effect shows within seconds.
RECONCILE_INTERVAL = 3.0
REPO_ROOT = Path(__file__).resolve().parents[2]
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "Chaos Runner",
    "GIT_AUTHOR_EMAIL": "chaos@example.invalid",
    "GIT_COMMITTER_NAME": "Chaos Runner",
    "GIT_COMMITTER_EMAIL": "chaos@example.invalid",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_refuses(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:``port`` (the connection is refused)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def proc_state(pid: int) -> str:
    """The kernel's state letter of ``pid`` (``T``: stopped), ``X`` when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return "X"


# ---------------------------------------------------------------- Git


class GitServer:
    """A bare repository served by ``git daemon`` on a fixed port, and a work tree that pushes to it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bare = root / "fleet.git"
        self.work = root / "work"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.contents: dict[str, content.ClusterContent] = {}
        root.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "--bare", "-b", "main", str(self.bare), cwd=root)
        self.git("init", "-q", "-b", "main", str(self.work), cwd=root)
        self.git("remote", "add", "origin", str(self.bare))

    @property
    def url(self) -> str:
        return f"git://127.0.0.1:{self.port}/fleet.git"

    def git(self, *args: str, cwd: Path | None = None) -> str:
        out = subprocess.run(
            ["git", *args],
            cwd=cwd or self.work,
            env={**os.environ, **GIT_ENV},
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def _write(self) -> None:
        for top in ("plain", "kust"):
            shutil.rmtree(self.work / top, ignore_errors=True)
        for cluster, c in sorted(self.contents.items()):
            for rel, text in content.files(cluster, c).items():
                path = self.work / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)

    def commit(self, message: str) -> str:
        """Commit ``contents`` as they are now (an empty commit if nothing changed) and push."""
        self._write()
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        self.git("push", "-q", "origin", "main")
        return self.head()

    def force_push(self, message: str) -> str:
        """Drop the last commit and push a new one in its place: history rewritten."""
        self.git("reset", "-q", "--hard", "HEAD~1")
        self._write()
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        self.git("push", "-q", "--force", "origin", "main")
        return self.head()

    def is_ancestor(self, old: str, new: str) -> bool:
        out = subprocess.run(
            ["git", "merge-base", "--is-ancestor", old, new], cwd=self.work, env={**os.environ, **GIT_ENV}
        )
        return out.returncode == 0

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                f"--base-path={self.root}",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                str(self.root),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while port_refuses(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"git daemon did not start on 127.0.0.1:{self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        # git daemon forks a child per connection, all in its session: end the whole group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None


# ---------------------------------------------------------------- the hanging proxy


class Proxy:
    """A TCP forwarder on 127.0.0.1 to a cluster's apiserver that can be told to hang.

    While hung, new connections are accepted and never answered, and data on open ones is
    swallowed: every request the agent sends through it waits for its timeout. ``release``
    closes what was held, and forwarding resumes for new connections.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self.hung = False
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="chaos-proxy", daemon=True).start()

    def hang(self) -> None:
        with self._lock:
            self.hung = True

    def release(self) -> None:
        with self._lock:
            self.hung = False
            held, self._held = self._held, []
        for s in held:
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._closed = True
        self.release()
        with contextlib.suppress(OSError):
            self.listener.close()

    def _hold(self, *socks: socket.socket) -> None:
        with self._lock:
            self._held.extend(socks)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.hung:
                self._hold(conn)
                continue
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                conn.close()
                continue
            up.settimeout(None)
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.hung:
                    self._hold(src, dst)  # swallowed: the other side waits until release
                    return
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def answers(self, timeout: float = 1.0) -> bool:
        """Whether a connection through the proxy gets any byte back (a TLS alert to garbage)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
                s.sendall(b"\x16\x03\x01\x00\x05hello")  # not a valid ClientHello: a live server answers
                return bool(s.recv(1))
        except OSError:
            return False


# ---------------------------------------------------------------- the agent process


@dataclass
class Sample:
    at: float
    rss_mb: float
    fds: int


@dataclass
class AgentProcess:
    """``python -m agent.cli run`` as a subprocess, from ``source_root`` (the repository or a plant)."""

    config: Path
    listen: str
    log: Path
    source_root: Path = REPO_ROOT
    proc: subprocess.Popen[bytes] | None = None
    #: Every process's samples, by pid, in start order.
    samples: dict[int, list[Sample]] = field(default_factory=dict)

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.source_root)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.source_root,
                env=env,
                start_new_session=True,
            )
        self.samples[self.proc.pid] = []
        deadline = time.monotonic() + timeout
        while self.get("/healthz")[0] != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the agent exited ({self.proc.returncode}) on start; see {self.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the agent's /healthz did not answer 200 within {timeout:.0f}s; see {self.log}"
                )
            time.sleep(0.1)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def kill(self) -> int:
        """SIGKILL and reap; returns the exit code as ``Popen`` reports it (-9 when the signal did it)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.listen}{path}", timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    def post(self, path: str) -> int:
        req = urllib.request.Request(f"http://{self.listen}{path}", data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def status(self) -> dict[str, Any] | None:
        code, body = self.get("/status")
        if code != 200:
            return None
        doc: dict[str, Any] = json.loads(body)
        return doc

    def sample(self) -> None:
        pid = self.pid
        if pid is None:
            return
        try:
            rss_kb = next(
                int(line.split()[1])
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")
            )
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, StopIteration):
            return
        self.samples.setdefault(pid, []).append(Sample(time.monotonic(), rss_kb / 1024, fds))


class Watch:
    """Polls the agent's ``/healthz`` every 250 ms and samples its RSS and fds every 2 s, on a thread.

    ``agent_down`` is set by the runner around a kill and restart of the agent: failures then
    are the fault itself, not a liveness failure (invariant 6's exception).
    """

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self.agent_down = False
        self.failures: list[tuple[float, int, str]] = []
        self.probes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def take_failures(self) -> list[tuple[float, int, str]]:
        out, self.failures = self.failures, []
        return out

    def _run(self) -> None:
        last_sample = 0.0
        while not self._stop.is_set():
            down = self.agent_down
            code, body = self.agent.get("/healthz", timeout=5)
            self.probes += 1
            if code != 200 and not down and not self.agent_down:
                self.failures.append((time.time(), code, body.strip()[:200]))
            if time.monotonic() - last_sample >= 2.0:
                self.agent.sample()
                last_sample = time.monotonic()
            self._stop.wait(0.25)


# ---------------------------------------------------------------- the whole


class World:
    """Everything one chaos run starts, under ``root``; ``close`` stops and deletes all of it."""

    def __init__(self, root: Path, *, source_root: Path = REPO_ROOT) -> None:
        self.root = root
        self.state_dir = root / "clusters"
        self.clusters: dict[str, LocalCluster] = {}
        self.git = GitServer(root / "git")
        self.proxy: Proxy | None = None
        self.kubeconfigs: dict[str, Path] = {}
        listen = f"127.0.0.1:{free_port()}"
        self.agent = AgentProcess(root / "agent.toml", listen, root / "agent.log", source_root)
        self.watch = Watch(self.agent)

    def start(self) -> None:
        self.clusters.update(dict.fromkeys(CLUSTERS))  # type: ignore[arg-type]  # recorded before start, for close
        for name in CLUSTERS:  # one at a time: three apiservers starting at once starve two cores
            self.clusters[name] = localcluster.start(name, self.state_dir, timeout=180)
        self.kubeconfigs = {c: self.clusters[c].kubeconfig for c in CLUSTERS}
        self.kubeconfigs[TOKEN_CLUSTER] = localcluster.token(TOKEN_CLUSTER, self.state_dir, SERVICE_ACCOUNT)
        proxied = self.clusters[PROXIED_CLUSTER]
        self.proxy = Proxy(proxied.ports.apiserver)
        text = proxied.kubeconfig.read_text().replace(
            f"https://127.0.0.1:{proxied.ports.apiserver}", f"https://127.0.0.1:{self.proxy.port}"
        )
        path = self.root / f"{PROXIED_CLUSTER}.proxied.kubeconfig"
        path.write_text(text)
        path.chmod(0o600)
        self.kubeconfigs[PROXIED_CLUSTER] = path
        self.git.contents = {c: content.ClusterContent() for c in CLUSTERS}
        self.git.commit("initial content")
        self.git.start()
        self.write_config()
        self.agent.start()
        self.watch.start()

    def write_config(self) -> None:
        lines = [
            "[agent]",
            f'name = "{AGENT_NAME}"',
            f'cache_dir = "{self.root / "cache"}"',
            f'listen = "{self.agent.listen}"',
            'log_level = "info"',
            'leases = "off"',
            'backoff_base = "1s"',
            'backoff_cap = "4s"',
            'reload_interval = "0s"',
            'shutdown_grace = "5s"',
            "",
            "[source]",
            f'url = "{self.git.url}"',
            'poll_interval = "1s"',
            'timeout = "5s"',
            "",
            "[defaults]",
            f'reconcile_interval = "{RECONCILE_INTERVAL:g}s"',
            'connect_timeout = "2s"',
            'request_timeout = "4s"',
            'pass_deadline = "30s"',
            "prune = true",
            "max_prune_fraction = 0.5",
            "brake_min_inventory = 10",
            "",
        ]
        for c in CLUSTERS:
            lines += [
                "[[clusters]]",
                f'name = "{c}"',
                f'kubeconfig = "{self.kubeconfigs[c]}"',
                f'path = "plain/{c}"',
                "",
            ]
        for c in CLUSTERS:
            lines += [
                "[[apps]]",
                f'name = "{content.kust_app(c)}"',
                f'cluster = "{c}"',
                f'path = "kust/{c}"',
                "",
            ]
        self.agent.config.write_text("\n".join(lines))

    def api(self, cluster: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request to ``cluster`` as its admin, straight to its apiserver (never through the proxy)."""
        return localcluster.api_request(self.clusters[cluster], method, path, body, timeout=10)

    def kubectl(self, cluster: str, *args: str) -> str:
        return localcluster.kubectl(self.clusters[cluster].kubeconfig, *args, timeout=30).stdout

    def pid(self, cluster: str, component: str) -> int | None:
        return localcluster.status(cluster, self.state_dir).pids.get(component)

    def close(self) -> None:
        steps = [
            self.watch.stop,
            self.agent.stop,
            self.git.stop,
            *([self.proxy.close] if self.proxy else []),
        ]
        for step in steps:
            with contextlib.suppress(Exception):
                step()
        for name in list(self.clusters):
            with contextlib.suppress(Exception):
                localcluster.delete(name, self.state_dir)
