"""The local control plane itself: real etcd + kube-apiserver + kube-controller-manager processes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.dev import localcluster
from agent.dev.process import LocalCluster
from agent.errors import LocalClusterError
from agent.render import binaries as tools
from tests import clusters
from tests.clusters import ClusterControl, ClusterPool, TestNamespace, kubectl
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def test_two_pool_clusters_run_at_once_and_each_answers(cluster_pool: ClusterPool) -> None:
    a, b = cluster_pool.all
    assert a.ports != b.ports
    for cluster in (a, b):
        assert localcluster.api_request(cluster, "GET", "/readyz") == (200, "ok")
        assert "namespace/default" in kubectl(cluster.kubeconfig, "get", "ns", "-o", "name").split()
        assert cluster.kubeconfig == cluster.state_dir / cluster.name / "admin.kubeconfig"


def test_objects_written_to_one_cluster_are_not_seen_by_the_other(cluster_pool: ClusterPool) -> None:
    a, b = cluster_pool.all
    kubectl(a.kubeconfig, "create", "configmap", "only-in-a", "-n", "default")
    try:
        assert (
            "NotFound"
            in localcluster.kubectl(
                b.kubeconfig, "get", "configmap", "only-in-a", "-n", "default", check=False
            ).stderr
        )
    finally:
        kubectl(a.kubeconfig, "delete", "configmap", "only-in-a", "-n", "default")


def test_starting_a_running_cluster_returns_it_unchanged(cluster_pool: ClusterPool) -> None:
    a = cluster_pool.all[0]
    again = localcluster.start(a.name, a.state_dir)
    assert again == a
    assert localcluster.status(a.name, a.state_dir).running


def test_restart_keeps_objects_certificates_and_the_kubeconfig_path(
    fresh_cluster: Callable[[], LocalCluster], cluster_ctl: ClusterControl
) -> None:
    cluster = fresh_cluster()
    kubectl(cluster.kubeconfig, "create", "configmap", "survivor", "--from-literal=k=v")
    uid = kubectl(cluster.kubeconfig, "get", "configmap", "survivor", "-o", "jsonpath={.metadata.uid}")
    ca = cluster.ca_file.read_bytes()

    cluster_ctl.stop(cluster)
    assert not localcluster.status(cluster.name, cluster.state_dir).running
    restarted = cluster_ctl.start(cluster)

    assert restarted.kubeconfig == cluster.kubeconfig
    assert restarted.ca_file.read_bytes() == ca
    assert restarted.pids != cluster.pids
    same = kubectl(restarted.kubeconfig, "get", "configmap", "survivor", "-o", "json")
    assert json.loads(same)["metadata"]["uid"] == uid
    assert json.loads(same)["data"] == {"k": "v"}


def test_a_frozen_cluster_hangs_and_answers_again_when_thawed(
    fresh_cluster: Callable[[], LocalCluster], cluster_ctl: ClusterControl
) -> None:
    cluster = fresh_cluster()
    with cluster_ctl.frozen(cluster):
        assert localcluster.status(cluster.name, cluster.state_dir).frozen
        with pytest.raises(TimeoutError):
            localcluster.api_request(cluster, "GET", "/readyz", timeout=1.0)
    assert localcluster.api_request(cluster, "GET", "/readyz") == (200, "ok")


def test_stop_works_while_the_cluster_is_frozen(
    fresh_cluster: Callable[[], LocalCluster], cluster_ctl: ClusterControl
) -> None:
    cluster = fresh_cluster()
    cluster_ctl.freeze(cluster)
    cluster_ctl.stop(cluster)
    state = localcluster.status(cluster.name, cluster.state_dir)
    assert not state.running
    assert set(state.pids.values()) == {None}
    for pid in (cluster.pids.etcd, cluster.pids.apiserver, cluster.pids.controller_manager):
        assert not Path(f"/proc/{pid}").exists()


def test_a_service_account_token_works_is_subject_to_rbac_and_fails_with_401_after_revoke(
    namespace: TestNamespace, cluster_ctl: ClusterControl
) -> None:
    cluster = namespace.cluster
    admin_sa, plain_sa = f"{namespace.name}/robot", f"{namespace.name}/nobody"
    admin = cluster_ctl.token(cluster, admin_sa)
    plain = cluster_ctl.token(cluster, plain_sa, cluster_role=None)
    assert admin == cluster_ctl.token(cluster, admin_sa)  # stable path

    who = kubectl(admin, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert who == f"system:serviceaccount:{namespace.name}:robot"
    assert "namespace/default" in kubectl(admin, "get", "ns", "-o", "name").split()
    assert "Forbidden" in localcluster.kubectl(plain, "get", "ns", check=False).stderr

    cluster_ctl.revoke(cluster, admin_sa)
    denied = localcluster.kubectl(admin, "get", "ns", check=False)
    assert denied.returncode != 0
    assert "Unauthorized" in denied.stderr


def test_namespace_deletion_and_garbage_collection_complete(namespace: TestNamespace) -> None:
    cfg, ns = namespace.cluster.kubeconfig, namespace.name
    kubectl(cfg, "create", "configmap", "owner", "-n", ns)
    owner_uid = kubectl(cfg, "get", "configmap", "owner", "-n", ns, "-o", "jsonpath={.metadata.uid}")
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "namespace": ns,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}],
        },
    }
    localcluster.kubectl(cfg, "apply", "-f", "-", stdin=json.dumps(dependent))
    kubectl(cfg, "delete", "configmap", "owner", "-n", ns)

    def gone(*args: str) -> bool:
        return "NotFound" in localcluster.kubectl(cfg, "get", *args, check=False).stderr

    wait_for("the garbage collector to delete it", lambda: gone("configmap", "dependent", "-n", ns), 30)
    kubectl(cfg, "create", "namespace", f"{ns}-x")
    kubectl(cfg, "delete", "namespace", f"{ns}-x", "--wait=false")
    wait_for("the namespace controller to finish deletion", lambda: gone("namespace", f"{ns}-x"), 60)


def test_a_pool_cluster_a_test_stopped_is_started_again_afterwards(cluster_pool: ClusterPool) -> None:
    ctl = ClusterControl(cluster_pool)
    b = cluster_pool.all[1]
    ctl.stop(b)
    assert not localcluster.status(b.name, b.state_dir).running
    ctl.cleanup()
    assert localcluster.api_request(cluster_pool[b.name], "GET", "/readyz") == (200, "ok")


def test_a_component_that_dies_at_startup_fails_with_the_tail_of_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clusters.require_control_plane()
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in ("etcd", "kube-controller-manager", "kubectl"):
        (bins / name).symlink_to(tools.tool(name))
    broken = bins / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'Error: unknown flag: --no-such-flag' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("GITOPS_AGENT_BIN_DIR", str(bins))
    tools.cache_clear()
    try:
        with pytest.raises(LocalClusterError) as failed:
            localcluster.start("broken", tmp_path / "state")
    finally:
        monkeypatch.undo()
        tools.cache_clear()
    assert "kube-apiserver exited during startup" in str(failed.value)
    assert "unknown flag: --no-such-flag" in str(failed.value)
    assert not localcluster.status("broken", tmp_path / "state").running
    assert set(localcluster.status("broken", tmp_path / "state").pids.values()) == {None}
    localcluster.delete("broken", tmp_path / "state")


def test_a_missing_binary_gives_an_error_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITOPS_AGENT_BIN_DIR", str(tmp_path / "empty"))
    tools.cache_clear()
    try:
        with pytest.raises(LocalClusterError, match=r"etcd not found: run scripts/install-control-plane"):
            localcluster.start("nobins", tmp_path)
        with pytest.raises(pytest.fail.Exception, match="local control plane unavailable"):
            clusters.require_control_plane()
    finally:
        monkeypatch.undo()
        tools.cache_clear()
    assert not (tmp_path / "nobins").exists()


def test_a_missing_go_tool_names_the_go_tools_script_and_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITOPS_AGENT_BIN_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("GITOPS_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    tools.cache_clear()
    try:
        for name in ("sops", "kstatus", "fluxssa"):
            with pytest.raises(
                LocalClusterError, match=rf"{name} not found: run scripts/install-go-tools {name}"
            ):
                tools.tool(name)
    finally:
        monkeypatch.undo()
        tools.cache_clear()


def test_the_api_server_calls_nothing_off_this_machine_for_a_webhook_or_an_aggregated_api(
    namespace: TestNamespace,
) -> None:
    """A webhook's Service has a ClusterIP (10.0.0.x): without a kubelet or proxy nothing answers
    there, and the API server must not dial it. Its "cluster" egress is a socket nobody listens
    on, so the call fails at once, naming that socket."""
    cfg, ns = namespace.cluster.kubeconfig, namespace.name
    kubectl(cfg, "label", "namespace", ns, f"egress-test={ns}")
    kubectl(cfg, "create", "service", "clusterip", "hook", "--tcp=443:8443", "-n", ns)
    hook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": ns},
        "webhooks": [
            {
                "name": "hook.example.com",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "namespaceSelector": {"matchLabels": {"egress-test": ns}},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["podtemplates"],
                    }
                ],
                "clientConfig": {"service": {"namespace": ns, "name": "hook", "port": 443}},
            }
        ],
    }
    localcluster.kubectl(cfg, "apply", "-f", "-", stdin=json.dumps(hook))
    try:
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t", "namespace": ns},
            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
        }
        out = localcluster.kubectl(cfg, "create", "-f", "-", stdin=json.dumps(template), check=False)
        assert out.returncode != 0
        assert "no-egress.sock" in out.stderr, out.stderr
    finally:
        kubectl(cfg, "delete", "validatingwebhookconfiguration", ns)
