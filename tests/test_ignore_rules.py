"""Ignore rules in the config (``[[ignore]]``, ``[[apps.ignore]]``): fields of third-party objects
(a chart's) that someone else sets are left to them, neither reverted nor reported as conflicts.

Real API server and a Helm chart in Git for the pass and ``gitops-agent diff``; the planner and
the loader directly for list selectors, managers and the errors a bad rule gets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli.diff import diff
from agent.config.ignore_rules import ignore_rules
from agent.config.load import load_config, parse_config
from agent.config.types import DEFAULT_CONFLICT_RULES
from agent.errors import ConfigError
from agent.model import Action, DesiredObject, IgnoredFields, Outcome, Provenance
from agent.plan.planner import PlanOptions, plan_object
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl

CHART = "apiVersion: v2\nname: web\nversion: 0.1.0\n"
DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {{ .Values.ns }}
  labels: {app: web, tier: front}
  annotations: {rollout: stable}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - {name: web, image: "nginx:1.0"}
        - {name: log, image: "busybox:1.0"}
"""
RULES = """
[[ignore]]
kind = "Deployment"
name = "w*"
selector = "app=web,tier!=db"
json_pointers = ["/spec/replicas"]
paths = ["spec.template.spec.containers[name=web].image"]

[[ignore]]
group = "apps"
managers = ["flagger"]
"""


def chart_files(ns: str) -> dict[str, str]:
    base = "clusters/pool-a/web"
    return {
        "clusters/pool-a/ns.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n",
        f"{base}/Chart.yaml": CHART,
        f"{base}/values.yaml": f"ns: {ns}\n",
        f"{base}/templates/web.yaml": DEPLOYMENT,
    }


def test_ignore_rules_keep_foreign_values_on_a_charts_deployment_without_a_conflict_across_passes(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("ignore")
    repo = make_repo(tmp_path, chart_files(ns))
    config = write_config(tmp_path, repo, {"pool-a": a})
    Path(config.file).write_text(Path(config.file).read_text() + RULES)
    agent = e2e.agent(load_config(config.file))
    first = agent.reconcile()["pool-a"]
    assert first.ok, (first.error, first.results)
    # Created whole, as Git declares it: the rules leave fields alone only once the object exists.
    assert kubectl(a.kubeconfig, "get", "deploy/web", "-n", ns, "-o", "jsonpath={.spec.replicas}") == "2"

    # Someone else: a hand image bump and scale (kubectl, which the default rules force over),
    # and a rollout tool's annotation (an unknown manager: a yielded conflict without a rule).
    kubectl(a.kubeconfig, "set", "image", "deploy/web", "web=nginx:9.9", "-n", ns)
    kubectl(a.kubeconfig, "scale", "deploy/web", "--replicas=5", "-n", ns)
    kubectl(
        a.kubeconfig,
        "annotate",
        "--overwrite",
        "--field-manager=flagger",
        "deploy/web",
        "rollout=canary",
        "-n",
        ns,
    )

    for _ in range(2):  # across passes
        r = agent.reconcile()["pool-a"]
        assert r.ok, (r.error, r.results)
        web = next(x for x in r.results if x.key.name == "web" and x.key.kind == "Deployment")
        assert web.outcome is Outcome.UNCHANGED and not web.yielded and web.note is None, web.message
        assert web.ignored == (IgnoredFields("ignore[0]", 2), IgnoredFields("ignore[1]", 1))
        live = json.loads(kubectl(a.kubeconfig, "get", "deploy/web", "-n", ns, "-o", "json"))
        images = {c["name"]: c["image"] for c in live["spec"]["template"]["spec"]["containers"]}
        assert images == {"web": "nginx:9.9", "log": "busybox:1.0"}
        assert live["spec"]["replicas"] == 5
        assert live["metadata"]["annotations"]["rollout"] == "canary"

    report = CliRunner().invoke(diff, ["--config", config.file, "--format", "json"], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    doc = json.loads(report.stdout)
    (app,) = doc["clusters"][0]["apps"]
    assert app["ignored"] == [{"rule": "ignore[0]", "fields": 2}, {"rule": "ignore[1]", "fields": 1}]
    assert app["summary"]["conflicts"] == 0 and not app["objects"]
    text = CliRunner().invoke(diff, ["--config", config.file], catch_exceptions=False)
    assert text.exit_code == 0 and "2 field(s) left alone by rule `ignore[0]`" in text.stdout, text.output


# -- the planner ---------------------------------------------------------------------------


def _rules(toml_rules: list[dict[str, Any]]) -> PlanOptions:
    rules = ignore_rules(toml_rules, "ignore", "")
    return PlanOptions(field_manager="agent", rules=DEFAULT_CONFLICT_RULES, ignore=rules)


def _entry(manager: str, fields: dict[str, Any], operation: str = "Update") -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "apps/v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }


def _deployment(image: str, sidecar: str, managed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    containers = [{"name": "web", "image": image}, {"name": "log", "image": sidecar}]
    meta: dict[str, Any] = {"name": "web", "namespace": "n", "labels": {"app": "web"}}
    if managed is not None:
        meta |= {"managedFields": managed, "resourceVersion": "7", "uid": "u"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {"template": {"spec": {"containers": containers}}},
    }


def _containers(images: dict[str, dict[str, Any]]) -> dict[str, Any]:
    items = {f'k:{{"name":"{n}"}}': {".": {}, "f:name": {}, **f} for n, f in images.items()}
    return {"f:spec": {"f:template": {"f:spec": {"f:containers": items}}}}


def _ours(*with_image: str) -> dict[str, Any]:
    """Our Apply entry: the label, both containers, the image of those named."""
    fields = _containers({n: ({"f:image": {}} if n in with_image else {}) for n in ("web", "log")})
    return _entry("agent", {**fields, "f:metadata": {"f:labels": {"f:app": {}}}}, "Apply")


OURS = _ours("web", "log")


def test_ignore_rules_a_list_selector_leaves_only_the_selected_containers_image_to_its_owner() -> None:
    live = _deployment(
        "nginx:9.9",
        "busybox:9.9",
        [OURS, _entry("kubectl-set", _containers({"web": {"f:image": {}}, "log": {"f:image": {}}}))],
    )
    desired = DesiredObject(_deployment("nginx:1.0", "busybox:1.0"), Provenance("web.yaml"))
    options = _rules([{"paths": ["spec.template.spec.containers[name=web].image"]}])
    change = plan_object(desired, live, options)
    # The sidecar's image is still Git's (forced over kubectl); the web image is left alone.
    assert change.action is Action.UPDATE and change.body is not None
    sent = {c["name"]: c.get("image") for c in change.body["spec"]["template"]["spec"]["containers"]}
    assert sent == {"web": None, "log": "busybox:1.0"}
    assert [c.path[-2:] for c in change.conflicts] == [('k:{"name":"log"}', "f:image")]
    assert change.ignored == (IgnoredFields("ignore[0]", 1),)
    # `[0]` selects the first item the same way.
    assert plan_object(
        desired, live, _rules([{"paths": ["spec.template.spec.containers[0].image"]}])
    ).ignored == (IgnoredFields("ignore[0]", 1),)


def test_ignore_rules_fields_a_named_manager_owns_are_left_silently_where_a_yield_is_a_conflict() -> None:
    live = _deployment(
        "nginx:1.0", "busybox:2.0", [_ours("web"), _entry("flagger", _containers({"log": {"f:image": {}}}))]
    )
    desired = DesiredObject(_deployment("nginx:1.0", "busybox:1.0"), Provenance("web.yaml"))
    without = plan_object(desired, live, _rules([{"managers": ["other"]}]))
    assert without.action is Action.CONFLICT and without.yielded
    change = plan_object(desired, live, _rules([{"managers": ["flag*"]}]))
    assert (change.action, change.conflicts, change.ignored) == (
        Action.NOOP,
        (),
        (IgnoredFields("ignore[0]", 1),),
    )


def test_ignore_rules_a_field_only_the_agent_holds_is_sent_as_live_holds_it_never_released() -> None:
    live = _deployment("nginx:1.0", "busybox:1.0", [OURS])
    desired = DesiredObject(_deployment("nginx:2.0", "busybox:1.0"), Provenance("web.yaml"))
    change = plan_object(
        desired, live, _rules([{"json_pointers": ["/spec/template/spec/containers/0/image"]}])
    )
    # Git's new image is not applied, and the field is not dropped (the server would delete it).
    assert change.action is Action.NOOP and change.ignored == (IgnoredFields("ignore[0]", 1),)


def test_ignore_rules_do_not_apply_to_objects_the_selector_or_globs_do_not_match() -> None:
    live = _deployment(
        "nginx:9.9", "busybox:1.0", [OURS, _entry("kubectl-set", _containers({"web": {"f:image": {}}}))]
    )
    desired = DesiredObject(_deployment("nginx:1.0", "busybox:1.0"), Provenance("web.yaml"))
    for rule in ({"selector": "app!=web"}, {"kind": "StatefulSet"}, {"namespace": "other"}, {"group": ""}):
        change = plan_object(
            desired, live, _rules([{"json_pointers": ["/spec/template/spec/containers/0/image"], **rule}])
        )
        assert change.action is Action.UPDATE and not change.ignored, rule


# -- the loader ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "where", "says"),
    [
        ({"json_pointers": ["spec/replicas"]}, "ignore[0].json_pointers[0]", "starting with '/'"),
        ({"json_pointers": ["/spec/a~2b"]}, "ignore[0].json_pointers[0]", "'~' must be escaped"),
        ({"json_pointers": ["/metadata/labels"]}, "ignore[0].json_pointers[0]", "membership"),
        ({"paths": ["metadata.name"]}, "ignore[0].paths[0]", "identity"),
        ({"paths": ["spec..replicas"]}, "ignore[0].paths[0]", "column 6"),
        ({"paths": ["spec.containers[name]"]}, "ignore[0].paths[0]", "list selector"),
        ({"selector": "app=web,,x", "managers": ["m"]}, "ignore[0].selector", "column 9"),
        ({"selector": "app in web", "managers": ["m"]}, "ignore[0].selector", "not a label selector"),
        ({"selector": "-bad=x", "managers": ["m"]}, "ignore[0].selector", "not a valid label key"),
        ({"selector": "", "managers": ["m"]}, "ignore[0].selector", "empty selector"),
        ({"managers": [""]}, "ignore[0].managers[0]", "empty string"),
        ({"kind": "Deployment"}, "ignore[0].json_pointers", "must say what to ignore"),
        ({"managers": ["m"], "pointers": ["/x"]}, "ignore[0].pointers", "unknown key"),
    ],
)
def test_ignore_rules_a_bad_rule_fails_the_load_naming_its_key_path(
    rule: dict[str, Any], where: str, says: str
) -> None:
    with pytest.raises(ConfigError) as e:
        _rules([rule])
    assert e.value.path == where and says in str(e.value), str(e.value)


def test_ignore_rules_an_apps_own_rules_replace_the_global_ones(tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    kc.write_text("apiVersion: v1\nkind: Config\n")
    data = {
        "source": {"url": "https://git.example.com/f.git"},
        "clusters": [{"name": "c", "kubeconfig": str(kc), "path": "p"}],
        "ignore": [{"managers": ["a"]}],
        "apps": [
            {"name": "own", "cluster": "c", "path": "q", "ignore": [{"managers": ["b"]}]},
            {"name": "bad", "cluster": "c", "path": "r", "ignore": [{"json_pointers": ["x"]}]},
        ],
    }
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert e.value.path == "apps[1].ignore[0].json_pointers[0]"
    data["apps"].pop()
    config = parse_config(data)
    by_name = {a.name: a for a in config.apps}
    assert [r.managers for r in by_name["c"].ignore] == [("a",)]
    assert [(r.origin, r.managers) for r in by_name["own"].ignore] == [("apps[0].ignore[0]", ("b",))]
