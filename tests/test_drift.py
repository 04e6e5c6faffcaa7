"""Drift modes on a real API server (``drift = "report"``, docs/operations.md).

In report mode, while the app's revision is the one it last applied, a hand edit of a field Git
declares stays, and is reported once (Event ``DriftDetected``, metric, ``/status``) naming the
kubectl manager that made it and when; an alert fires once and resolves when the drift is gone;
an object deleted by hand is reported, not re-created; a new revision is applied whole and says
which drift it corrected. The default (``correct``) is unchanged (``test_ownership``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli.diff import diff
from agent.cli.ops import format_status
from agent.model import DriftFate, DriftKind, Evidence, Note, Outcome
from agent.report.events import events_for
from agent.run.record_store import FileStore
from agent.run.statuspage import ClusterSnapshot, Snapshot, StatusPage
from agent.ui import auth
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import Daemons, status, tune
from tests.sinkkit import Sink, add_lines, stamp
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

REPORT = 'drift = "report"'


def deployment(ns: str, *, image: str = "nginx:1.27") -> str:
    return (
        f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: {ns}\n"
        f"spec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: web}}\n"
        f"  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      containers:\n"
        f"        - name: web\n          image: {image}\n"
    )


def manifests(ns: str, *, image: str = "nginx:1.27") -> str:
    return "---\n".join(
        [
            f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n",
            deployment(ns, image=image),
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: {ns}\n"
            "data:\n  greeting: hello\n",
            f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\n  namespace: {ns}\n"
            "stringData:\n  password: from-git\n",
        ]
    )


def get(kubeconfig: Path, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(kubeconfig, "get", *args, "-o", "json", "--show-managed-fields"))  # type: ignore[no-any-return]


def edit_image(kubeconfig: Path, ns: str, image: str) -> None:
    """What ``kubectl edit`` writes: an Update as manager ``kubectl-edit``."""
    patch = json.dumps({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": image}]}}}})
    kubectl(kubeconfig, "patch", "deployment", "web", "-n", ns, "--field-manager=kubectl-edit", "-p", patch)


def entry_time(live: dict[str, Any], manager: str) -> str:
    return next(str(e["time"]) for e in live["metadata"]["managedFields"] if e["manager"] == manager)


def test_a_hand_edit_in_report_mode_stays_and_is_reported_once_naming_kubectl_and_when(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("drift")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": manifests(ns)})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, defaults=REPORT))
    assert agent.reconcile()["pool-a"].ok
    edit_image(a.kubeconfig, ns, "evil:1")
    secret = {"data": {"password": "aGFuZC1zZXQ="}}  # "hand-set"
    kubectl(a.kubeconfig, "patch", "secret", "creds", "-n", ns, "-p", json.dumps(secret))
    for _ in range(3):
        r = agent.reconcile()["pool-a"]
        assert r.ok, r.error
        live = get(a.kubeconfig, "deployment", "web", "-n", ns)
        assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "evil:1"  # left as it is
        (web,) = [x for x in r.results if x.key.kind == "Deployment"]
        assert (web.outcome, web.note) == (Outcome.UNCHANGED, Note.DRIFT), web
        assert "containers[name=web].image" in web.message
    image = next(d for d in r.drift if d.key.kind == "Deployment")
    assert (image.kind, image.fate, image.path) == (
        DriftKind.CHANGED,
        DriftFate.REPORTED,
        "spec.template.spec.containers[name=web].image",
    )
    assert (image.git, image.live) == ("nginx:1.27", "evil:1")
    assert (image.manager, image.operation, image.evidence) == ("kubectl-edit", "Update", Evidence.OWNER)
    assert image.time == entry_time(live, "kubectl-edit")  # the server's managedFields timestamp
    password = next(d for d in r.drift if d.key.kind == "Secret")
    assert password.path == "data.password" and password.manager == "kubectl-patch"
    assert "hand-set" not in repr(r.drift) and "aGFuZC1zZXQ=" not in repr(r.drift)  # masked
    assert "from-git" not in repr(r.drift)
    assert get(a.kubeconfig, "secret", "creds", "-n", ns)["data"]["password"] == "aGFuZC1zZXQ="

    # Reported once: one Event per drifted object, never counted up by later passes.
    cfg = agent.config
    parent = agent.fleet._slots["pool-a"].reconciler.parent_of("pool-a")
    drifted = [
        e
        for e in events_for(agent.fleet._slots["pool-a"].reconciler.client, cfg.agent.namespace, parent)
        if e["reason"] == "DriftDetected"
    ]
    assert len(drifted) == 2 and all(e["count"] == 1 for e in drifted), drifted
    (on_web,) = [e for e in drifted if "Deployment" in e["message"]]
    assert "kubectl-edit (Update)" in on_web["message"] and image.time in on_web["message"]
    assert "evil:1" in on_web["message"] and on_web["type"] == "Warning"
    assert not any("hand-set" in e["message"] or "aGFuZC1zZXQ=" in e["message"] for e in drifted)
    metrics = agent.fleet.metrics.render().decode()
    assert 'gitops_agent_drift_objects{app="pool-a",cluster="pool-a"} 2.0' in metrics
    row = agent.fleet.status["pool-a"].rows()[0]
    assert row["drift_objects"] == 2
    shown = next(d for d in row["drift"] if d["object"].startswith("Deployment"))
    assert (shown["manager"], shown["git"], shown["live"]) == ("kubectl-edit", "nginx:1.27", "evil:1")

    table = format_status({"agent": cfg.agent.name, "clusters": [row]}).splitlines()
    by = f"by kubectl-edit (Update) at {image.time}"
    assert f"  pool-a: Deployment.apps/{ns}/web: drift reported: {image.path} {by}" in table, table
    # The status page: field, Git's and live's value, who and when.
    page = StatusPage(
        lambda: Snapshot(cfg.agent.name, (ClusterSnapshot("pool-a", agent.fleet.status["pool-a"]),)),
        FileStore(tmp_path / "records"),
        access=auth.Access.OPEN,
    )
    page.load()
    page.record_passes([r], {}, may_write=lambda _: True)
    html = page.handle("GET", "/ui/clusters/pool-a/apps/pool-a", {}).body.decode()
    drift_table = html[html.index('id="drift"') : html.index("<h2>Objects</h2>")]
    assert "spec.template.spec.containers[name=web].image" in drift_table
    assert "kubectl-edit (Update)" in drift_table and f'datetime="{image.time}"' in drift_table
    assert "&#34;evil:1&#34;" in drift_table or '"evil:1"' in drift_table
    assert "hand-set" not in html and "aGFuZC1zZXQ=" not in html

    # The live diff marks it: at this revision the pass leaves it.
    report = CliRunner().invoke(diff, ["--config", cfg.file, "--format", "json"], catch_exceptions=False)
    doc = json.loads(report.stdout)
    (web_diff,) = [o for o in doc["clusters"][0]["apps"][0]["objects"] if o["kind"] == "Deployment"]
    assert web_diff["note"].startswith("drift (drift = report), left and reported at this revision: "), (
        web_diff
    )
    assert f"{image.path} changed by kubectl-edit (Update) at {image.time}" in web_diff["note"]

    # A new revision is applied whole: the drift of what it applies is corrected, and said so.
    repo.commit({"clusters/pool-a/app.yaml": manifests(ns, image="nginx:1.28")})
    r = agent.reconcile()["pool-a"]
    assert r.ok and r.drift_reported == []
    corrected = {(d.key.kind, d.fate, d.manager) for d in r.drift}
    assert ("Deployment", DriftFate.CORRECTED, "kubectl-edit") in corrected, r.drift
    assert ("Secret", DriftFate.CORRECTED, "kubectl-patch") in corrected, r.drift
    live = get(a.kubeconfig, "deployment", "web", "-n", ns)
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.28"
    metrics = agent.fleet.metrics.render().decode()
    assert 'gitops_agent_drift_objects{app="pool-a",cluster="pool-a"} 0.0' in metrics
    r = agent.reconcile()["pool-a"]
    assert r.ok and r.drift == [] and r.count(Outcome.UNCHANGED) == 4


def test_an_object_deleted_by_hand_in_report_mode_is_reported_not_recreated_until_a_new_revision(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("drift")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": manifests(ns)})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, defaults=REPORT))
    assert agent.reconcile()["pool-a"].ok
    kubectl(a.kubeconfig, "delete", "configmap", "settings", "-n", ns)
    for _ in range(2):
        r = agent.reconcile()["pool-a"]
        assert r.ok, r.error
        (gone,) = r.drift
        assert (gone.key.kind, gone.kind, gone.fate) == ("ConfigMap", DriftKind.DELETED, DriftFate.REPORTED)
        (cm,) = [x for x in r.results if x.key.kind == "ConfigMap"]
        assert (cm.outcome, cm.note) == (Outcome.UNCHANGED, Note.DRIFT) and "not re-created" in cm.message
        assert "configmap/settings" not in kubectl(a.kubeconfig, "get", "configmap", "-n", ns, "-o", "name")
    repo.commit({"clusters/pool-a/app.yaml": manifests(ns, image="nginx:1.28")})
    r = agent.reconcile()["pool-a"]
    assert r.ok
    (cm,) = [x for x in r.results if x.key.kind == "ConfigMap"]
    assert cm.outcome is Outcome.CREATED
    assert [(d.key.kind, d.kind, d.fate) for d in r.drift] == [
        ("ConfigMap", DriftKind.DELETED, DriftFate.CORRECTED)
    ]


def test_a_restarted_agent_still_reports_drift_at_the_revision_its_parent_records(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("drift")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": manifests(ns)})
    cfg = write_config(tmp_path, repo, {"pool-a": a}, defaults=REPORT)
    first = e2e.agent(cfg)
    assert first.reconcile()["pool-a"].ok
    edit_image(a.kubeconfig, ns, "evil:1")
    restarted = e2e.agent(cfg)  # knows nothing of the passes before
    r = restarted.reconcile()["pool-a"]
    assert r.ok and [(d.key.kind, d.manager, d.fate) for d in r.drift] == [
        ("Deployment", "kubectl-edit", DriftFate.REPORTED)
    ]
    live = get(a.kubeconfig, "deployment", "web", "-n", ns)
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "evil:1"


def test_correct_mode_reverts_a_hand_edit_and_reports_no_drift(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("drift")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": manifests(ns)})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}, defaults='drift = "correct"'))
    assert agent.reconcile()["pool-a"].ok
    edit_image(a.kubeconfig, ns, "evil:1")
    kubectl(a.kubeconfig, "delete", "configmap", "settings", "-n", ns)
    r = agent.reconcile()["pool-a"]
    assert r.ok and r.drift == []
    outcomes = {x.key.kind: x.outcome for x in r.results}
    assert (outcomes["Deployment"], outcomes["ConfigMap"]) == (Outcome.CONFIGURED, Outcome.CREATED)
    live = get(a.kubeconfig, "deployment", "web", "-n", ns)
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"


def test_a_drift_alert_fires_once_while_the_drift_lasts_and_resolves_once_it_is_undone(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("drift")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": manifests(ns)})
    sink = Sink()
    e2e.at_end(sink.stop)
    cfg = write_config(tmp_path, repo, {"pool-a": a}, defaults=REPORT)
    cfg = add_lines(
        cfg,
        f"""
[alerts]
remind = ["1s"]

[[notifications]]
name = "hook"
kind = "webhook"
url = "{sink.url}/events"
""",
    )
    cfg = tune(cfg, defaults={"reconcile_interval": "1s"})
    daemons(cfg)
    wait_for("the first pass", lambda: status(cfg)["clusters"][0]["result"] == "ok", 30)
    edit_image(a.kubeconfig, ns, "evil:1")
    wait_for("the drift alert", lambda: sink.events(), 30)
    (event,) = sink.events()
    assert stamp([event]) == [("firing", "DriftDetected", "pool-a/pool-a")]
    assert "kubectl-edit (Update)" in event["message"] and "evil:1" in event["message"]
    row = status(cfg)["clusters"][0]
    assert row["drift_objects"] == 1 and row["drift"][0]["manager"] == "kubectl-edit"
    runs = row["last_run_at"]
    wait_for("more passes", lambda: status(cfg)["clusters"][0]["last_run_at"] != runs, 15)
    wait_for("more passes", lambda: status(cfg)["clusters"][0]["last_run_at"] != runs, 15)
    assert len(sink.events()) == 1  # fired once, never reminded while it lasts
    edit_image(a.kubeconfig, ns, "nginx:1.27")  # undone by hand: Git's value again
    wait_for("resolved", lambda: len(sink.events()) >= 2, 30)
    assert [n for n, _, _ in stamp(sink.events())] == ["firing", "resolved"]
    assert sink.events()[1]["reason"] == "DriftResolved"
    live = get(a.kubeconfig, "deployment", "web", "-n", ns)
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"
