"""The running agent with apps from two sources: each app renders its own source's revision.

Two repositories, two apps on one cluster, one per source. A commit to the second source is
applied by the daemon's next pass of that app alone: the first app's objects are untouched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config.types import Config
from tests.agentkit import E2E, Repo, make_repo
from tests.appkit import write_apps_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import Daemons, configmaps, status, tune
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _cm(kubeconfig: Path, ns: str) -> dict | None:  # type: ignore[type-arg]
    out = kubectl(kubeconfig, "get", "cm", "settings", "-n", ns, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def _greeting(kubeconfig: Path, ns: str) -> str | None:
    cm = _cm(kubeconfig, ns)
    return cm["data"]["greeting"] if cm else None


def _row(doc: dict, app: str) -> dict:  # type: ignore[type-arg]
    return next(r for r in doc["clusters"] if r["app"] == app)


def _when(cfg: Config, pred: Callable[[dict], bool]) -> dict | None:  # type: ignore[type-arg]
    """``/status`` once ``pred`` holds of it."""
    doc = status(cfg)
    return doc if pred(doc) else None


def test_a_commit_to_a_second_source_is_applied_by_the_daemon_and_leaves_the_first_sources_app_alone(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns1, ns2 = e2e.namespace("first"), e2e.namespace("second")
    first = make_repo(tmp_path, {"apps/one/app.yaml": configmaps(ns1, "one")})
    second = Repo(tmp_path / "second.git", tmp_path / "second-work")
    second.commit({"apps/two/app.yaml": configmaps(ns2, "two")}, "initial")
    sources = (
        'reconcile_interval = "10m"\n'  # no drift pass of the first app during the test
        f'\n[[sources]]\nname = "second"\nurl = "{second.path}"\npoll_interval = "1s"\n'
    )
    apps = [{"name": "one", "path": "apps/one"}, {"name": "two", "path": "apps/two", "source": "second"}]
    cfg = tune(write_apps_config(tmp_path, first, a, apps, defaults=sources))
    daemons(cfg)

    wait_for("app one applied", lambda: _greeting(a.kubeconfig, ns1) == "one", 60)
    wait_for("app two applied", lambda: _greeting(a.kubeconfig, ns2) == "two", 60)
    doc = wait_for(
        "both apps ok",
        lambda: _when(cfg, lambda d: all(_row(d, n)["result"] == "ok" for n in ("one", "two"))),
        30,
    )
    before_one, before_cm = _row(doc, "one"), _cm(a.kubeconfig, ns1)
    assert before_cm is not None

    sha = second.commit({"apps/two/app.yaml": configmaps(ns2, "two, again")}, "second moves")
    wait_for("the second source's commit applied", lambda: _greeting(a.kubeconfig, ns2) == "two, again", 60)

    def two_done(d: dict) -> bool:  # type: ignore[type-arg]
        return bool(_row(d, "two")["revision"] == sha and _row(d, "two")["result"] == "ok")

    doc = wait_for("app two ok at the new commit", lambda: _when(cfg, two_done), 30)
    assert [s["revision"] for s in doc["sources"] if s["name"] == "second"] == [sha]
    # The first app did not run again: same pass, same revision, its object never written.
    assert _row(doc, "one")["last_run_at"] == before_one["last_run_at"]
    assert _row(doc, "one")["revision"] == before_one["revision"] == doc["revision"] != sha
    after_cm = _cm(a.kubeconfig, ns1)
    assert after_cm is not None
    assert after_cm["metadata"]["resourceVersion"] == before_cm["metadata"]["resourceVersion"]
