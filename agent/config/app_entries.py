"""The ``[[apps]]`` entries, and the implicit app of each ``[[clusters]]`` entry with a path: every
(app, cluster) of the config, in config order, each with where it was declared.

Called by ``load``; ``apps.check_apps`` then checks them together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.config.apps import Placed
from agent.config.clusters import entry_vars, helm, paths
from agent.config.conflict_rules import conflict_rules
from agent.config.health_checks import HealthCheck, health_checks
from agent.config.ignore_rules import IgnoreRule, ignore_rules
from agent.config.settings import SETTING_KEYS, cluster_settings
from agent.config.tomlreader import TableReader
from agent.config.types import (
    APP_SETTING_KEYS,
    DEFAULT_SOURCE,
    AppConfig,
    ClusterConfig,
    ConflictRule,
    NamedSource,
    implicit_app,
)
from agent.errors import ConfigError

#: `[defaults]` keys an app may not set: its cluster's, shared by all the cluster's apps.
_CLUSTER_ONLY = SETTING_KEYS - APP_SETTING_KEYS


def apps(
    top: TableReader,
    clusters: list[ClusterConfig],
    sources: tuple[NamedSource, ...],
    rules: tuple[ConflictRule, ...],
    checks: tuple[HealthCheck, ...],
    base_dir: Path,
    *,
    ignore: tuple[IgnoreRule, ...] = (),
) -> list[Placed]:
    """The implicit apps of `[[clusters]]` entries, then each `[[apps]]` entry's, in config order."""
    placed: list[Placed] = []
    has_default = sources[0].name == DEFAULT_SOURCE
    for i, c in enumerate(clusters):
        if not c.has_app:
            continue
        if not has_default:
            raise ConfigError(
                f"clusters[{i}]",
                f"its own app (path/paths) comes from the source named {DEFAULT_SOURCE!r}, and there is "
                "none: add [source], or name a [[sources]] entry default",
                file=top.file,
            )
        placed.append(Placed(implicit_app(c, rules, checks, ignore), f"clusters[{i}]"))
    by_name = {c.name: c for c in clusters}
    for i, table in enumerate(top.get("apps", list) or ()):
        entry = f"apps[{i}]"
        placed.extend(
            Placed(a, entry)
            for a in _app(
                _AppReader(table, entry, top.file), by_name, sources, rules, checks, base_dir, ignore
            )
        )
    return placed


class _AppReader(TableReader):
    """An `[[apps]]` table: of the `[defaults]` keys only ``APP_SETTING_KEYS`` exist.

    ``cluster_settings`` reads every settings key; here the cluster's own ones read as unset (so
    the app keeps the cluster's value) and stay unused, so ``finish`` rejects them.
    """

    def get(
        self, name: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False
    ) -> Any:
        if name in _CLUSTER_ONLY:
            return default
        return super().get(name, kind, default, required=required)


def _targets(r: TableReader, clusters: dict[str, ClusterConfig]) -> list[str]:
    """The clusters an entry names (`cluster` or `clusters`): known, each once."""
    one = r.get("cluster", str)
    many = r.string_list("clusters")
    if one is not None and many is not None:
        raise r.error("clusters", "set either cluster or clusters, not both")
    if one is None and many is None:
        raise r.error(
            "cluster", "required key is missing (the cluster this app goes to, or clusters = [...])"
        )
    targets = (
        [("cluster", one)] if one is not None else [(f"clusters[{i}]", c) for i, c in enumerate(many or ())]
    )
    if not targets:
        raise r.error("clusters", "must name at least one cluster")
    seen: set[str] = set()
    for key, cluster in targets:
        if cluster not in clusters:
            raise r.error(key, f"no cluster named {cluster!r} (have: {', '.join(clusters)})")
        if cluster in seen:
            raise r.error(key, f"cluster {cluster!r} is listed twice")
        seen.add(cluster)
    return [cluster for _, cluster in targets]


def _app(
    r: _AppReader,
    clusters: dict[str, ClusterConfig],
    sources: tuple[NamedSource, ...],
    rules: tuple[ConflictRule, ...],
    checks: tuple[HealthCheck, ...],
    base_dir: Path,
    ignore: tuple[IgnoreRule, ...] = (),
) -> list[AppConfig]:
    """One `[[apps]]` entry: one AppConfig per cluster it names, settings merged over each's."""
    name = r.setting(AppConfig, "name", required=True)
    targets = _targets(r, clusters)
    source = r.get("source", str, DEFAULT_SOURCE)
    if source not in {s.name for s in sources}:
        raise r.error("source", f"no source named {source!r} (have: {', '.join(s.name for s in sources)})")
    app_paths = paths(r)
    variables = entry_vars(r)
    helm_settings = helm(r, name)
    if app_paths is None and not (helm_settings and helm_settings.repository):
        raise r.error("path", "required key is missing (the directory of this app's manifests)")
    depends_on = r.string_list("depends_on") or ()
    for i, dep in enumerate(depends_on):
        if dep in depends_on[:i]:
            raise r.error("depends_on", f"{dep!r} is listed twice")
    suspend = r.get("suspend", bool, False)
    renamed_from = r.setting(AppConfig, "renamed_from", "")
    if (rules_raw := r.get("conflict_rules", list)) is not None:
        rules = conflict_rules(rules_raw, f"{r.path}.conflict_rules", r.file)
    if (checks_raw := r.get("health_checks", list)) is not None:
        checks = health_checks(checks_raw, f"{r.path}.health_checks", r.file, app=name)
    if (ignore_raw := r.get("ignore", list)) is not None:
        ignore = ignore_rules(ignore_raw, f"{r.path}.ignore", r.file)
    if cluster_only := sorted(set(r.table) & _CLUSTER_ONLY):
        raise r.error(
            cluster_only[0],
            "is the cluster's setting, shared by all its apps "
            "(set it on the [[clusters]] entry or in [defaults])",
        )
    placed = [
        AppConfig(
            name=name,
            cluster=cluster,
            paths=app_paths or (),
            settings=cluster_settings(r, clusters[cluster].settings, base_dir),
            conflict_rules=rules,
            health_checks=checks,
            source=source,
            vars={**clusters[cluster].vars, **variables},
            helm=helm_settings,
            depends_on=depends_on,
            suspend=suspend,
            renamed_from=renamed_from,
            ignore=ignore,
        )
        for cluster in targets
    ]
    r.finish()
    return placed
