"""The libyaml fast path of YAML parsing, and renders shared between clusters (``RenderCache``, ``Fleet``).

The fast path (``agent.render.fastyaml``) must give exactly what the pure-Python
loader gives for every stream it accepts, and hand every other stream over;
the cache must share a render between clusters only when its output cannot
depend on the cluster, bound what it keeps, and render once for concurrent
askers. The last test runs two real pool clusters off one shared render.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.config.types import HelmSettings
from agent.model import DesiredSet
from agent.render import fastyaml, manifests
from agent.render import renderer as render_module
from agent.render.binaries import tool
from agent.render.manifests import Origin, parse_yaml
from agent.render.renderer import RenderCache, RenderSpec, render
from tests.agentkit import Agent, make_repo, unique, write_config
from tests.clusters import ClusterPool, kubectl

FIXTURES = Path(__file__).parent / "fixtures" / "render"
PLAIN_VARS = {"NAMESPACE": "shop", "WEB_REPLICAS": "3", "NGINX_TAG": "1.27"}
ORIGIN = Origin("f.yaml")
VARS = {"N": "3", "T": "true", "S": "x y", "E": ""}

ORDINARY = [
    "a: ${N}\nb: \"${N}\"\nc: ${T}\nd: x-${N}\ne: $${N}\nf: '${S}'\ng: ${E}\n",
    "# ${NOWHERE} in a comment\nk: v # ${NOR} here\n",
    "s: !!str ${N}\nt: &anchor !!str ${N}\nu: ! ${N}\nq: ! '${N}'\ni: !!int '7'\nv: &w ${N}\n",
    "d: 2024-01-31\nf: 1.5\ne: 1e3\nh: 0x1F\no: 0o17\nn: ~\nb: yes\nx: .inf\n",
    '---\n---\nk: [1, two, {t: "${T}"}]\n...\n---\n- a\n- {b: c}\n',
    'block: |\n  line ${N}\n  $${KEEP}\nfolded: >-\n  a\n  b\nquoted: "tab\\there \\u00e9"\n',
    "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: A\n  metadata: {name: a}\n",
    "ünï: cödé 😀\nk: ${N}\n",
    "",
    "key with spaces: v\n? complex\n: value\n",
]

HANDED_OVER = {
    "duplicate key": "a: 1\na: 2\n",
    "undefined variable": "a: ${MISSING}\n",
    "malformed reference": "a: ${a-b}\n",
    "alias": "a: &x {b: 1}\nc: *x\n",
    "merge key": "base: &b {a: 1}\nspec:\n  <<: *b\n",
    "non-string key": "1: a\n",
    "tab": "a:\n\tb: 1\n",
    "syntax error": "a: b: c\n",
    "binary tag": "a: !!binary aGk=\n",
    "${X} in a flow mapping (libyaml: braces end it)": "a: {b: ${N}}\n",
    "deep nesting": "[" * 50_000 + "]" * 50_000,
}


def _python(text: str, variables: dict[str, str] | None) -> list[tuple[Any, int, int | None, list[int]]]:
    docs, problems = manifests._parse_yaml_python(text, ORIGIN, variables)
    assert problems == []
    return [(d.value, d.index, d.line, sorted(d.lines.values())) for d in docs]


def test_yaml_is_parsed_by_libyaml_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fastyaml.AVAILABLE, "PyYAML without libyaml: install PyYAML wheels built with it"

    def refuse(*args: object) -> object:
        raise AssertionError("an ordinary stream went to the pure-Python loader")

    monkeypatch.setattr(manifests, "_parse_yaml_python", refuse)
    docs, problems = parse_yaml('a: ${N}\nb: "${N}"\n', ORIGIN, VARS)
    assert problems == [] and docs[0].value == {"a": 3, "b": "3"}


@pytest.mark.parametrize("text", ORDINARY)
@pytest.mark.parametrize("variables", [VARS, None], ids=["vars", "no-vars"])
def test_libyaml_path_gives_exactly_what_the_python_loader_gives(
    text: str, variables: dict[str, str] | None
) -> None:
    fast = fastyaml.load(text, variables, max_nodes=manifests.MAX_EXPANDED_NODES)
    assert fast is not None, "an ordinary stream was handed over"
    got = [(value, index, line, sorted(lines.values())) for value, index, line, lines in fast]
    assert got == _python(text, variables)
    assert [type(v) for d in got if isinstance(d[0], dict) for v in d[0].values()] == [
        type(v) for d in _python(text, variables) if isinstance(d[0], dict) for v in d[0].values()
    ]


@pytest.mark.parametrize("text", list(HANDED_OVER.values()), ids=list(HANDED_OVER))
def test_streams_with_problems_or_rare_yaml_go_to_the_reference_loader(text: str) -> None:
    assert fastyaml.load(text, {}, max_nodes=manifests.MAX_EXPANDED_NODES) is None


def test_deep_nesting_is_refused_without_reaching_the_c_stack() -> None:
    box: dict[str, Any] = {}
    text = "- " * 40_000 + "x\n"  # would overflow libyaml's recursive composer on an 8 MB stack
    t = threading.Thread(target=lambda: box.update(r=parse_yaml(text, ORIGIN, None)))
    t.start()
    t.join()
    docs, problems = box["r"]
    assert docs == [] and "nested too deeply" in problems[0].message


def test_many_shallow_documents_still_take_the_fast_path() -> None:
    one = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: n, labels: {a: b}}\ndata: {k: v-1}\n"
    text = "---\n".join([one] * 3_000)  # far more level characters than MAX_C_DEPTH, in all
    fast = fastyaml.load(text, None, max_nodes=manifests.MAX_EXPANDED_NODES)
    assert fast is not None and len(fast) == 3_000


def test_a_star_in_text_does_not_hand_over_many_documents() -> None:
    # A "*" anywhere turns on alias detection by node id; ids of an earlier document's freed
    # nodes are reused, which once handed every CronJob file ("*/30 * * * *") to the slow loader.
    one = 'kind: CronJob\nmetadata: {name: n}\nspec: {schedule: "*/30 * * * *", a: [1, 2, {b: c}]}\n'
    text = "---\n".join([one] * 500)
    fast = fastyaml.load(text, None, max_nodes=manifests.MAX_EXPANDED_NODES)
    assert fast is not None and len(fast) == 500


# ---------------------------------------------------------------------------
# RenderCache


def _plain(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES / "plain", tmp_path / "plain")
    return tmp_path


def test_clusters_with_the_same_spec_share_one_render(tmp_path: Path) -> None:
    tree = _plain(tmp_path)
    cache = RenderCache()
    a = cache.render(tree, RenderSpec("a", ("plain",), PLAIN_VARS), revision="r1")
    shutil.rmtree(tree / "plain")  # a second render would now fail
    b = cache.render(tree, RenderSpec("b", ("plain",), PLAIN_VARS), revision="r1")
    assert (a.cluster, b.cluster) == ("a", "b")
    assert b.objects is a.objects and len(cache) == 1
    assert cache.get("r1", RenderSpec("b", ("plain",), PLAIN_VARS)) is b


def test_a_render_that_names_a_helm_release_after_the_cluster_is_not_shared(tmp_path: Path) -> None:
    tool("helm")
    helm = HelmSettings(chart="helm/charts/web", values_files=("helm/clusters/staging/values.yaml",))
    cache = RenderCache()
    staging = cache.render(FIXTURES, RenderSpec("staging", ("plain/infra",), {}, helm=helm), revision="r")
    other = cache.render(FIXTURES, RenderSpec("other", ("plain/infra",), {}, helm=helm), revision="r")
    assert other.objects is not staging.objects and len(cache) == 2
    names = {o.manifest["metadata"]["name"] for o in other.objects}
    assert any(n.startswith("other-") for n in names) and not any(n.startswith("staging-") for n in names)


def test_cache_keeps_the_two_newest_revisions_per_spec(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "other").mkdir()
    cache = RenderCache()
    spec, other = RenderSpec("c", ("app",), {}), RenderSpec("c", ("other",), {})
    cache.render(tmp_path, other, revision="a")
    for rev in ("a", "b", "c", "d"):
        cache.render(tmp_path, spec, revision=rev)
    assert [cache.get(r, spec) is not None for r in "abcd"] == [False, False, True, True]
    assert cache.get("a", other) is not None and len(cache) == 3


def test_concurrent_clusters_render_a_missing_entry_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _plain(tmp_path)
    calls: list[str] = []

    def slow_render(tree: Path, spec: RenderSpec, **kw: Any) -> DesiredSet:
        calls.append(spec.cluster)
        time.sleep(0.3)
        return render(tree, spec, **kw)

    monkeypatch.setattr(render_module, "render", slow_render)
    cache = RenderCache()
    out: dict[str, DesiredSet] = {}
    threads = [
        threading.Thread(
            target=lambda n=n: out.__setitem__(
                n, cache.render(tree, RenderSpec(n, ("plain",), PLAIN_VARS), revision="r")
            )
        )
        for n in ("a", "b", "c")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert out["a"].objects is out["b"].objects is out["c"].objects
    assert {ds.cluster for ds in out.values()} == {"a", "b", "c"}


# ---------------------------------------------------------------------------
# The fleet, on real clusters


CONFIG_MAPS = """
apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: shared
  namespace: {ns}
  labels: {{tier: web}}
  annotations: {{note: "n"}}
data:
  replicas: "${{N}}"
---
apiVersion: v1
kind: Secret
metadata:
  name: creds
  namespace: {ns}
stringData:
  password: s3cret
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: defaulted
data: {{k: v}}
"""


@pytest.mark.cluster
def test_render_shared_between_clusters_is_never_mutated(tmp_path: Path, cluster_pool: ClusterPool) -> None:
    ns = unique("shared-render")
    repo = make_repo(tmp_path, {"app/objects.yaml": CONFIG_MAPS.format(ns=ns)})
    config = write_config(
        tmp_path,
        repo,
        {"pool-a": cluster_pool["pool-a"], "pool-b": cluster_pool["pool-b"]},
        paths={"pool-a": ["app"], "pool-b": ["app"]},
        defaults=f'default_namespace = "{ns}"',
        cluster_extra='vars = { N = "2" }',
    )
    agent = Agent(config)
    try:
        reconcilers = agent.fleet.reconcilers
        assert reconcilers["pool-a"].render_cache is reconcilers["pool-b"].render_cache
        for _ in range(2):  # the apply pass, then a pass served from the shared cache
            results = agent.reconcile()
            assert all(r.ok for r in results.values()), {n: r.error for n, r in results.items()}
        revision = agent.revision()
        a, b = (reconcilers[n].render(revision) for n in ("pool-a", "pool-b"))
        assert a.objects is b.objects and (a.cluster, b.cluster) == ("pool-a", "pool-b")
        fresh = render(revision.tree, RenderSpec("x", ("app",), {"N": "2"}), revision=revision.sha)
        assert [o.manifest for o in a.objects] == [o.manifest for o in fresh.objects]
    finally:
        agent.close()
        for name in ("pool-a", "pool-b"):
            kubectl(cluster_pool[name].kubeconfig, "delete", "namespace", ns, "--wait=false", check=False)
