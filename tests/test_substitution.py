"""``${...}`` substitution: on only where vars reach an app (or ``substitute = true``), Flux's syntax,
an opt-out per object, and one problem per variable name and file.

Real stacks carry ``${...}`` that is not ours: kube-prometheus's Grafana dashboards hold
``${datasource}`` 575 times, ``${__data.fields.Pod}`` and blackbox's ``${1}``. Without vars they
render as written; with substitution on they fail with one problem per name and file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config.load import load_config
from agent.errors import RenderError
from agent.reconcile.stages import app_render_spec
from agent.render.jsonmanifest import parse_json
from agent.render.manifests import Origin, _parse_yaml_python, objects_of, parse_yaml
from agent.render.renderer import RenderSpec, render
from agent.render.substitute import SUPPORTED, substitute

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
ORIGIN = Origin("f.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${A:=d}", "1"),
        ("${A:-d}", "1"),
        ("${MISSING:=d}", "d"),
        ("${MISSING:-d}", "d"),
        ("${EMPTY:-d}", "d"),
        ("${EMPTY:=d}", "d"),
        ("${EMPTY}", ""),
        ("${MISSING:=}", ""),
        ("x-${MISSING:-a b/c:d}-y", "x-a b/c:d-y"),
        ("$${MISSING:-d}", "${MISSING:-d}"),
    ],
)
def test_fluxs_default_forms_give_the_default_when_the_variable_is_undefined_or_empty(
    text: str, expected: str
) -> None:
    assert substitute(text, {"A": "1", "EMPTY": ""}) == (expected, [])


@pytest.mark.parametrize(
    "text", ["${v:0:3}", "${v^}", "${#v}", "${v/a/b}", "${v-d}", "${v=d}", "${v:+x}", "${A:-${B}}"]
)
def test_other_envsubst_forms_are_an_error_naming_the_supported_forms(text: str) -> None:
    _, problems = substitute(text, {"v": "value", "A": "1", "B": "2"})
    assert len(problems) == 1 and SUPPORTED in problems[0].message, problems


DASHBOARD = """apiVersion: v1
kind: ConfigMap
metadata:
  name: grafana-dashboard
data:
  dashboard.json: |-
    {
      "datasource": "${datasource}",
      "targets": [{"expr": "up{cluster=\\"${cluster}\\"}", "datasource": "${datasource}"}],
      "legend": "${__data.fields.Pod}",
      "again": "${datasource} ${__data.fields.Pod}"
    }
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: other
data:
  k: ${datasource}
"""


@pytest.mark.parametrize("loader", ["parse_yaml", "pure-Python"])
def test_one_problem_per_variable_name_and_file_at_the_line_it_is_written(loader: str) -> None:
    parse = parse_yaml if loader == "parse_yaml" else _parse_yaml_python
    docs, problems = parse(DASHBOARD, ORIGIN, {})
    assert docs == []
    lines = DASHBOARD.splitlines()

    def at(line: int, reference: str) -> tuple[int, int]:
        return line, lines[line - 1].index(reference) + 1

    assert [(p.line, p.column, p.message.split(" (")[0]) for p in problems] == [
        (*at(8, "${datasource}"), "undefined variable ${datasource}"),
        (*at(9, "${cluster}"), "undefined variable ${cluster}"),
        (*at(10, "${__data"), "malformed variable reference '${__data.fields.Pod}'"),
    ]


OPTED_OUT = """apiVersion: v1
kind: ConfigMap
metadata:
  name: dashboards
  annotations:
    {annotation}: disabled
data:
  k: ${{datasource}} $${{kept}}
  count: ${{N}}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: substituted
data:
  count: ${{N}}
"""


@pytest.mark.parametrize(
    "annotation", ["gitops-agent.io/substitute", "kustomize.toolkit.fluxcd.io/substitute"]
)
@pytest.mark.parametrize("loader", ["parse_yaml", "pure-Python"])
def test_an_object_annotated_substitute_disabled_is_read_as_written(annotation: str, loader: str) -> None:
    parse = parse_yaml if loader == "parse_yaml" else _parse_yaml_python
    docs, problems = parse(OPTED_OUT.format(annotation=annotation), ORIGIN, {"N": "3"})
    assert problems == []
    assert [d.value["data"] for d in docs] == [
        {"k": "${datasource} $${kept}", "count": "${N}"},
        {"count": 3},
    ]


def test_the_opt_out_holds_per_item_of_a_list_and_in_json() -> None:
    item = (
        '{{"apiVersion": "v1", "kind": "ConfigMap", '
        '"metadata": {{"name": "{name}"{notes}}}, "data": {{"k": "${{N}}"}}}}'
    )
    notes = ', "annotations": {"gitops-agent.io/substitute": "disabled"}'
    items = [item.format(name="kept", notes=notes), item.format(name="set", notes="")]
    text = '{"apiVersion": "v1", "kind": "List", "items": [' + ", ".join(items) + "]}"
    for parse in (parse_json, parse_yaml):
        docs, problems = parse(text, ORIGIN, {"N": "3"})
        assert problems == [], parse
        found, _ = objects_of(docs, ORIGIN)
        assert [m["data"]["k"] for m, _ in found] == ["${N}", "3"]


def test_json_reports_one_problem_per_variable_name() -> None:
    text = (
        '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "${X}"},\n'
        ' "data": {"a": "${X}", "b": "${Y}"}}'
    )
    _, problems = parse_json(text, ORIGIN, {})
    assert [(p.line, p.message) for p in problems] == [
        (1, "undefined variable ${X}"),
        (2, "undefined variable ${Y}"),
    ]


# ---------------------------------------------------------------------------
# The corpus, rendered


def test_kube_prometheus_renders_as_written_when_no_vars_reach_the_app() -> None:
    """Before: 640 problems (575 x ${datasource}, ...) although no variable was configured."""
    found = render(CORPUS, RenderSpec("c", ("kube-prometheus",), None))
    dashboards = [o for o in found.objects if o.key.name == "grafana-dashboard-k8s-resources-cluster"]
    assert len(found.objects) > 100 and dashboards
    assert "${datasource}" in str(dashboards[0].manifest["data"])


def test_kube_prometheus_with_substitution_on_fails_with_one_problem_per_name_and_file() -> None:
    with pytest.raises(RenderError) as caught:
        render(CORPUS, RenderSpec("c", ("kube-prometheus",), {}))
    problems = caught.value.problems
    where = [(p.file, p.message) for p in problems]
    assert len(where) == len(set(where)), "a variable was reported more than once in one file"
    assert 5 < len(problems) < 60, len(problems)  # not one per occurrence (640)
    dashboards = [p for p in problems if p.file == "kube-prometheus/grafana-dashboardDefinitions.yaml"]
    assert {p.message for p in dashboards} >= {
        "undefined variable ${datasource}",
        "undefined variable ${cluster}",
    }
    assert all(p.line is not None and p.line > 1 for p in problems)


# ---------------------------------------------------------------------------
# The `substitute` setting


CONFIG = """
[source]
url = "https://git.example.com/fleet.git"

[defaults]
{defaults}

[[clusters]]
name = "a"
kubeconfig = "kc"
path = "clusters/a"
{cluster}

[[apps]]
name = "web"
cluster = "a"
path = "web"
{app}
"""


def _specs(tmp_path: Path, defaults: str = "", cluster: str = "", app: str = "") -> dict[str, object]:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    path = tmp_path / "agent.toml"
    path.write_text(CONFIG.format(defaults=defaults, cluster=cluster, app=app))
    cfg = load_config(path)
    return {a.name: app_render_spec(a).vars for a in cfg.apps}


def test_substitution_is_off_where_no_vars_reach_an_app_and_on_where_they_do(tmp_path: Path) -> None:
    assert _specs(tmp_path) == {"a": None, "web": None}
    assert _specs(tmp_path, app='[apps.vars]\nN = "3"') == {"a": None, "web": {"N": "3"}}
    cluster_vars = _specs(tmp_path, cluster='[clusters.vars]\nN = "3"')
    assert cluster_vars == {"a": {"N": "3"}, "web": {"N": "3"}}


def test_substitute_false_turns_it_off_even_with_vars_and_true_on_without_them(tmp_path: Path) -> None:
    with_vars = '[clusters.vars]\nN = "3"'
    assert _specs(tmp_path, defaults="substitute = false", cluster=with_vars) == {"a": None, "web": None}
    assert _specs(tmp_path, cluster="substitute = false\n" + with_vars, app="substitute = true") == {
        "a": None,
        "web": {"N": "3"},
    }
    assert _specs(tmp_path, defaults="substitute = true") == {"a": {}, "web": {}}
    assert _specs(tmp_path, app="substitute = true") == {"a": None, "web": {}}
