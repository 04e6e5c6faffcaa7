"""Who owns what, on a real API server (docs/safety.md rules 4, 5, 9 and adoption).

Foreign labels, annotations and HPA-owned replicas survive many reconciles;
a hand edit of a Git-declared field is reverted and reported as drift, a hand
`kubectl scale` too (default rule `kubectl*` on `scale`: force), while an
autoscaler's `/scale` write is yielded and shown (run table, `/status`, page, diff);
`reconcile: disabled` and `prune: disabled` end ownership on purpose without
changing content; existing objects are adopted per `adopt`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli.diff import diff
from agent.cli.main import main
from agent.cli.ops import format_status
from agent.dev import localcluster
from agent.model import PART_OF, Note, ObjectKey, Outcome
from agent.run.record_store import FileStore
from agent.run.statuspage import ClusterSnapshot, Snapshot, StatusPage
from agent.ui import auth
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl, scale_as_hpa

pytestmark = pytest.mark.cluster


def deployment(ns: str, *, image: str = "nginx:1.27", replicas: int | None = 2) -> str:
    reps = f"  replicas: {replicas}\n" if replicas is not None else ""
    return (
        f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: {ns}\n"
        f"  labels:\n    app: web\nspec:\n{reps}  selector:\n    matchLabels: {{app: web}}\n"
        f"  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      containers:\n"
        f"        - name: web\n          image: {image}\n"
    )


def namespace_doc(ns: str) -> str:
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"


def get(kubeconfig: Path, *args: str) -> dict[str, Any]:
    out = kubectl(kubeconfig, "get", *args, "-o", "json", "--show-managed-fields")
    return json.loads(out)  # type: ignore[no-any-return]


def test_never_revert_foreign_labels_annotations_and_hpa_replicas_over_20_reconciles(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("own")
    files = {"clusters/pool-a/app.yaml": namespace_doc(ns) + "---\n" + deployment(ns)}
    repo = make_repo(tmp_path, files)
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    kubectl(a.kubeconfig, "label", "deployment", "web", "-n", ns, "team=payments")
    kubectl(a.kubeconfig, "annotate", "deployment", "web", "-n", ns, "owner/note=keep-me")
    scale_as_hpa(a.kubeconfig, ns, 5)
    for _ in range(20):
        r = agent.reconcile()["pool-a"]
        assert r.ok and r.count(Outcome.FAILED) == 0
    (web,) = [x for x in r.results if x.key.kind == "Deployment"]
    assert (web.outcome, web.note) == (Outcome.UNCHANGED, Note.YIELDED), web
    metrics = agent.fleet.metrics.render().decode()
    assert 'gitops_agent_objects{app="pool-a",cluster="pool-a",outcome="conflicting"} 1.0' in metrics
    live = get(a.kubeconfig, "deployment", "web", "-n", ns)
    assert live["metadata"]["labels"]["team"] == "payments"
    assert live["metadata"]["annotations"]["owner/note"] == "keep-me"
    assert live["spec"]["replicas"] == 5  # yielded to the HPA, never fought
    assert live["metadata"]["labels"][PART_OF]


def test_drift_versus_cooperation_kubectl_edit_of_a_declared_field_is_reverted_and_reported(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("own")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": namespace_doc(ns) + "---\n" + deployment(ns)})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    # `kubectl edit` writes as manager kubectl-edit (operation Update).
    patch = json.dumps({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "evil:1"}]}}}})
    kubectl(a.kubeconfig, "patch", "deployment", "web", "-n", ns, "--field-manager=kubectl-edit", "-p", patch)
    r = agent.reconcile()["pool-a"]
    assert r.ok
    (res,) = [x for x in r.results if x.key.kind == "Deployment"]
    assert res.outcome is Outcome.CONFIGURED and "image" in res.message
    live = get(a.kubeconfig, "deployment", "web", "-n", ns)
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"
    assert agent.reconcile()["pool-a"].count(Outcome.UNCHANGED) == 2


def test_drift_versus_cooperation_hand_kubectl_scale_loses_to_git_and_an_autoscaler_keeps_its_yield_shown(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """Rule `kubectl*` on `scale` → force: Git's next replicas are applied over a hand
    `kubectl scale`; an HPA's `/scale` write (as kube-controller-manager) is still yielded, and
    the yield shows in `run --once`'s table, `/status`, the status page and the diff report."""
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("own")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": namespace_doc(ns) + "---\n" + deployment(ns)})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    kubectl(a.kubeconfig, "scale", "deployment", "web", "-n", ns, "--replicas=4")  # as people do
    hand = {
        (e["manager"], e.get("subresource"))
        for e in get(a.kubeconfig, "deployment", "web", "-n", ns)["metadata"]["managedFields"]
    }
    assert ("kubectl", "scale") in hand, hand  # kubectl scale writes /scale as manager `kubectl`
    repo.commit({"clusters/pool-a/app.yaml": namespace_doc(ns) + "---\n" + deployment(ns, replicas=3)})
    r = agent.reconcile()["pool-a"]
    (web,) = [x for x in r.results if x.key.kind == "Deployment"]
    assert (r.ok, web.outcome, web.yielded, r.yielded) == (True, Outcome.CONFIGURED, (), 0), web
    assert get(a.kubeconfig, "deployment", "web", "-n", ns)["spec"]["replicas"] == 3  # Git's value

    scale_as_hpa(a.kubeconfig, ns, 6)
    r = agent.reconcile()["pool-a"]
    (web,) = [x for x in r.results if x.key.kind == "Deployment"]
    assert (web.outcome, web.note, r.yielded) == (Outcome.UNCHANGED, Note.YIELDED, 1), web
    assert get(a.kubeconfig, "deployment", "web", "-n", ns)["spec"]["replicas"] == 6  # the HPA's
    key = f"Deployment.apps/{ns}/web"
    # /status, and `gitops-agent status` reading it
    row = agent.fleet.status["pool-a"].rows()[0]
    assert row["yielded"] == 1
    assert row["yields"] == [
        {
            "object": key,
            "path": "spec.replicas",
            "manager": "kube-controller-manager",
            "operation": "Update",
            "subresource": "scale",
        }
    ]
    yielded_line = f"  pool-a: {key}: yielded: spec.replicas kept by kube-controller-manager (scale)"
    assert yielded_line in format_status({"agent": agent.config.agent.name, "clusters": [row]}).splitlines()
    # The status page (records of the real pass).
    page = StatusPage(
        lambda: Snapshot(agent.config.agent.name, (ClusterSnapshot("pool-a", agent.fleet.status["pool-a"]),)),
        FileStore(tmp_path / "records"),
        access=auth.Access.OPEN,
    )
    page.load()
    page.record_passes([r], {}, may_write=lambda _: True)
    html = page.handle("GET", "/ui/clusters/pool-a/apps/pool-a", {}).body.decode()
    assert "spec.replicas owned by kube-controller-manager (scale), kept 6, Git says 3" in html
    # `run --once`'s table
    once = CliRunner().invoke(main, ["run", "--once", "--config", agent.config.file], catch_exceptions=False)
    lines = once.stdout.splitlines()
    header, row_a = lines[0].split(), next(line.split() for line in lines if line.startswith("pool-a"))
    assert row_a[header.index("YIELDED")] == "1", once.stdout
    assert yielded_line in lines
    # the diff report
    report = CliRunner().invoke(
        diff, ["--config", agent.config.file, "--format", "json"], catch_exceptions=False
    )
    doc = json.loads(report.stdout)
    assert doc["summary"]["yielded"] == 1 and doc["clusters"][0]["apps"][0]["summary"]["yielded"] == 1
    (obj,) = doc["clusters"][0]["apps"][0]["objects"]
    assert (obj["key"], obj["action"], obj["conflicts"][0]["resolution"]) == (key, "conflict", "yield")


def test_ownership_ends_on_purpose_reconcile_disabled_and_prune_disabled(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("own")

    def cm(name: str, value: str) -> str:
        return (
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"
            f"  namespace: {ns}\ndata:\n  k: {value}\n"
        )

    repo = make_repo(
        tmp_path,
        {"clusters/pool-a/x.yaml": "---\n".join([namespace_doc(ns), cm("frozen", "v1"), cm("kept", "v1")])},
    )
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    kubectl(a.kubeconfig, "annotate", "configmap", "frozen", "-n", ns, "gitops-agent.io/reconcile=disabled")
    kubectl(a.kubeconfig, "annotate", "configmap", "kept", "-n", ns, "gitops-agent.io/prune=disabled")
    before = get(a.kubeconfig, "configmap", "kept", "-n", ns)
    # Git changes the disabled one and drops the other.
    repo.commit({"clusters/pool-a/x.yaml": "---\n".join([namespace_doc(ns), cm("frozen", "v2")])})
    r = agent.reconcile()["pool-a"]
    assert r.ok, r.error
    by_name = {x.key.name: x for x in r.results}
    assert by_name["frozen"].outcome is Outcome.SKIPPED
    assert by_name["kept"].outcome is Outcome.ORPHANED
    assert get(a.kubeconfig, "configmap", "frozen", "-n", ns)["data"]["k"] == "v1"
    after = get(a.kubeconfig, "configmap", "kept", "-n", ns)
    assert after["data"] == before["data"] and after["metadata"]["uid"] == before["metadata"]["uid"]
    assert PART_OF not in after["metadata"].get("labels", {})
    managers = {(e["manager"], e["operation"]) for e in after["metadata"]["managedFields"]}
    assert (agent.config.agent.name, "Apply") not in managers
    # Nothing is tracked after the agent stops owning it: later passes leave it alone.
    r2 = agent.reconcile()["pool-a"]
    assert "kept" not in {x.key.name for x in r2.results}
    assert ObjectKey("", "ConfigMap", ns, "kept") not in agent.tracked()
    assert get(a.kubeconfig, "configmap", "kept", "-n", ns)["metadata"]["uid"] == before["metadata"]["uid"]


@pytest.mark.parametrize(
    ("mode", "foreign_apply", "adopted"),
    [
        ("if-unowned", False, True),
        ("if-unowned", True, False),
        ("never", False, False),
        ("always", False, True),
    ],
)
def test_adopt_existing_objects_per_mode(
    tmp_path: Path, cluster_pool: ClusterPool, mode: str, foreign_apply: bool, adopted: bool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("adopt")
    kubectl(a.kubeconfig, "create", "namespace", ns)
    cm = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
        f"  name: existing\n  namespace: {ns}\ndata:\n  k: from-git\n"
    )
    if foreign_apply:
        localcluster.kubectl(
            a.kubeconfig,
            "apply",
            "--server-side",
            "--field-manager=other-tool",
            "-f",
            "-",
            stdin=cm.replace("from-git", "theirs"),
        )
    else:
        localcluster.kubectl(a.kubeconfig, "create", "-f", "-", stdin=cm.replace("from-git", "theirs"))
    repo = make_repo(tmp_path, {"clusters/pool-a/cm.yaml": cm})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, defaults=f'adopt = "{mode}"'))
    r = agent.reconcile()["pool-a"]
    (res,) = r.results
    live = get(a.kubeconfig, "configmap", "existing", "-n", ns)
    if adopted:
        assert res.outcome is Outcome.CONFIGURED
        assert live["data"]["k"] == "from-git" and PART_OF in live["metadata"]["labels"]
    else:
        assert res.outcome is Outcome.SKIPPED and res.message
        assert live["data"]["k"] == "theirs" and PART_OF not in (live["metadata"].get("labels") or {})


def test_adopt_always_takes_membership_but_yields_fields_another_applier_owns(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """`always` adopts the object; docs/safety.md rule 5 still decides each conflicting field
    (default: yield)."""
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("adopt")
    kubectl(a.kubeconfig, "create", "namespace", ns)
    cm = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
        f"  name: existing\n  namespace: {ns}\ndata:\n  k: from-git\n"
    )
    localcluster.kubectl(
        a.kubeconfig,
        "apply",
        "--server-side",
        "--field-manager=other-tool",
        "-f",
        "-",
        stdin=cm.replace("from-git", "theirs"),
    )
    repo = make_repo(tmp_path, {"clusters/pool-a/cm.yaml": cm})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, defaults='adopt = "always"'))
    (res,) = agent.reconcile()["pool-a"].results
    assert res.outcome is Outcome.CONFIGURED
    live = get(a.kubeconfig, "configmap", "existing", "-n", ns)
    assert PART_OF in live["metadata"]["labels"]
    assert live["data"]["k"] == "theirs"  # other-tool's field: yielded, not forced


def test_ownership_ends_on_purpose_an_object_taken_out_of_the_set_by_hand_is_kept_and_untracked(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """Removing the membership label takes an object out of the set: when it then leaves Git it
    is neither deleted nor tracked any more (it would otherwise stay a member for good)."""
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("own")
    docs = {
        name: f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {ns}}}\ndata: {{k: v}}"
        for name in ("stays", "released")
    }
    files = "\n---\n".join([namespace_doc(ns), *docs.values()])
    repo = make_repo(tmp_path, {"clusters/pool-a/x.yaml": files})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    released = ObjectKey("", "ConfigMap", ns, "released")
    assert agent.reconcile()["pool-a"].ok
    assert released in agent.tracked()
    uid = get(a.kubeconfig, "configmap", "released", "-n", ns)["metadata"]["uid"]
    kubectl(a.kubeconfig, "label", "configmap", "released", "-n", ns, f"{PART_OF}-")
    repo.commit({"clusters/pool-a/x.yaml": "\n---\n".join([namespace_doc(ns), docs["stays"]])})
    r = agent.reconcile()["pool-a"]
    assert r.ok, r.error
    assert r.count(Outcome.PRUNED) == 0 and r.prune_refused is None
    assert get(a.kubeconfig, "configmap", "released", "-n", ns)["metadata"]["uid"] == uid
    members = agent.tracked()
    assert released not in members and ObjectKey("", "ConfigMap", ns, "stays") in members
