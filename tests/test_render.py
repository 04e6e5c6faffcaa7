"""The render stage on real files: plain manifests, kustomize overlays, a Helm chart; determinism.

Fixture repository: ``tests/fixtures/render`` (``plain/``, ``kustomize/``,
``helm/``). Kustomize and Helm run the pinned binaries; a missing binary
fails these tests.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.config.types import HelmSettings
from agent.model import DesiredSet
from agent.render.binaries import tool
from agent.render.process import RunResult, run_subprocess
from agent.render.renderer import RenderSpec, dump_stream, render

FIXTURES = Path(__file__).parent / "fixtures" / "render"
PLAIN_VARS = {"NAMESPACE": "shop", "WEB_REPLICAS": "3", "NGINX_TAG": "1.27"}
PROD_HELM = HelmSettings(
    chart="helm/charts/web",
    release_name="shop",
    namespace="shop-prod",
    values_files=("helm/clusters/prod/values.yaml",),
)


@pytest.fixture
def binaries() -> None:
    """Fail (not skip) when the pinned kustomize/helm are missing: run scripts/install-control-plane."""
    tool("krender")
    tool("helm")


def by_key(ds: DesiredSet) -> dict[str, Any]:
    return {str(o.key): o.manifest for o in ds.objects}


# ---------------------------------------------------------------------------
# Plain manifests


def test_plain_manifests_are_read_recursively_in_a_stable_order_with_lists_json_and_multi_documents() -> None:
    ds = render(FIXTURES, RenderSpec("prod", ("plain",), PLAIN_VARS), revision="r1")
    assert [(str(o.key), str(o.provenance)) for o in ds.objects] == [
        ("ConfigMap/shop/db-config", "plain/apps/db/list.yml:4"),
        ("Secret/shop/db-password", "plain/apps/db/list.yml:11"),
        ("StatefulSet.apps/shop/db", "plain/apps/db/statefulset.json:1"),
        ("Deployment.apps/shop/web", "plain/apps/web/deployment.yaml:2"),
        ("Service/shop/web", "plain/apps/web/deployment.yaml:26"),
        ("PriorityClass.scheduling.k8s.io/high", "plain/infra/priority.yaml:1"),
        ("Namespace/shop", "plain/namespace.yaml:2"),
    ]
    assert ds.revision == "r1" and ds.cluster == "prod" and not ds.empty


def test_variables_are_substituted_with_their_types_and_escapes_stay_literal() -> None:
    web = by_key(render(FIXTURES, RenderSpec("prod", ("plain",), PLAIN_VARS)))["Deployment.apps/shop/web"]
    spec = web["spec"]
    assert isinstance(spec, dict)
    assert spec["replicas"] == 3
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == "nginx:1.27"
    assert container["args"] == ["--greeting=${NOT_A_VAR}"]


def test_ignore_file_and_hidden_directories_keep_files_out() -> None:
    keys = by_key(render(FIXTURES, RenderSpec("prod", ("plain",), PLAIN_VARS)))
    # plain/infra/draft-quota.yaml and scratch/ are in .gitops-agent-ignore; .hidden/ is hidden: all broken.
    assert not any("ResourceQuota" in k for k in keys)


def test_exclude_globs_are_anchored_at_the_repository_root(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "plain", tmp_path / "plain")
    spec = RenderSpec("prod", ("plain",), PLAIN_VARS, exclude=("*.json", "plain/apps/web/"))
    assert sorted(by_key(render(tmp_path, spec))) == [
        "ConfigMap/shop/db-config",
        "Namespace/shop",
        "PriorityClass.scheduling.k8s.io/high",
        "Secret/shop/db-password",
    ]


def test_ignore_file_negation_and_double_star(tmp_path: Path) -> None:
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {}\n"
    for rel in ("a/keep.yaml", "a/b/c/drop.yaml", "a/b/keep-me.yaml", "a/x/drop.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(cm.format(rel.replace("/", "-").removesuffix(".yaml")))
    (tmp_path / "a" / ".gitops-agent-ignore").write_text("b/**/*.yaml\n!b/keep-*.yaml\n/x/\n")
    names = [o.key.name for o in render(tmp_path, RenderSpec("c", ("a",), {})).objects]
    assert names == ["a-b-keep-me", "a-keep"]


def test_a_directory_without_manifests_renders_an_empty_set_marked_empty(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("nothing here\n")
    (tmp_path / "empty" / "blank.yaml").write_text("# only a comment\n---\n")
    ds = render(tmp_path, RenderSpec("c", ("empty",), {}))
    assert ds.empty and ds.objects == ()
    assert dump_stream(ds) == ""


def test_a_path_may_name_a_single_file() -> None:
    ds = render(FIXTURES, RenderSpec("c", ("plain/infra/priority.yaml",), {}))
    assert [str(o.key) for o in ds.objects] == ["PriorityClass.scheduling.k8s.io/high"]


# ---------------------------------------------------------------------------
# Kustomize


def test_kustomize_overlay_builds_with_its_shared_base_and_substitutes_variables(binaries: None) -> None:
    ds = render(
        FIXTURES, RenderSpec("prod", ("kustomize/overlays/prod",), {"CLUSTER_NAME": "prod", "REGION": "eu-1"})
    )
    objs = by_key(ds)
    assert sorted(objs) == [
        "ConfigMap/shop-prod/shop-settings-h99df6d886",
        "Deployment.apps/shop-prod/shop",
        "Namespace/shop-prod",
        "Service/shop-prod/shop",
    ]
    deploy = objs["Deployment.apps/shop-prod/shop"]
    assert deploy["spec"]["replicas"] == 5
    assert deploy["metadata"]["labels"] == {"app.kubernetes.io/part-of": "shop"}
    assert objs["ConfigMap/shop-prod/shop-settings-h99df6d886"]["data"] == {
        "cluster": "prod",
        "region": "eu-1",
    }
    assert {o.provenance.file for o in ds.objects} == {"kustomize/overlays/prod/kustomization.yaml"}


def test_two_overlays_of_one_base_render_independently(binaries: None) -> None:
    ds = render(FIXTURES, RenderSpec("staging", ("kustomize/overlays/staging",), {}))
    assert sorted(by_key(ds)) == ["Deployment.apps/shop-staging/shop", "Service/shop-staging/shop"]
    assert by_key(ds)["Deployment.apps/shop-staging/shop"]["spec"]["replicas"] == 1


def test_a_kustomization_inside_a_plain_directory_is_built_not_walked(binaries: None, tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "kustomize" / "base", tmp_path / "base")
    app = tmp_path / "clusters" / "prod" / "shop"
    app.mkdir(parents=True)
    (app / "kustomization.yaml").write_text("namespace: shop\nresources:\n  - ../../../base\n")
    (tmp_path / "clusters" / "prod" / "ns.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n"
    )
    ds = render(tmp_path, RenderSpec("prod", ("clusters/prod",), {}))
    assert [str(o.key) for o in ds.objects] == [
        "Namespace/shop",
        "Service/shop/shop",
        "Deployment.apps/shop/shop",
    ]


def test_kustomize_runs_in_the_sandbox_on_the_checked_files_only_without_plugins_or_helm(
    binaries: None,
) -> None:
    calls: list[list[str]] = []

    def spy(
        argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float, max_output: int
    ) -> RunResult:
        calls.append(list(argv))
        return run_subprocess(argv, cwd=cwd, env=env, timeout=timeout, max_output=max_output)

    render(FIXTURES, RenderSpec("s", ("kustomize/overlays/staging",), {}), runner=spy)
    (argv,) = calls
    kustomize = FIXTURES.resolve() / "kustomize"
    assert Path(argv[0]).name == "krender" and argv[1:3] == ["-root", str(FIXTURES.resolve())]
    mounted = [argv[i + 1] for i, a in enumerate(argv) if a == "-dir"]
    assert mounted == [str(kustomize / "base"), str(kustomize / "overlays" / "staging")]
    assert argv[-1] == str(kustomize / "overlays" / "staging")
    assert not {"--enable-exec", "--enable-alpha-plugins", "--enable-helm", "--network"} & set(argv)


# ---------------------------------------------------------------------------
# Helm


def test_helm_chart_renders_with_per_cluster_values_release_and_namespace(binaries: None) -> None:
    ds = render(FIXTURES, RenderSpec("prod", ("helm/charts/web",), {}, helm=PROD_HELM))
    objs = by_key(ds)
    assert sorted(objs) == [
        "ConfigMap/shop-prod/shop-cache",  # from the vendored dependency under charts/
        "ConfigMap/shop-prod/shop-settings",
        "CustomResourceDefinition.apiextensions.k8s.io/widgets.example.org",  # crds/ included
        "Deployment.apps/shop-prod/shop-web",
    ]  # the helm test Pod is skipped
    deploy = objs["Deployment.apps/shop-prod/shop-web"]
    assert deploy["spec"]["replicas"] == 4
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "example.org/web:2.4.0"
    assert container["env"][1]["value"] == "${HOME} is left alone in Helm output"
    assert objs["ConfigMap/shop-prod/shop-cache"]["data"] == {"size": "1Gi"}
    files = {str(o.key): o.provenance.file for o in ds.objects}
    assert files["Deployment.apps/shop-prod/shop-web"] == "helm/charts/web/templates/deployment.yaml"
    assert files["ConfigMap/shop-prod/shop-cache"] == "helm/charts/web/charts/cache/templates/configmap.yaml"


def test_helm_release_name_defaults_to_the_cluster_and_values_differ_per_cluster(binaries: None) -> None:
    helm = HelmSettings(chart="helm/charts/web", values_files=("helm/clusters/staging/values.yaml",))
    objs = by_key(render(FIXTURES, RenderSpec("staging", ("plain/infra",), {}, helm=helm)))
    deploy = objs["Deployment.apps/default/staging-web"]
    assert deploy["spec"]["replicas"] == 2
    assert "PriorityClass.scheduling.k8s.io/high" in objs  # the configured chart adds to the paths


def test_helm_runs_offline_with_throwaway_homes_and_no_post_renderer(binaries: None) -> None:
    calls: list[tuple[list[str], dict[str, str], list[str]]] = []

    def spy(
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
        max_output: int,
        then: Sequence[str] | None = None,
    ) -> RunResult:
        calls.append((list(argv), dict(env), list(then or ())))
        return run_subprocess(argv, cwd=cwd, env=env, timeout=timeout, max_output=max_output, then=then)

    render(FIXTURES, RenderSpec("prod", ("helm/charts/web",), {}, helm=PROD_HELM), runner=spy)
    ((argv, env, then),) = calls
    assert argv[1:4] == ["template", "shop", str((FIXTURES / "helm/charts/web").resolve())]
    assert then[:2] == [str(tool("krender")), "-helm-output"]  # reads helm's output as it comes
    assert "--post-renderer" not in argv and "--dependency-update" not in argv
    homes = [
        Path(env[k])
        for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME", "HELM_PLUGINS", "HOME")
    ]
    assert all(h.is_relative_to(Path(env["HOME"])) for h in homes)
    assert not Path(env["HOME"]).exists()  # removed after the run
    assert env["PATH"] == "" and env["HTTPS_PROXY"].startswith("http://127.0.0.1:")
    assert env["HOME"] != os.environ.get("HOME")


# ---------------------------------------------------------------------------
# Determinism


def _shuffled_copy(src: Path, dst: Path, rng: random.Random) -> None:
    files = [p for p in src.rglob("*") if p.is_file()]
    rng.shuffle(files)
    for f in files:
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)


def test_the_same_tree_renders_to_identical_bytes_twice_and_from_a_shuffled_copy(
    binaries: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variables = {**PLAIN_VARS, "CLUSTER_NAME": "prod", "REGION": "eu-1"}
    spec = RenderSpec("prod", ("plain", "kustomize/overlays/prod"), variables, helm=PROD_HELM)
    first = dump_stream(render(FIXTURES, spec, revision="r")).encode()
    second = dump_stream(render(FIXTURES, spec, revision="r")).encode()
    assert first == second
    assert first.count(b"\n---\n") + 1 == 15

    rng = random.Random(20240531)
    _shuffled_copy(FIXTURES, tmp_path / "copy", rng)
    real_listdir = os.listdir

    def shuffled_listdir(path: str | os.PathLike[str]) -> list[str]:
        names = real_listdir(path)
        rng.shuffle(names)
        return names

    monkeypatch.setattr(os, "listdir", shuffled_listdir)
    third = dump_stream(render(tmp_path / "copy", spec, revision="r")).encode()
    assert third == first


def test_dump_stream_sorts_keys_and_names_each_source() -> None:
    ds = render(FIXTURES, RenderSpec("c", ("plain/infra/priority.yaml",), {}))
    assert dump_stream(ds) == (
        "---\n# Source: plain/infra/priority.yaml:1\n"
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata:\n  name: high\nvalue: 1000\n"
    )
