"""``gitops-agent rollback`` and ``history`` on a real local API server, from a real Git server on
loopback (``git http-backend``): the rollback works with the Git server stopped, pins one app
(the other follows its source), the next commit resumes auto-sync, ``--clear`` resumes at once,
and bad input exits 2 naming what is wrong.

Each command runs as its own process (``python -m agent.cli``); the passes run in this process as
the daemon runs them (``Fleet.run_apps``), their records kept as the status page keeps them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.config.load import load_config
from agent.config.types import Config
from agent.model import ROLLBACK_FROM, ROLLBACK_TO, ClusterResult, Revision
from agent.run.fleet import Fleet
from agent.run.record_store import FileStore
from agent.source.git import GitSource
from agent.ui import records
from tests.agentkit import unique
from tests.appkit import parent
from tests.clusters import ClusterPool, kubectl
from tests.gitserver import GitHttpServer, Origin

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
CM = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  v: "{v}"\n'
NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture
def ns(cluster_pool: ClusterPool) -> Iterator[str]:
    name = unique("rollback")
    yield name
    kubectl(cluster_pool["pool-a"].kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


def files(ns: str, web: int, db: int) -> dict[str, str | None]:
    return {
        "apps/web/objects.yaml": NS.format(ns=ns) + "---\n" + CM.format(name="web", ns=ns, v=web),
        "apps/db/cm.yaml": CM.format(name="db", ns=ns, v=db),
    }


def write_config(tmp_path: Path, url: str, kubeconfig: Path) -> Config:
    text = f"""
[agent]
name = "{unique("agent")}"
cache_dir = "{tmp_path / "cache"}"
listen = ""

[source]
url = "{url}"
branch = "main"
timeout = "5s"

[defaults]
pass_deadline = "60s"
request_timeout = "10s"
connect_timeout = "2s"

[[clusters]]
name = "pool-a"
kubeconfig = "{kubeconfig}"

[[apps]]
cluster = "pool-a"
name = "web"
path = "apps/web"

[[apps]]
cluster = "pool-a"
name = "db"
path = "apps/db"
depends_on = ["web"]
"""
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return load_config(p)


class Daemonish:
    """The fleet, the source and the status page's records, as the daemon keeps them."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.source = GitSource.from_config(config)
        self.fleet = Fleet(config)
        self.store = FileStore(Path(config.agent.cache_dir) / "status")

    def run(self, revision: Revision, trigger: str = "new revision") -> dict[str, ClusterResult]:
        results = self.fleet.run_apps("pool-a", {"default": revision})
        for r in results:  # as ``StatusPage.record_passes``
            prev = self.store.load(r.cluster, r.app)
            rec = records.after_pass(prev, r, subject="", now=datetime.now(UTC), trigger=trigger)
            self.store.save(rec, records.encode(rec))
        return {r.app: r for r in results}

    def close(self) -> None:
        self.fleet.close()
        self.source.close()


def serve(origin: Origin, port: int = 0) -> GitHttpServer:
    """``origin`` over HTTP, on ``port`` (0: any): a server stopped and started again keeps its URL."""
    server = GitHttpServer(origin.root, {})
    if port:
        handler = server.httpd.RequestHandlerClass
        server.httpd.server_close()
        server.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        server.httpd.daemon_threads = True
        server.thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    return server.start()


def value(kubeconfig: Path, ns: str, name: str) -> str:
    return kubectl(kubeconfig, "get", "configmap", name, "-n", ns, "-o", "jsonpath={.data.v}")


def pin_annotations(cfg: Config, cluster_pool: ClusterPool) -> dict[str, str]:
    store = parent(cfg, cluster_pool["pool-a"], "web")
    try:
        ann = store.load().annotations
    finally:
        store.client.close()
    return {k: v for k, v in ann.items() if k in (ROLLBACK_TO, ROLLBACK_FROM)}


def test_rollback_with_git_down_pins_one_app_and_the_next_commit_resumes(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    kc = cluster_pool["pool-a"].kubeconfig
    origin = Origin(tmp_path / "srv")
    good = origin.commit(files(ns, 1, 1), "good")
    server = serve(origin)
    cfg = write_config(tmp_path, server.url(), kc)
    agent = Daemonish(cfg)
    try:
        assert all(r.ok for r in agent.run(agent.source.poll()).values())
        bad = origin.commit(files(ns, 2, 2), "bad")
        at_bad = agent.source.poll()
        assert at_bad.sha == bad
        assert all(r.ok for r in agent.run(at_bad).values())
        assert value(kc, ns, "web") == "2"
        server.stop()  # the Git server is down from here on

        # Without --yes: the diff of the revision before the current one, and no pin.
        shown = cli("rollback", "--config", str(cfg.file), "--cluster", "pool-a", "--app", "web")
        assert shown.returncode == 0, shown.stderr
        assert "web" in shown.stdout and "not pinned" in shown.stdout
        assert "-  v: '2'" in shown.stdout and "+  v: '1'" in shown.stdout  # the live diff first
        assert pin_annotations(cfg, cluster_pool) == {}

        done = cli("rollback", "--config", str(cfg.file), "--cluster", "pool-a", "--app", "web", "--yes")
        assert done.returncode == 0, done.stderr
        assert f"pinned to {good[:12]}" in done.stdout
        assert pin_annotations(cfg, cluster_pool) == {ROLLBACK_TO: good, ROLLBACK_FROM: bad}

        # The pass (the source still at the bad commit, its polls failing) renders the pin for web only.
        after = agent.run(at_bad)
        assert after["web"].ok and after["web"].revision == good and after["web"].pin is not None
        assert value(kc, ns, "web") == "1"
        assert value(kc, ns, "db") == "2"  # auto-sync stays on for the other app
        row = next(a for a in agent.fleet.status["pool-a"].apps.values() if a.app == "web").to_json()
        assert row["pin"] == {"revision": good, "bad": bad, "at": row["pin"]["at"]}
        assert "web" not in agent.fleet.due_apps("pool-a", {"default": at_bad})  # not due again for it

        hist = cli("history", "--config", str(cfg.file), "--cluster", "pool-a", "--app", "web", "-o", "json")
        assert hist.returncode == 0, hist.stderr
        doc = json.loads(hist.stdout)
        assert doc["pin"] == {"revision": good, "bad": bad}
        assert [p["revision"] for p in doc["passes"]] == [good, bad, good]
        assert doc["passes"][0]["rolled_back_from"] == bad
        assert doc["passes"][1]["trigger"] == "new revision"
        table = cli("history", "--config", str(cfg.file), "--cluster", "pool-a", "--app", "web")
        assert f"pinned to {good[:12]}" in table.stdout and "(rollback)" in table.stdout

        # A newer commit than the bad one resumes auto-sync: the pass clears the pin and says so.
        server = serve(origin, port=server.port)
        fixed = origin.commit(files(ns, 3, 3), "fix")
        at_fixed = agent.source.poll()
        assert at_fixed.sha == fixed
        resumed = agent.run(at_fixed)
        assert resumed["web"].ok and resumed["web"].revision == fixed and resumed["web"].pin is None
        assert "cleared" in resumed["web"].pin_cleared
        assert value(kc, ns, "web") == "3"
        assert pin_annotations(cfg, cluster_pool) == {}

        # --to a named commit, then --clear: the app follows its source again at once.
        pinned = cli(
            "rollback", "--config", str(cfg.file), "--cluster", "pool-a", "--app", "web",
            "--to", good[:10], "--yes",
        )  # fmt: skip
        assert pinned.returncode == 0, pinned.stderr
        assert pin_annotations(cfg, cluster_pool)[ROLLBACK_TO] == good
        assert agent.run(at_fixed)["web"].revision == good
        assert value(kc, ns, "web") == "1"
        cleared = cli("rollback", "--config", str(cfg.file), "--cluster", "pool-a", "--app", "web", "--clear")
        assert cleared.returncode == 0, cleared.stderr
        assert "cleared" in cleared.stdout
        assert pin_annotations(cfg, cluster_pool) == {}
        assert agent.run(at_fixed)["web"].revision == fixed
        assert value(kc, ns, "web") == "3"
        server.stop()
    finally:
        agent.close()
        server.stop()


def test_rollback_refuses_bad_input_naming_it(tmp_path: Path, cluster_pool: ClusterPool, ns: str) -> None:
    kc = cluster_pool["pool-a"].kubeconfig
    origin = Origin(tmp_path / "srv")
    origin.commit(files(ns, 1, 1), "good")
    cfg = write_config(tmp_path, origin.url, kc)
    agent = Daemonish(cfg)
    try:
        agent.run(agent.source.poll())
        base = ("rollback", "--config", str(cfg.file), "--cluster", "pool-a")
        unknown_app = cli(*base, "--app", "nope", "--yes")
        assert unknown_app.returncode == 2
        assert "nope" in unknown_app.stderr and "web" in unknown_app.stderr
        unknown_rev = cli(*base, "--app", "web", "--to", "deadbeef00", "--yes")
        assert unknown_rev.returncode == 2
        assert "deadbeef00" in unknown_rev.stderr
        not_sha = cli(*base, "--app", "web", "--to", "main~1")
        assert not_sha.returncode == 2 and "main~1" in not_sha.stderr
        no_earlier = cli(*base, "--app", "web")
        assert no_earlier.returncode == 2 and "--to" in no_earlier.stderr
        both = cli(*base, "--app", "web", "--clear", "--to", "abcdef1")
        assert both.returncode == 2
        assert pin_annotations(cfg, cluster_pool) == {}
        history = cli("history", "--config", str(cfg.file), "--cluster", "pool-a", "--app", "nope")
        assert history.returncode == 2 and "nope" in history.stderr
    finally:
        agent.close()
