"""Renders kept and shared between clusters (``RenderCache`` in ``agent/render/renderer.py``, ``Fleet``).

The cache must serve a drift-only pass without rendering again, keep neither failures nor
renders without a revision, share a render between clusters only when its output cannot
depend on the cluster, bound what it keeps, and render once for concurrent askers. The
last test runs two real pool clusters off one shared render.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.config.types import HelmSettings
from agent.errors import RenderError
from agent.model import DesiredObject, DesiredSet
from agent.render import renderer as render_module
from agent.render.binaries import tool
from agent.render.renderer import RenderCache, RenderSpec, render
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool

FIXTURES = Path(__file__).parent / "fixtures" / "render"
PLAIN_VARS = {"NAMESPACE": "shop", "WEB_REPLICAS": "3", "NGINX_TAG": "1.27"}


def test_clusters_preparing_one_render_alike_share_the_prepared_objects(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "plain", tmp_path / "plain")
    cache = RenderCache()
    a = cache.render(tmp_path, RenderSpec("a", ("plain",), PLAIN_VARS), revision="abc123")
    b = cache.render(tmp_path, RenderSpec("b", ("plain",), PLAIN_VARS), revision="abc123")
    assert a.objects is b.objects
    built: list[int] = []

    def build() -> list[DesiredObject]:
        built.append(1)
        return [DesiredObject(dict(o.manifest), o.provenance) for o in a.objects]

    pa, pb = cache.prepared(a, ("set", "ns"), build), cache.prepared(b, ("set", "ns"), build)
    assert len(built) == 1 and all(x is y for x, y in zip(pa, pb, strict=True))
    other = cache.prepared(b, ("set", "elsewhere"), build)  # another token: prepared apart
    assert len(built) == 2 and not set(map(id, other)) & set(map(id, pa))
    alone = render(tmp_path, RenderSpec("c", ("plain",), PLAIN_VARS))  # not in the cache: never kept
    cache.prepared(alone, ("set", "ns"), build)
    cache.prepared(alone, ("set", "ns"), build)
    assert len(built) == 4


def test_cache_serves_a_drift_only_pass_without_rendering_again(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "plain", tmp_path / "plain")
    cache = RenderCache()
    spec = RenderSpec("prod", ("plain",), PLAIN_VARS)
    first = cache.render(tmp_path, spec, revision="abc123")
    shutil.rmtree(tmp_path / "plain")  # a re-render would now fail
    assert cache.render(tmp_path, spec, revision="abc123") is first
    assert cache.get("abc123", spec) is first
    with pytest.raises(RenderError):  # other vars: another key, so a real render
        cache.render(
            tmp_path, RenderSpec("prod", ("plain",), {**PLAIN_VARS, "NGINX_TAG": "2"}), revision="abc123"
        )
    with pytest.raises(RenderError):  # another commit
        cache.render(tmp_path, spec, revision="def456")


def test_cache_keeps_neither_failures_nor_renders_without_a_revision(tmp_path: Path) -> None:
    cache = RenderCache()
    spec = RenderSpec("c", ("app",), {})
    with pytest.raises(RenderError):
        cache.render(tmp_path, spec, revision="abc")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
    assert len(cache.render(tmp_path, spec, revision="abc").objects) == 1
    cache.put("", spec, cache.render(tmp_path, spec, revision=""))
    assert cache.get("", spec) is None
    assert len(cache) == 1


def test_cache_evicts_the_least_recently_used(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    cache = RenderCache(max_entries=2)
    spec = RenderSpec("c", ("app",), {})
    for rev in ("a", "b"):
        cache.render(tmp_path, spec, revision=rev)
    cache.get("a", spec)
    cache.render(tmp_path, spec, revision="c")
    assert cache.get("a", spec) is not None and cache.get("b", spec) is None and len(cache) == 2


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
    # Whether a render may be shared is the render's own data, not a table beside it.
    assert a.cluster_neutral and b.cluster_neutral and a.capabilities is b.capabilities is None


def test_a_render_that_names_a_helm_release_after_the_cluster_is_not_shared(tmp_path: Path) -> None:
    tool("helm")
    helm = HelmSettings(chart="helm/charts/web", values_files=("helm/clusters/staging/values.yaml",))
    cache = RenderCache()
    staging = cache.render(FIXTURES, RenderSpec("staging", ("plain/infra",), {}, helm=helm), revision="r")
    other = cache.render(FIXTURES, RenderSpec("other", ("plain/infra",), {}, helm=helm), revision="r")
    assert other.objects is not staging.objects and len(cache) == 2
    assert not staging.cluster_neutral and not other.cluster_neutral
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
    rendering, finish = threading.Event(), threading.Event()

    def held_render(tree: Path, spec: RenderSpec, **kw: Any) -> DesiredSet:
        calls.append(spec.cluster)
        rendering.set()
        assert finish.wait(30), "the test never let the render finish"
        return render(tree, spec, **kw)

    monkeypatch.setattr(render_module, "render", held_render)
    cache = RenderCache()
    missed = {n: threading.Event() for n in ("b", "c")}
    lookup = cache.get

    def get(revision: str, spec: RenderSpec) -> DesiredSet | None:
        found = lookup(revision, spec)
        if found is None and spec.cluster in missed:
            missed[spec.cluster].set()
        return found

    monkeypatch.setattr(cache, "get", get)
    out: dict[str, DesiredSet] = {}

    def ask(cluster: str) -> None:
        out[cluster] = cache.render(tree, RenderSpec(cluster, ("plain",), PLAIN_VARS), revision="r")

    threads = [threading.Thread(target=ask, args=("a",))]
    threads[0].start()
    assert rendering.wait(30), "the first cluster never started rendering"
    threads += [threading.Thread(target=ask, args=(n,)) for n in missed]
    for t in threads[1:]:
        t.start()
    # The others asked and found no entry while the first render ran: they wait for it, not render.
    for n, event in missed.items():
        assert event.wait(30), f"cluster {n} never asked for the render"
    finish.set()
    for t in threads:
        t.join(30)
    assert calls == ["a"]
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
def test_render_shared_between_clusters_is_never_mutated(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("shared-render")
    repo = make_repo(tmp_path, {"app/objects.yaml": CONFIG_MAPS.format(ns=ns)})
    config = write_config(
        tmp_path,
        repo,
        {"pool-a": cluster_pool["pool-a"], "pool-b": cluster_pool["pool-b"]},
        paths={"pool-a": ["app"], "pool-b": ["app"]},
        defaults=f'default_namespace = "{ns}"',
        cluster_extra='vars = { N = "2" }',
    )
    agent = e2e.agent(config)
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
    # Prepared (label, namespaces) alike, the two clusters hold one copy of the objects too.
    ra, rb = reconcilers["pool-a"], reconcilers["pool-b"]
    inventory_id = ra.store_for(ra.parent_of("pool-a")).id
    pa, pb = ra.prepare(a, inventory_id), rb.prepare(b, inventory_id)
    assert pa and all(x is y for x, y in zip(pa, pb, strict=True))
    assert not set(map(id, rb.prepare(b, "another-set"))) & set(map(id, pb))
