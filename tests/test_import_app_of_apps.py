"""`gitops-agent import --from argocd` of apps of apps whose Applications are rendered: a Helm chart
of Applications (argoproj/argocd-example-apps' `apps/`), a kustomization of them, nested parents,
a cycle and a chain deeper than the bound. Fixtures are ours, in the example repository's shape;
the parents render with the pinned helm and kustomize, offline."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.config.load import parse_config
from agent.imports import app_of_apps
from agent.imports.argo_helm import values_of
from agent.imports.argocd import import_argocd
from agent.imports.model import Note
from agent.imports.toml_text import toml_text

# argocd-example-apps' apps/ chart, as it is: one Application per entry of .Values.applications.
CHART_OF_APPS = {
    "apps/Chart.yaml": "apiVersion: v2\nname: applications\nversion: 0.1.0\n",
    "apps/values.yaml": """
config:
  spec:
    destination: {server: "https://kubernetes.default.svc"}
    source: {repoURL: "https://git.example.com/apps.git", targetRevision: master}
applications:
  - name: guestbook
  - name: helm-guestbook
    tool: {helm: {releaseName: helm-guestbook}}
""",
    "apps/values-prod.yaml": "applications:\n- name: guestbook\n- name: helm-guestbook\n- name: extra\n",
    "apps/templates/applications.yaml": """{{- range .Values.applications }}
{{- $config := $.Values.config -}}
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: {{ printf "%s.%s" $.Values.prefix .name | quote }}
  namespace: argocd
spec:
  destination:
    namespace: {{ .namespace | default .name | quote }}
    server: {{ $config.spec.destination.server | quote }}
  project: default
  source:
    path: {{ .path | default .name | quote }}
    repoURL: {{ $config.spec.source.repoURL }}
    targetRevision: {{ $config.spec.source.targetRevision }}
    {{- with .tool }}
    {{- . | toYaml | nindent 4 }}
    {{- end }}
  syncPolicy:
    syncOptions: [CreateNamespace=true]
    automated: {prune: true, selfHeal: true}
---
{{ end -}}
""",
    "guestbook/guestbook-ui-svc.yaml": "apiVersion: v1\nkind: Service\nmetadata: {name: guestbook-ui}\n",
    "helm-guestbook/Chart.yaml": "apiVersion: v2\nname: helm-guestbook\nversion: 0.1.0\n",
    "helm-guestbook/templates/cm.yaml": "kind: ConfigMap\napiVersion: v1\n"
    "metadata: {name: {{ .Release.Name }}}\n",
    "extra/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra}\n",
}

ROOT = """
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: root, namespace: argocd}
spec:
  source:
    repoURL: "https://git.example.com/apps.git"
    targetRevision: master
    path: apps
    helm:
      valueFiles: [values-prod.yaml]
      values: "prefix: overridden\\n"
      parameters: [{name: prefix, value: team}]
  destination: {server: "https://kubernetes.default.svc", namespace: argocd}
  syncPolicy: {automated: {prune: true, selfHeal: true}}
"""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _imported(root: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    text = toml_text(import_argocd(root), path="repo")
    data = tomllib.loads(text)
    parse_config(data, base_dir=root)  # what is written loads
    return text, {a["name"]: a for a in data["apps"]}


def test_a_chart_of_applications_is_rendered_with_the_parents_values_and_its_children_imported(
    tmp_path: Path,
) -> None:
    text, apps = _imported(_tree(tmp_path, {**CHART_OF_APPS, "root.yaml": ROOT}))
    # values-prod.yaml adds `extra`; helm.parameters beat helm.values for the prefix.
    assert set(apps) == {"team-guestbook", "team-helm-guestbook", "team-extra"}
    assert apps["team-guestbook"]["path"] == "guestbook"
    assert apps["team-guestbook"]["default_namespace"] == "guestbook"
    # values-prod.yaml's list replaces the chart's, releaseName with it: Argo CD then names the
    # release after the Application.
    assert apps["team-helm-guestbook"]["helm"] == {
        "chart": "helm-guestbook",
        "release_name": "team.helm-guestbook",
        "namespace": "helm-guestbook",
    }
    assert apps["team-extra"].get("helm") is None
    parent = "yielded by the app of apps Application argocd/root"
    assert f"# from Application argocd/team.guestbook (apps/templates/applications.yaml), {parent}" in text
    assert "Application argocd/root (path apps) because it is an app of apps: the 3 Application(s)" in text


def test_a_chart_of_applications_no_application_points_at_is_still_imported(tmp_path: Path) -> None:
    files = {**CHART_OF_APPS, "apps/values.yaml": CHART_OF_APPS["apps/values.yaml"] + "prefix: example\n"}
    text, apps = _imported(_tree(tmp_path, files))
    assert set(apps) == {"example-guestbook", "example-helm-guestbook"}
    assert "the parent Application of apps because no Application in PATH points at it" in text
    assert "yielded by the app of apps Application argocd/apps" in text


def test_a_kustomization_of_applications_is_built_and_nested_parents_are_followed(tmp_path: Path) -> None:
    child = """
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: team-apps, namespace: argocd}
spec:
  source: {repoURL: "https://git.example.com/apps.git", targetRevision: main, path: teams/a}
  destination: {server: "https://kubernetes.default.svc", namespace: a}
"""
    leaf = """
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: web, namespace: argocd}
spec:
  source: {repoURL: "https://git.example.com/apps.git", targetRevision: main, path: web}
  destination: {server: "https://kubernetes.default.svc", namespace: web}
  syncPolicy: {automated: {prune: true, selfHeal: true}}
"""
    root = ROOT.replace("path: apps", "path: parents").split("    helm:")[0] + (
        '  destination: {server: "https://kubernetes.default.svc"}\n'
    )
    files = {
        "root.yaml": root,
        "parents/kustomization.yaml": "resources: [team-a.yaml, db.yaml]\nnamePrefix: prod-\n",
        "parents/team-a.yaml": child,
        "parents/db.yaml": leaf.replace("name: web", "name: db"),
        "teams/a/web.yaml": leaf,  # a plain directory of Applications: read as the agent reads it
        "web/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\n",
    }
    text, apps = _imported(_tree(tmp_path, files))
    # As the kustomization yields them (renamed), never also as read from their files: team-apps
    # is a parent too, followed once.
    assert set(apps) == {"web", "prod-db"}, apps
    chain = "Application argocd/root > Application argocd/prod-team-apps"
    assert f"# from Application argocd/web (teams/a/web.yaml), yielded by the app of apps {chain}" in text


def test_a_cycle_and_a_chain_deeper_than_the_bound_are_noted_not_followed(tmp_path: Path) -> None:
    def application(name: str, path: str) -> str:
        return (
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\n"
            f"metadata: {{name: {name}, namespace: argocd}}\n"
            f'spec: {{source: {{repoURL: "https://git.example.com/apps.git", path: {path}}},'
            ' destination: {server: "https://kubernetes.default.svc"}}\n'
        )

    files = {"loop.yaml": application("loop", "loop"), "loop/self.yaml": application("loop", "loop")}
    depth = app_of_apps.MAX_DEPTH + 2
    files |= {"deep.yaml": application("d0", "d0")}
    files |= {f"d{i}/next.yaml": application(f"d{i + 1}", f"d{i + 1}") for i in range(depth)}
    files |= {f"d{depth}/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bottom}\n"}
    text = toml_text(import_argocd(_tree(tmp_path, files)), path="repo")
    assert "Application argocd/loop yielded by Application argocd/loop because it is a cycle" in text
    assert f"because apps of apps deeper than {app_of_apps.MAX_DEPTH} are not followed" in text


def test_a_parent_that_does_not_render_is_noted_with_the_file_and_problem(tmp_path: Path) -> None:
    files = {**CHART_OF_APPS, "root.yaml": ROOT}
    files["apps/templates/broken.yaml"] = "{{ .Values.nope.missing }}\nkind: Application\n"
    text = toml_text(import_argocd(_tree(tmp_path, files)), path="repo")
    assert "Application argocd/root (path apps) because it may yield Applications but its path" in text
    assert "apps/templates/broken.yaml" in text


@pytest.mark.parametrize(
    ("parameters", "expected", "noted"),
    [
        ([{"name": "a.b", "value": "3"}], {"a": {"b": 3, "c": 1}}, ""),
        ([{"name": "a", "value": "true"}], {"a": True}, ""),
        ([{"name": "a.b", "value": "007"}], {"a": {"b": "007", "c": 1}}, ""),
        ([{"name": "a.b", "value": "3", "forceString": True}], {"a": {"b": "3", "c": 1}}, ""),
        ([{"name": "list[0]", "value": "x"}], {"a": {"c": 1}}, "list indexes or escapes"),
        ([{"name": "a.b", "value": "{x,y}"}], {"a": {"c": 1}}, "list syntax"),
        ([{"name": "a.c", "value": "null"}], {"a": {"c": 1}}, "null deletes the key"),
    ],
)
def test_helm_parameters_are_set_over_values_as_helm_set_types_them(
    parameters: list[dict[str, Any]], expected: dict[str, Any], noted: str
) -> None:
    notes: list[Note] = []
    values = values_of({"valuesObject": {"a": {"c": 1}}, "parameters": parameters}, "Application x", notes)
    assert values == expected
    assert (noted in notes[0].why) if noted else not notes


def test_the_command_imports_a_chart_of_applications_with_the_config_alone_on_stdout(tmp_path: Path) -> None:
    files = {**CHART_OF_APPS, "apps/values.yaml": CHART_OF_APPS["apps/values.yaml"] + "prefix: example\n"}
    result = CliRunner().invoke(main, ["import", "--from", "argocd", str(_tree(tmp_path, files))])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("# Imported by `gitops-agent import --from argocd`")
    assert tomllib.loads(result.stdout)["apps"]
    # Chart templates are Helm text, not YAML: not read as objects, so no warning about them.
    assert result.stderr == "import: 2 app(s); 2 field(s) not carried over\n"  # the parent, twice
