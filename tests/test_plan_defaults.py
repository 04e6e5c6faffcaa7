"""Server defaults inside atomic values are not drift; real changes there still are (real API server).

An atomic map or list is replaced whole by an apply and then defaulted by the server
(``fieldRef.apiVersion: v1``, ``resourceFieldRef.divisor: "0"``, a NetworkPolicy port's
``protocol: TCP``). Each case is applied once as the agent applies it, planned again
against the live object, and the verdict is checked against a server-side dry-run apply.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.config.types import DEFAULT_CONFLICT_RULES
from agent.kube.client import KubeClient
from agent.model import Action, DesiredObject, Manifest, Provenance
from agent.plan.planner import PlanOptions, plan_object, request_body, send_body
from agent.plan.schema import SchemaIndex
from tests.clusters import TestNamespace

pytestmark = pytest.mark.cluster

MANAGER = "defaults-agent"


def deployment(ns: str, env: list[dict[str, Any]]) -> Manifest:
    pod = {"containers": [{"name": "app", "image": "nginx:1.27", "env": env}]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod},
        },
    }


def network_policy(ns: str, port: dict[str, Any]) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "np", "namespace": ns},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"ports": [port]}]},
    }


ENV = [
    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
]


# From istio's base chart and gateway-api's standard install: `rules` of a webhook and
# `matchConstraints` of a ValidatingAdmissionPolicy are atomic, and the server fills in `scope: "*"`
# and `matchPolicy: Equivalent` without publishing those defaults.
# Rules naming a group nothing serves, so that the pool cluster's other tests never meet them.
RULE = {
    "apiGroups": ["example.io"],
    "apiVersions": ["v1"],
    "operations": ["CREATE"],
    "resources": ["widgets"],
}


def webhook_configuration(ns: str) -> Manifest:
    hook = {
        "name": "validation.example.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "clientConfig": {"service": {"name": "hook", "namespace": ns, "path": "/validate"}},
        "rules": [RULE],
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"{ns}-validator"},
        "webhooks": [hook],
    }


def admission_policy(ns: str) -> Manifest:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"{ns}-policy"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [RULE]},
            "validations": [{"expression": "true"}],
        },
    }


def _options(client: KubeClient) -> list[PlanOptions]:
    groups = [("apps", "v1"), ("networking.k8s.io", "v1"), ("admissionregistration.k8s.io", "v1")]
    index = SchemaIndex.from_openapi_v3([client.openapi_v3(g, v) for g, v in groups])
    return [PlanOptions(MANAGER, DEFAULT_CONFLICT_RULES, schema) for schema in (index, None)]


def _server_changes(client: KubeClient, desired: DesiredObject, live: Manifest, options: PlanOptions) -> bool:
    """Whether a dry-run apply of what the plan would send changes the object's spec."""
    body = send_body(desired, live, options)
    assert body is not None
    dry = client.apply(body, field_manager=MANAGER, dry_run=True)
    return _content(dry) != _content(live)


def _content(obj: Manifest) -> Manifest:
    return {k: v for k, v in obj.items() if k != "metadata"}


def _apply_as_agent(client: KubeClient, manifest: Manifest, options: PlanOptions) -> Manifest:
    first = DesiredObject(manifest, Provenance("defaults.yaml"))
    change = plan_object(first, None, options)
    return client.apply(request_body(change, first) or {}, field_manager=MANAGER)


def test_server_defaults_inside_atomic_maps_we_declared_are_not_a_difference(
    namespace: TestNamespace,
) -> None:
    client = KubeClient.connect("defaults", kubeconfig=str(namespace.cluster.kubeconfig))
    try:
        manifests = [
            deployment(namespace.name, ENV),
            network_policy(namespace.name, {"port": 80}),
            webhook_configuration(namespace.name),
            admission_policy(namespace.name),
        ]
        for options in _options(client):
            for manifest in manifests:
                if options.schema is None and manifest["kind"].endswith("WebhookConfiguration"):
                    continue  # without a schema `webhooks` is guessed atomic: the dry-run confirms it
                live = _apply_as_agent(client, manifest, options)
                desired = DesiredObject(manifest, Provenance("defaults.yaml"))
                change = plan_object(desired, live, options)
                where = f"{manifest['kind']} (schema: {options.schema is not None})"
                assert change.action is Action.NOOP, f"{where}: {change.reason}"
                assert not _server_changes(client, desired, live, options), where
    finally:
        for manifest in manifests[2:]:  # cluster-scoped: the namespace's deletion does not take them
            client.delete(client.resource_for(manifest), None, manifest["metadata"]["name"])
        client.close()


def test_a_real_change_inside_an_atomic_map_is_still_an_update(namespace: TestNamespace) -> None:
    client = KubeClient.connect("defaults", kubeconfig=str(namespace.cluster.kubeconfig))
    try:
        for options in _options(client):
            env = copy.deepcopy(ENV)
            env[0]["valueFrom"]["fieldRef"]["fieldPath"] = "metadata.namespace"
            env[1]["valueFrom"]["resourceFieldRef"]["divisor"] = "1m"
            # Git dropping an explicit non-default value: the apply resets it to the default.
            udp, dropped = {"port": 80, "protocol": "UDP"}, {"port": 80}
            pairs = [
                (deployment(namespace.name, ENV), deployment(namespace.name, env)),
                (network_policy(namespace.name, udp), network_policy(namespace.name, dropped)),
            ]
            for base, changed in pairs:
                live = _apply_as_agent(client, base, options)
                desired = DesiredObject(changed, Provenance("defaults.yaml"))
                change = plan_object(desired, live, options)
                where = f"{base['kind']} (schema: {options.schema is not None})"
                assert change.action is Action.UPDATE, f"{where}: {change.reason}"
                assert _server_changes(client, desired, live, options), where
                if base["kind"] == "Deployment":
                    assert "fieldRef (fieldPath)" in change.reason, change.reason
                    assert "resourceFieldRef (divisor)" in change.reason, change.reason
    finally:
        client.close()


def test_an_object_another_tool_created_is_adopted_without_a_conflict_on_a_server_spelled_value(
    namespace: TestNamespace,
) -> None:
    # From the kyverno chart, installed with `helm install` and then taken over by the agent:
    # Helm's Update entry owns each env var's atomic `fieldRef`, which the server completed with
    # `apiVersion: v1`. Git's `{fieldPath: ...}` equals it, but an apply of that spelling
    # replaces the atomic value, and the server refuses it (409, conflict with "helm") every pass.
    client = KubeClient.connect("defaults", kubeconfig=str(namespace.cluster.kubeconfig))
    try:
        manifest = deployment(namespace.name, ENV)
        manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1000m"}}
        for i, options in enumerate(_options(client)):
            manifest = copy.deepcopy(manifest)
            manifest["metadata"]["name"] = f"web-{i}"
            client.create(client.resource_for(manifest), manifest, field_manager="helm")
            live = client.get(client.resource_for(manifest), namespace.name, manifest["metadata"]["name"])
            assert live is not None
            desired = DesiredObject(manifest, Provenance("kyverno/templates/deployment.yaml"))
            change = plan_object(desired, live, options)
            where = f"schema: {options.schema is not None}"
            assert change.action is Action.UPDATE and not change.conflicts, (where, change.reason)
            body = request_body(change, desired) or {}
            after = client.apply(body, field_manager=MANAGER, force=change.force)
            assert after["spec"] == live["spec"], where
            assert plan_object(desired, after, options).action is Action.NOOP, where
    finally:
        client.close()
