"""The daemon's per-app schedule on a real local API server: each app alone (docs/safety.md rule 6).

One job per cluster, but each app on its own interval and backoff: an app failing on backoff
never holds back a healthy app of the same cluster, whose hand edits are corrected within its
own interval, and the failing app is not retried at the healthy app's pace either.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from agent.config.types import Config
from tests.agentkit import E2E, make_repo
from tests.appkit import write_apps_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import Daemons, configmaps, status, tune
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

#: The healthy app's interval, and the failing app's first backoff: far apart, so a healthy app
#: held back by the failing one's backoff cannot pass for one on its own interval.
INTERVAL = 4.0
BACKOFF = 60.0
#: A pass on a shared, busy machine: the margin on top of the interval (and its 10 % jitter).
PASS_MARGIN = 6.0


def _rows(cfg: Config) -> dict[str, dict[str, Any]]:
    """The cluster's `/status` rows by app."""
    return {r["app"]: r for r in status(cfg)["clusters"]}


def _greeting(kubeconfig: Path, ns: str) -> str:
    cm = json.loads(kubectl(kubeconfig, "get", "configmap", "settings", "-n", ns, "-o", "json"))
    return str(cm["data"]["greeting"])


def test_each_app_alone_a_hand_edit_to_a_healthy_app_is_corrected_within_its_interval_while_another_backs_off(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("appsched")
    repo = make_repo(
        tmp_path, {"apps/good/app.yaml": configmaps(ns, "git"), "apps/broken/app.yaml": "kind: [\n"}
    )
    apps = [
        {"name": "good", "path": "apps/good", "reconcile_interval": f"{INTERVAL:g}s"},
        {"name": "broken", "path": "apps/broken", "reconcile_interval": f"{INTERVAL:g}s"},
    ]
    cfg = tune(write_apps_config(tmp_path, repo, a, apps))
    daemons(cfg, backoff_base=BACKOFF, backoff_cap=BACKOFF)
    wait_for(
        "good applied and broken failing",
        lambda: (r := _rows(cfg))["good"]["state"] == "ok" and r["broken"]["state"] == "failed",
        60,
    )
    assert "apps/broken/app.yaml" in (_rows(cfg)["broken"]["error"] or "")
    bound = INTERVAL * 1.1 + PASS_MARGIN
    took = []
    for edit in ("hand-1", "hand-2"):
        patch = json.dumps({"data": {"greeting": edit}})
        kubectl(a.kubeconfig, "patch", "configmap", "settings", "-n", ns, "--type=merge", "-p", patch)
        t0 = time.monotonic()
        wait_for(f"{edit} corrected", lambda: _greeting(a.kubeconfig, ns) == "git", bound)
        took.append(time.monotonic() - t0)
    rows = _rows(cfg)
    # The failing app waited out its own backoff meanwhile: it ran once, not at good's pace.
    assert rows["broken"]["consecutive_failures"] == 1, rows["broken"]
    assert rows["good"]["consecutive_failures"] == 0, rows["good"]
    whys = [why for _, _, why in rows["good"]["schedule"]]
    assert "interval (app good)" in whys, whys
    print(f"\nMEASURED hand edits corrected after {[round(t, 2) for t in took]}s (interval {INTERVAL:g}s)")
