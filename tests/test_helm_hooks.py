"""Helm delete and rollback hooks are never applied (docs/safety.md, "Helm delete and rollback
hooks are not applied").

A chart in Git, rendered by the pinned ``helm template``, applied to a real pool cluster: its
``pre-delete`` Job (Kyverno's kind, which scales the release to zero at uninstall) and its
``post-rollback`` ConfigMap are skipped with reason ``helm-hook`` in the pass's results, the
``run --once`` table, ``/status`` and the diff report's sync order, never created and never
recorded in the inventory; a hook that also names an install phase runs at the install as a
hook: created, never a member (docs/ordering.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli.diff import diff
from agent.cli.main import main
from agent.config.types import DEFAULT_CONFLICT_RULES
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import (
    Action,
    ClusterResult,
    DesiredObject,
    FailureReason,
    Outcome,
    PassState,
    Provenance,
    SkipReason,
)
from agent.plan.hooks import deferred_hook
from agent.plan.planner import PlanOptions, plan
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, TestNamespace, kubectl

CHART = "apiVersion: v2\nname: guard\nversion: 0.1.0\n"


def hooked(kind_body: str, name: str, hook: str | None) -> str:
    annotations = f"  annotations:\n    helm.sh/hook: {hook}\n" if hook else ""
    return f"metadata:\n  name: {name}\n  namespace: {{{{ .Values.ns }}}}\n{annotations}{kind_body}"


def config_map(name: str, hook: str | None) -> str:
    return "apiVersion: v1\nkind: ConfigMap\n" + hooked("data:\n  k: v\n", name, hook)


def job(name: str, hook: str) -> str:
    spec = (
        "spec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n"
        "        - name: scale-to-zero\n          image: bitnami/kubectl:1.31\n"
        "          command: [kubectl, scale, deployment, --all, --replicas=0]\n"
    )
    return "apiVersion: batch/v1\nkind: Job\n" + hooked(spec, name, hook)


def chart_files(ns: str) -> dict[str, str]:
    base = "clusters/pool-a/guard"
    return {
        "clusters/pool-a/ns.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n",
        f"{base}/Chart.yaml": CHART,
        f"{base}/values.yaml": f"ns: {ns}\n",
        f"{base}/templates/settings.yaml": config_map("settings", None),
        f"{base}/templates/scale-to-zero.yaml": job("scale-to-zero", "pre-delete"),
        f"{base}/templates/rolled-back.yaml": config_map("rolled-back", "post-rollback, post-delete"),
        f"{base}/templates/both.yaml": config_map("both", "post-install,pre-delete"),
    }


@pytest.mark.parametrize(
    ("hook", "deferred"),
    [
        ("pre-delete", ("pre-delete",)),
        ("post-delete", ("post-delete",)),
        ("pre-rollback,post-rollback", ("pre-rollback", "post-rollback")),
        (" Pre-Delete , post-delete ", ("pre-delete", "post-delete")),
        ("pre-install,pre-delete", ()),
        ("post-upgrade,post-rollback", ()),
        ("pre-install", ()),
        ("", ()),
        (None, ()),
    ],
)
def test_helm_delete_hook_only_an_object_naming_delete_or_rollback_phases_alone_is_deferred(
    hook: str | None, deferred: tuple[str, ...]
) -> None:
    annotations = {} if hook is None else {"helm.sh/hook": hook}
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "annotations": annotations},
    }
    assert deferred_hook(manifest) == deferred


def test_helm_delete_hook_is_planned_as_a_skip_whatever_live_holds_and_a_mixed_hook_is_created() -> None:
    def obj(name: str, hook: str) -> DesiredObject:
        meta = {"name": name, "namespace": "ns", "annotations": {"helm.sh/hook": hook}}
        return DesiredObject(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}, Provenance("c.yaml")
        )

    deferred, mixed, unlisted = (
        obj("d", "pre-delete"),
        obj("m", "pre-install,pre-delete"),
        obj("u", "post-delete"),
    )
    live = {deferred.key: {"metadata": {"name": "d", "resourceVersion": "1"}}, mixed.key: None}
    changes = plan(
        "c", "r", [deferred, mixed, unlisted], live, PlanOptions("agent", DEFAULT_CONFLICT_RULES)
    ).changes
    assert [(c.action, c.skip) for c in changes] == [
        (Action.SKIP, SkipReason.HELM_HOOK),
        (Action.CREATE, None),
        (Action.SKIP, SkipReason.HELM_HOOK),  # not listed: still a hook, never "live state unknown"
    ]
    assert changes[0].body is None and "pre-delete hook" in changes[0].reason


@pytest.mark.cluster
def test_helm_delete_hook_a_charts_pre_delete_job_is_never_applied_nor_tracked_and_says_why(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("hooks")
    repo = make_repo(tmp_path, chart_files(ns))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    r = agent.reconcile()["pool-a"]
    assert r.ok, (r.error, r.results)
    by_name = {x.key.name: x for x in r.results}
    for name in ("scale-to-zero", "rolled-back"):
        assert (by_name[name].outcome, by_name[name].skip) == (Outcome.SKIPPED, SkipReason.HELM_HOOK)
    assert "pre-delete hook" in by_name["scale-to-zero"].message
    assert by_name["both"].outcome is Outcome.CREATED and by_name["settings"].outcome is Outcome.CREATED
    assert by_name["both"].message == "hook created"  # a post-install hook: run, never a member

    # Absent from the cluster, and never a member of the inventory (so never pruned as one).
    gone = kubectl(a.kubeconfig, "get", "job,configmap", "-n", ns, "-o", "name")
    assert "job.batch/scale-to-zero" not in gone and "configmap/rolled-back" not in gone
    assert "configmap/both" in gone and "configmap/settings" in gone
    members = {k.name for k in agent.tracked()}
    assert "settings" in members and not members & {"scale-to-zero", "rolled-back", "both"}

    # Where people look: /status, the diff report, the run table.
    skipped = agent.fleet.status["pool-a"].rows()[0]["skipped"]
    assert {"object": f"Job.batch/{ns}/scale-to-zero", "skip": "helm-hook"} in [
        {"object": s["object"], "skip": s["skip"]} for s in skipped
    ]
    report = CliRunner().invoke(
        diff, ["--config", agent.config.file, "--format", "json"], catch_exceptions=False
    )
    doc = json.loads(report.stdout)
    (sync,) = [app["sync"] for c in doc["clusters"] for app in c["apps"]]
    assert f"never applied: Job.batch/{ns}/scale-to-zero (delete-or-rollback)" in sync, sync
    assert report.exit_code == 0, report.output

    # Steady: the next pass (`run --once`) applies and deletes nothing, and the hooks stay out.
    once = CliRunner().invoke(main, ["run", "--once", "--config", agent.config.file], catch_exceptions=False)
    assert once.exit_code == 0, once.output
    assert f"  pool-a: Job.batch/{ns}/scale-to-zero: skipped: Helm pre-delete hook" in once.stdout
    row = next(line.split() for line in once.stdout.splitlines() if line.startswith("pool-a"))
    assert row[2:7] == ["0", "2", "0", "0", "0"]  # APPLIED UNCHANGED YIELDED PRUNED FAILED (no hook runs)
    after = kubectl(a.kubeconfig, "get", "job,configmap", "-n", ns, "-o", "name")
    assert "job.batch/scale-to-zero" not in after and "configmap/rolled-back" not in after


# -- Helm install and upgrade hooks in the pass, on simulated Pods (docs/ordering.md) --------------

SETTLE_SECONDS = 90.0


def helm_job(name: str, hook: str, *, image: str = "registry.example.com/task:1", extra: str = "") -> str:
    """A hook Job of the chart (``{{ .Values.ns }}``); an image ending ``:fail`` fails its Pod."""
    return (
        "apiVersion: batch/v1\nkind: Job\n"
        f"metadata:\n  name: {name}\n  namespace: {{{{ .Values.ns }}}}\n"
        f"  annotations:\n    helm.sh/hook: {hook}\n{extra}"
        "spec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n"
        f"      containers:\n        - name: main\n          image: {image}\n"
    )


def release_chart(
    ns: str, version: str, *, migrate_image: str = "registry.example.com/migrate:1"
) -> dict[str, str]:
    """A chart whose ConfigMap says ``.Release.IsUpgrade``, with install, upgrade and test hooks."""
    base = "clusters/pods/release"
    weight = "    helm.sh/hook-weight: '-1'\n"
    succeeded = "    helm.sh/hook-delete-policy: hook-succeeded\n"
    release = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: release\n  namespace: {{ .Values.ns }}\n"
        'data:\n  upgrade: "{{ .Release.IsUpgrade }}"\n  version: "{{ .Values.version }}"\n'
    )
    return {
        f"{base}/Chart.yaml": "apiVersion: v2\nname: release\nversion: 0.1.0\n",
        f"{base}/values.yaml": f"ns: {ns}\nversion: '{version}'\n",
        f"{base}/templates/release.yaml": release,
        f"{base}/templates/setup.yaml": helm_job("setup", "pre-install", extra=weight),
        f"{base}/templates/migrate.yaml": helm_job("migrate", "pre-upgrade", image=migrate_image),
        f"{base}/templates/smoke.yaml": helm_job("smoke", "post-install,post-upgrade", extra=succeeded),
        f"{base}/templates/tests/check.yaml": helm_job("check", "test"),
    }


def settle(agent: Any, cluster: str = "pods") -> tuple[ClusterResult, list[str]]:
    """Passes until the app's sync no longer waits on a step (as the scheduler runs them): the
    last pass's result, and what the passes created, in order."""
    deadline, created = time.monotonic() + SETTLE_SECONDS, []
    while True:
        r: ClusterResult = agent.reconcile()[cluster]
        created += [x.key.name for x in r.results if x.outcome is Outcome.CREATED]
        if r.state is not PassState.SYNCING or time.monotonic() > deadline:
            return r, created
        time.sleep(0.5)


def items(client: KubeClient, ns: str, resource: str) -> dict[str, dict[str, Any]]:
    group = "/api/v1" if resource in ("configmaps", "services") else "/apis/batch/v1"
    if resource == "replicasets":
        group = "/apis/apps/v1"
    listed = client.request("GET", f"{group}/namespaces/{ns}/{resource}")["items"]
    return {i["metadata"]["name"]: i for i in listed if i["metadata"]["name"] != "kube-root-ca.crt"}


@pytest.mark.cluster
def test_helm_hooks_install_hooks_run_at_the_first_install_upgrade_hooks_on_a_later_revision_never_twice(
    tmp_path: Path, pods_cluster: LocalCluster, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    ns = pods_namespace.name
    repo = make_repo(tmp_path, release_chart(ns, "1"))
    agent = e2e.agent(write_config(tmp_path, repo, {"pods": pods_cluster}))
    client = agent.fleet.reconcilers["pods"].client

    # The first install: pre-install, then the chart's objects (rendered as an install), then
    # post-install (deleted once it succeeded); no upgrade hook, no test hook.
    r, created = settle(agent)
    assert r.state is PassState.OK, (r.state, r.error, r.results)
    jobs = items(client, ns, "jobs")
    assert set(jobs) == {"setup"}, jobs  # smoke: hook-succeeded
    assert items(client, ns, "configmaps")["release"]["data"] == {"upgrade": "false", "version": "1"}
    assert {k.name for k in agent.tracked("pods")} == {"release"}  # hooks are never members
    skipped = {x.key.name: x for x in r.results if x.outcome is Outcome.SKIPPED}
    assert skipped["migrate"].skip is SkipReason.HELM_HOOK and "other-sync" in skipped["migrate"].message
    assert created.index("setup") < created.index("release") < created.index("smoke"), created

    # The same revision again (the install's hooks ran): no hook at all, reads only.
    r = agent.reconcile()["pods"]
    assert r.ok and not any(x.outcome is Outcome.CREATED for x in r.results), r.results
    assert items(client, ns, "jobs")["setup"]["metadata"]["uid"] == jobs["setup"]["metadata"]["uid"]

    # A later revision is an upgrade: pre-upgrade and post-upgrade run, the chart says IsUpgrade.
    repo.commit(release_chart(ns, "2"))
    r, created = settle(agent)
    assert created == ["migrate", "smoke"], created
    assert r.state is PassState.OK, (r.state, r.error, r.results)
    jobs_after = items(client, ns, "jobs")
    assert set(jobs_after) == {"setup", "migrate"} and jobs_after["migrate"]["status"].get("succeeded") == 1
    assert jobs_after["setup"]["metadata"]["uid"] == jobs["setup"]["metadata"]["uid"]  # not run again
    assert items(client, ns, "configmaps")["release"]["data"] == {"upgrade": "true", "version": "2"}
    assert {k.name for k in agent.tracked("pods")} == {"release"}
    r = agent.reconcile()["pods"]
    assert r.ok and not any(x.outcome is Outcome.CREATED for x in r.results), r.results


@pytest.mark.cluster
def test_helm_hooks_a_failing_pre_upgrade_hook_applies_nothing_else_and_fails_the_app_with_reason_hook(
    tmp_path: Path, pods_cluster: LocalCluster, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    ns = pods_namespace.name
    repo = make_repo(tmp_path, release_chart(ns, "1"))
    agent = e2e.agent(write_config(tmp_path, repo, {"pods": pods_cluster}, defaults='health_debounce = "0s"'))
    client = agent.fleet.reconcilers["pods"].client
    assert settle(agent)[0].state is PassState.OK

    repo.commit(release_chart(ns, "2", migrate_image="registry.example.com/migrate:fail"))
    r, _ = settle(agent)
    assert r.failure is not None and r.failure.reason is FailureReason.HOOK, (r.state, r.error, r.results)
    assert f"hook Job.batch/{ns}/migrate" in r.failure.message, r.failure.message
    assert items(client, ns, "configmaps")["release"]["data"]["version"] == "1"  # nothing else applied
    assert set(items(client, ns, "jobs")) == {"setup", "migrate"}  # no post-upgrade hook either


ARGOCD_EXAMPLES = Path(__file__).parent / "fixtures" / "argocd-example-apps"


@pytest.mark.cluster
def test_helm_hooks_argo_cds_helm_hooks_example_runs_in_helms_order_once(
    tmp_path: Path, pods_cluster: LocalCluster, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    """Argo CD's helm-hooks example, plain YAML with ``helm.sh/hook`` annotations: pre-install by
    weight (the ``generateName`` Job by a POST, then ``maint-page-up``), the ReplicaSet and Service,
    then post-install ``maint-page-down``; the order read from the server; a second pass runs none."""
    ns = pods_namespace.name
    example = (ARGOCD_EXAMPLES / "helm-hooks" / "manifests.yaml").read_text()
    repo = make_repo(tmp_path, {"clusters/pods/manifests.yaml": example})
    config = write_config(tmp_path, repo, {"pods": pods_cluster}, cluster_extra=f'default_namespace = "{ns}"')
    agent = e2e.agent(config)
    client = agent.fleet.reconcilers["pods"].client

    r, created = settle(agent)
    assert r.state is PassState.OK, (r.state, r.error, r.results)
    jobs = items(client, ns, "jobs")
    (schema,) = [n for n in jobs if n.startswith("upgrade-sql-schema")]  # named by the server
    assert set(jobs) == {schema, "maint-page-up", "maint-page-down"}
    assert created == [schema, "maint-page-up", "frontend", "frontend", "maint-page-down"], created

    # From the server: each step created only once the one before was through.
    frontend = items(client, ns, "replicasets")["frontend"]
    service = items(client, ns, "services")["frontend"]

    def made(obj: dict[str, Any]) -> str:
        return str(obj["metadata"]["creationTimestamp"])

    def done(job: dict[str, Any]) -> str:
        return str(job["status"]["completionTime"])

    assert done(jobs[schema]) <= made(jobs["maint-page-up"])
    assert done(jobs["maint-page-up"]) <= made(frontend) <= made(jobs["maint-page-down"])
    assert done(jobs["maint-page-up"]) <= made(service) <= made(jobs["maint-page-down"])
    assert {k.name for k in agent.tracked("pods")} == {"frontend"}  # the ReplicaSet and Service only
    assert {k.kind for k in agent.tracked("pods")} == {"ReplicaSet", "Service"}

    # A second pass at the same revision runs no hook and creates nothing.
    r = agent.reconcile()["pods"]
    assert r.ok and not any(x.outcome is Outcome.CREATED for x in r.results), r.results
    after = items(client, ns, "jobs")
    assert {n: j["metadata"]["uid"] for n, j in after.items()} == {
        n: j["metadata"]["uid"] for n, j in jobs.items()
    }


@pytest.mark.cluster
def test_helm_hooks_gitops_agent_test_runs_the_apps_test_hooks_alone_and_exits_by_their_result(
    tmp_path: Path, pods_cluster: LocalCluster, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    ns = pods_namespace.name
    repo = make_repo(tmp_path, release_chart(ns, "1"))
    agent = e2e.agent(write_config(tmp_path, repo, {"pods": pods_cluster}))
    client = agent.fleet.reconcilers["pods"].client
    args = ["test", "--config", agent.config.file, "--cluster", "pods"]

    # Not installed yet: nothing created, exit 1.
    early = CliRunner().invoke(main, args, catch_exceptions=False)
    assert early.exit_code == 1 and "not installed" in early.stderr, early.output
    assert settle(agent)[0].state is PassState.OK
    assert "check" not in items(client, ns, "jobs")  # a sync never runs a test hook

    passed = CliRunner().invoke(main, [*args, "-o", "json"], catch_exceptions=False)
    assert passed.exit_code == 0, passed.output
    doc = json.loads(passed.stdout)
    assert doc["ok"] and [t["object"] for t in doc["tests"]] == [f"Job.batch/{ns}/check"], doc
    assert doc["tests"][0]["result"] == "passed"
    assert "check" not in {k.name for k in agent.tracked("pods")}  # never a member

    failing = release_chart(ns, "1")
    failing["clusters/pods/release/templates/tests/check.yaml"] = helm_job(
        "check", "test", image="registry.example.com/check:fail"
    )
    repo.commit(failing)
    failed = CliRunner().invoke(main, args, catch_exceptions=False)
    assert failed.exit_code == 1 and f"failed  Job.batch/{ns}/check: Failed" in failed.stdout, failed.output


@pytest.mark.cluster
def test_helm_hooks_succeeded_hooks_go_once_their_phase_succeeded_and_a_ttl_job_gone_counts_as_finished(
    tmp_path: Path, pods_cluster: LocalCluster, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    """As ingress-nginx's and cert-manager's charts: a ServiceAccount hook of weight 0 is still
    there while the Job of weight 1 that runs as it is created (Helm deletes ``hook-succeeded``
    hooks once every hook of the phase succeeded; in both phases, as ingress-nginx's RBAC: the
    post-install one, beside the post-install Job, is not deleted again by the pre-install
    phase's end in a later pass), and a Job deleted by its
    ``ttlSecondsAfterFinished: 0`` before a pass reads it does not hold the sync."""
    ns = pods_namespace.name
    succeeded = "    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded\n"
    account = (
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: checker\n  namespace: {{ .Values.ns }}\n"
        "  annotations:\n    helm.sh/hook: pre-install,post-install\n"
        f"    helm.sh/hook-weight: '0'\n{succeeded}"
    )
    job = helm_job("check-api", "pre-install", extra=f"    helm.sh/hook-weight: '1'\n{succeeded}")
    job = job.replace(
        "spec:\n  backoffLimit: 0\n", "spec:\n  backoffLimit: 0\n  ttlSecondsAfterFinished: 0\n"
    )
    files = release_chart(ns, "1")
    files["clusters/pods/release/templates/account.yaml"] = account
    files["clusters/pods/release/templates/check-api.yaml"] = job
    repo = make_repo(tmp_path, files)
    agent = e2e.agent(write_config(tmp_path, repo, {"pods": pods_cluster}))
    client = agent.fleet.reconcilers["pods"].client

    def accounts() -> set[str]:
        listed = client.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts")["items"]
        return {a["metadata"]["name"] for a in listed}

    r = agent.reconcile()["pods"]
    while not any(x.key.name == "check-api" for x in r.results) and r.state is PassState.SYNCING:
        time.sleep(0.5)
        r = agent.reconcile()["pods"]
    assert any(x.key.name == "check-api" for x in r.results), (r.state, r.error, r.results)
    assert "checker" in accounts()  # its Job runs as it: kept until the phase succeeded
    r, created = settle(agent)
    assert r.state is PassState.OK and "release" in created, (r.state, r.error, r.results)
    assert "checker" not in accounts()  # deleted once the phase succeeded
    assert "check-api" not in items(client, ns, "jobs")
