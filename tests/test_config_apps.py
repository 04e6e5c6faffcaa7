"""Apps and named sources in the config: the implicit app, expansion, inheritance, bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.config.load import load_config
from agent.config.types import (
    DEFAULT_CONFLICT_RULES,
    AppConfig,
    ClusterSettings,
    ConflictRule,
    HelmSettings,
    NamedSource,
)
from agent.errors import ConfigError

SOURCE = """
[source]
url = "https://git.example.com/fleet.git"
"""

#: Two clusters: `a` with its own path (an implicit app), `b` only reachable.
CLUSTERS = """
[[clusters]]
name = "a"
kubeconfig = "kc"
path = "clusters/a"

[[clusters]]
name = "b"
kubeconfig = "kc"
"""

#: An app on each of `a` and `b`, so that `b` serves one.
INFRA = """
[[apps]]
name = "infra"
clusters = ["a", "b"]
path = "infra"
"""

BASE = SOURCE + CLUSTERS + INFRA


def write(tmp_path: Path, body: str) -> Path:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    p = tmp_path / "agent.toml"
    p.write_text(body)
    return p


def app(name: str, cluster: str, *lines: str) -> str:
    return "\n".join(("", "[[apps]]", f'name = "{name}"', f'cluster = "{cluster}"', 'path = "p"', *lines, ""))


# -- what a good config becomes ---------------------------------------------------------


def test_a_config_written_before_apps_is_one_implicit_app_per_cluster_entry(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            SOURCE
            + """
[defaults]
prune = false

[[clusters]]
name = "prod"
kubeconfig = "kc"
paths = ["base", "clusters/prod"]
reconcile_interval = "1m"
[clusters.vars]
REGION = "eu"
[clusters.helm]
chart = "charts/platform"

[[clusters]]
name = "mgmt"
kubeconfig = "kc"
path = "clusters/mgmt"

[[conflict_rules]]
manager = "*"
action = "yield"
""",
        )
    )
    prod, mgmt = cfg.clusters
    assert cfg.apps == (
        AppConfig(
            name="prod",
            cluster="prod",
            paths=("base", "clusters/prod"),
            settings=prod.settings,
            conflict_rules=(ConflictRule(manager="*", action="yield"),),
            source="default",
            vars={"REGION": "eu"},
            helm=HelmSettings(chart="charts/platform", release_name="prod"),
            implicit=True,
        ),
        AppConfig(
            name="mgmt",
            cluster="mgmt",
            paths=("clusters/mgmt",),
            settings=mgmt.settings,
            conflict_rules=(ConflictRule(manager="*", action="yield"),),
            implicit=True,
        ),
    )
    # Today's callers read the cluster entry; it still holds everything the implicit app does.
    assert (prod.paths, prod.vars, prod.helm) == (cfg.apps[0].paths, cfg.apps[0].vars, cfg.apps[0].helm)
    assert prod.settings == ClusterSettings(prune=False, reconcile_interval=60)
    assert cfg.sources == (NamedSource("default", cfg.source),)
    assert cfg.source.url == "https://git.example.com/fleet.git"
    assert cfg.app("prod", "prod") is cfg.apps[0]
    assert cfg.apps_of("mgmt") == (cfg.apps[1],)


def test_an_app_listing_clusters_is_one_app_on_each_after_the_implicit_apps(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE + app("web", "a", 'depends_on = ["infra"]')))
    assert [(a.name, a.cluster, a.implicit) for a in cfg.apps] == [
        ("a", "a", True),
        ("infra", "a", False),
        ("infra", "b", False),
        ("web", "a", False),
    ]
    assert [a.name for a in cfg.apps_of("a")] == ["a", "infra", "web"]
    assert [a.name for a in cfg.apps_of("b")] == ["infra"]
    assert cfg.clusters[1].paths == (), "an entry without path has no implicit app"
    infra = cfg.app("b", "infra")
    assert (infra.paths, infra.source, infra.depends_on, infra.suspend, infra.renamed_from) == (
        ("infra",),
        "default",
        (),
        False,
        "",
    )
    assert infra.conflict_rules == DEFAULT_CONFLICT_RULES
    assert cfg.app("a", "web").depends_on == ("infra",)


def test_app_settings_are_the_defaults_then_the_clusters_then_the_apps(tmp_path: Path) -> None:
    body = (
        SOURCE
        + """
[defaults]
prune = false
adopt = "never"
concurrency = 4

[[clusters]]
name = "a"
kubeconfig = "kc"
reconcile_interval = "1m"
adopt = "always"

[[clusters]]
name = "b"
kubeconfig = "kc"

[[apps]]
name = "web"
clusters = ["a", "b"]
path = "web"
allow_empty = true
render_timeout = "2m"
exclude = ["**/*.md"]
"""
    )
    cfg = load_config(write(tmp_path, body))
    on_a, on_b = cfg.app("a", "web").settings, cfg.app("b", "web").settings
    assert on_a == ClusterSettings(
        prune=False,
        adopt="always",
        concurrency=4,
        reconcile_interval=60,
        allow_empty=True,
        render_timeout=120,
        exclude=("**/*.md",),
    )
    assert on_b == ClusterSettings(
        prune=False, adopt="never", concurrency=4, allow_empty=True, render_timeout=120, exclude=("**/*.md",)
    )
    assert cfg.cluster("a").settings.allow_empty is False, "an app's setting stays the app's"


def test_app_vars_are_merged_over_the_clusters_and_helm_releases_default_to_the_app_name(
    tmp_path: Path,
) -> None:
    body = BASE.replace(
        'path = "clusters/a"', 'path = "clusters/a"\n[clusters.vars]\nREGION = "eu"\nTEAM = "ops"'
    )
    body += app("web", "a", "[apps.vars]", 'TEAM = "web"', "N = 2", "[apps.helm]", 'chart = "charts/web"')
    cfg = load_config(write(tmp_path, body))
    web = cfg.app("a", "web")
    assert web.vars == {"REGION": "eu", "TEAM": "web", "N": "2"}
    assert web.helm == HelmSettings(chart="charts/web", release_name="web")
    assert cfg.app("a", "a").vars == {"REGION": "eu", "TEAM": "ops"}


def test_an_apps_conflict_rules_replace_the_global_list_for_that_app_only(tmp_path: Path) -> None:
    body = BASE + app(
        "web",
        "a",
        "[[apps.conflict_rules]]",
        'manager = "web-operator"',
        'action = "yield"',
        "[[apps.conflict_rules]]",
        'manager = "*"',
        'operation = "Update"',
        'action = "force"',
    )
    cfg = load_config(write(tmp_path, body))
    assert cfg.app("a", "web").conflict_rules == (
        ConflictRule(manager="web-operator", action="yield"),
        ConflictRule(manager="*", operation="Update", action="force"),
    )
    assert cfg.app("a", "infra").conflict_rules == cfg.conflict_rules == DEFAULT_CONFLICT_RULES
    assert cfg.app("a", "a").conflict_rules == DEFAULT_CONFLICT_RULES


def test_apps_render_from_the_source_they_name(tmp_path: Path) -> None:
    body = (
        BASE
        + """
[[sources]]
name = "shop"
url = "https://git.example.com/shop.git"
tag = "v2"
poll_interval = "5m"
"""
        + app("shop", "a", 'source = "shop"')
    )
    cfg = load_config(write(tmp_path, body))
    assert [s.name for s in cfg.sources] == ["default", "shop"]
    shop = cfg.source_named(cfg.app("a", "shop").source)
    assert (shop.url, shop.tag, shop.branch, shop.poll_interval) == (
        "https://git.example.com/shop.git",
        "v2",
        "",
        300,
    )
    assert cfg.source_named("default") is cfg.source
    with pytest.raises(ConfigError) as err:
        cfg.source_named("nope")
    assert str(err.value) == "sources: no source named 'nope' (have: default, shop)"


def test_a_sources_entry_may_be_the_default_source(tmp_path: Path) -> None:
    body = BASE.replace(
        SOURCE,
        '\n[[sources]]\nname = "shop"\nurl = "/srv/shop"\n'
        '\n[[sources]]\nname = "default"\nurl = "/srv/fleet"\n',
    )
    cfg = load_config(write(tmp_path, body))
    assert [s.name for s in cfg.sources] == ["default", "shop"], "default first, then config order"
    assert cfg.source.url == "/srv/fleet"


def test_without_a_default_source_every_app_names_its_own(tmp_path: Path) -> None:
    body = (
        '\n[[sources]]\nname = "shop"\nurl = "/srv/shop"\n'
        + CLUSTERS.replace('path = "clusters/a"\n', "")
        + INFRA.replace('path = "infra"', 'path = "infra"\nsource = "shop"')
    )
    cfg = load_config(write(tmp_path, body))
    assert [s.name for s in cfg.sources] == ["shop"]
    assert {a.source for a in cfg.apps} == {"shop"}
    assert all(c.paths == () for c in cfg.clusters), "so callers that know no apps render nothing"


def test_an_unknown_app_is_an_error_naming_the_known_ones(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE))
    with pytest.raises(ConfigError) as err:
        cfg.app("a", "web")
    assert str(err.value) == "apps: no app named 'web' on cluster 'a' (have: a, infra)"
    with pytest.raises(ConfigError, match="no cluster named 'c'"):
        cfg.app("c", "infra")


# -- bad input: one error, naming the key path and the file --------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            BASE + app("infra", "a"),
            "apps[1].name: duplicate app 'infra' on cluster 'a' (also apps[0])",
        ),
        (
            BASE + app("a", "a"),
            "apps[1].name: duplicate app 'a' on cluster 'a' (also the implicit app of clusters[0])",
        ),
        (BASE + app("web", "c"), "apps[1].cluster: no cluster named 'c' (have: a, b)"),
        (
            BASE.replace('clusters = ["a", "b"]', 'clusters = ["a", "c"]'),
            "apps[0].clusters[1]: no cluster named 'c' (have: a, b)",
        ),
        (
            BASE.replace('clusters = ["a", "b"]', 'clusters = ["b", "b"]'),
            "apps[0].clusters[1]: cluster 'b' is listed twice",
        ),
        (
            BASE.replace('clusters = ["a", "b"]', 'clusters = ["a", "b"]\ncluster = "a"'),
            "apps[0].clusters: set either cluster or clusters, not both",
        ),
        (
            BASE.replace('clusters = ["a", "b"]', ""),
            "apps[0].cluster: required key is missing (the cluster this app goes to, or clusters = [...])",
        ),
        (
            BASE.replace('path = "infra"', ""),
            "apps[0].path: required key is missing (the directory of this app's manifests)",
        ),
        (BASE + app("web", "a", 'source = "shop"'), "apps[1].source: no source named 'shop' (have: default)"),
        (
            BASE + app("web", "a", 'depends_on = ["db"]'),
            "apps[1].depends_on: no app named 'db' on cluster 'a' (have: a, infra, web)",
        ),
        (
            BASE + app("db", "b") + app("web", "a", 'depends_on = ["infra", "db"]'),
            "apps[2].depends_on: depends_on across clusters: 'db' is an app on b, not on 'a' "
            "(apps on 'a': a, infra, web)",
        ),
        (
            BASE + app("web", "a", 'depends_on = ["infra", "infra"]'),
            "apps[1].depends_on: 'infra' is listed twice",
        ),
        (
            BASE + app("web", "a", 'depends_on = ["db"]') + app("db", "a", 'depends_on = ["web"]'),
            "apps[1].depends_on: dependency cycle on cluster 'a': web -> db -> web",
        ),
        (
            BASE
            + app("x", "b", 'depends_on = ["y"]')
            + app("y", "b", 'depends_on = ["z"]')
            + app("z", "b", 'depends_on = ["infra", "y"]'),
            "apps[2].depends_on: dependency cycle on cluster 'b': y -> z -> y",
        ),
        (
            BASE.replace('path = "infra"', 'path = "infra"\ndepends_on = ["infra"]'),
            "apps[0].depends_on: dependency cycle on cluster 'a': infra -> infra",
        ),
        (
            SOURCE + CLUSTERS + app("infra", "a"),
            "clusters[1]: serves no app: set path or paths, or name this cluster in an [[apps]] entry",
        ),
        (
            BASE + app("web", "a", 'renamed_from = "infra"'),
            "apps[1].renamed_from: 'infra' is still an app on cluster 'a' (apps[0]): an app takes over "
            "a renamed app's objects only once the old name is gone",
        ),
        (
            BASE + app("web", "a", 'renamed_from = "a"'),
            "apps[1].renamed_from: 'a' is still an app on cluster 'a' (the implicit app of clusters[0]): "
            "an app takes over a renamed app's objects only once the old name is gone",
        ),
        (
            BASE + app("web", "a", 'renamed_from = "web"'),
            "apps[1].renamed_from: is this app's own name 'web'",
        ),
        (
            BASE + app("web", "a", 'renamed_from = "old"') + app("shop", "a", 'renamed_from = "old"'),
            "apps[2].renamed_from: apps[1] on cluster 'a' is renamed from 'old' too: "
            "only one app can take over its objects",
        ),
        (
            BASE + app("web", "a", "concurrency = 2"),
            "apps[1].concurrency: is the cluster's setting, shared by all its apps "
            "(set it on the [[clusters]] entry or in [defaults])",
        ),
        (
            BASE + app("web", "a", 'depends_onn = ["infra"]'),
            "apps[1].depends_onn: unknown key (did you mean 'depends_on'?)",
        ),
        (
            # Not "clusters[1]: serves no app": the typo is what is wrong.
            SOURCE + CLUSTERS + '\n[[app]]\nname = "web"\ncluster = "b"\npath = "p"\n',
            "app: unknown key (did you mean 'apps'?)",
        ),
        (
            BASE + app("Web", "a"),
            "apps[1].name: must be a DNS label (lowercase letters, digits, '-'), got 'Web'",
        ),
        (
            BASE + app("web", "a", 'adopt = "sometimes"'),
            "apps[1].adopt: must be one of never, if-unowned, always; got 'sometimes'",
        ),
        (
            BASE + app("web", "a", "[[apps.conflict_rules]]", 'manager = "x"', 'action = "win"'),
            "apps[1].conflict_rules[0].action: must be force or yield, got 'win'",
        ),
        (
            BASE + app("web", "a", "[apps.helm]", 'chart = "../x"'),
            "apps[1].helm.chart: must be a path inside the repository, got '../x'",
        ),
        (
            BASE + '\n[[sources]]\nname = "default"\nurl = "/srv/x"\n',
            "sources[0].name: duplicate source 'default' (also [source])",
        ),
        (
            BASE + '\n[[sources]]\nname = "x"\nurl = "/srv/x"\n\n[[sources]]\nname = "x"\nurl = "/srv/y"\n',
            "sources[1].name: duplicate source 'x' (also sources[0])",
        ),
        (BASE + '\n[[sources]]\nname = "x"\n', "sources[0].url: required key is missing"),
        (
            BASE + '\n[[sources]]\nname = "x"\nurl = "/srv/x"\nbrnach = "main"\n',
            "sources[0].brnach: unknown key (did you mean 'branch'?)",
        ),
        (
            CLUSTERS + INFRA + '\n[[sources]]\nname = "shop"\nurl = "/srv/shop"\n',
            "clusters[0]: its own app (path/paths) comes from the source named 'default', and there is "
            "none: add [source], or name a [[sources]] entry default",
        ),
        (
            CLUSTERS + INFRA,
            "source: required table is missing ([source] with url, or [[sources]] entries)",
        ),
        (
            BASE.replace(
                'name = "b"\nkubeconfig = "kc"', 'name = "b"\nkubeconfig = "kc"\n[clusters.helm]\nchart = "c"'
            ),
            "clusters[1].helm: needs path or paths (the chart renders with this entry's own app)",
        ),
    ],
)
def test_bad_apps_and_sources_are_one_error_naming_the_key_and_file(
    tmp_path: Path, body: str, expected: str
) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {expected}"


def test_run_refuses_a_bad_app_with_exit_2_before_anything_is_touched(tmp_path: Path) -> None:
    """The config error comes before any Git fetch or cluster: no cache, no output."""
    cache = tmp_path / "cache"
    body = (
        f'[agent]\ncache_dir = "{cache}"\n'
        + BASE.replace('kubeconfig = "kc"', 'kubeconfig = "no-such-kubeconfig"')
        + app("web", "c")
    )
    bad = write(tmp_path, body)
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--once", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert f"{bad}: apps[1].cluster: no cluster named 'c' (have: a, b)" in out.stderr
    assert "kubeconfig" not in out.stderr, "the config was refused before any cluster was reached"
    assert out.stdout == ""
    assert not cache.exists()
