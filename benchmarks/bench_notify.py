"""Benchmark 10: notifications and the webhook receiver, timed (docs/notifications.md).

Called by ``benchmarks.__main__`` (``python -m benchmarks notify``). One local cluster, a workload
of N objects in Git.

- **Push-to-pass latency.** The daemon in-process (``scheduler.Daemon``, as ``gitops-agent run``
  wires it) with ``poll_interval = "1h"`` and a GitHub hook on its receiver: a commit, then a signed
  push; the clock runs from the push until the cluster's pass at that commit has finished. Its
  peer, in the same run: the same commit found by polling every 2 s (no receiver).
- **The cost of a hanging sink.** Passes of one in-process ``Fleet`` at a new commit each (so each
  pass sends a ``pending`` and a ``success`` commit status), in turn with a notifier whose GitHub
  sink never answers (a TCP server that accepts and stays silent), with one whose sink answers at
  once, and with no notifier. The figure is the median pass latency with the hanging sink over
  the answering one; a second row gives the answering one's over none (what notifying costs).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks import workload as w

SECRET = "benchmark-hook-secret"
PUSH_TARGET = 1.0
SINK_TARGET = 1.10


class _Silent:
    """Accepts TCP connections and never answers: a sink that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(c)

    def close(self) -> None:
        self._stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


def _commit(repo: Path, files: Path, i: int) -> str:
    (files / "zz-bench-revision.yaml").write_text(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bench-revision\n  namespace: default\n"
        f"data:\n  n: '{i}'\n"
    )
    return h.commit_workload(repo, files, f"revision {i}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _daemon(config_file: Path) -> Any:
    from agent.config.load import load_config
    from agent.run.fleet import Fleet
    from agent.run.lease_settings import LeaseSettings
    from agent.run.scheduler import Daemon, DaemonOptions
    from agent.source.sources import SourceSet

    cfg = load_config(config_file)
    d = Daemon(cfg, SourceSet.from_config(cfg), Fleet, DaemonOptions(leases=LeaseSettings(), tick=0.2))
    d.start()
    return d


def _wait_applied(daemon: Any, cluster: str, sha: str, timeout: float = 120.0) -> float:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = daemon.fleet.status[cluster].app(cluster)
        if st.last_success_revision == sha:
            return time.monotonic()
        time.sleep(0.005)
    raise RuntimeError(f"{sha[:12]} not applied on {cluster} within {timeout:g}s")


def _push_rows(root: Path, repo: Path, files: Path, cluster: Any, reps: int) -> dict[str, Any]:
    secret = root / "hook-secret"
    secret.write_text(SECRET)
    port = _free_port()
    pushed: list[float] = []
    polled: list[float] = []
    n = 1000
    for mode in ("push", "poll"):
        cfg = root / f"notify-{mode}.toml"
        # One agent name for both: the second daemon takes the first one's inventory over as is.
        h.write_config(cfg, repo, root / f"cache-notify-{mode}", [cluster], agent="bench-notify")
        interval = "1h" if mode == "push" else "2s"
        text = cfg.read_text().replace("[source]\n", f'[source]\npoll_interval = "{interval}"\n')
        if mode == "push":
            text += (
                f'\n[receiver]\nlisten = "127.0.0.1:{port}"\n\n'
                f'[[receivers]]\nname = "bench"\nkind = "github"\nsecret_file = "{secret}"\n'
            )
        cfg.write_text(text)
        daemon = _daemon(cfg)
        try:
            _wait_applied(daemon, cluster.name, _head(repo))
            for _ in range(reps):
                n += 1
                sha = _commit(repo, files, n)
                t0 = time.monotonic()
                if mode == "push":
                    _push_repo(port, sha, repo)
                took = _wait_applied(daemon, cluster.name, sha) - t0
                (pushed if mode == "push" else polled).append(took)
        finally:
            daemon.stop(grace=5)
    p, q = h.median(pushed), h.median(polled)
    return {
        "metric": "push-to-pass latency (poll_interval 1h, a signed GitHub push)",
        "agent_seconds": round(p, 3),
        "peer_name": "polling every 2 s",
        "peer_seconds": round(q, 3),
        "time_ratio": h.ratio(p, q),
        "target": "<= 1.0x",
        "met": p <= PUSH_TARGET * q,
        "push_runs": [round(x, 3) for x in pushed],
        "poll_runs": [round(x, 3) for x in polled],
    }


def _head(repo: Path) -> str:
    import pygit2

    r = pygit2.Repository(str(repo))
    return str(r.references["refs/heads/main"].target)


def _push_repo(port: int, sha: str, repo: Path) -> None:
    """A GitHub push of ``sha`` naming the repository by the URL the source follows."""
    from agent.notify import signing

    body = json.dumps(
        {"ref": "refs/heads/main", "after": sha, "repository": {"clone_url": str(repo)}}
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": sha,
        "X-Hub-Signature-256": signing.body_signature(SECRET.encode(), body),
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/hook/bench", data=body, headers=headers, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        if r.status != 202:
            raise RuntimeError(f"push answered {r.status}")


class _Answering:
    """An HTTP server that answers every request at once (201): a sink that works."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _notifier(root: Path, repo: Path, cluster: Any, name: str, api_url: str, fleet: Any) -> Any:
    from prometheus_client import CollectorRegistry

    from agent.config.load import load_config
    from agent.notify.delivery import NotifyMetrics
    from agent.notify.notifier import Notifier
    from agent.notify.store import FileStore

    token = root / "sink-token"
    token.write_text("benchmark-token")
    cfg_file = root / f"notify-{name}.toml"
    h.write_config(cfg_file, repo, root / "cache-notify-sink", [cluster], agent="bench-sink")
    cfg_file.write_text(
        cfg_file.read_text()
        + f'\n[[notifications]]\nname = "{name}"\nkind = "github"\napi_url = "{api_url}"\n'
        f'repository = "acme/fleet"\ntoken_file = "{token}"\ntimeout = "60s"\nretries = 1\nqueue_size = 4\n'
    )
    n = Notifier(
        load_config(cfg_file),
        store=FileStore(root / f"notify-state-{name}"),
        metrics=NotifyMetrics(CollectorRegistry()),
        fence=lambda _c: None,
        clusters=fleet.names,
        instance="bench",
    )
    n.start()
    return n


def _sink_rows(root: Path, repo: Path, files: Path, cluster: Any, reps: int) -> list[dict[str, Any]]:
    silent, answering = _Silent(), _Answering()
    cfg_file = root / "notify-sink.toml"
    h.write_config(cfg_file, repo, root / "cache-notify-sink", [cluster], agent="bench-sink")
    agent = h.InProcessAgent(cfg_file)
    observers = {
        "hanging": _notifier(root, repo, cluster, "stuck", silent.url, agent.fleet),
        "answering": _notifier(root, repo, cluster, "working", answering.url, agent.fleet),
        "none": None,
    }
    runs: dict[str, list[float]] = {k: [] for k in observers}
    n = 5000
    try:
        agent.reconcile()
        for _ in range(reps):
            for variant, observer in observers.items():  # interleaved: the machine's noise hits all three
                n += 1
                _commit(repo, files, n)
                agent.fleet.observer = observer
                (r,) = agent.reconcile()
                runs[variant].append((r.finished - r.started).total_seconds())
        stuck = observers["hanging"].deliveries[0].to_json()  # type: ignore[union-attr]
    finally:
        for o in observers.values():
            if o is not None:
                o.stop()
        agent.close()
        silent.close()
        answering.close()
    med = {k: h.median(v) for k, v in runs.items()}
    hanging = {
        "metric": "pass latency with a sink that hangs (commit statuses to it every pass)",
        "agent_seconds": round(med["hanging"], 3),
        "peer_name": "a sink that answers at once",
        "peer_seconds": round(med["answering"], 3),
        "time_ratio": h.ratio(med["hanging"], med["answering"]),
        "target": "<= 1.10x",
        "met": med["hanging"] <= SINK_TARGET * med["answering"],
        "hanging_runs": [round(x, 3) for x in runs["hanging"]],
        "answering_runs": [round(x, 3) for x in runs["answering"]],
        "sink": {k: stuck[k] for k in ("queued", "sent", "failed", "dropped")},
    }
    notifying = {
        "metric": "pass latency with commit statuses sent (a sink that answers)",
        "agent_seconds": round(med["answering"], 3),
        "peer_name": "no notifications",
        "peer_seconds": round(med["none"], 3),
        "time_ratio": h.ratio(med["answering"], med["none"]),
        "none_runs": [round(x, 3) for x in runs["none"]],
    }
    return [hanging, notifying]


def run(root: Path, n: int = 500, reps: int = 3) -> dict[str, Any]:
    h.quiet_logs()
    repo = root / "repo-notify.git"
    files = root / "files-notify"
    w.write(w.generate(n), files)
    _commit(repo, files, 0)
    out: dict[str, Any] = {"objects": n, "rows": []}
    with h.ClusterSet(root / "state-notify") as cs:
        (cluster,) = cs.start("notify-a")
        out["rows"].append(_push_rows(root, repo, files, cluster, reps))
        out["rows"] += _sink_rows(root, repo, files, cluster, max(10, reps))
    for row in out["rows"]:
        verdict = "" if "met" not in row else "  target met" if row["met"] else "  TARGET MISSED"
        print(
            f"notify {n}  {row['metric']}: {row['agent_seconds']:.3f}s vs {row['peer_seconds']:.3f}s "
            f"({row['peer_name']}) x{row['time_ratio']}{verdict}",
            flush=True,
        )
    return out
