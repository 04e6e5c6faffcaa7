"""Deletion only on positive evidence, on real API servers (docs/safety.md rules 1, 2, 3).

For each fault — a cluster stopped mid-pass, revoked credentials, a kind whose
LIST is forbidden, a render error, an empty render — an object removed from
Git is NOT deleted and the reason is reported; with the fault cleared, the
next pass prunes it. The mass-deletion brake holds until the exact set is
approved with `gitops-agent prune approve`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from agent.dev import localcluster
from agent.errors import ApiError
from agent.kube.client import KubeClient, ResourceInfo
from agent.model import Manifest, ObjectKey, Outcome
from agent.reconcile import live
from agent.reconcile.live import LiveState
from agent.reconcile.reconciler import ClusterReconciler
from tests.agentkit import E2E, make_repo, unique, write_config
from tests.clusters import ClusterControl, ClusterPool, kubectl

pytestmark = pytest.mark.cluster


def configmaps(ns: str, names: list[str], *, cluster: str = "pool-a") -> dict[str, str]:
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"]
    docs += [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {n}\n  namespace: {ns}\ndata:\n  k: v\n"
        for n in names
    ]
    return {f"clusters/{cluster}/objects.yaml": "---\n".join(docs)}


def exists(kubeconfig: Path, kind: str, name: str, ns: str) -> bool:
    out = kubectl(kubeconfig, "get", kind, name, "-n", ns, "--ignore-not-found", "-o", "name")
    return bool(out.strip())


#: A listing fault: how ``KubeClient.scan`` (``scan``, the real one) fails for the faulty kind.
Fault = Callable[..., tuple[bool, str]]
FailingListing = Callable[[str, Fault], AbstractContextManager[None]]


@pytest.fixture
def failing_listing(monkeypatch: pytest.MonkeyPatch) -> FailingListing:
    """``with failing_listing(kind, fault):`` the LIST of ``kind`` goes through ``fault``; others list."""
    scan = KubeClient.scan

    @contextlib.contextmanager
    def failing(kind: str, fault: Fault) -> Iterator[None]:
        def faulty_scan(
            self: KubeClient, info: ResourceInfo, on_item: Callable[[Manifest], None], **kw: Any
        ) -> tuple[bool, str]:
            if info.kind != kind:
                return scan(self, info, on_item, **kw)
            return fault(scan, self, info, on_item, **kw)

        with monkeypatch.context() as m:
            m.setattr(KubeClient, "scan", faulty_scan)
            yield

    return failing


def answers_500(
    scan: Fault, client: KubeClient, info: ResourceInfo, on_item: Callable[[Manifest], None], **kw: Any
) -> tuple[bool, str]:
    """The server fails the LIST (a 500, not a cluster-level fault: the pass goes on)."""
    where = info.base_path(kw.get("namespace"))
    raise ApiError(client.name, 500, "etcdserver: request timed out", verb="GET", target=where)


def expires_after_the_first_item_in(ns: str) -> Fault:
    """The first page hands over one object of ``ns`` (planned), then the continue token expires."""

    def fault(
        scan: Fault, client: KubeClient, info: ResourceInfo, on_item: Callable[[Manifest], None], **kw: Any
    ) -> tuple[bool, str]:
        items: list[Manifest] = []
        _, rv = scan(client, info, items.append, **kw)
        for it in items:
            if (it.get("metadata") or {}).get("namespace") == ns:
                on_item(it)
                break
        return False, rv

    return fault


def test_unknown_is_not_absent_cluster_stopped_mid_pass_prunes_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, cluster_ctl: ClusterControl, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("guard")
    repo = make_repo(tmp_path, configmaps(ns, ["keep", "gone"]))
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    agent = e2e.agent(cfg)
    assert agent.reconcile()["pool-a"].ok
    repo.commit(configmaps(ns, ["keep"]))
    revision = agent.revision()

    class StopsMidPass(ClusterReconciler):
        def read_live(self, *args: object, **kw: object) -> LiveState:
            cluster_ctl.stop(a)  # the inventory was read; now the cluster goes away
            return super().read_live(*args, **kw)  # type: ignore[arg-type]

    rec = StopsMidPass(cfg, cfg.clusters[0])
    e2e.at_end(rec.close)
    result = rec.reconcile(revision)
    assert not result.ok and "connection refused" in (result.error or "")
    assert result.count(Outcome.PRUNED) == 0
    a = cluster_ctl.start(a)
    assert exists(a.kubeconfig, "configmap", "gone", ns)

    healed_agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, agent=cfg.agent.name))
    healed = healed_agent.reconcile()["pool-a"]
    assert healed.ok and healed.count(Outcome.PRUNED) == 1
    assert not exists(a.kubeconfig, "configmap", "gone", ns)


def test_unknown_is_not_absent_revoked_credentials_prune_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, cluster_ctl: ClusterControl, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("guard")
    sa = f"default/{unique('agent')}"
    token = cluster_ctl.token(a, sa)
    repo = make_repo(tmp_path, configmaps(ns, ["keep", "gone"]))
    name = unique("agent")
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": token}, agent=name))
    assert agent.reconcile()["pool-a"].ok
    repo.commit(configmaps(ns, ["keep"]))
    cluster_ctl.revoke(a, sa)
    result = agent.reconcile()["pool-a"]
    assert not result.ok and "401" in (result.error or "")
    assert exists(a.kubeconfig, "configmap", "gone", ns)

    fresh = cluster_ctl.token(a, f"default/{unique('agent')}")
    healed = e2e.agent(write_config(tmp_path, repo, {"pool-a": fresh}, agent=name)).reconcile()["pool-a"]
    assert healed.ok and healed.count(Outcome.PRUNED) == 1
    assert not exists(a.kubeconfig, "configmap", "gone", ns)


def test_unknown_is_not_absent_forbidden_list_of_one_kind_prunes_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, cluster_ctl: ClusterControl, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("guard")
    role = unique("no-list-secrets")
    # Everything the agent needs, except LIST on Secrets.
    rbac = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": role},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "namespaces"], "verbs": ["*"]},
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "verbs": ["get", "create", "patch", "update", "delete"],
            },
        ],
    }
    e2e.delete_after(a, "clusterrole", role)
    localcluster.kubectl(a.kubeconfig, "apply", "--server-side", "-f", "-", stdin=json.dumps(rbac))
    sa = f"default/{unique('agent')}"
    limited = cluster_ctl.token(a, sa, cluster_role=role)
    secret = (
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {n}\n  namespace: " + ns + "\nstringData:\n  k: v\n"
    )
    both = {"clusters/pool-a/secrets.yaml": secret.format(n="s1") + "---\n" + secret.format(n="s2")}
    repo = make_repo(tmp_path, configmaps(ns, ["keep", "dropped"]) | both)
    name = unique("agent")
    admin = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, agent=name))
    dropped = ObjectKey("", "ConfigMap", ns, "dropped")
    assert admin.reconcile()["pool-a"].ok
    # A Secret and a ConfigMap leave Git. The ConfigMaps are listed completely and "dropped"
    # is ours: only the refusal of every deletion while any listing is incomplete keeps it.
    repo.commit(configmaps(ns, ["keep"]) | {"clusters/pool-a/secrets.yaml": secret.format(n="s1")})
    restricted = e2e.agent(write_config(tmp_path, repo, {"pool-a": limited}, agent=name))
    result = restricted.reconcile()["pool-a"]
    assert result.prune_refused and "Secret" in result.prune_refused
    assert "unknown is not absent" in result.prune_refused
    assert result.count(Outcome.PRUNED) == 0
    assert exists(a.kubeconfig, "secret", "s2", ns)
    assert exists(a.kubeconfig, "configmap", "dropped", ns)
    assert dropped in admin.tracked()

    healed = admin.reconcile()["pool-a"]
    assert healed.ok and healed.count(Outcome.PRUNED) == 2
    assert not exists(a.kubeconfig, "secret", "s2", ns)
    assert not exists(a.kubeconfig, "configmap", "dropped", ns)
    assert dropped not in admin.tracked()


def test_unknown_is_not_absent_a_listing_that_fails_for_one_kind_prunes_nothing_of_any_kind(
    tmp_path: Path,
    cluster_pool: ClusterPool,
    e2e: E2E,
    failing_listing: FailingListing,
) -> None:
    # Only the LIST of Secrets fails (a 500, not a cluster-level fault: the pass goes on, applies,
    # and the DELETE of a ConfigMap would succeed). A ConfigMap that left Git is listed completely,
    # so nothing but the refusal of every deletion on an incomplete listing keeps it.
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("guard")
    secret = f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: s1\n  namespace: {ns}\nstringData:\n  k: v\n"
    files = {"clusters/pool-a/secrets.yaml": secret}
    repo = make_repo(tmp_path, configmaps(ns, ["keep", "gone"]) | files)
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, agent=unique("agent")))
    gone = ObjectKey("", "ConfigMap", ns, "gone")
    assert agent.reconcile()["pool-a"].ok
    repo.commit(configmaps(ns, ["keep"]) | files)

    with failing_listing("Secret", answers_500):
        result = agent.reconcile()["pool-a"]

    assert result.prune_refused and "Secret" in result.prune_refused
    assert "unknown is not absent" in result.prune_refused
    assert result.count(Outcome.PRUNED) == 0
    by_key = {r.key: r for r in result.results}
    assert by_key[gone].outcome is Outcome.PRUNE_SKIPPED, by_key[gone]
    assert exists(a.kubeconfig, "configmap", "gone", ns)
    assert gone in agent.tracked()

    healed = agent.reconcile()["pool-a"]
    assert healed.ok and healed.count(Outcome.PRUNED) == 1
    assert not exists(a.kubeconfig, "configmap", "gone", ns)
    assert gone not in agent.tracked()


def test_unknown_is_not_absent_listing_expired_part_way_plans_and_prunes_nothing(
    tmp_path: Path,
    cluster_pool: ClusterPool,
    monkeypatch: pytest.MonkeyPatch,
    e2e: E2E,
    failing_listing: FailingListing,
) -> None:
    # Objects are planned as a listing is decoded (live.CHUNK at a time). When the listing
    # then fails (its continue token expired: 410), the verdicts already made must go with it.
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("guard")
    repo = make_repo(tmp_path, configmaps(ns, ["a", "b", "c"]))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, agent=unique("agent")))
    assert agent.reconcile()["pool-a"].ok
    changed = configmaps(ns, ["a", "b"])["clusters/pool-a/objects.yaml"].replace("k: v", "k: changed")
    repo.commit({"clusters/pool-a/objects.yaml": changed})

    with failing_listing("ConfigMap", expires_after_the_first_item_in(ns)), monkeypatch.context() as m:
        m.setattr(live, "CHUNK", 1)
        result = agent.reconcile()["pool-a"]

    mine = {r.key.name: r for r in result.results if r.key.kind == "ConfigMap" and r.key.namespace == ns}
    for name in ("a", "b"):
        assert mine[name].outcome is Outcome.SKIPPED and "expired" in mine[name].message, mine[name]
    assert result.count(Outcome.PRUNED) == 0 and result.count(Outcome.CONFIGURED) == 0
    assert result.prune_refused and "ConfigMap" in result.prune_refused
    assert exists(a.kubeconfig, "configmap", "c", ns)
    data = kubectl(a.kubeconfig, "get", "configmap", "a", "-n", ns, "-o", "jsonpath={.data.k}")
    assert data.strip() == "v"

    healed = agent.reconcile()["pool-a"]
    assert healed.ok and healed.count(Outcome.PRUNED) == 1 and healed.count(Outcome.CONFIGURED) == 2


def test_fail_closed_render_error_applies_and_prunes_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("guard")
    repo = make_repo(tmp_path, configmaps(ns, ["keep", "gone"]))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    broken = configmaps(ns, ["keep"]) | {
        "clusters/pool-a/broken.yaml": "kind: ConfigMap\nmetadata: {name: [\n"
    }
    repo.commit(broken)
    result = agent.reconcile()["pool-a"]
    assert not result.ok and "broken.yaml" in (result.error or "")
    assert result.results == []  # nothing applied, nothing pruned
    assert exists(a.kubeconfig, "configmap", "gone", ns)

    repo.commit(configmaps(ns, ["keep"]))
    healed = agent.reconcile()["pool-a"]
    assert healed.ok and healed.count(Outcome.PRUNED) == 1


def test_fail_closed_empty_render_prunes_nothing_unless_allow_empty(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("guard")
    repo = make_repo(tmp_path, configmaps(ns, ["one", "two"]))
    name = unique("agent")
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, agent=name))
    assert agent.reconcile()["pool-a"].ok
    repo.commit({"clusters/pool-a/README.md": "nothing here any more\n"})
    result = agent.reconcile()["pool-a"]
    assert result.ok and "empty" in (result.prune_refused or "")
    assert exists(a.kubeconfig, "configmap", "one", ns) and exists(a.kubeconfig, "namespace", ns, ns)

    allowing = e2e.agent(
        write_config(tmp_path, repo, {"pool-a": a}, agent=name, defaults="allow_empty = true")
    )
    healed = allowing.reconcile()["pool-a"]
    assert healed.ok and healed.count(Outcome.PRUNED) == 3


def test_mass_deletion_brake_holds_until_the_exact_set_is_approved(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("brake")
    names = [f"cm{i}" for i in range(10)]
    repo = make_repo(tmp_path, configmaps(ns, names))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].count(Outcome.CREATED) == 11
    repo.commit(configmaps(ns, names[:2]))  # 80% of the objects leave Git
    braked = agent.reconcile()["pool-a"]
    assert braked.count(Outcome.PRUNED) == 0
    refusal = braked.prune_refused or ""
    assert "mass-deletion brake" in refusal
    digest = refusal.split("--digest ")[1].split("`")[0]
    assert all(exists(a.kubeconfig, "configmap", n, ns) for n in names)
    assert agent.reconcile()["pool-a"].count(Outcome.PRUNED) == 0  # still held on the next pass

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "prune",
            "approve",
            "--config",
            agent.config.file,
            "--cluster",
            "pool-a",
            "--digest",
            digest,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    approved = agent.reconcile()["pool-a"]
    assert approved.count(Outcome.PRUNED) == 8 and approved.prune_refused is None
    assert [n for n in names if exists(a.kubeconfig, "configmap", n, ns)] == names[:2]


def test_a_namespace_that_still_holds_objects_we_do_not_own_is_reported_not_deleted(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns, other = e2e.namespace("hold"), e2e.namespace("keep")
    repo = make_repo(
        tmp_path,
        configmaps(ns, ["ours"])
        | {"clusters/pool-a/ns2.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {other}\n"},
    )
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    kubectl(a.kubeconfig, "create", "configmap", "users-data", "-n", ns, "--from-literal=k=v")
    repo.commit(
        {"clusters/pool-a/ns2.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {other}\n"}
    )
    r = agent.reconcile()["pool-a"]
    by_name = {x.key.name: x for x in r.results}
    assert by_name["ours"].outcome is Outcome.PRUNED
    assert by_name[ns].outcome is Outcome.PRUNE_SKIPPED and "users-data" in by_name[ns].message
    assert exists(a.kubeconfig, "configmap", "users-data", ns)
    # Still tracked: once the user's object is gone, the namespace is pruned.
    kubectl(a.kubeconfig, "delete", "configmap", "users-data", "-n", ns)
    assert agent.reconcile()["pool-a"].count(Outcome.PRUNED) == 1
