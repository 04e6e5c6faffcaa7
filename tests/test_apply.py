"""Applying a plan on a real API server: order, isolation, immutables, dry-run, interop."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.apply import ssa
from agent.apply.inventory import applyset_id
from agent.model import ADDITIONAL_NAMESPACES, GROUP_KINDS, ID_LABEL, PART_OF, TOOLING, Outcome
from tests.agentkit import E2E, make_repo, unique, write_config
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster


def ns_doc(ns: str) -> str:
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"


def get(kubeconfig: Path, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))  # type: ignore[no-any-return]


def test_crd_and_its_custom_resources_in_one_commit_apply_in_one_pass(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("crd")
    group = f"{unique('g')}.example.com"
    crd = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {{type: integer}}
"""
    widgets = "---\n".join(
        f"apiVersion: {group}/v1\nkind: Widget\nmetadata:\n"
        f"  name: w{i}\n  namespace: {ns}\nspec:\n  size: {i}\n"
        for i in range(3)
    )
    # Custom resources first in file order: apply order must not depend on it.
    repo = make_repo(
        tmp_path, {"clusters/pool-a/a.yaml": widgets, "clusters/pool-a/b.yaml": crd + "---\n" + ns_doc(ns)}
    )
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    e2e.delete_after(a, "crd", f"widgets.{group}")
    r = agent.reconcile()["pool-a"]
    assert r.ok, [(str(x.key), x.message) for x in r.results if not x.ok]
    assert r.count(Outcome.CREATED) == 5
    assert get(a.kubeconfig, f"widgets.{group}", "w2", "-n", ns)["spec"]["size"] == 2
    assert agent.reconcile()["pool-a"].count(Outcome.UNCHANGED) == 5


def test_each_cluster_alone_one_rejected_object_does_not_stop_the_rest(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("iso")
    bad = (
        f"apiVersion: v1\nkind: Service\nmetadata:\n  name: bad\n"
        f"  namespace: {ns}\nspec:\n  ports:\n    - port: 99999\n"
    )
    goods = [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: good{i}\n  namespace: {ns}\ndata: {{k: v}}\n"
        for i in range(4)
    ]
    repo = make_repo(tmp_path, {"clusters/pool-a/x.yaml": "---\n".join([ns_doc(ns), bad, *goods])})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    r = agent.reconcile()["pool-a"]
    assert not r.ok and r.error is None  # the cluster worked; one object failed
    (failed,) = [x for x in r.results if x.outcome is Outcome.FAILED]
    assert failed.key.name == "bad" and failed.status == 422 and "99999" in failed.message
    assert r.count(Outcome.CREATED) == 5


def job(ns: str, image: str, *, recreate: bool = False) -> str:
    ann = "  annotations:\n    gitops-agent.io/recreate: on-immutable-change\n" if recreate else ""
    return (
        f"apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: once\n  namespace: {ns}\n{ann}spec:\n"
        f"  template:\n    spec:\n      restartPolicy: Never\n"
        f"      containers:\n        - name: c\n"
        f"          image: {image}\n"
    )


@pytest.mark.parametrize("recreate", [False, True])
def test_immutable_field_change_is_reported_or_recreated_on_request(
    tmp_path: Path, cluster_pool: ClusterPool, recreate: bool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("immut")
    repo = make_repo(
        tmp_path, {"clusters/pool-a/j.yaml": ns_doc(ns) + "---\n" + job(ns, "busybox:1", recreate=recreate)}
    )
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    uid = get(a.kubeconfig, "job", "once", "-n", ns)["metadata"]["uid"]
    repo.commit({"clusters/pool-a/j.yaml": ns_doc(ns) + "---\n" + job(ns, "busybox:2", recreate=recreate)})
    r = agent.reconcile()["pool-a"]
    (res,) = [x for x in r.results if x.key.kind == "Job"]
    live = get(a.kubeconfig, "job", "once", "-n", ns)
    if recreate:
        assert res.outcome is Outcome.CREATED and "re-created" in res.message
        assert live["metadata"]["uid"] != uid
        assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox:2"
    else:
        assert (
            res.outcome is Outcome.FAILED
            and "immutable" in res.message
            and "gitops-agent.io/recreate" in res.message
        )
        assert live["metadata"]["uid"] == uid


def test_namespaces_are_defaulted_and_cluster_scoped_objects_with_a_namespace_fail_closed(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("defns")
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: no-namespace\ndata: {k: v}\n"
    repo = make_repo(tmp_path, {"clusters/pool-a/x.yaml": ns_doc(ns) + "---\n" + cm})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, defaults=f'default_namespace = "{ns}"'))
    assert agent.reconcile()["pool-a"].ok
    assert get(a.kubeconfig, "configmap", "no-namespace", "-n", ns)["data"] == {"k": "v"}
    role = (
        "apiVersion: rbac.authorization.k8s.io/v1\n"
        "kind: ClusterRole\nmetadata:\n  name: x\n  namespace: oops\n"
    )
    repo.commit({"clusters/pool-a/x.yaml": ns_doc(ns) + "---\n" + cm, "clusters/pool-a/role.yaml": role})
    r = agent.reconcile()["pool-a"]
    assert not r.ok and "role.yaml" in (r.error or "") and "cluster-scoped" in (r.error or "")
    assert r.results == []


def test_dry_run_changes_nothing(tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("dry")
    repo = make_repo(tmp_path, {"clusters/pool-a/x.yaml": ns_doc(ns)})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    r = agent.reconcile(dry_run=True)["pool-a"]
    assert r.ok and r.dry_run and r.count(Outcome.CREATED) == 1
    assert kubectl(a.kubeconfig, "get", "namespace", ns, "--ignore-not-found", "-o", "name").strip() == ""
    parent = kubectl(
        a.kubeconfig,
        "get",
        "configmap",
        agent.config.agent.name,
        "-n",
        "gitops-agent",
        "--ignore-not-found",
        "-o",
        "name",
    )
    assert parent.strip() == ""


def test_applyset_parent_follows_kep_3659_and_kubectl_lists_exactly_the_members(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns, other = e2e.namespace("aset"), e2e.namespace("aset")
    docs = [ns_doc(ns), ns_doc(other)]
    docs += [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{i}\n  namespace: {ns}\ndata: {{k: v}}\n"
        for i in range(2)
    ]
    docs += [
        f"apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n"
        f"  namespace: {other}\nspec:\n  ports: [{{port: 80}}]\n"
    ]
    repo = make_repo(tmp_path, {"clusters/pool-a/x.yaml": "---\n".join(docs)})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    name = agent.config.agent.name
    assert agent.reconcile()["pool-a"].ok
    parent = get(a.kubeconfig, "configmap", name, "-n", "gitops-agent")
    aid = applyset_id(name, "gitops-agent")
    assert parent["metadata"]["labels"][ID_LABEL] == aid
    ann = parent["metadata"]["annotations"]
    assert ann[TOOLING].startswith("gitops-agent/v")
    assert ann[GROUP_KINDS] == "ConfigMap,Namespace,Service"
    assert set(ann[ADDITIONAL_NAMESPACES].split(",")) == {ns, other}
    listed = kubectl(
        a.kubeconfig,
        "get",
        "configmaps,services,namespaces",
        "-A",
        "-l",
        f"{PART_OF}={aid}",
        "-o",
        "jsonpath={range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name}{'\\n'}{end}",
    )
    assert sorted(listed.split()) == sorted(
        [
            f"ConfigMap/{ns}/c0",
            f"ConfigMap/{ns}/c1",
            f"Service/{other}/s",
            f"Namespace//{ns}",
            f"Namespace//{other}",
        ]
    )
    # The id is KEP-3659's: base64url(sha256(name.namespace.Kind.group)) without padding.
    import hashlib

    expected = base64.urlsafe_b64encode(hashlib.sha256(f"{name}.gitops-agent.ConfigMap.".encode()).digest())
    assert aid == f"applyset-{expected.decode().rstrip('=')}-v1"


def test_secret_values_are_applied_but_never_appear_in_results(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("sec")
    secret = (
        f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\n"
        f"  namespace: {ns}\nstringData:\n  password: hunter2-xyzzy\n"
    )
    repo = make_repo(tmp_path, {"clusters/pool-a/x.yaml": ns_doc(ns) + "---\n" + secret})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    r = agent.reconcile()["pool-a"]
    assert r.ok, r.results
    data = get(a.kubeconfig, "secret", "creds", "-n", ns)["data"]
    assert base64.b64decode(data["password"]).decode() == "hunter2-xyzzy"
    repo.commit(
        {"clusters/pool-a/x.yaml": ns_doc(ns) + "---\n" + secret.replace("hunter2-xyzzy", "swordfish-42")}
    )
    r2 = agent.reconcile()["pool-a"]
    assert r2.count(Outcome.CONFIGURED) == 1
    text = repr(r.results) + repr(r2.results) + str(r2.error)
    for leaked in ("hunter2-xyzzy", "swordfish-42", base64.b64encode(b"swordfish-42").decode()):
        assert leaked not in text
    assert agent.reconcile()["pool-a"].count(Outcome.UNCHANGED) == 2


def test_a_write_between_plan_and_apply_gets_409_and_the_object_is_replanned(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """The planned resourceVersion rides along: an interleaved write is never overwritten blindly."""
    from agent.apply import ssa as apply_stage

    a = cluster_pool["pool-a"]
    ns = e2e.namespace("race")
    cm = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: raced\n  namespace: {ns}\ndata:\n  k: v1\n"
    repo = make_repo(tmp_path, {"clusters/pool-a/x.yaml": ns_doc(ns) + "---\n" + cm})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    original = apply_stage._send
    calls: list[str] = []

    def racing_send(client, change, body, options):  # type: ignore[no-untyped-def]
        if change.key.name == "raced" and not calls:
            # Someone else writes after our plan was made (a label: not a field we declare).
            kubectl(a.kubeconfig, "label", "configmap", "raced", "-n", ns, "racer=yes")
        calls.append(change.resource_version or "")
        return original(client, change, body, options)

    assert agent.reconcile()["pool-a"].ok
    repo.commit({"clusters/pool-a/x.yaml": ns_doc(ns) + "---\n" + cm.replace("k: v1", "k: v2")})
    apply_stage._send = racing_send  # type: ignore[assignment]
    try:
        r = agent.reconcile()["pool-a"]
    finally:
        apply_stage._send = original  # type: ignore[assignment]
    assert r.ok, r.results
    assert len(calls) == 2 and calls[0] != calls[1]  # 409 on the stale version, then re-planned
    live = get(a.kubeconfig, "configmap", "raced", "-n", ns)
    assert live["data"]["k"] == "v2" and live["metadata"]["labels"]["racer"] == "yes"


def test_a_field_the_schema_does_not_declare_fails_that_object_naming_the_field(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """A typo in Git (``datta:``) is refused by the server's typed apply, not silently dropped and
    re-applied every pass; the object's neighbours apply, and the next pass says the same."""
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("typo")
    cm = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {ns}}}\n"
    cm += "{field}: {{a: b}}\n"
    doc = ns_doc(ns) + cm.format(name="good", ns=ns, field="data")
    doc += cm.format(name="typo", ns=ns, field="datta")
    repo = make_repo(tmp_path, {"clusters/pool-a/a.yaml": doc})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    for expected_good in (Outcome.CREATED, Outcome.UNCHANGED):
        r = agent.reconcile()["pool-a"]
        by_name = {x.key.name: x for x in r.results}
        assert by_name["good"].outcome is expected_good
        assert by_name["typo"].outcome is Outcome.FAILED
        assert ".datta" in by_name["typo"].message and "not declared" in by_name["typo"].message
        assert r.count(Outcome.PRUNED) == 0
    assert kubectl(a.kubeconfig, "get", "configmap", "typo", "-n", ns, "--ignore-not-found") == ""


class _CountingPool(ThreadPoolExecutor):
    submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_apply_keeps_a_bounded_window_of_requests_submitted_not_every_object_at_once() -> None:
    """A first pass of 9,000 objects per cluster submitted a future for each before the first
    answer came back (~1 KB each); results still come back in order, each object once."""
    with _CountingPool(max_workers=2) as pool:
        taken = []
        for i, result in enumerate(ssa._windowed(pool, lambda c: c, list(range(100)), window=3)):  # type: ignore[arg-type]
            taken.append(result)
            assert pool.submitted <= i + 1 + 3
    assert taken == list(range(100))
