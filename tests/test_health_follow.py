"""Following apps' rollouts after their passes, on a real local API server.

The pool's control plane runs no Deployment or ReplicaSet controller and no kubelet: there
``tests/rollout.py`` writes what they would (ReplicaSets, Pods, every status through the status
subresource), where a test steps the rollout itself. The daemon tests of two apps run on the
``pods`` cluster instead, whose Pods run (kube-scheduler, kwok): a Deployment rolls out by
itself, and one whose image is tagged ``:fail`` stays in ImagePullBackOff. Waits are stepped with
an explicit clock where the test is about time (debounce, timeout), so those tests take seconds;
the daemon tests wait on ``/status`` for what they expect.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config.load import load_config
from agent.config.types import CLUSTER_DEFAULTS, ClusterConfig, Config
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import AppHealth, HealthCause, HealthState, PassState
from agent.reconcile.reconciler import ClusterReconciler
from tests import daemonkit
from tests.agentkit import Repo, kubectl, make_repo, unique
from tests.appkit import AppsAgent, write_apps_config
from tests.clusters import PODS_NAME, ClusterPool
from tests.rollout import roll_out
from tests.waiting import wait_for

NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"


def deployment(ns: str, name: str, image: str = "nginx:1.27", replicas: int = 1) -> str:
    return f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {ns}
spec:
  replicas: {replicas}
  progressDeadlineSeconds: 600
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      automountServiceAccountToken: false
      containers:
      - name: main
        image: {image}
"""


def configmap(ns: str, name: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: v\n"


@pytest.fixture
def ns(cluster_pool: ClusterPool) -> Iterator[str]:
    name = unique("health")
    yield name
    kubectl(cluster_pool["pool-a"].kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def admin(cluster_pool: ClusterPool) -> Iterator[KubeClient]:
    """A client acting as the controllers and the kubelet the local control plane lacks."""
    client = KubeClient.from_config(
        ClusterConfig("pool-a", (), CLUSTER_DEFAULTS, kubeconfig=str(cluster_pool["pool-a"].kubeconfig))
    )
    yield client
    client.close()


def reconciler(agent: AppsAgent) -> ClusterReconciler:
    return agent.fleet.reconcilers["pool-a"]


def step(agent: AppsAgent, now: float) -> dict[str, AppHealth]:
    """One step of the cluster's waits at ``now``, recorded as the daemon records them."""
    for follow in reconciler(agent).follows.follows.values():
        follow.due = min(follow.due, now)  # the test's clock decides when
    return {h.app: h for h in agent.fleet.health.step("pool-a", now)}


# -- one app, stepped by hand -------------------------------------------------------------------


def one_app(tmp_path: Path, cluster_pool: ClusterPool, files: dict[str, str], **app: Any) -> AppsAgent:
    repo = make_repo(tmp_path, files)
    cfg = write_apps_config(tmp_path, repo, cluster_pool["pool-a"], [{"name": "web", "path": "web", **app}])
    return AppsAgent(cfg)


@contextlib.contextmanager
def applied(
    tmp_path: Path, cluster_pool: ClusterPool, files: dict[str, str], **app: Any
) -> Iterator[AppsAgent]:
    """App ``web`` of ``files`` (its `[[apps]]` keys ``app``) after one successful pass; closed after."""
    agent = one_app(tmp_path, cluster_pool, files, **app)
    try:
        assert agent.reconcile()["web"].ok
        yield agent
    finally:
        agent.close()


def test_a_bad_image_fails_the_app_at_the_timeout_naming_the_pod_and_its_waiting_reason(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str, admin: KubeClient
) -> None:
    with applied(
        tmp_path,
        cluster_pool,
        {"web/all.yaml": NS.format(ns=ns) + "---\n" + deployment(ns, "web", image="nginx:does-not-exist")},
        wait=True,
        health_timeout="6s",
        health_debounce="1s",
    ) as agent:
        t0 = reconciler(agent).follows.follows["web"].tracker.started
        first = step(agent, t0 + 0.1)["web"]
        assert first.state is HealthState.IN_PROGRESS and not first.done, first
        pod = roll_out(
            admin, ns, "web", ready=0, waiting="ImagePullBackOff", message='Back-off pulling image "x"'
        )
        during = step(agent, t0 + 3)["web"]
        assert during.state is HealthState.IN_PROGRESS, during
        assert during.health.blocker is not None and during.health.blocker.reason == "ImagePullBackOff"
        end = step(agent, t0 + 6.5)["web"]
        assert end.state is HealthState.FAILED and end.done, end
        assert end.health.cause is HealthCause.TIMEOUT
        assert f"Pod {pod}: ImagePullBackOff" in end.health.describe()
        assert agent.fleet.status["pool-a"].apps["web"].state is PassState.OK  # applied, degraded


def test_an_hpa_scale_of_a_healthy_deployment_never_reads_failed(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str, admin: KubeClient
) -> None:
    with applied(
        tmp_path,
        cluster_pool,
        {"web/all.yaml": NS.format(ns=ns) + "---\n" + deployment(ns, "web", replicas=2)},
        wait=True,
        health_timeout="60s",
        health_debounce="1s",
    ) as agent:
        roll_out(admin, ns, "web")
        t0 = time.monotonic()
        assert step(agent, t0)["web"].state is HealthState.CURRENT
        # An autoscaler writes through the scale subresource; the controller catches up in steps.
        admin.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{ns}/deployments/web/scale",
            body={"spec": {"replicas": 4}},
            content_type="application/merge-patch+json",
        )
        assert agent.reconcile()["web"].ok  # the next pass yields replicas to the scale writer
        seen = []
        for i, ready in enumerate((2, 3, 4)):
            roll_out(admin, ns, "web", ready=ready)
            seen.append(step(agent, t0 + 5 * (i + 1)).get("web"))
        states = [h.state for h in seen if h is not None]
        assert HealthState.FAILED not in states, seen
        assert states[-1] is HealthState.CURRENT
        live = admin.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/web")
        assert live["spec"]["replicas"] == 4


WIDGETS = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.health.example.com
spec:
  group: health.example.com
  scope: Namespaced
  names: {{plural: {plural}, singular: {singular}, kind: {kind}, listKind: {kind}List}}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {{status: {{}}}}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"""


@pytest.fixture
def widgets(admin: KubeClient) -> Iterator[str]:
    """A namespaced custom kind with a status subresource (its CRD removed after the test)."""
    kind = "Widget" + unique("w").split("-")[-1].capitalize()
    plural = kind.lower() + "s"
    crd = WIDGETS.format(plural=plural, singular=kind.lower(), kind=kind)
    body = yaml.safe_load(crd)
    admin.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=body)
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.health.example.com"
    wait_for(
        f"CRD {plural} Established",
        lambda: any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (admin.request("GET", path).get("status") or {}).get("conditions") or []
        ),
        30,
    )
    admin.discovery(refresh=True)
    yield kind
    admin.request("DELETE", path)


def widget(ns: str, kind: str, name: str = "w1") -> str:
    meta = f"metadata:\n  name: {name}\n  namespace: {ns}\n"
    return f"apiVersion: health.example.com/v1\nkind: {kind}\n{meta}spec:\n  size: 1\n"


def set_status(admin: KubeClient, ns: str, kind: str, status: dict[str, Any], name: str = "w1") -> None:
    admin.request(
        "PATCH",
        f"/apis/health.example.com/v1/namespaces/{ns}/{kind.lower()}s/{name}/status",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


def stalled(value: str, generation: int = 1) -> dict[str, Any]:
    return {
        "observedGeneration": generation,
        "conditions": [
            {"type": "Stalled", "status": value, "reason": "OutOfQuota", "message": "no quota left"}
        ],
    }


def test_a_stalled_flap_shorter_than_the_debounce_is_no_failure_a_longer_one_is(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str, admin: KubeClient, widgets: str
) -> None:
    with applied(
        tmp_path,
        cluster_pool,
        {"web/all.yaml": NS.format(ns=ns) + "---\n" + widget(ns, widgets)},
        wait=True,
        health_timeout="60s",
        health_debounce="3s",
    ) as agent:
        t0 = time.monotonic()
        set_status(admin, ns, widgets, stalled("True"))
        flap = step(agent, t0)["web"]
        assert flap.state is HealthState.IN_PROGRESS and flap.health.cause is HealthCause.DEBOUNCING, flap
        set_status(admin, ns, widgets, stalled("False"))
        assert step(agent, t0 + 2)["web"].state is HealthState.CURRENT  # the flap ended inside 3 s
        # A second Stalled=True that holds: Failed once it has held for the debounce, not before.
        agent.reconcile()  # a steady pass begins a fresh wait on the same revision
        set_status(admin, ns, widgets, stalled("True"))
        assert step(agent, t0 + 10)["web"].state is HealthState.IN_PROGRESS
        assert step(agent, t0 + 12)["web"].state is HealthState.IN_PROGRESS
        held = step(agent, t0 + 13.5)["web"]
        assert held.state is HealthState.FAILED and held.done, held
        assert "no quota left" in held.health.describe()


def test_ready_false_is_in_progress_never_failed(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str, admin: KubeClient, widgets: str
) -> None:
    with applied(
        tmp_path,
        cluster_pool,
        {"web/all.yaml": NS.format(ns=ns) + "---\n" + widget(ns, widgets)},
        wait=True,
        health_timeout="60s",
        health_debounce="1s",
    ) as agent:
        t0 = time.monotonic()
        ready_false = {
            "observedGeneration": 1,
            "conditions": [{"type": "Ready", "status": "False", "reason": "Provisioning"}],
        }
        set_status(admin, ns, widgets, ready_false)
        states = [step(agent, t0 + s)["web"].state for s in (0, 5, 20)]
        assert states == [HealthState.IN_PROGRESS] * 3


def test_a_cel_check_decides_a_custom_kind(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str, admin: KubeClient, widgets: str
) -> None:
    repo = make_repo(tmp_path, {"web/all.yaml": NS.format(ns=ns) + "---\n" + widget(ns, widgets)})
    checks = (
        "\n[[health_checks]]\n"
        'api_version = "health.example.com/v1"\n'
        f'kind = "{widgets}"\n'
        "current = \"has(self.status) && self.status.phase == 'Running'\"\n"
        "failed = \"has(self.status) && self.status.phase == 'Broken'\"\n"
    )
    cfg = write_apps_config(
        tmp_path,
        repo,
        cluster_pool["pool-a"],
        [{"name": "web", "path": "web", "wait": True, "health_timeout": "60s", "health_debounce": "1s"}],
    )
    Path(cfg.file).write_text(Path(cfg.file).read_text() + checks)
    agent = AppsAgent(load_config(Path(cfg.file)))
    try:
        assert agent.reconcile()["web"].ok
        t0 = time.monotonic()
        set_status(admin, ns, widgets, {"phase": "Starting"})
        assert step(agent, t0)["web"].state is HealthState.IN_PROGRESS
        set_status(admin, ns, widgets, {"phase": "Running"})
        assert step(agent, t0 + 1)["web"].state is HealthState.CURRENT
        agent.reconcile()
        set_status(admin, ns, widgets, {"phase": "Broken"})
        step(agent, t0 + 2)
        broken = step(agent, t0 + 4)["web"]
        assert broken.state is HealthState.FAILED, broken
    finally:
        agent.close()


def test_a_wait_entry_the_app_does_not_apply_is_named_and_fails_at_the_timeout(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    with applied(
        tmp_path,
        cluster_pool,
        {"web/all.yaml": NS.format(ns=ns) + "---\n" + configmap(ns, "settings")},
        wait=["ConfigMap/settings", "Deployment/webb"],
        health_timeout="5s",
        health_debounce="1s",
    ) as agent:
        t0 = reconciler(agent).follows.follows["web"].tracker.started
        end = step(agent, t0 + 6)["web"]
        assert end.state is HealthState.FAILED and end.objects == 2 and end.current == 1, end
        assert "Deployment/webb" in end.health.message and "did not apply" in end.health.message


# -- the daemon: two apps on one cluster, a new commit, dependencies ----------------------------


@pytest.fixture
def pods_ns(pods_cluster: LocalCluster) -> Iterator[str]:
    """A namespace name on the ``pods`` cluster, deleted after the test (the agent creates it)."""
    name = unique("health")
    yield name
    kubectl(pods_cluster.kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


def two_apps(tmp_path: Path, cluster: LocalCluster, ns: str, **web: Any) -> tuple[Repo, Config]:
    """``web`` (image tagged ``:fail``: ImagePullBackOff) and ``api`` (rolls out) on ``cluster``."""
    repo = make_repo(
        tmp_path,
        {
            "web/all.yaml": NS.format(ns=ns) + "---\n" + deployment(ns, "web", image="nginx:fail"),
            "api/all.yaml": NS.format(ns=ns) + "---\n" + deployment(ns, "api"),
        },
    )
    common = {"wait": True, "health_debounce": "1s"}
    cfg = write_apps_config(
        tmp_path,
        repo,
        cluster,
        [
            {"name": "web", "path": "web", "health_timeout": "15s", **common, **web},
            {"name": "api", "path": "api", "health_timeout": "300s", **common},
        ],
        cluster_name=cluster.name,
    )
    return repo, daemonkit.tune(cfg)


def app_row(cfg: Config, app: str) -> dict[str, Any]:
    doc = daemonkit.status(cfg)
    return next(r for r in doc["clusters"] if r["app"] == app)


def health_of(cfg: Config, app: str) -> dict[str, Any] | None:
    h: dict[str, Any] | None = app_row(cfg, app)["health"]
    return h


def health_in(cfg: Config, app: str, state: str) -> dict[str, Any] | None:
    """``app``'s health in ``/status`` when it is ``state``, else None (for ``wait_for``)."""
    h = health_of(cfg, app)
    return h if h is not None and h["state"] == state else None


def test_one_app_failing_its_rollout_does_not_delay_another_on_the_same_cluster(
    tmp_path: Path, pods_cluster: LocalCluster, pods_ns: str, daemons: daemonkit.Daemons
) -> None:
    ns = pods_ns
    _, cfg = two_apps(tmp_path, pods_cluster, ns)
    daemons(cfg)
    wait_for("both apps applied", lambda: all(app_row(cfg, a)["state"] == "ok" for a in ("web", "api")), 60)
    api = wait_for("api rolled out", lambda: health_in(cfg, "api", "Current"), 30)
    web_now = health_of(cfg, "web")
    assert web_now is not None and web_now["state"] == "InProgress", web_now  # still waiting meanwhile
    assert api["waited"] < 15, api
    web = wait_for("web Failed", lambda: health_in(cfg, "web", "Failed"), 45)
    assert "ImagePullBackOff" in (web["blocker"] or ""), web
    assert app_row(cfg, "web")["state"] == "ok"  # applied, degraded: health is reported apart
    metrics = daemonkit.http(daemonkit.url(cfg, "/metrics"))[1]
    assert f'gitops_agent_app_health{{app="web",cluster="{PODS_NAME}",state="Failed"}} 1.0' in metrics
    assert f'gitops_agent_app_health{{app="api",cluster="{PODS_NAME}",state="Current"}} 1.0' in metrics
    events = json.loads(
        kubectl(pods_cluster.kubeconfig, "get", "events", "-n", cfg.agent.namespace, "-o", "json")
    )["items"]
    reasons = {(e["reason"], e["involvedObject"]["name"]) for e in events}
    assert ("HealthFailed", f"{cfg.agent.name}.web") in reasons, reasons
    assert ("HealthCurrent", f"{cfg.agent.name}.api") in reasons, reasons
    table = subprocess.run(
        [sys.executable, "-m", "agent.cli", "status", "--config", cfg.file], capture_output=True, text=True
    ).stdout
    assert "HEALTH" in table and f"{PODS_NAME}/web: health Failed" in table and "ImagePullBackOff" in table


def test_a_new_commit_during_a_long_wait_cancels_it_and_assesses_the_new_revision(
    tmp_path: Path, pods_cluster: LocalCluster, pods_ns: str, daemons: daemonkit.Daemons
) -> None:
    ns = pods_ns
    repo, cfg = two_apps(tmp_path, pods_cluster, ns, health_timeout="300s")
    daemons(cfg)
    first = wait_for("web waiting", lambda: health_in(cfg, "web", "InProgress"), 60)
    fixed = {
        "web/all.yaml": NS.format(ns=ns) + "---\n" + deployment(ns, "web", image="nginx:1.27"),
        "api/all.yaml": NS.format(ns=ns) + "---\n" + deployment(ns, "api"),
    }
    second = repo.commit(fixed, "web: a good image")
    assert second != first["revision"]
    wait_for(
        "web's wait on the new revision", lambda: (health_of(cfg, "web") or {}).get("revision") == second, 60
    )
    done = wait_for("web rolled out", lambda: health_in(cfg, "web", "Current"), 60)
    assert done["revision"] == second and done["done"]


def test_depends_on_waits_for_the_dependency_to_roll_out_not_only_to_apply(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str, admin: KubeClient, daemons: daemonkit.Daemons
) -> None:
    repo = make_repo(
        tmp_path,
        {
            "infra/all.yaml": NS.format(ns=ns) + "---\n" + deployment(ns, "db"),
            "shop/all.yaml": configmap(ns, "shop"),
        },
    )
    cfg = write_apps_config(
        tmp_path,
        repo,
        cluster_pool["pool-a"],
        [
            {"name": "infra", "path": "infra", "wait": True, "health_timeout": "300s"},
            {"name": "shop", "path": "shop", "depends_on": ["infra"]},
        ],
    )
    cfg = daemonkit.tune(cfg)
    daemons(cfg)
    wait_for("shop waiting on infra", lambda: app_row(cfg, "shop")["waiting_on"] == ["infra"], 60)
    assert app_row(cfg, "infra")["state"] == "ok"
    got = kubectl(cluster_pool["pool-a"].kubeconfig, "get", "configmap", "shop", "-n", ns, check=False)
    assert "NotFound" in got or not got.strip()
    roll_out(admin, ns, "db")
    wait_for("shop applied once infra rolled out", lambda: app_row(cfg, "shop")["state"] == "ok", 60)


def test_run_once_waits_for_rollouts_and_exits_1_naming_the_blocking_pod(
    tmp_path: Path, pods_cluster: LocalCluster, pods_ns: str
) -> None:
    _, cfg = two_apps(tmp_path, pods_cluster, pods_ns)
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--once", "--config", cfg.file],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert "HEALTH" in out.stdout and "Failed" in out.stdout and "Current" in out.stdout, out.stdout
    assert "ImagePullBackOff" in out.stdout, out.stdout
    assert "health Failed" in out.stdout


def test_an_object_annotated_out_of_health_is_not_waited_for(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    ignored = deployment(ns, "batch").replace(
        "  namespace: " + ns + "\n",
        "  namespace: " + ns + "\n  annotations: {gitops-agent.io/health: ignore}\n",
        1,
    )
    with applied(
        tmp_path,
        cluster_pool,
        {"web/all.yaml": NS.format(ns=ns) + "---\n" + configmap(ns, "settings") + "---\n" + ignored},
        wait=True,
        health_timeout="60s",
    ) as agent:
        h = step(agent, time.monotonic())["web"]
        assert h.state is HealthState.CURRENT and h.done and h.objects == 2, h  # Namespace, ConfigMap


def test_a_step_costs_one_list_per_kind_and_one_per_child_kind_per_namespace_of_waiting_workloads(
    tmp_path: Path, cluster_pool: ClusterPool, ns: str
) -> None:
    files = NS.format(ns=ns) + "---\n" + configmap(ns, "settings")
    for name in ("a", "b", "c"):  # never rolled out here: each stays InProgress
        files += "---\n" + deployment(ns, name)
    agent = one_app(tmp_path, cluster_pool, {"web/all.yaml": files}, wait=True, health_timeout="60s")
    try:
        assert agent.reconcile()["web"].ok
        h = step(agent, time.monotonic())["web"]
        # Namespace, ConfigMap, Deployment; then ReplicaSets and Pods of the one namespace.
        assert h.reads == 5 and h.state is HealthState.IN_PROGRESS and h.objects == 5, h
    finally:
        agent.close()
