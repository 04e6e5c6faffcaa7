"""Change windows on real clusters: a closed window holds every write, ``--force-window`` one pass.

A deny window that is open keeps a change in Git from being applied (and what left Git from
being pruned, and the inventory from being written), while the pass still plans and says which
window held it; ``gitops-agent sync --force-window`` through the running agent's ``POST /sync``
lets exactly one pass write, recorded in that pass's result and the history; the next pass is
held again. Outside every allow window the same holds, naming the window that opens next.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli import ops as cli_ops
from agent.model import PassState, WindowReason, app_page
from agent.run.scheduler import Daemon
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import Daemons, cluster_status, configmaps, http, tune, url
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

#: Open at every moment: each minute starts it, for a minute.
ALWAYS = 'schedule = "* * * * *"\nduration = "1m"'


def _cm(kubeconfig: Path, ns: str, name: str) -> dict[str, Any] | None:
    out = kubectl(kubeconfig, "get", "cm", name, "-n", ns, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def _greeting(kubeconfig: Path, ns: str) -> str | None:
    cm = _cm(kubeconfig, ns, "settings")
    return cm["data"]["greeting"] if cm else None


def _with_windows(cfg_file: str, text: str) -> None:
    path = Path(cfg_file)
    path.write_text(path.read_text() + "\n" + text + "\n")


def _history(daemon: Daemon, cluster: str) -> list[tuple[str, str]]:
    record = daemon.page.record(cluster, cluster) if daemon.page else None
    return [(h.state, h.window) for h in record.history] if record else []


def test_a_deny_window_holds_every_write_and_force_window_lets_one_pass_through(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("windows")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "one", "settings", "extra")})
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    _with_windows(cfg.file, f'[[windows]]\nname = "freeze"\n{ALWAYS}\nkind = "deny"\nclusters = ["pool-*"]')
    cfg = tune(cfg, defaults={"reconcile_interval": "1h"}, agent_lines='sync_interval = "0s"', token=True)
    daemon = daemons(cfg)
    parent = ("cm", cfg.agent.name, "-n", cfg.agent.namespace, "--ignore-not-found", "-o", "name")

    # Held from the first pass: planned (what waits is counted), nothing applied, no inventory.
    row = wait_for("held", lambda: (r := cluster_status(cfg, "pool-a"))["state"] == "window" and r, 30)
    assert row["window"]["reason"] == WindowReason.DENY.value and row["window"]["window"] == "freeze"
    assert row["window"]["changes"] >= 2 and not row["window"]["forced"]
    assert "deny window 'freeze'" in row["window"]["message"]
    assert "deny window 'freeze'" in row["writes_blocked"]
    assert [(w["name"], w["kind"], w["open"]) for w in row["windows"]] == [("freeze", "deny", True)]
    assert _cm(a.kubeconfig, ns, "settings") is None
    assert kubectl(a.kubeconfig, "get", *parent).strip() == ""
    # A plain sync is held like any pass.
    first = daemon.fleet.status["pool-a"].apps["pool-a"].last_result
    code, _ = http(url(cfg, "/sync?cluster=pool-a"), "POST")
    assert code == 202
    wait_for(
        "a second pass", lambda: daemon.fleet.status["pool-a"].apps["pool-a"].last_result is not first, 30
    )
    assert cluster_status(cfg, "pool-a")["state"] == "window"
    assert _cm(a.kubeconfig, ns, "settings") is None

    # sync --force-window: this one pass writes, and says so.
    out = CliRunner().invoke(cli_ops.sync, ["--config", cfg.file, "--cluster", "pool-a", "--force-window"])
    assert out.exit_code == 0 and "overrides a closed change window once" in out.output, out.output
    wait_for("applied once", lambda: _greeting(a.kubeconfig, ns) == "one", 30)
    row = wait_for("forced ok", lambda: (r := cluster_status(cfg, "pool-a"))["state"] == "ok" and r, 30)
    assert row["window"]["forced"] and "overridden once" in row["window"]["message"]
    assert row["writes_blocked"]  # the window itself is still open
    assert kubectl(a.kubeconfig, "get", *parent).strip() != ""

    # The next pass is held again: the new commit is not applied, the removed object not pruned.
    sha = repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "two", "settings")})
    row = wait_for(
        "held at the new revision",
        lambda: (r := cluster_status(cfg, "pool-a"))["revision"] == sha and r["state"] == "window" and r,
        30,
    )
    assert row["window"]["window"] == "freeze" and not row["window"]["forced"]
    assert row["window"]["changes"] == 1 and row["window"]["prunes"] == 1
    assert _greeting(a.kubeconfig, ns) == "one"
    assert _cm(a.kubeconfig, ns, "extra") is not None
    assert row["last_success_revision"] != sha

    # The history keeps the held passes and the one that overrode the window.
    history = _history(daemon, "pool-a")
    states = [s for s, _ in history]
    assert PassState.OK.value in states and states[-1] == PassState.WINDOW.value
    forced = [w for s, w in history if s == PassState.OK.value]
    assert "overridden once" in forced[-1]
    # The status page shows the window and that writes are blocked now.
    code, page = http(url(cfg, app_page("pool-a", "pool-a")))
    assert code == 200, page
    assert "Writes are blocked now" in page and 'data-window="freeze"' in page


def test_outside_every_allow_window_nothing_is_written_and_the_next_opening_is_named(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("allow")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "one")})
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    later = (datetime.now(UTC).hour + 12) % 24  # twelve hours away: closed now, whatever the hour
    _with_windows(
        cfg.file,
        f'[[windows]]\nname = "nightly"\nschedule = "0 {later} * * *"\nduration = "1h"\nkind = "allow"\n'
        f'[[windows]]\nname = "other-apps"\n{ALWAYS}\nkind = "allow"\napps = ["not-this-one"]',
    )
    cfg = tune(cfg, listen=False)
    agent = e2e.agent(cfg)
    result = agent.reconcile()["pool-a"]
    assert result.state is PassState.WINDOW and result.ok
    assert result.window is not None and result.window.reason is WindowReason.OUTSIDE_ALLOW
    assert result.window.window == "nightly" and "'nightly' opens at" in result.window.message
    assert result.applied == 0 and _cm(a.kubeconfig, ns, "settings") is None
    # Forced once (as `sync --local --force-window` does), it applies; the pass after is held again.
    agent.fleet.force_window("pool-a", ["pool-a"])
    forced = agent.reconcile()["pool-a"]
    assert forced.state is PassState.OK and forced.window is not None and forced.window.forced
    assert _greeting(a.kubeconfig, ns) == "one"
    assert agent.reconcile()["pool-a"].state is PassState.WINDOW
