"""Apps on real local API servers: one inventory per app, one shared read, each app failing alone.

Requests are counted by the API server (``apiserver_request_total``, controllers paused), never
by the agent. Each test runs an agent of its own name in namespaces of its own on ``pool-a``.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import __version__
from agent.apply.inventory import MEMBERS_KEY, applyset_id
from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import (
    ADDITIONAL_NAMESPACES,
    AGENT_LABEL,
    CLAIMED_BY,
    GROUP_KINDS,
    ID_LABEL,
    PART_OF,
    PRUNE_APPROVAL,
    TOOLING,
    FailureReason,
    ObjectKey,
    Outcome,
    PassState,
    PruneReason,
    SkipReason,
)
from agent.report.events import events_for
from agent.report.summary import format_summary
from tests.agentkit import Agent, make_repo, unique, write_config
from tests.appkit import AppsAgent, counting, members, parent, write_apps_config
from tests.clusters import ClusterPool, kubectl

CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: {value}\n"
NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"


def cms(ns: str, *names: str, value: str = "v") -> str:
    return "---\n".join(CM.format(name=n, ns=ns, value=value) for n in names)


@pytest.fixture
def ns(cluster_pool: ClusterPool) -> Iterator[str]:
    """A namespace name for the test's objects (the test's Git declares it); deleted after."""
    name = unique("apps")
    yield name
    kubectl(cluster_pool["pool-a"].kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


def live(cluster: LocalCluster, ns: str) -> dict[str, dict[str, Any]]:
    """The ConfigMaps of ``ns`` by name: uid, resourceVersion, part-of label, data."""
    out = json.loads(kubectl(cluster.kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))
    return {
        i["metadata"]["name"]: {
            "uid": i["metadata"]["uid"],
            "rv": i["metadata"]["resourceVersion"],
            "part_of": (i["metadata"].get("labels") or {}).get(PART_OF),
            "data": i.get("data") or {},
        }
        for i in out["items"]
        if i["metadata"]["name"] != "kube-root-ca.crt"
    }


def app_id(config: Config, app: str) -> str:
    return applyset_id(f"{config.agent.name}.{app}", config.agent.namespace)


def cm_key(ns: str, name: str) -> ObjectKey:
    return ObjectKey("", "ConfigMap", ns, name)


def test_two_apps_on_one_cluster_each_keep_their_own_inventory_and_steady_passes_write_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    repo = make_repo(
        tmp_path,
        {
            "apps/infra/objects.yaml": NS.format(ns=ns) + "---\n" + cms(ns, "settings"),
            "apps/web/cms.yaml": cms(ns, "web-1", "web-2"),
        },
    )
    cfg = write_apps_config(
        tmp_path, repo, a, [{"name": "infra", "path": "apps/infra"}, {"name": "web", "path": "apps/web"}]
    )
    agent = AppsAgent(cfg)
    try:
        first = agent.reconcile()
        assert set(first) == {"infra", "web"}
        assert first["infra"].ok and first["infra"].count(Outcome.CREATED) == 2, first["infra"]
        assert first["web"].ok and first["web"].count(Outcome.CREATED) == 2, first["web"]
        uids = {n: o["uid"] for n, o in live(a, ns).items()}
        for _ in range(5):
            with counting(a) as counted:
                results = agent.reconcile()
            # Nothing written; both apps' parents read with one labelled LIST, their objects with
            # one LIST per kind (Namespace, ConfigMap): no request per app.
            assert counted.requests.by_resource == {"LIST configmaps": 2, "LIST namespaces": 1}
            for r in results.values():
                assert r.ok and r.state is PassState.OK and r.count(Outcome.UNCHANGED) == len(r.results), r
        now = live(a, ns)
        assert {n: o["uid"] for n, o in now.items()} == uids, "an object was deleted or re-created"
        assert now["settings"]["part_of"] == app_id(cfg, "infra")
        assert now["web-1"]["part_of"] == now["web-2"]["part_of"] == app_id(cfg, "web")
        assert members(cfg, a, "infra") == {ObjectKey("", "Namespace", "", ns), cm_key(ns, "settings")}
        assert members(cfg, a, "web") == {cm_key(ns, "web-1"), cm_key(ns, "web-2")}
        parents = json.loads(
            kubectl(
                a.kubeconfig,
                "get",
                "configmaps",
                "-n",
                cfg.agent.namespace,
                "-l",
                f"{AGENT_LABEL}={cfg.agent.name}",
                "-o",
                "json",
            )
        )
        names = sorted(p["metadata"]["name"] for p in parents["items"])
        assert names == [f"{cfg.agent.name}.infra", f"{cfg.agent.name}.web"]
        table = format_summary(list(results.values())).splitlines()
        assert table[0].split()[:3] == ["CLUSTER", "APP", "REVISION"]
        assert {line.split()[1] for line in table[1:]} == {"infra", "web"}
        status = agent.fleet.status["pool-a"].rows()
        assert [(row["cluster"], row["app"], row["state"]) for row in status] == [
            ("pool-a", "infra", "ok"),
            ("pool-a", "web", "ok"),
        ]
        metrics = agent.fleet.metrics.render().decode()
        assert 'gitops_agent_reconcile_total{app="web",cluster="pool-a",result="success"} 6.0' in metrics
    finally:
        agent.close()


def _previous_release_layout(cfg: Config, cluster: LocalCluster, ns: str, names: list[str]) -> None:
    """What a release before apps left on a cluster it reconciled: the objects applied by the
    agent's field manager with its part-of label, and its parent ConfigMap named after the agent
    (labelled with its ApplySet id only, claimed by the entry, members with their UIDs), exactly
    as that release's ``InventoryStore.write`` and ``claim`` wrote them."""
    agent, namespace = cfg.agent.name, cfg.agent.namespace
    set_id = applyset_id(agent, namespace)
    client = KubeClient.from_config(cfg.clusters[0])
    try:
        client.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, field_manager=agent
        )
        objects = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {PART_OF: set_id}}}
        ]
        for n in names:
            meta = {"name": n, "namespace": ns, "labels": {PART_OF: set_id}}
            objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}})
        uids = {}
        for obj in objects:
            applied = client.apply(obj, field_manager=agent)
            key = ObjectKey.of(obj)
            uids[key] = applied["metadata"]["uid"]
        ordered = sorted(uids)
        blob = json.dumps(
            [
                {"group": k.group, "kind": k.kind, "namespace": k.namespace, "name": k.name, "uid": uids[k]}
                for k in ordered
            ],
            separators=(",", ":"),
        ).encode()
        parent = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": agent,
                "namespace": namespace,
                "labels": {ID_LABEL: set_id},
                "annotations": {
                    TOOLING: f"gitops-agent/v{__version__}",
                    GROUP_KINDS: ",".join(sorted({k.group_kind for k in ordered})),
                    ADDITIONAL_NAMESPACES: ns,
                    CLAIMED_BY: cfg.clusters[0].name,
                },
            },
            "binaryData": {MEMBERS_KEY: base64.b64encode(gzip.compress(blob, mtime=0)).decode()},
        }
        client.apply(parent, field_manager=agent, force=True)
    finally:
        client.close()


def test_upgrading_from_the_layout_before_apps_writes_nothing_and_keeps_the_inventory(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    names = ["one", "two", "three"]
    repo = make_repo(tmp_path, {"clusters/pool-a/objects.yaml": NS.format(ns=ns) + "---\n" + cms(ns, *names)})
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    _previous_release_layout(cfg, a, ns, names)
    before = live(a, ns)
    parent_rv = json.loads(
        kubectl(a.kubeconfig, "get", "configmap", cfg.agent.name, "-n", cfg.agent.namespace, "-o", "json")
    )["metadata"]["resourceVersion"]
    agent = Agent(cfg)
    try:
        with counting(a) as counted:
            result = agent.reconcile()["pool-a"]
        assert result.ok and result.app == "pool-a", result
        assert result.count(Outcome.UNCHANGED) == 4 and len(result.results) == 4, result.results
        assert counted.writes == {}, counted.requests.by_resource
    finally:
        agent.close()
    assert live(a, ns) == before, "an object was written, deleted or re-created"
    after = json.loads(
        kubectl(a.kubeconfig, "get", "configmap", cfg.agent.name, "-n", cfg.agent.namespace, "-o", "json")
    )
    assert after["metadata"]["resourceVersion"] == parent_rv, "the inventory was rewritten"


def test_an_object_two_apps_declare_is_reported_by_both_and_written_by_its_holder_only(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    repo = make_repo(
        tmp_path,
        {
            "apps/first/ns.yaml": NS.format(ns=ns),
            "apps/first/shared.yaml": cms(ns, "shared", value="first"),
            "apps/second/shared.yaml": cms(ns, "shared", value="second"),
            "apps/second/own.yaml": cms(ns, "own"),
        },
    )
    cfg = write_apps_config(
        tmp_path,
        repo,
        a,
        [{"name": "first", "path": "apps/first"}, {"name": "second", "path": "apps/second"}],
    )
    agent = AppsAgent(cfg)
    try:
        runs = [agent.reconcile()]
        created = live(a, ns)["shared"]
        for _ in range(5):
            with counting(a) as counted:
                runs.append(agent.reconcile())
            assert counted.writes == {}, counted.requests.by_resource
    finally:
        agent.close()
    shared = live(a, ns)["shared"]
    assert shared["data"] == {"k": "first"} and shared["part_of"] == app_id(cfg, "first")
    assert shared["rv"] == created["rv"], "the shared object was written after its first owner wrote it"
    key = cm_key(ns, "shared")
    for results in runs:
        first, second = results["first"], results["second"]
        assert first.ok and second.ok, (first, second)
        for r in (first, second):
            (conflict,) = r.conflicts
            assert (conflict.key, conflict.holder, conflict.other) == (key, "first", "second")
            text = str(conflict)
            assert "'first'" in text and "'second'" in text, text
            assert "apps/first/shared.yaml" in text and "apps/second/shared.yaml" in text, text
        (skipped,) = [x for x in second.results if x.key == key]
        assert skipped.outcome is Outcome.SKIPPED and skipped.skip is SkipReason.OTHER_APP, skipped
        assert "apps/first/shared.yaml" in skipped.message and "apps/second/shared.yaml" in skipped.message
    assert members(cfg, a, "first") >= {key} and key not in members(cfg, a, "second")


def test_depends_on_waits_while_the_dependency_fails_to_render_and_converges_once_it_renders(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    web = {"apps/web/cms.yaml": cms(ns, "web")}
    repo = make_repo(tmp_path, {"apps/infra/ns.yaml": NS.format(ns=ns) + "---\nkind: [\n", **web})
    cfg = write_apps_config(
        tmp_path,
        repo,
        a,
        [
            {"name": "infra", "path": "apps/infra"},
            {"name": "web", "path": "apps/web", "depends_on": ["infra"]},
        ],
    )
    agent = AppsAgent(cfg)
    try:
        for _ in range(2):
            results = agent.reconcile()
            infra, web_result = results["infra"], results["web"]
            assert infra.reason is FailureReason.RENDER and "apps/infra/ns.yaml" in (infra.error or "")
            assert web_result.state is PassState.WAITING and web_result.waiting_on == ("infra",), web_result
            assert web_result.failure is None and web_result.results == [], web_result
        assert "waiting on infra" in format_summary(list(results.values()))
        assert live(a, ns) == {} and members(cfg, a, "web") == set()
        repo.commit({"apps/infra/ns.yaml": NS.format(ns=ns), **web}, "fix infra")
        healed = agent.reconcile()
        assert healed["infra"].ok and healed["infra"].state is PassState.OK, healed["infra"]
        assert healed["web"].state is PassState.OK and healed["web"].count(Outcome.CREATED) == 1, healed[
            "web"
        ]
        assert set(live(a, ns)) == {"web"}
    finally:
        agent.close()


def test_an_apps_render_error_fails_that_app_alone_which_applies_and_prunes_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    files = {
        "apps/base/ns.yaml": NS.format(ns=ns),
        "apps/good/cms.yaml": cms(ns, "good-1"),
        "apps/bad/cms.yaml": cms(ns, "bad-1", "bad-2"),
    }
    repo = make_repo(tmp_path, files)
    apps = [
        {"name": "base", "path": "apps/base"},
        {"name": "good", "path": "apps/good"},
        {"name": "bad", "path": "apps/bad"},
    ]
    cfg = write_apps_config(tmp_path, repo, a, apps)
    agent = AppsAgent(cfg)
    try:
        assert all(r.ok for r in agent.reconcile().values())
        before = live(a, ns)
        repo.commit(
            {
                **files,
                "apps/good/cms.yaml": cms(ns, "good-1", "good-2"),
                "apps/bad/cms.yaml": cms(ns, "bad-1") + "---\nkind: [\n",  # bad-2 gone, and broken
            }
        )
        results = agent.reconcile()
    finally:
        agent.close()
    good, bad = results["good"], results["bad"]
    assert good.ok and good.count(Outcome.CREATED) == 1, good
    assert bad.reason is FailureReason.RENDER and "apps/bad/cms.yaml" in (bad.error or ""), bad
    assert bad.results == [], "the broken app applied or pruned something"
    now = live(a, ns)
    assert now["bad-2"]["uid"] == before["bad-2"]["uid"], "the broken app's object was pruned"
    assert "good-2" in now


def test_unknown_is_not_absent_an_object_moved_to_an_app_whose_render_fails_is_not_pruned_by_its_old_app(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    """A handover in the commit that breaks the receiving app: the old app holds its prune until then."""
    a = cluster_pool["pool-a"]
    base = {"apps/a/ns.yaml": NS.format(ns=ns), "apps/b/own.yaml": cms(ns, "b-own")}
    repo = make_repo(tmp_path, {**base, "apps/a/data.yaml": cms(ns, "data")})
    cfg = write_apps_config(
        tmp_path, repo, a, [{"name": "a", "path": "apps/a"}, {"name": "b", "path": "apps/b"}]
    )
    agent = AppsAgent(cfg)
    try:
        assert all(r.ok for r in agent.reconcile().values())
        uid = live(a, ns)["data"]["uid"]
        broken = cms(ns, "data") + "---\nkind: [\n"
        repo.commit({**base, "apps/b/data.yaml": broken}, "move data to b, and break b")
        held = agent.reconcile()
        repo.commit({**base, "apps/b/data.yaml": cms(ns, "data")}, "fix b")
        handed = agent.reconcile()
    finally:
        agent.close()
    assert held["b"].reason is FailureReason.RENDER, held["b"]
    refusal = held["a"].prune_refusal
    assert refusal is not None and refusal.reason is PruneReason.OTHER_APP_UNKNOWN, held["a"]
    assert "b" in refusal.message and held["a"].count(Outcome.PRUNED) == 0
    assert handed["a"].ok and handed["b"].ok and handed["a"].count(Outcome.PRUNED) == 0, handed
    now = live(a, ns)
    assert now["data"]["uid"] == uid, "the moved object was deleted and re-created"
    assert now["data"]["part_of"] == app_id(cfg, "b")
    assert members(cfg, a, "a") == {ObjectKey("", "Namespace", "", ns)}


def test_handover_of_ten_objects_from_one_app_to_another_keeps_every_uid(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    moved = [f"moved-{i}" for i in range(10)]
    base = {"apps/b/own.yaml": cms(ns, "b-own"), "apps/a/ns.yaml": NS.format(ns=ns)}
    repo = make_repo(tmp_path, {**base, "apps/a/moved.yaml": cms(ns, *moved)})
    cfg = write_apps_config(
        tmp_path, repo, a, [{"name": "a", "path": "apps/a"}, {"name": "b", "path": "apps/b"}]
    )
    agent = AppsAgent(cfg)
    try:
        assert all(r.ok for r in agent.reconcile().values())
        uids = {n: o["uid"] for n, o in live(a, ns).items()}
        repo.commit({**base, "apps/b/moved.yaml": cms(ns, *moved)}, "move ten objects from a to b")
        handed = agent.reconcile()
        with counting(a) as counted:
            steady = agent.reconcile()
    finally:
        agent.close()
    assert handed["a"].ok and handed["b"].ok, handed
    assert handed["a"].count(Outcome.PRUNED) == 0 and handed["a"].prune_refusal is None, handed["a"]
    assert handed["b"].count(Outcome.CONFIGURED) == 10, handed["b"].results
    now = live(a, ns)
    assert {n: o["uid"] for n, o in now.items()} == uids, "an object was deleted or re-created"
    assert {now[n]["part_of"] for n in moved} == {app_id(cfg, "b")}
    keys = {cm_key(ns, n) for n in moved}
    assert members(cfg, a, "a") == {ObjectKey("", "Namespace", "", ns)}
    assert members(cfg, a, "b") == keys | {cm_key(ns, "b-own")}
    assert counted.writes == {}, counted.requests.by_resource
    assert all(r.ok and r.applied == 0 for r in steady.values()), steady


@pytest.mark.parametrize("old_app", ["shop", "pool-a"], ids=["an-apps-app", "a-cluster-entrys-own-app"])
def test_an_app_renamed_with_renamed_from_takes_over_its_objects_and_the_old_parent_goes(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str, old_app: str
) -> None:
    a = cluster_pool["pool-a"]
    names = ["one", "two", "three"]
    repo = make_repo(tmp_path, {"apps/shop/objects.yaml": NS.format(ns=ns) + "---\n" + cms(ns, *names)})
    agent_name = unique("agent")
    if old_app == "pool-a":  # the cluster entry's own path becomes an [[apps]] app
        old = write_apps_config(tmp_path, repo, a, [], agent=agent_name, cluster_paths=["apps/shop"])
        old_parent = agent_name
    else:
        old = write_apps_config(tmp_path, repo, a, [{"name": "shop", "path": "apps/shop"}], agent=agent_name)
        old_parent = f"{agent_name}.shop"
    first = AppsAgent(old)
    try:
        assert first.reconcile()[old_app].ok
    finally:
        first.close()
    uids = {n: o["uid"] for n, o in live(a, ns).items()}
    new = write_apps_config(
        tmp_path,
        repo,
        a,
        [{"name": "store", "path": "apps/shop", "renamed_from": old_app}],
        agent=agent_name,
        file="renamed.toml",
    )
    second = AppsAgent(new)
    try:
        renamed = second.reconcile()["store"]
        again = second.reconcile()["store"]
    finally:
        second.close()
    assert renamed.ok and renamed.count(Outcome.CONFIGURED) == 4, renamed.results
    assert renamed.count(Outcome.PRUNED) == 0 and renamed.count(Outcome.CREATED) == 0
    now = live(a, ns)
    assert {n: o["uid"] for n, o in now.items()} == uids, "an object was deleted or re-created"
    assert {o["part_of"] for o in now.values()} == {app_id(new, "store")}
    assert members(new, a, "store") == {ObjectKey("", "Namespace", "", ns)} | {cm_key(ns, n) for n in names}
    gone = kubectl(
        a.kubeconfig,
        "get",
        "configmap",
        old_parent,
        "-n",
        new.agent.namespace,
        "--ignore-not-found",
    )
    assert gone.strip() == "", "the renamed app's parent is still there"
    assert again.ok and again.applied == 0


def test_deleting_an_apps_objects_on_purpose_trips_its_brake_until_the_exact_set_is_approved(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    a = cluster_pool["pool-a"]
    names = [f"cm-{i}" for i in range(12)]
    base = {"apps/base/ns.yaml": NS.format(ns=ns), "apps/empty/README.md": "nothing here on purpose\n"}
    repo = make_repo(tmp_path, {**base, "apps/doomed/cms.yaml": cms(ns, *names)})
    apps = [{"name": "base", "path": "apps/base"}, {"name": "doomed", "path": "apps/doomed"}]
    agent_name = unique("agent")
    cfg = write_apps_config(tmp_path, repo, a, apps, agent=agent_name)
    agent = AppsAgent(cfg)
    try:
        assert all(r.ok for r in agent.reconcile().values())
    finally:
        agent.close()
    # Removing the app from the config deletes nothing.
    without = write_apps_config(tmp_path, repo, a, apps[:1], agent=agent_name, file="without.toml")
    agent = AppsAgent(without)
    try:
        assert set(agent.reconcile()) == {"base"}
    finally:
        agent.close()
    assert set(live(a, ns)) == set(names)
    # On purpose: the app stays, its path is an empty directory, allow_empty; the brake holds.
    emptied = {"name": "doomed", "path": "apps/empty", "allow_empty": True}
    cfg = write_apps_config(tmp_path, repo, a, [apps[0], emptied], agent=agent_name, file="emptied.toml")
    agent = AppsAgent(cfg)
    try:
        braked = agent.reconcile()["doomed"]
        assert braked.prune_refusal is not None and braked.prune_refusal.reason is PruneReason.BRAKE, braked
        assert "--app doomed" in braked.prune_refusal.message
        assert set(live(a, ns)) == set(names), "the brake let a deletion through"
        digest = braked.prune_refusal.message.split("--digest ")[1].split("`")[0]
        store = parent(cfg, a, "doomed")
        try:
            store.set_annotation(PRUNE_APPROVAL, digest)  # what `prune approve --app doomed` writes
        finally:
            store.client.close()
        approved = agent.reconcile()
    finally:
        agent.close()
    assert approved["doomed"].count(Outcome.PRUNED) == 12 and approved["base"].ok, approved
    assert live(a, ns) == {} and members(cfg, a, "doomed") == set()
    client = KubeClient.from_config(cfg.clusters[0])
    try:  # the Events are on the app's own parent and name the app
        pruned = [
            e
            for e in events_for(client, cfg.agent.namespace, f"{agent_name}.doomed")
            if e["reason"] == "Pruned"
        ]
    finally:
        client.close()
    assert len(pruned) == 12 and all("app doomed" in e["message"] for e in pruned), pruned
