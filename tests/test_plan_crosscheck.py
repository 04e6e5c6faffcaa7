"""The planner's noop/update verdicts, object by object, against a real API server.

A corpus of well over 100 objects (ConfigMaps, Secrets, Deployments, Services,
ServiceAccounts, RBAC, Ingresses, NetworkPolicies, PodDisruptionBudgets, CRDs
and custom resources) is first applied as our field manager, then touched by
other managers the way clusters are (a label by ``kubectl-label``, an HPA
scaling through ``/scale`` as ``kube-controller-manager``, another applier, a
hand edit). For each object a Git variation is then planned locally
(unchanged, changed values, ``1000m`` vs ``1``, int-or-string, reordered list
maps and sets, released fields, defaulted fields and empties, foreign managers)
and the same body is sent as a server-side dry-run apply (``dryRun=All``, same
field manager, the plan's ``force``, the live ``resourceVersion`` as a
precondition). Agreement means: the dry-run result differs from live (ignoring
managedFields timestamps, ``resourceVersion`` and ``generation``) exactly when
the plan says ``update``. Zero disagreements; the count is printed.
"""

from __future__ import annotations

import copy
import secrets
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from deepdiff import DeepDiff

from agent.config.types import DEFAULT_CONFLICT_RULES
from agent.errors import ApiError
from agent.kube.client import KubeClient, ResourceInfo
from agent.model import Action, DesiredObject, Manifest, Provenance
from agent.plan.planner import PlanOptions, plan_object, request_body, send_body
from agent.plan.schema import SchemaIndex
from agent.reconcile.stages import ClusterStages
from tests.agentkit import make_repo, write_config
from tests.clusters import ClusterPool, TestNamespace
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

MANAGER = "crosscheck-agent"
CRD_TEMPLATE = Path(__file__).parent / "fixtures" / "crosscheck" / "widgets-crd.yaml"
#: A foreign write after our first apply: (client, info, base manifest) → None.
Foreign = Callable[[KubeClient, ResourceInfo, Manifest], None]


@dataclass
class Case:
    """One object: applied as ``base`` by us, touched by ``foreign``, then planned as ``desired``."""

    name: str
    base: Manifest
    desired: Manifest
    foreign: list[Foreign] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Foreign writers


def label_by(manager: str, key: str = "team", value: str = "payments") -> Foreign:
    def write(c: KubeClient, info: ResourceInfo, m: Manifest) -> None:
        meta = m["metadata"]
        c.patch(info, meta.get("namespace"), meta["name"], {"metadata": {"labels": {key: value}}},
                field_manager=manager)  # fmt: skip

    return write


def merge_by(manager: str, patch: Manifest) -> Foreign:
    def write(c: KubeClient, info: ResourceInfo, m: Manifest) -> None:
        meta = m["metadata"]
        c.patch(info, meta.get("namespace"), meta["name"], patch, field_manager=manager)

    return write


def co_apply(manager: str) -> Foreign:
    """Another applier declares our ``app`` label with the same value, and a label of its own."""

    def write(c: KubeClient, info: ResourceInfo, m: Manifest) -> None:
        meta = {k: v for k, v in m["metadata"].items() if k in ("name", "namespace")}
        meta["labels"] = {"app": m["metadata"]["labels"]["app"], "owner-tool": "yes"}
        c.apply({"apiVersion": m["apiVersion"], "kind": m["kind"], "metadata": meta}, field_manager=manager)

    return write


def scale_by_hpa(replicas: int) -> Foreign:
    """What an HPA does: ``kube-controller-manager`` writing ``spec.replicas`` through ``/scale``."""

    def write(c: KubeClient, info: ResourceInfo, m: Manifest) -> None:
        meta = m["metadata"]
        c.request("PATCH", info.path(meta["namespace"], meta["name"]) + "/scale",
                  query={"fieldManager": "kube-controller-manager"}, body={"spec": {"replicas": replicas}},
                  content_type="application/merge-patch+json")  # fmt: skip

    return write


# ---------------------------------------------------------------------------
# The corpus


def _meta(name: str, ns: str | None, **labels: str) -> Manifest:
    meta: Manifest = {"name": name, "labels": {"app": name, **labels}}
    if ns:
        meta["namespace"] = ns
    return meta


def _families(ns: str, widget: tuple[str, str]) -> dict[str, Callable[[str], Manifest]]:
    group, kind = widget
    return {
        "cm": lambda n: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(n, ns, tier="config"),
                         "data": {"greeting": "hello", "mode": "prod"}},
        "secret": lambda n: {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(n, ns, tier="auth"),
                             "type": "Opaque", "stringData": {"password": "hunter2"},
                             "data": {"user": "YWRtaW4="}},
        "deploy": lambda n: {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(n, ns, tier="web"),
            "spec": {
                "replicas": 2, "selector": {"matchLabels": {"app": n}},
                "strategy": {"type": "RollingUpdate",
                             "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                "template": {"metadata": {"labels": {"app": n}}, "spec": {"containers": [
                    {"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80, "name": "http"}],
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                     "resources": {"requests": {"cpu": "500m", "memory": "64Mi"},
                                   "limits": {"cpu": "1", "memory": "1Gi"}}},
                    {"name": "sidecar", "image": "busybox:1.36", "args": ["sleep", "3600"]},
                ]}},
            },
        },
        "svc": lambda n: {"apiVersion": "v1", "kind": "Service", "metadata": _meta(n, ns, tier="net"),
                          "spec": {"selector": {"app": n}, "ports": [
                              {"name": "http", "port": 80, "targetPort": "http"},
                              {"name": "metrics", "port": 9090, "targetPort": 9090}]}},
        "sa": lambda n: {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(n, ns, tier="id"),
                         "automountServiceAccountToken": False},
        "role": lambda n: {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                           "metadata": _meta(n, ns, tier="rbac"),
                           "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                                      "verbs": ["get", "list"]}]},
        "rb": lambda n: {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                         "metadata": _meta(n, ns, tier="rbac"),
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                     "name": "reader"},
                         "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": ns}]},
        "ing": lambda n: {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": _meta(n, ns),
                          "spec": {"rules": [{"host": f"{n}.example.com", "http": {"paths": [
                              {"path": "/", "pathType": "Prefix",
                               "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}},
        "netpol": lambda n: {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                             "metadata": _meta(n, ns),
                             "spec": {"podSelector": {"matchLabels": {"app": n}}, "policyTypes": ["Ingress"],
                                      "ingress": [{"ports": [{"port": 8080, "protocol": "TCP"}]}]}},
        "pdb": lambda n: {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(n, ns),
                          "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": n}}}},
        "widget": lambda n: {"apiVersion": f"{group}/v1", "kind": kind, "metadata": _meta(n, ns),
                             "spec": {"size": "1", "replicas": 3, "tags": ["a", "b"],
                                      "ports": [{"name": "http", "port": 80}, {"name": "grpc", "port": 90}],
                                      "selector": {"app": n}, "config": {"x": {"y": 1}}}},
    }  # fmt: skip


def _edit(m: Manifest, fn: Callable[[Manifest], Any]) -> Manifest:
    out = copy.deepcopy(m)
    fn(out)
    return out


def _spec_containers(m: Manifest) -> list[Manifest]:
    containers: list[Manifest] = m["spec"]["template"]["spec"]["containers"]
    return containers


#: Variations every family gets: (name, Git edit, foreign writes).
COMMON: list[tuple[str, Callable[[Manifest], Any] | None, list[Foreign]]] = [
    ("same", None, []),
    ("foreign-label", None, [label_by("kubectl-label")]),
    ("add-label", lambda m: m["metadata"]["labels"].update(owner="sre"), []),
    ("change-label", lambda m: m["metadata"]["labels"].update(app="renamed"), []),
    ("release-label", lambda m: m["metadata"]["labels"].pop("app"), []),
    ("release-co-owned", lambda m: m["metadata"]["labels"].pop("app"),
     [co_apply("other-tool")]),
    ("shared-same-value", None, [co_apply("other-tool")]),
    ("kubectl-drift-forced", None, [merge_by("kubectl-edit", {"metadata": {"labels": {"app": "edited"}}})]),
    ("helm-drift-yielded", None, [merge_by("helm", {"metadata": {"labels": {"app": "edited"}}})]),
    ("empty-annotations", lambda m: m["metadata"].update(annotations={}), []),
]  # fmt: skip

#: Variations of one family: (name, base edit or None, Git edit, foreign writes).
SPECIFIC: dict[str, list[tuple[str, Callable[[Manifest], Any] | None, Callable[[Manifest], Any] | None,
                               list[Foreign]]]] = {
    "cm": [
        ("change-value", None, lambda m: m["data"].update(greeting="bonjour"), []),
        ("add-key", None, lambda m: m["data"].update(extra="x"), []),
        ("release-key", None, lambda m: m["data"].pop("mode"), []),
        ("foreign-key", None, None, [merge_by("kubectl-edit", {"data": {"theirs": "1"}})]),
    ],
    "secret": [
        ("same-as-data", None, lambda m: m.update(data={"user": "YWRtaW4=", "password": "aHVudGVyMg=="},
                                                  stringData=None) or m.pop("stringData"), []),
        ("change-password", None, lambda m: m["stringData"].update(password="hunter3"), []),
        ("release-user", None, lambda m: m.pop("data"), []),
    ],
    "deploy": [
        ("quantities-equal", None, lambda m: _spec_containers(m)[0]["resources"].update(
            limits={"cpu": "1000m", "memory": "1073741824"}, requests={"cpu": "0.5", "memory": "64Mi"}), []),
        ("quantities-same-spelling", None, lambda m: _spec_containers(m)[0]["resources"]["limits"].update(
            cpu="1000m", memory="1024Mi"), []),
        ("quantity-changed", None,
         lambda m: _spec_containers(m)[0]["resources"]["limits"].update(cpu="2"), []),
        ("image", None, lambda m: _spec_containers(m)[0].update(image="nginx:1.28"), []),
        ("reorder-containers", None, lambda m: _spec_containers(m).reverse(), []),
        ("reorder-env", None, lambda m: _spec_containers(m)[0]["env"].reverse(), []),
        ("env-value", None, lambda m: _spec_containers(m)[0]["env"][1].update(value="3"), []),
        ("release-container", None, lambda m: _spec_containers(m).pop(), []),
        ("int-or-string-changed", None,
         lambda m: m["spec"]["strategy"]["rollingUpdate"].update(maxUnavailable="25%"), []),
        ("hpa-yielded", None, None, [scale_by_hpa(5)]),
        ("hpa-yielded-and-image", None, lambda m: _spec_containers(m)[0].update(image="nginx:1.28"),
         [scale_by_hpa(5)]),
        ("hpa-same-replicas", None, None, [scale_by_hpa(2)]),
        ("defaults-explicit", None, lambda m: (_spec_containers(m)[0].update(
            imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log"),
            m["spec"].update(revisionHistoryLimit=10, progressDeadlineSeconds=600)), []),
        ("defaults-applied", lambda m: m["spec"].update(revisionHistoryLimit=10), None, []),
        ("empty-resources", None, lambda m: _spec_containers(m)[1].update(resources={}), []),
        ("empties-applied", lambda m: (_spec_containers(m)[1].update(resources={}, env=[]),
                                       m["metadata"].update(annotations={})), None, []),
        ("foreign-container", None, None, [merge_by("injector", {"spec": {"template": {"metadata": {
            "annotations": {"injected": "yes"}}}}})]),
    ],
    "svc": [
        ("reorder-ports", None, lambda m: m["spec"]["ports"].reverse(), []),
        ("target-port", None, lambda m: m["spec"]["ports"][1].update(targetPort=9091), []),
        ("target-port-named", None, lambda m: m["spec"]["ports"][1].update(targetPort="metrics"), []),
        ("defaults-explicit", None, lambda m: (m["spec"].update(type="ClusterIP", sessionAffinity="None"),
                                               m["spec"]["ports"][0].update(protocol="TCP")), []),
        ("protocol-applied", lambda m: m["spec"]["ports"][0].update(protocol="TCP"), None, []),
    ],
    "sa": [("automount", None, lambda m: m.update(automountServiceAccountToken=True), [])],
    "role": [
        ("verbs", None, lambda m: m["rules"][0]["verbs"].append("watch"), []),
        ("verbs-reordered", None, lambda m: m["rules"][0]["verbs"].reverse(), []),
    ],
    "rb": [("subject-added", None, lambda m: m["subjects"].append({"kind": "User", "name": "ann"}), [])],
    "ing": [("path", None, lambda m: m["spec"]["rules"][0]["http"]["paths"][0].update(path="/v2"), [])],
    "netpol": [("port", None, lambda m: m["spec"]["ingress"][0]["ports"][0].update(port=8081), [])],
    "pdb": [
        ("percent", None, lambda m: m["spec"].update(minAvailable="50%"), []),
    ],
    "widget": [
        ("size-as-written", None, lambda m: m["spec"].update(size="1000m"), []),
        ("size-int", None, lambda m: m["spec"].update(size=1), []),
        ("tags-reordered", None, lambda m: m["spec"]["tags"].reverse(), []),
        ("tag-added", None, lambda m: m["spec"]["tags"].append("c"), []),
        ("ports-reordered", None, lambda m: m["spec"]["ports"].reverse(), []),
        ("selector-changed", None, lambda m: m["spec"]["selector"].update(extra="1"), []),
        ("free-form", None, lambda m: m["spec"]["config"]["x"].update(z=2), []),
        ("default-explicit", None, lambda m: m["spec"].update(mode="auto"), []),
        ("default-applied", lambda m: m["spec"].update(mode="auto"), None, []),
        ("hand-edited", None, None, [merge_by("kubectl-edit", {"spec": {"replicas": 4}})]),
        ("hand-edited-other", None, None, [merge_by("operator", {"spec": {"replicas": 4}})]),
    ],
}  # fmt: skip


def corpus(ns: str, widget: tuple[str, str]) -> list[Case]:
    cases: list[Case] = []
    for family, make in _families(ns, widget).items():
        variants = [(n, None, edit, foreign) for n, edit, foreign in COMMON] + SPECIFIC.get(family, [])
        for variant, base_edit, git_edit, foreign in variants:
            name = f"{family}-{variant}"
            base = make(name)
            if base_edit:
                base = _edit(base, base_edit)
            desired = _edit(base, git_edit) if git_edit else copy.deepcopy(base)
            cases.append(Case(name, base, desired, list(foreign)))
    return cases


def cluster_scoped(run: str) -> list[Case]:
    """CRDs and ClusterRoles: cluster-wide, so named after this run and deleted afterwards."""
    cases: list[Case] = []
    template = CRD_TEMPLATE.read_text()
    extra: list[tuple[str, Callable[[Manifest], Any] | None, list[Foreign]]] = [
        ("describe", lambda m: m["spec"]["versions"][0]["schema"]["openAPIV3Schema"].update(
            description="widgets"), []),
        ("unserved", lambda m: m["spec"]["names"].update(shortNames=["w"]), []),
    ]  # fmt: skip
    for i, (variant, edit, foreign) in enumerate([*COMMON, *extra]):
        plural = f"gadgets{i}x{run}"
        text = template.replace("PLURAL", plural).replace("KINDLOWER", f"gadget{i}x{run}")
        base = yaml.safe_load(text.replace("GROUP", f"cc{run}.example.com").replace("KIND", f"Gadget{i}X"))
        base["metadata"]["labels"] = {"app": f"crd-{variant}"}
        cases.append(
            Case(f"crd-{variant}", base, _edit(base, edit) if edit else copy.deepcopy(base), foreign)
        )
    role_extra: list[tuple[str, Callable[[Manifest], Any] | None, list[Foreign]]] = [
        ("rule-added", lambda m: m["rules"].append({"nonResourceURLs": ["/healthz"], "verbs": ["get"]}), []),
    ]
    for variant, edit, foreign in [*COMMON, *role_extra]:
        base = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": _meta(f"cc-{run}-{variant}", None),
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}  # fmt: skip
        cases.append(Case(f"clusterrole-{variant}", base, _edit(base, edit) if edit else copy.deepcopy(base),
                          foreign))  # fmt: skip
    return cases


# ---------------------------------------------------------------------------
# Helpers against the server


def _wait_established(client: KubeClient, name: str) -> None:
    info = client.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")

    def established() -> bool:
        conds = ((client.get(info, None, name) or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for(f"CRD {name} to be Established", established, 30)


def _schema(
    client: KubeClient, group_versions: set[tuple[str, str]], custom: tuple[str, str, str]
) -> SchemaIndex:
    """The real OpenAPI v3 documents; the CRD's appears a moment after it is Established."""
    index = SchemaIndex()
    for group, version in sorted(group_versions):
        index.add_document(client.openapi_v3(group, version))

    def published() -> bool:
        try:
            index.add_document(client.openapi_v3(custom[0], custom[1]))
        except ApiError:
            return False
        return index.knows(*custom)

    if not index.knows(*custom):
        wait_for(f"the server to publish an OpenAPI v3 schema for {custom}", published, 30, interval=0.3)
    return index


def _stable(obj: Manifest) -> Manifest:
    """The object without what every write changes anyway: timestamps, resourceVersion, generation."""
    out = copy.deepcopy(obj)
    meta = out.get("metadata") or {}
    meta.pop("resourceVersion", None)
    meta.pop("generation", None)
    for entry in meta.get("managedFields") or ():
        entry.pop("time", None)
    return out


def _verdict(client: KubeClient, case: Case, options: PlanOptions) -> tuple[Action, DeepDiff, str]:
    """(the plan's action, how the server's dry-run result differs from live, the plan's reason)."""
    desired = DesiredObject(case.desired, Provenance(f"crosscheck/{case.name}.yaml"))
    info = client.resource_for(case.desired)
    ns = case.desired["metadata"].get("namespace") if info.namespaced else None
    for _ in range(5):
        live = client.get(info, ns, case.desired["metadata"]["name"])
        assert live is not None, case.name
        change = plan_object(desired, live, options)
        body = send_body(desired, live, options)
        assert body is not None, f"{case.name}: {change.action} {change.reason}"
        if change.body is not None:
            assert body == request_body(change, desired)
        body = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]},
        }
        try:
            dry = client.apply(body, field_manager=MANAGER, force=change.force, dry_run=True, info=info)
        except ApiError as e:
            if e.status == 409 and "modified" in e.api_message:
                continue  # a controller wrote in between (Deployment status): read again
            pytest.fail(f"{case.name}: the server refused what the plan ({change.action}) would send: {e}")
        return change.action, DeepDiff(_stable(live), _stable(dry), verbose_level=2), change.reason
    pytest.fail(f"{case.name}: the object kept changing under the dry-run")


def test_plan_agrees_with_a_server_side_dry_run_apply_on_every_object(namespace: TestNamespace) -> None:
    client = KubeClient.connect("crosscheck", kubeconfig=str(namespace.cluster.kubeconfig))
    run = secrets.token_hex(3)
    group, kind = f"cc{run}.example.com", f"Widget{run.upper()}X"
    crd_text = (
        CRD_TEMPLATE.read_text().replace("PLURAL", f"widgets{run}").replace("KINDLOWER", f"widget{run}")
    )
    widget_crd = yaml.safe_load(crd_text.replace("GROUP", group).replace("KIND", kind))
    cases = corpus(namespace.name, (group, kind)) + cluster_scoped(run)
    cluster_wide = [widget_crd] + [c.base for c in cases if not c.base["metadata"].get("namespace")]
    try:
        client.apply(widget_crd, field_manager=MANAGER)
        _wait_established(client, widget_crd["metadata"]["name"])
        gvs = {tuple(c.base["apiVersion"].rpartition("/")[::2]) for c in cases} - {(group, "v1")}
        options = PlanOptions(MANAGER, DEFAULT_CONFLICT_RULES, _schema(client, gvs, (group, "v1", kind)))

        for case in cases:  # our first apply, exactly as the agent makes it
            first = DesiredObject(case.base, Provenance(f"crosscheck/{case.name}.yaml"))
            change = plan_object(first, None, options)
            assert change.action is Action.CREATE, case.name
            client.apply(request_body(change, first) or {}, field_manager=MANAGER)
        for case in cases:
            info = client.resource_for(case.base)
            for write in case.foreign:
                write(client, info, case.base)

        disagreements: list[str] = []
        actions: Counter[str] = Counter()
        for case in cases:
            action, diff, reason = _verdict(client, case, options)
            actions[action.value] += 1
            if (action is Action.UPDATE) != bool(diff):
                disagreements.append(
                    f"{case.name}: plan {action.value} ({reason}); server: {diff or 'no change'}"
                )
        print(f"\ncross-checked {len(cases)} objects against a server-side dry-run apply: "
              f"{dict(actions)}, {len(disagreements)} disagreement(s)", file=sys.stderr)  # fmt: skip
        assert not disagreements, "\n".join(disagreements)
        assert len(cases) >= 100
        assert actions["noop"] >= 30 and actions["update"] >= 30 and actions["conflict"] >= 3, actions
    finally:
        for obj in cluster_wide:
            info = client.resource_for(obj)
            try:
                client.delete(info, None, obj["metadata"]["name"])
            except ApiError as e:
                if e.status != 404:
                    raise
        client.close()


@pytest.mark.cluster
def test_an_openapi_document_without_a_kind_of_the_pass_is_asked_for_again_next_pass(
    tmp_path: Path, cluster_pool: ClusterPool
) -> None:
    """A CRD created in this pass may be published without its kind yet: marking its group-version
    loaded would plan the kind's list-maps as atomic lists for good, re-applying every pass."""
    repo = make_repo(tmp_path, {"clusters/pool-a/none.yaml": "# nothing\n"})
    cfg = write_config(tmp_path, repo, {"pool-a": cluster_pool["pool-a"]})
    stages = ClusterStages(cfg, cfg.cluster("pool-a"))
    try:
        meta = {"name": "x", "namespace": "default"}
        unpublished = DesiredObject(
            {"apiVersion": "apps/v1", "kind": "NotYet", "metadata": meta}, Provenance("a")
        )
        deployment = DesiredObject(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta}, Provenance("b")
        )
        stages.load_schema([unpublished])
        first = stages._schema_generation
        stages.load_schema([unpublished])
        assert stages._schema_generation == first + 1, "the document lacking the kind was not asked for again"
        stages.load_schema([deployment])
        loaded = stages._schema_generation
        stages.load_schema([deployment])
        assert stages._schema_generation == loaded, "a document holding every kind is asked for once"
    finally:
        stages.client.close()
