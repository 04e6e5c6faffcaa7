"""The ``[[clusters]]`` entries: where each cluster is reached, its variables, its own app's
``path``/``paths`` and ``helm`` table (read here for ``[[apps]]`` entries too), its settings.

Called by ``load`` (and ``app_entries`` for the keys an app shares with a cluster entry).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from agent.config.constraints import VAR_NAME
from agent.config.settings import cluster_settings
from agent.config.tomlreader import TableReader, type_name
from agent.config.types import ClusterConfig, ClusterSettings, HelmSettings
from agent.errors import ConfigError

#: A chart's name in a repository, as `helm create` and `helm repo index` allow it.
_CHART_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def clusters(top: TableReader, defaults: ClusterSettings, base_dir: Path) -> list[ClusterConfig]:
    """Every `[[clusters]]` entry, in order; at least one, names unique."""
    raw = top.get("clusters", list, required=True)
    if not raw:
        raise top.error("clusters", "at least one [[clusters]] entry is required")
    found: list[ClusterConfig] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(raw):
        c = _cluster(TableReader(table, f"clusters[{i}]", top.file), defaults, base_dir)
        if c.name in seen:
            raise ConfigError(
                f"clusters[{i}].name",
                f"duplicate cluster name {c.name!r} (also clusters[{seen[c.name]}])",
                file=top.file,
            )
        seen[c.name] = i
        found.append(c)
    return found


def _cluster(r: TableReader, base: ClusterSettings, base_dir: Path) -> ClusterConfig:
    name = r.setting(ClusterConfig, "name", required=True)
    # Without path/paths the entry only connects; [[apps]] name it (check_apps: it must serve one).
    all_paths = paths(r) or ()
    in_cluster = r.get("in_cluster", bool, False)
    kubeconfig = r.get("kubeconfig", str, "")
    context = r.get("context", str, "")
    if in_cluster and kubeconfig:
        raise r.error("kubeconfig", "set either kubeconfig or in_cluster = true, not both")
    if not in_cluster:
        if not kubeconfig:
            raise r.error("kubeconfig", "required key is missing (or set in_cluster = true)")
        kubeconfig = str((base_dir / os.path.expanduser(kubeconfig)).resolve())
    variables = entry_vars(r)
    helm_settings = helm(r, name)
    if helm_settings is not None and not all_paths and not helm_settings.repository:
        raise r.error("helm", "needs path or paths (the chart renders with this entry's own app)")
    settings = cluster_settings(r, base, base_dir)
    r.finish()
    return ClusterConfig(
        name=name,
        paths=all_paths,
        settings=settings,
        kubeconfig=kubeconfig,
        context=context,
        in_cluster=in_cluster,
        vars=variables,
        helm=helm_settings,
    )


def _repo_relative(r: TableReader, name: str, value: str) -> str:
    p = Path(value)
    if p.is_absolute() or ".." in p.parts:
        raise r.error(name, f"must be a path inside the repository, got {value!r}")
    return p.as_posix().strip("/") or "."


def paths(r: TableReader) -> tuple[str, ...] | None:
    """`path` or `paths`, repository-relative; None when neither is set."""
    path = r.get("path", str)
    many = r.string_list("paths")
    if path is not None and many is not None:
        raise r.error("paths", "set either path or paths, not both")
    if path is None and many is None:
        return None
    all_paths = tuple(
        _repo_relative(r, "path" if path is not None else "paths", p)
        for p in ([path] if path else many or [])
    )
    if not all_paths:
        raise r.error("paths", "must name at least one directory")
    return all_paths


def entry_vars(r: TableReader) -> dict[str, str]:
    """The entry's `vars` table: ``${NAME}`` values, numbers written as text."""
    vars_table = r.sub("vars")
    variables: dict[str, str] = {}
    if vars_table is not None:
        for k, v in vars_table.table.items():
            if not VAR_NAME.match(k):
                raise vars_table.error(
                    k, "variable names are letters, digits and '_', not starting with a digit"
                )
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise vars_table.error(k, f"expected string or number, got {type_name(type(v))}")
            variables[k] = str(v)
            vars_table.used.add(k)
    return variables


def helm(r: TableReader, release_name: str) -> HelmSettings | None:
    """The entry's `helm` table (a chart in the repository, or with `repository` a chart in a
    chart repository), if any."""
    h = r.sub("helm")
    if h is None:
        return None
    repository = h.setting(HelmSettings, "repository", "").rstrip("/")
    chart = h.get("chart", str, required=True)
    if repository and not _CHART_NAME.match(chart):
        raise h.error("chart", f"must be a chart's name in the repository, got {chart!r}")
    version = h.setting(HelmSettings, "version", "")
    if version and not repository:
        raise h.error("version", "needs repository (a chart in Git renders as its commit has it)")
    values = h.get("values", dict)
    settings = HelmSettings(
        chart=chart if repository else _repo_relative(h, "chart", chart),
        release_name=h.get("release_name", str, release_name),
        namespace=h.get("namespace", str, ""),
        values_files=tuple(_repo_relative(h, "values_files", v) for v in h.string_list("values_files") or ()),
        repository=repository,
        version=version.strip(),
        values=json.dumps(values, sort_keys=True, default=str) if values else "",
    )
    h.finish()
    return settings
