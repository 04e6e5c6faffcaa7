"""Malformed input fails the whole render closed: one clear problem each, with file and line, and no set.

Every case builds a small repository, renders it, and asserts that ``render``
raised a ``RenderError`` whose problems include the case's own message at the
case's own file (and line, where the input has one) -- and that nothing was
returned, so nothing could be applied or pruned. The kustomize and helm cases
run the pinned binaries (they fail, not skip, when those are missing).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.config.types import HelmSettings
from agent.errors import RenderError
from agent.model import DesiredSet
from agent.render.binaries import tool
from agent.render.renderer import RenderSpec, render

CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"


@dataclass
class Case:
    id: str
    files: dict[str, str | bytes]
    fragment: str
    file: str
    line: int | None = None
    column: int | None = None
    vars: dict[str, str] = field(default_factory=dict)
    paths: tuple[str, ...] = ("app",)
    helm: HelmSettings | None = None
    setup: Callable[[Path], None] | None = None
    tools: tuple[str, ...] = ()


def _big_file(repo: Path) -> None:
    with (repo / "app" / "huge.yaml").open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # sparse: 50 MB on paper, nothing on disk


def _escaping_symlink(repo: Path) -> None:
    outside = repo.parent / "outside"
    outside.mkdir()
    (outside / "secret.yaml").write_text(CM.format(name="stolen"))
    (repo / "app" / "stolen.yaml").symlink_to(outside / "secret.yaml")


def _escaping_dir_symlink(repo: Path) -> None:
    (repo.parent / "elsewhere").mkdir()
    (repo / "app" / "linked").symlink_to(repo.parent / "elsewhere", target_is_directory=True)


def _path_outside(repo: Path) -> None:
    (repo.parent / "theirs").mkdir()
    (repo / "app").symlink_to(repo.parent / "theirs", target_is_directory=True)


def _escaping_base(repo: Path) -> None:
    base = repo.parent / "outside-base"
    base.mkdir()
    (base / "kustomization.yaml").write_text("resources: []\n")


CHART: dict[str, str | bytes] = {
    "app/Chart.yaml": "apiVersion: v2\nname: app\nversion: 0.1.0\n",
    "app/values.yaml": "x: 1\n",
}

CASES = [
    Case(
        "yaml syntax error",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  labels: a: b\n"},
        "YAML syntax error: mapping values are not allowed here",
        "app/a.yaml",
        5,
        12,
    ),
    Case(
        "unclosed flow sequence",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: [a, b\n"},
        "YAML syntax error: expected ',' or ']'",
        "app/a.yaml",
        5,
        1,
    ),
    Case(
        "tab indentation",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n\tname: x\n"},
        "tab character where YAML expects indentation",
        "app/a.yaml",
        4,
        1,
    ),
    Case(
        "duplicate mapping key",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  name: y\n"},
        "duplicate mapping key 'name' (YAML would keep only one) (first at line 4)",
        "app/a.yaml",
        5,
        3,
    ),
    Case(
        "duplicate object across files",
        {"app/a.yaml": CM.format(name="x"), "app/sub/b.yaml": "---\n" + CM.format(name="x")},
        "duplicate object ConfigMap/x: also defined at app/a.yaml:1",
        "app/sub/b.yaml",
        2,
    ),
    Case(
        "missing metadata.name",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  labels: {a: b}\n"},
        "ConfigMap (unnamed): metadata.name is missing",
        "app/a.yaml",
        1,
    ),
    Case(
        "generateName instead of name",
        {"app/a.yaml": "apiVersion: batch/v1\nkind: Job\nmetadata:\n  generateName: j-\n"},
        "generateName is not supported",
        "app/a.yaml",
        1,
    ),
    Case(
        "missing apiVersion",
        {"app/a.yaml": "---\nkind: ConfigMap\nmetadata: {name: x}\n"},
        "ConfigMap/x: apiVersion is missing",
        "app/a.yaml",
        2,
    ),
    Case(
        "missing kind",
        {"app/a.yaml": "apiVersion: v1\nmetadata: {name: x}\n"},
        "object/x: kind is missing",
        "app/a.yaml",
        1,
    ),
    Case(
        "kind not a string",
        {"app/a.yaml": "apiVersion: v1\nkind: [ConfigMap]\nmetadata: {name: x}\n"},
        "kind must be a string, got list",
        "app/a.yaml",
        1,
    ),
    Case(
        "name not a string",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: 42}\n"},
        "metadata.name must be a string, got int 42",
        "app/a.yaml",
        1,
    ),
    Case(
        "name unusable in an API path",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a/b}\n"},
        "metadata.name 'a/b' is not a valid object name",
        "app/a.yaml",
        1,
    ),
    Case(
        "metadata not a mapping",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: x\n"},
        "ConfigMap (unnamed): metadata must be a mapping",
        "app/a.yaml",
        1,
    ),
    Case(
        "scalar document",
        {"app/a.yaml": CM.format(name="x") + "---\njust a string\n"},
        "document 1 is a str ('just a string'), not a mapping",
        "app/a.yaml",
        6,
    ),
    Case(
        "list document",
        {"app/a.yaml": "- apiVersion: v1\n  kind: ConfigMap\n"},
        "document 0 is a list, not a mapping",
        "app/a.yaml",
        1,
    ),
    Case(
        "List items not a list",
        {"app/a.yaml": "apiVersion: v1\nkind: List\nitems: {a: b}\n"},
        "List.items must be a list, got dict",
        "app/a.yaml",
        1,
    ),
    Case(
        "undefined variable",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-${ENVIRONMENT}\n"},
        "undefined variable ${ENVIRONMENT}",
        "app/a.yaml",
        4,
        13,
        vars={"ENV": "prod"},
    ),
    Case(
        "malformed variable reference",
        {"app/a.yaml": CM.format(name="x") + "data:\n  cmd: echo ${not-a-name}\n"},
        "malformed variable reference '${not-a-name}",
        "app/a.yaml",
        6,
        13,
        vars={"ENV": "prod"},  # substitution is on where vars reach the app
    ),
    Case(
        "binary garbage",
        {"app/a.yaml": b"apiVersion: v1\n\x7fELF\x00\x00\x02\x01binary"},
        "binary content (NUL byte)",
        "app/a.yaml",
        2,
    ),
    Case(
        "not UTF-8",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: caf\xe9}\n".encode("latin-1")},
        "not UTF-8 text (byte 0xe9)",
        "app/a.yaml",
        3,
        21,
    ),
    Case(
        "control character",
        {"app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a\x07}\n"},
        "control character U+0007 is not allowed in YAML text",
        "app/a.yaml",
        3,
        19,
    ),
    Case(
        "50 MB file",
        {"app/ok.yaml": CM.format(name="ok")},
        "file is 52428800 bytes, over the limit of 16777216",
        "app/huge.yaml",
        setup=_big_file,
    ),
    Case(
        "symlinked file escaping the repository",
        {"app/ok.yaml": CM.format(name="ok")},
        "symlink points outside the repository",
        "app/stolen.yaml",
        setup=_escaping_symlink,
    ),
    Case(
        "symlinked directory escaping the repository",
        {"app/ok.yaml": CM.format(name="ok")},
        "symlink points outside the repository",
        "app/linked",
        setup=_escaping_dir_symlink,
    ),
    Case(
        "configured path is a symlink leaving the repository",
        {},
        "path is a symlink pointing outside the repository",
        "app",
        setup=_path_outside,
    ),
    Case(
        "recursive alias",
        {"app/a.yaml": CM.format(name="x") + "data: &d\n  self: *d\n"},
        "recursive YAML alias",
        "app/a.yaml",
        1,
    ),
    Case(
        "alias bomb",
        {
            "app/a.yaml": CM.format(name="x")
            + "".join(
                f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" if i else "l0: &l0 [lol]\n"
                for i in range(8)
            )
        },
        "alias bomb",
        "app/a.yaml",
        1,
    ),
    Case(
        "binary tag",
        {"app/a.yaml": CM.format(name="x") + "binaryData:\n  b: !!binary aGVsbG8=\n"},
        "unsupported YAML tag 'tag:yaml.org,2002:binary'",
        "app/a.yaml",
        6,
        6,
    ),
    Case(
        "custom tag",
        {"app/a.yaml": CM.format(name="x") + "data:\n  b: !vault secret/x\n"},
        "unsupported YAML tag '!vault'",
        "app/a.yaml",
        6,
        6,
    ),
    Case(
        "null key",
        {"app/a.yaml": CM.format(name="x") + "data:\n  ~: http\n"},
        "mapping key null is not a string, number or boolean (quote it)",
        "app/a.yaml",
        6,
        3,
    ),
    Case(
        "NaN in YAML",
        {"app/a.yaml": CM.format(name="x") + "spec:\n  ratio: .nan\n"},
        "spec.ratio: nan is not a JSON number",
        "app/a.yaml",
        1,
    ),
    Case(
        "JSON syntax error",
        {"app/a.json": '{\n  "apiVersion": "v1",\n  "kind": "ConfigMap"\n  "metadata": {}\n}\n'},
        "JSON syntax error: Expecting ',' delimiter",
        "app/a.json",
        4,
        3,
    ),
    Case(
        "JSON duplicate key",
        {"app/a.json": '{"apiVersion": "v1", "kind": "ConfigMap",\n "metadata": {"name": "a", "name": "b"}}'},
        "duplicate key 'name' in JSON object",
        "app/a.json",
        2,
        14,
    ),
    Case(
        "JSON NaN",
        {"app/a.json": '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "x": NaN}'},
        "NaN is not valid JSON for Kubernetes",
        "app/a.json",
    ),
    Case(
        "JSON top-level array",
        {"app/a.json": '[{"apiVersion": "v1"}]'},
        "document 0 is a list, not a mapping",
        "app/a.json",
        1,
    ),
    Case(
        "path missing from the revision",
        {"other/a.yaml": CM.format(name="x")},
        "path does not exist in this revision",
        "app",
    ),
    Case(
        "kustomize remote base",
        {"app/kustomization.yaml": "resources:\n  - github.com/example/repo//deploy?ref=v1\n"},
        "resources: remote reference 'github.com/example/repo//deploy?ref=v1' is refused",
        "app/kustomization.yaml",
        2,
    ),
    Case(
        "kustomize remote file",
        {"app/kustomization.yaml": "resources:\n  - https://example.com/cm.yaml\n"},
        "resources: remote reference 'https://example.com/cm.yaml' is refused",
        "app/kustomization.yaml",
        2,
    ),
    Case(
        "kustomize base outside the repository",
        {"app/kustomization.yaml": "resources:\n  - ../../outside-base\n"},
        "resources: '../../outside-base' leaves the repository",
        "app/kustomization.yaml",
        2,
        setup=_escaping_base,
    ),
    Case(
        "kustomize helmCharts",
        {"app/kustomization.yaml": "helmCharts:\n  - name: x\n    repo: https://charts.example.com\n"},
        "helmCharts is refused",
        "app/kustomization.yaml",
    ),
    Case(
        "kustomization nested thousands deep",
        {"app/kustomization.yaml": "resources:\n" + "- " * 3_000 + "x\n"},
        "invalid kustomization: nested more than 200 levels deep",  # before: RecursionError, no file
        "app/kustomization.yaml",
        2,
    ),
    Case(
        "Chart.yaml nested thousands deep",
        {**CHART, "app/Chart.yaml": "apiVersion: v2\nname: app\nversion: 0.1.0\nx:\n" + "- " * 3_000 + "y\n"},
        "invalid Chart.yaml: nested more than 200 levels deep",
        "app/Chart.yaml",
        5,
    ),
    Case(
        "JSON nested thousands deep",
        {"app/a.json": "[" * 5_000},
        "JSON is nested more than 200 levels deep",
        "app/a.json",
        1,
        column=213,
    ),
    Case(
        "kustomize build error",
        {
            "app/kustomization.yaml": "resources:\n  - cm.yaml\npatches:\n  - path: patch.yaml\n",
            "app/cm.yaml": CM.format(name="x"),
            "app/patch.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: not-there\n",
        },
        "kustomize build app failed (exit 1)",
        "app",
        tools=("kustomize",),
    ),
    Case(
        "undefined variable in kustomize output",
        {
            "app/kustomization.yaml": "resources:\n  - cm.yaml\n",
            "app/cm.yaml": CM.format(name="x") + "data:\n  k: ${NOPE}\n",
        },
        "undefined variable ${NOPE}",
        "app (kustomize build output)",
        3,
        vars={"ENV": "prod"},
        tools=("kustomize",),
    ),
    Case(
        "helm template error",
        {
            **CHART,
            "app/templates/cm.yaml": CM.format(name="x") + "data:\n  k: {{ .Values.x | nosuchfunc }}\n",
        },
        "helm template app failed (exit 1)",
        "app/templates/cm.yaml",
        6,
        tools=("helm",),
    ),
    Case(
        "helm fail()",
        {**CHART, "app/templates/cm.yaml": '{{ fail "refusing: x must be set" }}\n'},
        "refusing: x must be set",
        "app/templates/cm.yaml",
        1,
        tools=("helm",),
    ),
    Case(
        "helm dependency not vendored",
        {
            **CHART,
            "app/Chart.yaml": "apiVersion: v2\nname: app\nversion: 0.1.0\n"
            "dependencies:\n  - name: redis\n    version: 1.0.0\n    repository: https://charts.example.com\n",
        },
        "chart dependency 'redis' (https://charts.example.com) is not vendored under app/charts/",
        "app/Chart.yaml",
    ),
    Case(
        "helm output with duplicate keys",
        {**CHART, "app/templates/cm.yaml": CM.format(name="x") + "data:\n  a: '1'\n  a: '2'\n"},
        "duplicate mapping key 'a' (YAML would keep only one) (first at line 6)",
        "app/templates/cm.yaml (rendered)",
        7,
        tools=("helm",),
    ),
    Case(
        "helm values file missing",
        CHART,
        "helm values file does not exist in this revision",
        "clusters/c/values.yaml",
        helm=HelmSettings(chart="app", values_files=("clusters/c/values.yaml",)),
    ),
]


def _write(repo: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def test_there_are_at_least_25_cases_with_distinct_messages() -> None:
    assert len(CASES) >= 25
    fragments = [c.fragment for c in CASES]
    distinct_by_file = {(c.fragment, c.file) for c in CASES}
    assert len(distinct_by_file) == len(fragments)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_input_fails_the_whole_render_with_its_own_clear_error(case: Case, tmp_path: Path) -> None:
    for name in case.tools:
        tool(name)  # a missing pinned binary fails the test instead of passing it vacuously
    repo = tmp_path / "repo"
    repo.mkdir()
    # A valid object next to the broken one: it must not come back as a partial set.
    _write(repo, {"good/cm.yaml": CM.format(name="good"), **case.files})
    if case.setup is not None:
        case.setup(repo)
    spec = RenderSpec("c", ("good", *case.paths), case.vars, helm=case.helm)
    result: DesiredSet | None = None
    with pytest.raises(RenderError) as caught:
        result = render(repo, spec, revision="abc")
    assert result is None  # nothing to apply, nothing to prune
    err = caught.value
    assert err.cluster == "c" and not err.retryable
    matching = [p for p in err.problems if case.fragment in p.message]
    assert matching, f"no problem mentions {case.fragment!r}: {[str(p) for p in err.problems]}"
    problem = matching[0]
    assert problem.file == case.file, str(problem)
    assert problem.line == case.line, str(problem)
    if case.column is not None:
        assert problem.column == case.column, str(problem)
    assert case.fragment in str(err)  # the message users see carries it too


def test_every_problem_of_every_file_is_reported_not_just_the_first(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "app/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
            "app/b.yaml": "key: [unclosed\n",
            "app/c.yaml": CM.format(name="${X}") + "---\n" + CM.format(name="${Y}"),
            "app/d.yaml": CM.format(name="fine"),
        },
    )
    with pytest.raises(RenderError) as caught:
        render(tmp_path, RenderSpec("c", ("app",), {}))
    where = [(p.file, p.line) for p in caught.value.problems]
    assert where == [("app/a.yaml", 1), ("app/b.yaml", 2), ("app/c.yaml", 4), ("app/c.yaml", 9)]


def test_a_symlink_inside_the_repository_is_followed(tmp_path: Path) -> None:
    _write(tmp_path, {"shared/cm.yaml": CM.format(name="shared"), "app/own.yaml": CM.format(name="own")})
    os.symlink("../shared/cm.yaml", tmp_path / "app" / "link.yaml")
    ds = render(tmp_path, RenderSpec("c", ("app",), {}))
    assert sorted(o.key.name for o in ds.objects) == ["own", "shared"]


def test_a_symlink_loop_inside_the_repository_ends(tmp_path: Path) -> None:
    _write(tmp_path, {"app/cm.yaml": CM.format(name="x")})
    os.symlink("..", tmp_path / "app" / "loop")
    ds = render(tmp_path, RenderSpec("c", ("app",), {}))
    assert [o.key.name for o in ds.objects] == ["x"]
