"""``gitops-agent diff`` on a cluster with two apps: grouped by cluster, then app, and an
object both apps declare flagged in both apps' parts naming both apps and both files.

Live against the real pool cluster (the first pass applied by the agent), and offline
between two commits of a real repository with no cluster at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner, Result

from agent.cli.diff import diff
from agent.dev.process import LocalCluster
from tests.agentkit import make_repo, unique
from tests.appkit import AppsAgent, write_apps_config
from tests.clusters import ClusterPool, kubectl

CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: {value}\n"
NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
APPS = [{"name": "first", "path": "apps/first"}, {"name": "second", "path": "apps/second"}]


def run_diff(*args: str) -> tuple[Result, dict[str, Any]]:
    result = CliRunner().invoke(diff, [*args, "--format", "json"], catch_exceptions=False)
    return result, json.loads(result.stdout)


def by_app(doc: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """The one cluster's apps, in report order: app → object key → object."""
    (cluster,) = doc["clusters"]
    return {a["name"]: {o["key"]: o for o in a["objects"]} for a in cluster["apps"]}


def assert_flagged_in_both(apps: dict[str, dict[str, dict[str, Any]]], key: str) -> None:
    for name in ("first", "second"):
        (c,) = apps[name][key]["appConflicts"]
        assert (c["holder"], c["holderFile"]) == ("first", "apps/first/shared.yaml"), c
        assert (c["other"], c["otherFile"]) == ("second", "apps/second/shared.yaml"), c


@pytest.fixture
def ns(cluster_pool: ClusterPool) -> Iterator[str]:
    name = unique("diffapps")
    yield name
    kubectl(cluster_pool["pool-a"].kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.cluster
def test_live_diff_groups_a_two_app_cluster_by_app_and_flags_the_object_both_declare_in_both(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    repo = make_repo(
        tmp_path,
        {
            "apps/first/ns.yaml": NS.format(ns=ns),
            "apps/first/shared.yaml": CM.format(name="shared", ns=ns, value="first"),
            "apps/second/own.yaml": CM.format(name="own", ns=ns, value="v1"),
        },
    )
    cfg = write_apps_config(tmp_path, repo, a, APPS)
    agent = AppsAgent(cfg)
    try:
        assert all(r.ok for r in agent.reconcile().values())
    finally:
        agent.close()
    repo.commit(
        {
            "apps/first/ns.yaml": NS.format(ns=ns),
            "apps/first/shared.yaml": CM.format(name="shared", ns=ns, value="first"),
            "apps/second/shared.yaml": CM.format(name="shared", ns=ns, value="second"),
            "apps/second/own.yaml": CM.format(name="own", ns=ns, value="v2"),
        }
    )
    # Listed second first: the app whose ApplySet holds the object still manages it.
    swapped = write_apps_config(tmp_path, repo, a, APPS[::-1], agent=cfg.agent.name, file="swapped.toml")
    result, doc = run_diff("--config", str(swapped.file))
    assert result.exit_code == 1, result.output
    apps = by_app(doc)
    assert list(apps) == ["second", "first"]
    key = f"ConfigMap/{ns}/shared"
    assert_flagged_in_both(apps, key)
    mine, theirs = apps["first"][key], apps["second"][key]
    assert mine["action"] == "skip" and mine["reason"] == "no change", mine
    assert theirs["action"] == "skip" and "'first' manages it" in theirs["reason"], theirs
    assert apps["second"][f"ConfigMap/{ns}/own"]["action"] == "update"
    assert doc["clusters"][0]["summary"]["created"] == 0  # the shared object is nobody's create
    md = CliRunner().invoke(diff, ["--config", str(swapped.file), "--format", "markdown"]).stdout
    assert md.index("#### pool-a") < md.index("##### App `second`") < md.index("##### App `first`")
    assert "apps/first/shared.yaml" in md and "apps/second/shared.yaml" in md
    # Narrowed with --app to the app that does not manage it: still flagged, still not its write.
    result, doc = run_diff("--config", str(swapped.file), "--cluster", "pool-a", "--app", "second")
    assert result.exit_code == 1, result.output
    narrowed = by_app(doc)
    assert list(narrowed) == ["second"]
    (c,) = narrowed["second"][key]["appConflicts"]
    assert (c["holder"], c["other"]) == ("first", "second"), c
    assert narrowed["second"][key]["action"] == "skip", narrowed["second"][key]
    live = json.loads(kubectl(a.kubeconfig, "get", "configmap", "shared", "-n", ns, "-o", "json"))
    assert live["data"] == {"k": "first"}  # the diff wrote nothing


def test_offline_diff_groups_a_two_app_cluster_by_app_and_flags_the_object_both_declare_in_both(
    tmp_path: Path,
) -> None:
    base_files = {
        "apps/first/shared.yaml": CM.format(name="shared", ns="shop", value="first"),
        "apps/second/own.yaml": CM.format(name="own", ns="shop", value="v1"),
    }
    repo = make_repo(tmp_path, base_files)
    base = repo.commit(base_files, "base")
    head = repo.commit(
        {
            **base_files,
            "apps/second/shared.yaml": CM.format(name="shared", ns="shop", value="second"),
            "apps/second/own.yaml": CM.format(name="own", ns="shop", value="v2"),
        },
        "second declares shared too",
    )
    nowhere = cast(LocalCluster, type("Nowhere", (), {"kubeconfig": tmp_path / "missing.kubeconfig"}))
    cfg = write_apps_config(tmp_path, repo, nowhere, APPS)
    args = ["--offline", "--repo", str(repo.path), "--base", base, "--head", head, "--config", str(cfg.file)]
    result, doc = run_diff(*args)
    assert result.exit_code == 1, result.output
    apps = by_app(doc)
    assert list(apps) == ["first", "second"]
    key = "ConfigMap/shop/shared"
    assert_flagged_in_both(apps, key)
    assert apps["first"][key]["action"] == "skip" and apps["first"][key]["reason"] == "no change"
    assert apps["second"][key]["action"] == "create"
    assert apps["second"]["ConfigMap/shop/own"]["action"] == "update"
    text = CliRunner().invoke(diff, [*args, "--format", "text"]).stdout
    assert text.index("== pool-a ==") < text.index("-- app first --") < text.index("-- app second --")
    assert "app conflict: declared by app 'first' (apps/first/shared.yaml)" in text


@pytest.mark.cluster
def test_live_diff_of_an_object_moving_to_another_app_shows_the_handover_the_pass_makes(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    """The ConfigMap leaves app first and is declared by app second with another value: the
    pass updates it in second and deletes nothing, so the diff says exactly that (a diff that
    planned each app alone said first deletes it and second skips it)."""
    a = cluster_pool["pool-a"]
    repo = make_repo(
        tmp_path,
        {
            "apps/first/ns.yaml": NS.format(ns=ns),
            "apps/first/moving.yaml": CM.format(name="moving", ns=ns, value="first"),
            "apps/second/own.yaml": CM.format(name="own", ns=ns, value="v1"),
        },
    )
    cfg = write_apps_config(tmp_path, repo, a, APPS)
    agent = AppsAgent(cfg)
    try:
        assert all(r.ok for r in agent.reconcile().values())
        repo.commit(
            {
                "apps/first/ns.yaml": NS.format(ns=ns),
                "apps/second/own.yaml": CM.format(name="own", ns=ns, value="v1"),
                "apps/second/moving.yaml": CM.format(name="moving", ns=ns, value="second"),
            }
        )
        result, doc = run_diff("--config", str(cfg.file))
        assert result.exit_code == 1, result.output
        apps = by_app(doc)
        key = f"ConfigMap/{ns}/moving"
        assert key not in apps["first"], apps["first"].get(key)  # not deleted by the app it leaves
        moved = apps["second"][key]
        assert moved["action"] == "update", moved
        assert "second" in moved["diff"], moved["diff"]
        assert doc["clusters"][0]["summary"]["pruned"] == 0
        # And the pass does what the report said: the same object, updated, nothing deleted.
        before = json.loads(kubectl(a.kubeconfig, "get", "configmap", "moving", "-n", ns, "-o", "json"))
        results = agent.reconcile()
        assert all(r.ok for r in results.values()), results
        live = json.loads(kubectl(a.kubeconfig, "get", "configmap", "moving", "-n", ns, "-o", "json"))
        assert live["data"] == {"k": "second"}
        assert live["metadata"]["uid"] == before["metadata"]["uid"]
        result, doc = run_diff("--config", str(cfg.file))
        assert result.exit_code == 0, result.output
    finally:
        agent.close()
