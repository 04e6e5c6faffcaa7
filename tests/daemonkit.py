"""Helpers for the daemon, scheduler, lease and HTTP server tests (no tests of its own).

A daemon in this process on real local clusters, with its HTTP server on a
free loopback port; a watcher that polls ``/healthz`` for a whole test; small
manifests. Waiting with a deadline is ``tests/waiting.py``'s ``wait_for``.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.config.load import load_config
from agent.config.types import Config
from agent.run.fleet import Fleet
from agent.run.lease_settings import LeaseSettings
from agent.run.scheduler import Daemon, DaemonOptions
from agent.source.sources import SourceSet

NO_LEASES = LeaseSettings(enabled=False)

#: The ``daemons`` fixture: ``daemons(config, **options)`` is ``start_daemon``, stopped after the test.
Daemons = Callable[..., Daemon]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The ``[agent] ui_token_file`` token ``tune(token=True)`` configures; ``http`` sends it.
TOKEN = "daemonkit-ui-token"


def tune(
    cfg: Config,
    *,
    listen: bool = True,
    poll: str = "1s",
    agent_lines: str = "",
    defaults: dict[str, str | int] | None = None,
    token: bool = False,
) -> Config:
    """The same config with a loopback listen port, a short source poll and ``[defaults]`` overrides;
    ``token``: with ``[agent] ui_token_file`` (``TOKEN``), which ``POST /sync`` needs."""
    path = Path(cfg.file)
    text = path.read_text()
    if token:
        (path.parent / "ui-token").write_text(TOKEN + "\n")
        agent_lines = "\n".join(filter(None, [agent_lines, 'ui_token_file = "ui-token"']))
    for key, value in (defaults or {}).items():
        line = f"{key} = {value}" if isinstance(value, int) else f'{key} = "{value}"'
        if re.search(rf"^{key} = .*$", text, flags=re.M):
            text = re.sub(rf"^{key} = .*$", line, text, count=1, flags=re.M)
        else:
            text = text.replace("[defaults]\n", f"[defaults]\n{line}\n", 1)
    if listen:
        text = text.replace('listen = ""', f'listen = "127.0.0.1:{free_port()}"')
    text = re.sub(r"(\[source\]\n)", f'\\1poll_interval = "{poll}"\n', text, count=1)
    if agent_lines:
        text = text.replace("[agent]\n", f"[agent]\n{agent_lines}\n", 1)
    path.write_text(text)
    return load_config(path)


def start_daemon(cfg: Config, **options: Any) -> Daemon:
    options.setdefault("leases", NO_LEASES)
    options.setdefault("tick", 0.2)
    d = Daemon(cfg, SourceSet.from_config(cfg), Fleet, DaemonOptions(**options))
    d.start()
    return d


def stop_daemon(daemon: Daemon) -> None:
    """Stop ``daemon`` as the tests do (grace 2 s), unless it is stopped or stopping already."""
    if not daemon.stopping:
        daemon.stop(grace=2)


def url(cfg: Config, path: str) -> str:
    return f"http://{cfg.agent.listen}{path}"


def http(target: str, method: str = "GET", *, token: str = TOKEN) -> tuple[int, str]:
    """(status, body); sends ``token`` as a bearer (ignored where none is configured)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = b"" if method == "POST" else None
    req = urllib.request.Request(target, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def status(cfg: Config) -> dict[str, Any]:
    code, body = http(url(cfg, "/status"))
    assert code == 200, body
    doc: dict[str, Any] = json.loads(body)
    return doc


def cluster_status(cfg: Config, name: str) -> dict[str, Any]:
    doc = status(cfg)
    return next(c for c in doc["clusters"] if c["cluster"] == name)


class HealthWatch:
    """Polls ``/healthz`` every 100 ms on a thread; ``failures`` lists every non-200 answer."""

    def __init__(self, cfg: Config) -> None:
        self.target = url(cfg, "/healthz")
        self.failures: list[tuple[float, int, str]] = []
        self.probes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                code, body = http(self.target)
            except OSError as e:
                code, body = 0, str(e)
            self.probes += 1
            if code != 200:
                self.failures.append((time.time(), code, body))
            self._stop.wait(0.1)


def configmaps(ns: str, greeting: str, *names: str) -> str:
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"]
    for n in names or ("settings",):
        docs.append(
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {n}\n  namespace: {ns}\n"
            f"data:\n  greeting: {greeting}\n"
        )
    return "---\n".join(docs)
