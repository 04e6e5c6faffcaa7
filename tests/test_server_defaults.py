"""Fields the server fills in or drops (defaults, explicit nulls) are not changes, on real local API servers.

Real-world stacks declare objects whose stored form differs from what Git says although an
apply changes nothing: webhook ``rules[].scope`` left out (the corpus's ingress-nginx,
cert-manager, istio and opentelemetry-operator charts), a ValidatingAdmissionPolicy's atomic
``matchConstraints`` filled in by the server, an RBAC subject's explicit ``apiGroup: ""``, a
Helm template's explicit nulls. The local plan sees a change; the server's dry-run says none,
and the pass remembers that, so such objects are written once, then never again, and the diff
report shows nothing for them. Requests are counted by the API server
(``apiserver_request_total``, controllers paused), never by the agent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.apply import ssa
from agent.cli.diff import diff
from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import Action, ApplyResult, Change, ClusterResult, ObjectKey, Outcome
from tests.agentkit import E2E, Agent, Repo, make_repo, unique, write_config
from tests.appkit import counting
from tests.clusters import ClusterPool, kubectl, scale_as_hpa

pytestmark = pytest.mark.cluster


#: A Secret's value: never in a result, a log line or a report.
SECRET_VALUE = "hunter2-server-defaults"


def stack(ns: str, webhook: str, policy: str, image: str = "nginx", password: str = SECRET_VALUE) -> str:
    """The issue's objects, as their charts write them (nothing the server fills in is declared)."""
    return f"""apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: {webhook}}}
webhooks:
- name: check.{webhook}.example.com
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Ignore
  clientConfig: {{url: "https://127.0.0.1:9/validate"}}
  objectSelector: {{matchLabels: {{never-matches: {webhook}}}}}
  rules:
  - {{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {policy}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [apiextensions.k8s.io]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [customresourcedefinitions]
  validations:
  - expression: "true"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: rb, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}}
subjects: [{{apiGroup: "", kind: ServiceAccount, name: sa, namespace: {ns}}}]
---
apiVersion: v1
kind: Secret
metadata: {{name: s, namespace: {ns}}}
type: null
immutable: null
stringData: {{password: {password}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: d, namespace: {ns}}}
spec:
  replicas: null
  selector: {{matchLabels: {{app: d}}}}
  template:
    metadata: {{labels: {{app: d}}}}
    spec: {{containers: [{{name: c, image: {image}, imagePullPolicy: null}}]}}
"""


@dataclass
class Stack:
    """The stack applied once by an agent of its own on ``pool-a``."""

    cluster: LocalCluster
    repo: Repo
    config: Config
    agent: Agent
    ns: str
    webhook: str
    policy: str

    def keys(self) -> set[ObjectKey]:
        ns = self.ns
        return {
            ObjectKey("", "Namespace", "", ns),
            ObjectKey("admissionregistration.k8s.io", "ValidatingWebhookConfiguration", "", self.webhook),
            ObjectKey("admissionregistration.k8s.io", "ValidatingAdmissionPolicy", "", self.policy),
            ObjectKey("rbac.authorization.k8s.io", "RoleBinding", ns, "rb"),
            ObjectKey("", "Secret", ns, "s"),
            ObjectKey("apps", "Deployment", ns, "d"),
        }

    def versions(self) -> dict[str, str]:
        """kind/name → resourceVersion, read with kubectl."""
        out = {}
        for what, ns in (
            (f"validatingwebhookconfiguration/{self.webhook}", None),
            (f"validatingadmissionpolicy/{self.policy}", None),
            ("rolebinding/rb", self.ns),
            ("secret/s", self.ns),
            ("deployment/d", self.ns),
        ):
            args = ["get", what, "-o", "jsonpath={.metadata.resourceVersion}"]
            out[what] = kubectl(self.cluster.kubeconfig, *args, *(["-n", ns] if ns else []))
        return out


@pytest.fixture
def applied(tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E) -> Iterator[Stack]:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("defaults")
    webhook, policy = unique("defaults-webhook"), unique("defaults-policy")
    e2e.delete_after(a, "validatingwebhookconfiguration", webhook)
    e2e.delete_after(a, "validatingadmissionpolicy", policy)
    repo = make_repo(tmp_path, {"clusters/pool-a/stack.yaml": stack(ns, webhook, policy)})
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    agent = e2e.agent(cfg)
    s = Stack(a, repo, cfg, agent, ns, webhook, policy)
    first = agent.reconcile()["pool-a"]
    assert first.ok, first
    assert {r.key for r in first.results if r.outcome is Outcome.CREATED} == s.keys(), first.results
    yield s


def run_diff(cfg: Config, *secrets: str) -> tuple[int, dict[str, Any]]:
    """``gitops-agent diff``'s exit code and JSON report; ``secrets`` appear in none of its output."""
    result = CliRunner().invoke(diff, ["--config", cfg.file, "--format", "json"], catch_exceptions=False)
    for value in secrets:
        assert value not in result.output and value not in result.stderr
    return result.exit_code, json.loads(result.stdout)


def said(result: ClusterResult) -> str:
    """Every message of a pass's results."""
    return " ".join(r.message for r in result.results)


def test_server_defaulted_and_null_fields_are_written_once_then_never_again(applied: Stack) -> None:
    before = applied.versions()
    with counting(applied.cluster) as second:
        result = applied.agent.reconcile()["pool-a"]
    assert result.ok, result
    assert {r.key: r.outcome for r in result.results} == dict.fromkeys(applied.keys(), Outcome.UNCHANGED)
    assert second.writes == {}, second.requests.by_resource
    assert SECRET_VALUE not in said(result)
    # The objects the local plan saw change were confirmed by the server (a dry-run each), nothing else.
    # The webhook's and the policy's `scope` and `matchPolicy` are defaults the plan knows (schema.py).
    confirmed = {k: n for k, n in second.requests.by_resource.items() if not k.startswith("LIST ")}
    assert confirmed == {
        "APPLY(dry-run) rolebindings": 1,
        "APPLY(dry-run) secrets": 1,
        "APPLY(dry-run) deployments": 1,
    }, second.requests.by_resource
    assert applied.versions() == before

    with counting(applied.cluster) as third:
        result = applied.agent.reconcile()["pool-a"]
    assert result.ok, result
    assert {r.key: r.outcome for r in result.results} == dict.fromkeys(applied.keys(), Outcome.UNCHANGED)
    # The no-op memo: the same desired objects against the same live versions cost no request.
    assert all(k.startswith("LIST ") for k in third.requests.by_resource), third.requests.by_resource
    assert applied.versions() == before


def test_the_diff_report_shows_no_change_for_server_defaulted_and_null_fields(applied: Stack) -> None:
    code, doc = run_diff(applied.config, SECRET_VALUE)
    assert code == 0, doc
    section = doc["clusters"][0]
    assert [o for app in section["apps"] for o in app["objects"]] == []
    assert section["summary"]["unchanged"] == len(applied.keys())
    assert doc["summary"]["differences"] is False


def test_a_real_change_beside_server_defaulted_fields_is_still_applied_and_reported(applied: Stack) -> None:
    applied.agent.reconcile()  # the false changes confirmed and remembered
    changed = stack(applied.ns, applied.webhook, applied.policy, image="nginx:1.28", password="rotated-value")
    applied.repo.commit({"clusters/pool-a/stack.yaml": changed})
    code, doc = run_diff(applied.config, SECRET_VALUE, "rotated-value")
    assert code == 1, doc
    found = {o["key"]: o for app in doc["clusters"][0]["apps"] for o in app["objects"]}
    assert sorted(found) == [f"Deployment.apps/{applied.ns}/d", f"Secret/{applied.ns}/s"]
    d = found[f"Deployment.apps/{applied.ns}/d"]
    assert d["action"] == "update" and d["basis"] == "server" and d["error"] is None
    assert "+          image: nginx:1.28" in d["diff"]
    assert found[f"Secret/{applied.ns}/s"]["action"] == "update"

    with counting(applied.cluster) as counted:
        result = applied.agent.reconcile()["pool-a"]
    assert result.ok, result
    deployment = ObjectKey("apps", "Deployment", applied.ns, "d")
    secret = ObjectKey("", "Secret", applied.ns, "s")
    assert {r.key: r.outcome for r in result.results} == {
        **dict.fromkeys(applied.keys(), Outcome.UNCHANGED),
        deployment: Outcome.CONFIGURED,
        secret: Outcome.CONFIGURED,
    }
    assert counted.writes == {"APPLY deployments": 1, "APPLY secrets": 1}
    assert SECRET_VALUE not in said(result) and "rotated-value" not in said(result)
    image = kubectl(
        applied.cluster.kubeconfig,
        "get",
        "deployment",
        "d",
        "-n",
        applied.ns,
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    )
    assert image == "nginx:1.28"


def test_an_apply_the_server_answers_with_the_live_resource_version_counts_as_unchanged(
    applied: Stack,
) -> None:
    client = KubeClient.from_config(applied.config.clusters[0])
    try:
        options = ssa.ApplyOptions(field_manager="defaults-test")
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "quiet", "namespace": applied.ns},
            "data": {"k": "v"},
        }
        rv = client.apply(body, field_manager=options.field_manager)["metadata"]["resourceVersion"]
        key = ObjectKey("", "ConfigMap", applied.ns, "quiet")

        def update(data: dict[str, str]) -> ApplyResult:
            sent = {**body, "data": data}
            change = Change(key, Action.UPDATE, "v1", body=sent, resource_version=rv)
            results = ssa.apply_changes(client, [change], options, lambda *_: change, lambda c: c.body)
            assert len(results) == 1, results
            return results[0]

        assert update({"k": "v"}).outcome is Outcome.UNCHANGED  # the server wrote nothing
        assert update({"k": "w"}).outcome is Outcome.CONFIGURED
        assert json.loads(
            kubectl(applied.cluster.kubeconfig, "get", "configmap", "quiet", "-n", applied.ns, "-o", "json")
        )["data"] == {"k": "w"}
    finally:
        client.close()


def test_a_false_change_beside_a_field_yielded_to_an_autoscaler_sends_nothing_and_shows_the_yield(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("defaults-yield")
    web = f"""apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec: {{containers: [{{name: c, image: nginx, imagePullPolicy: null}}]}}
"""
    agent = e2e.agent(
        write_config(tmp_path, make_repo(tmp_path, {"clusters/pool-a/web.yaml": web}), {"pool-a": a})
    )
    assert agent.reconcile()["pool-a"].ok
    # What an HPA does: spec.replicas through /scale as kube-controller-manager (yielded to it).
    scale_as_hpa(a.kubeconfig, ns, 5)
    key = ObjectKey("apps", "Deployment", ns, "web")
    for n in range(2):
        with counting(a) as counted:
            result = agent.reconcile()["pool-a"]
        assert result.ok, result
        r = next(r for r in result.results if r.key == key)
        assert r.outcome is Outcome.UNCHANGED, r
        assert [c.manager for c in r.yielded] == ["kube-controller-manager"], r
        assert counted.writes == {}, counted.requests.by_resource
        if n:  # remembered: the same live version costs no request
            assert all(k.startswith("LIST ") for k in counted.requests.by_resource), counted.requests
    replicas = kubectl(a.kubeconfig, "get", "deployment", "web", "-n", ns, "-o", "jsonpath={.spec.replicas}")
    assert replicas == "5"
    # The diff report shows the yield (as for any conflict), not an update with an empty diff.
    code, doc = run_diff(agent.config)
    found = {o["key"]: o for app in doc["clusters"][0]["apps"] for o in app["objects"]}
    assert list(found) == [f"Deployment.apps/{ns}/web"], found
    entry = found[f"Deployment.apps/{ns}/web"]
    assert entry["action"] == "conflict" and entry["diff"] == "", entry
    assert "kube-controller-manager" in json.dumps(entry["conflicts"]), entry
    assert code == 1  # a yield is shown as a difference, as the plan's own conflicts are


def test_a_conflict_of_spelling_only_after_taking_over_a_helm_release_is_no_change(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """Objects Helm created (its manager, Update operations) and Git declares with the same values
    spelled otherwise: sealed-secrets' RBAC subject with ``apiGroup: ""`` (the server drops it) and
    a chart's ``annotations: null`` beside Helm's annotations. Values that only differ in spelling
    are yielded conflicts to the local plan; a forced dry-run of Git's whole object stores nothing
    but ownership, so they are no change: not reported every pass, the diff is clean. A real
    difference held by the other manager stays a conflict (the autoscaler test above)."""
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("defaults-helm")
    git = f"""apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: rb, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}}
subjects: [{{apiGroup: "", kind: ServiceAccount, name: sa, namespace: {ns}}}]
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm
  namespace: {ns}
  annotations: null
data: {{k: v}}
"""
    helm = {"app.kubernetes.io/managed-by": "Helm"}
    release = {"meta.helm.sh/release-name": "rel", "meta.helm.sh/release-namespace": ns}
    cfg = write_config(tmp_path, make_repo(tmp_path, {"clusters/pool-a/stack.yaml": git}), {"pool-a": a})
    client = KubeClient.from_config(cfg.clusters[0])
    try:
        kubectl(a.kubeconfig, "create", "namespace", ns)
        for manifest in (
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "rb", "namespace": ns, "labels": helm, "annotations": release},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                "subjects": [{"apiGroup": "", "kind": "ServiceAccount", "name": "sa", "namespace": ns}],
            },
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": ns, "labels": helm, "annotations": release},
                "data": {"k": "v"},
            },
        ):
            client.create(client.resource_for(manifest), manifest, field_manager="helm")
    finally:
        client.close()
    agent = e2e.agent(cfg)
    assert agent.reconcile()["pool-a"].ok
    for n in range(2):
        with counting(a) as counted:
            result = agent.reconcile()["pool-a"]
        assert result.ok, result
        assert result.conflicts == [] and [r for r in result.results if r.yielded] == [], result.results
        assert {r.outcome for r in result.results} == {Outcome.UNCHANGED}, result.results
        assert counted.writes == {}, counted.requests.by_resource
        if n:  # remembered: the same live version costs no request
            assert all(k.startswith("LIST ") for k in counted.requests.by_resource), counted.requests
    code, doc = run_diff(agent.config)
    assert code == 0, doc
    annotations = json.loads(kubectl(a.kubeconfig, "get", "configmap", "cm", "-n", ns, "-o", "json"))
    assert annotations["metadata"]["annotations"] == release  # Helm's stay
