"""Chart dependencies fetched as `helm dependency build` would, from a real chart repository on
loopback: Chart.lock honoured when Helm's digest says it matches, stale otherwise; named
repositories; `file://` only inside the repository; every failure typed; the checkout never written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from agent.config.types import HelmRepository, HelmSettings
from agent.errors import ChartError, ChartProblem
from agent.render.binaries import tool
from agent.render.renderer import RenderSpec, render
from agent.render.tools import helm_env, load_chart_yaml
from agent.source.chart_deps import Dependency, DependencyBuilder, lock_digest
from agent.source.charts import ChartFetcher
from tests.chartrepo import ChartRepo


def builder(tmp_path: Path, *repos: HelmRepository) -> DependencyBuilder:
    fetcher = ChartFetcher(repos, tmp_path / "cache", load_index=load_chart_yaml, timeout=5)
    return DependencyBuilder(fetcher, load_yaml=load_chart_yaml)


def umbrella(tree: Path, deps: list[dict[str, object]], *, name: str = "umbrella") -> Path:
    chart = tree / "charts" / name
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    meta = {"apiVersion": "v2", "name": name, "version": "0.1.0", "dependencies": deps}
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return chart


def helm_lock(chart: Path, home: Path) -> None:
    """`helm dependency update` writes Chart.lock (and charts/, removed: Git holds only the lock)."""
    subprocess.run(
        [str(tool("helm")), "dependency", "update", str(chart)],
        check=True,
        capture_output=True,
        env=helm_env(home),
    )
    for archive in (chart / "charts").glob("*.tgz"):
        archive.unlink()


def fails(b: DependencyBuilder, chart: Path, tree: Path, label: str) -> ChartError:
    with pytest.raises(ChartError) as e:
        b.build(chart, root=tree, label=label)
    return e.value


def snapshot(tree: Path) -> dict[str, bytes]:
    return {p.relative_to(tree).as_posix(): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


def test_chart_lock_digest_is_helms_and_the_lock_is_honoured(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    for v in ("1.0.0", "1.1.0"):
        repo.publish("db", v)
    repo.publish("cache", "2.0.0")
    tree = tmp_path / "git"
    with repo.serve():
        deps: list[dict[str, object]] = [
            {"name": "db", "version": ">=1.0.0 <2", "repository": repo.url, "condition": "db.enabled"},
            {"name": "cache", "version": "2.x", "repository": f"{repo.url}/", "alias": "store"},
            {"name": "db", "version": "1.0.0", "repository": repo.url, "alias": "old", "tags": ["a"]},
        ]
        deps[2]["import-values"] = [{"parent": "b", "child": "a"}, "c"]
        chart = umbrella(tree, deps)
        helm_lock(chart, tmp_path / "home")
        lock = yaml.safe_load((chart / "Chart.lock").read_text())
        req = [Dependency.of(d) for d in deps]
        assert lock_digest(req, [Dependency.of(d) for d in lock["dependencies"]]) == lock["digest"]

        repo.publish("db", "1.2.0")  # newer than the lock: the lock still decides
        before = snapshot(tree)
        repo.log.clear()
        built = builder(tmp_path).build(chart, root=tree, label="charts/umbrella")
        assert [p for _, p, _, _ in repo.log].count("/index.yaml") == 1  # three dependencies, one index read
    assert built is not None and built.notes == ()
    assert snapshot(tree) == before  # the checkout is never written
    versions = {
        p.parent.name: yaml.safe_load(p.read_text())["version"]
        for p in built.directory.glob("charts/*/Chart.yaml")
    }
    assert versions == {"db": "1.1.0", "cache": "2.0.0", "db-1.0.0": "1.0.0"}
    assert [d.split(" ")[0] for d in built.dependencies] == ["db@1.1.0", "cache@2.0.0", "db@1.0.0"]


def test_a_stale_lock_resolves_the_constraints_and_says_so(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    for v in ("1.0.0", "1.1.0", "2.0.0"):
        repo.publish("db", v)
    tree = tmp_path / "git"
    with repo.serve():
        chart = umbrella(tree, [{"name": "db", "version": "1.0.0", "repository": repo.url}])
        helm_lock(chart, tmp_path / "home")
        umbrella(tree, [{"name": "db", "version": "2.x", "repository": repo.url}])  # edited, not locked again
        built = builder(tmp_path).build(chart, root=tree, label="charts/umbrella")
    assert built is not None
    assert yaml.safe_load((built.directory / "charts/db/Chart.yaml").read_text())["version"] == "2.0.0"
    (note,) = built.notes
    assert "charts/umbrella/Chart.lock is stale" in note


def test_named_repositories_and_file_dependencies_inside_the_repository(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("db", "1.0.0")
    tree = tmp_path / "git"
    common = umbrella(tree, [], name="common")
    with repo.serve():
        deps = [
            {"name": "db", "version": "1.x", "repository": "@stable"},
            {"name": "common", "version": "0.1.x", "repository": "file://../common"},
        ]
        chart = umbrella(tree, deps)
        named = HelmRepository(url=repo.url, name="stable")
        built = builder(tmp_path, named).build(chart, root=tree, label="charts/umbrella")
        assert built is not None
        assert sorted(p.name for p in (built.directory / "charts").iterdir()) == ["common", "db"]
        assert (built.directory / "charts/common/Chart.yaml").read_bytes() == (
            common / "Chart.yaml"
        ).read_bytes()
        unknown = fails(builder(tmp_path), chart, tree, "charts/umbrella")
        assert unknown.problem is ChartProblem.DEPENDENCY and "named 'stable'" in str(unknown)
    outside = umbrella(
        tree, [{"name": "common", "repository": f"file://{tmp_path}/elsewhere"}], name="escape"
    )
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "Chart.yaml").write_text("apiVersion: v2\nname: common\nversion: 0.1.0\n")
    e = fails(builder(tmp_path), outside, tree, "charts/escape")
    assert e.problem is ChartProblem.DEPENDENCY and "leaves the repository" in str(e)
    bare = umbrella(tree, [{"name": "lost", "version": "1.0.0"}], name="bare")
    e = fails(builder(tmp_path), bare, tree, "charts/bare")
    assert "names no repository" in str(e)


def test_a_dependency_missing_from_the_repository_fails_typed_and_vendored_ones_need_no_build(
    tmp_path: Path,
) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("db", "1.0.0")
    tree = tmp_path / "git"
    with repo.serve():
        chart = umbrella(tree, [{"name": "db", "version": "3.x", "repository": repo.url}])
        e = fails(builder(tmp_path), chart, tree, "charts/umbrella")
        assert e.problem is ChartProblem.NO_MATCH and "dependency 'db' of charts/umbrella" in str(e)
        assert e.url == repo.url and "'3.x'" in str(e)
        chart = umbrella(tree, [{"name": "gone", "version": "1.x", "repository": repo.url}])
        e = fails(builder(tmp_path), chart, tree, "charts/umbrella")
        assert e.problem is ChartProblem.INDEX
        chart = umbrella(tree, [{"name": "db", "version": "1.x", "repository": repo.url}])
        (chart / "charts" / "db").mkdir(parents=True)
        (chart / "charts" / "db" / "Chart.yaml").write_text("apiVersion: v2\nname: db\nversion: 1.0.0\n")
        assert builder(tmp_path).build(chart, root=tree, label="charts/umbrella") is None


def test_the_built_chart_renders_in_place_of_the_checkouts(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("db", "1.0.0", data="from-dependency")
    tree = tmp_path / "git"
    with repo.serve():
        chart = umbrella(tree, [{"name": "db", "version": "1.x", "repository": repo.url}])
        built = builder(tmp_path).build(chart, root=tree, label="charts/umbrella")
    assert built is not None
    helm = HelmSettings(chart="charts/umbrella", release_name="rel", namespace="ns")
    spec = RenderSpec("c", ("charts/umbrella",), helm=helm, chart_built=built.directory)
    (obj,) = render(tree, spec).objects
    assert obj.manifest["data"]["greeting"] == "from-dependency"
    with pytest.raises(Exception, match="not vendored"):  # without the build: refused as before
        render(tree, RenderSpec("c", ("charts/umbrella",), helm=helm))
    # condition and tags stay Helm's, at render time: a dependency turned off renders nothing.
    (tree / "charts/umbrella/values.yaml").write_text("db:\n  enabled: false\n")
    with repo.serve():
        umbrella(tree, [{"name": "db", "version": "1.x", "repository": repo.url, "condition": "db.enabled"}])
        off = builder(tmp_path).build(chart, root=tree, label="charts/umbrella")
    assert off is not None and (off.directory / "charts/db/Chart.yaml").is_file()  # fetched all the same
    assert (
        render(tree, RenderSpec("c", ("charts/umbrella",), helm=helm, chart_built=off.directory)).objects
        == ()
    )


def test_the_copy_follows_symlinks_inside_the_repository_only(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("db", "1.0.0")
    tree = tmp_path / "git"
    (tree / "shared").mkdir(parents=True)
    (tree / "shared" / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shared}\n")
    with repo.serve():
        chart = umbrella(tree, [{"name": "db", "version": "1.x", "repository": repo.url}])
        (chart / "templates" / "shared").symlink_to("../../../shared")
        (chart / "templates" / "again").symlink_to("shared")  # the same directory by another path
        (chart / "templates" / "loop").symlink_to("..")
        built = builder(tmp_path).build(chart, root=tree, label="charts/umbrella")
        assert built is not None
        copied = built.directory / "templates"
        assert (copied / "shared" / "cm.yaml").is_file() and (copied / "again" / "cm.yaml").is_file()
        assert not any(p.is_symlink() for p in built.directory.rglob("*"))
        (chart / "templates" / "secret").symlink_to(tmp_path / "repo")
        e = fails(builder(tmp_path), chart, tree, "charts/umbrella")
    assert e.problem is ChartProblem.DEPENDENCY and "templates/secret: symlink points outside" in str(e)


def test_a_chart_yaml_that_does_not_read_is_left_to_the_render_to_report(tmp_path: Path) -> None:
    b = builder(tmp_path)
    chart = umbrella(tmp_path / "git", [{"name": "db", "version": "1.x", "repository": "https://x"}])
    assert b.missing(chart)
    (chart / "Chart.yaml").write_text("dependencies: [unclosed\n")
    assert not b.missing(chart)  # the render fails it with file and line, as before
