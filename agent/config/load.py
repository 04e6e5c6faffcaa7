"""Load and validate the agent's TOML configuration into the typed ``Config``.

Called by the CLI before anything touches a cluster. Every problem raises one
``ConfigError`` naming the key path (``clusters[1].kubeconfig: file not found:
...``); unknown keys are errors so that a typo never silently falls back to a
default (the defaults are the types', in ``agent.config.types``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from agent.config import notify
from agent.config.apps import Placed, check_apps
from agent.config.health_checks import HealthCheck, health_checks, wait_setting
from agent.config.listeners import listener_keys
from agent.config.tomlreader import TableReader, too_deep, type_name
from agent.config.types import (
    AGENT_DEFAULTS,
    APP_SETTING_KEYS,
    CLUSTER_DEFAULTS,
    DEFAULT_BRANCH,
    DEFAULT_CONFLICT_RULES,
    DEFAULT_SOURCE,
    MIN_RENDER_MEMORY,
    Adopt,
    AgentSettings,
    AppConfig,
    ClusterConfig,
    ClusterSettings,
    Config,
    ConflictRule,
    Decryption,
    HelmSettings,
    Leases,
    LogFormat,
    LogLevel,
    NamedSource,
    PropagationPolicy,
    SourceAuth,
    SourceConfig,
    SourceVerify,
    choices,
    implicit_app,
)
from agent.errors import ConfigError
from agent.model import parse_release

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_E = TypeVar("_E", bound=StrEnum)


def _member(r: TableReader, name: str, value: str, kind: type[_E]) -> _E:
    """``value`` as a member of ``kind``, or an error naming the key and every spelling it accepts."""
    allowed = choices(kind)
    if value not in allowed:
        listed = f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0]
        raise r.error(name, f"must be {listed}, got {value!r}")
    return kind(value)


_AGE_RECIPIENT = re.compile(r"^age1[02-9ac-hj-np-z]{58}$")


def _decryption(r: TableReader, base_dir: Path) -> Decryption:
    """A `decryption` table: it replaces the inherited one as a whole (``Decryption``)."""
    d = Decryption()
    key_file = r.get("age_key_file", str, d.age_key_file)
    if key_file:
        key_file = str((base_dir / os.path.expanduser(key_file)).resolve())
    key_env = r.get("age_key_env", str, d.age_key_env)
    if key_env and not _VAR_NAME.match(key_env):
        raise r.error("age_key_env", f"not an environment variable name: {key_env!r}")
    secret_name = r.get("secret_name", str, d.secret_name)
    if secret_name and not _DNS_SUBDOMAIN.match(secret_name):
        raise r.error("secret_name", f"not a valid Secret name: {secret_name!r}")
    secret_namespace = r.get("secret_namespace", str, d.secret_namespace)
    if secret_namespace and not _DNS_LABEL.match(secret_namespace):
        raise r.error("secret_namespace", f"not a valid namespace name: {secret_namespace!r}")
    if secret_namespace and not secret_name:
        raise r.error("secret_namespace", "needs secret_name (the Secret holding the age identities)")
    recipients = r.string_list("age_recipients") or ()
    for i, rcpt in enumerate(recipients):
        if not _AGE_RECIPIENT.match(rcpt):
            raise ConfigError(
                f"{r.key('age_recipients')}[{i}]",
                f"not an age public key (age1 and 58 bech32 characters): {rcpt!r}",
                file=r.file,
            )
    r.finish()
    return Decryption(
        age_key_file=key_file,
        age_key_env=key_env,
        secret_name=secret_name,
        secret_namespace=secret_namespace,
        age_recipients=recipients,
    )


def _settings(r: TableReader, base: ClusterSettings, base_dir: Path) -> ClusterSettings:
    s = base
    values: dict[str, Any] = {}
    if (v := r.get("field_manager", str)) is not None:
        values["field_manager"] = v
    for name in (
        "reconcile_interval",
        "connect_timeout",
        "request_timeout",
        "pass_deadline",
        "render_timeout",
        "health_timeout",
    ):
        values[name] = r.duration(name, getattr(s, name))
    values["health_debounce"] = r.duration("health_debounce", s.health_debounce, minimum=0.0)
    values["render_memory"] = r.size("render_memory", s.render_memory, minimum=MIN_RENDER_MEMORY)
    if (wait := wait_setting(r)) is not None:
        values["wait"] = wait
    for name in ("prune", "allow_empty", "substitute", "create_namespace"):
        if (v := r.get(name, bool)) is not None:
            values[name] = v
    frac = r.get("max_prune_fraction", (float, int))
    if frac is not None:
        if not 0 < frac <= 1:
            raise r.error("max_prune_fraction", f"must be in (0, 1], got {frac}")
        values["max_prune_fraction"] = float(frac)
    for name, lowest in (("brake_min_inventory", 0), ("max_prune", 0), ("concurrency", 1)):
        v = r.get(name, int)
        if v is not None:
            if v < lowest:
                raise r.error(name, f"must be at least {lowest}, got {v}")
            values[name] = v
    kind: type[StrEnum]
    for name, kind in (("adopt", Adopt), ("propagation_policy", PropagationPolicy)):
        v = r.get(name, str)
        if v is not None:
            if v not in choices(kind):
                raise r.error(name, f"must be one of {', '.join(choices(kind))}; got {v!r}")
            values[name] = kind(v)
    if (v := r.get("default_namespace", str)) is not None:
        if not _DNS_LABEL.match(v):
            raise r.error("default_namespace", f"not a valid namespace name: {v!r}")
        values["default_namespace"] = v
    if (ex := r.string_list("exclude")) is not None:
        values["exclude"] = ex
    if (dec := r.sub("decryption")) is not None:
        values["decryption"] = _decryption(dec, base_dir)
    if (v := r.get("kubernetes_version", str)) is not None:
        if v:
            try:
                parse_release(v)
            except ValueError as e:
                raise r.error("kubernetes_version", str(e)) from None
        values["kubernetes_version"] = v
    values.update(_tenancy(r))
    return replace(s, **values)


_SERVICE_ACCOUNT = re.compile(
    r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)$"
)


def _tenancy(r: TableReader) -> dict[str, Any]:
    """``service_account`` and the scope keys (``allowed_namespaces``, ``allowed_kinds``,
    ``allow_cluster_scoped``) where the table sets them."""
    values: dict[str, Any] = {}
    if (sa := r.get("service_account", str)) is not None:
        if sa and not _SERVICE_ACCOUNT.match(sa):
            raise r.error("service_account", f'must be "namespace/name" of a ServiceAccount, got {sa!r}')
        values["service_account"] = sa
    for name in ("allowed_namespaces", "allowed_kinds"):
        if (globs := r.string_list(name)) is not None:
            for i, glob in enumerate(globs):
                if not glob.strip():
                    raise r.error(f"{name}[{i}]", "must not be empty")
            values[name] = globs
    if (v := r.get("allow_cluster_scoped", bool)) is not None:
        values["allow_cluster_scoped"] = v
    return values


_SETTING_KEYS = {f.name for f in fields(ClusterSettings)}


def _repo_relative(r: TableReader, name: str, value: str) -> str:
    p = Path(value)
    if p.is_absolute() or ".." in p.parts:
        raise r.error(name, f"must be a path inside the repository, got {value!r}")
    return p.as_posix().strip("/") or "."


def _paths(r: TableReader) -> tuple[str, ...] | None:
    """`path` or `paths`, repository-relative; None when neither is set."""
    path = r.get("path", str)
    paths = r.string_list("paths")
    if path is not None and paths is not None:
        raise r.error("paths", "set either path or paths, not both")
    if path is None and paths is None:
        return None
    all_paths = tuple(
        _repo_relative(r, "path" if path is not None else "paths", p)
        for p in ([path] if path else paths or [])
    )
    if not all_paths:
        raise r.error("paths", "must name at least one directory")
    return all_paths


def _vars(r: TableReader) -> dict[str, str]:
    vars_table = r.sub("vars")
    variables: dict[str, str] = {}
    if vars_table is not None:
        for k, v in vars_table.table.items():
            if not _VAR_NAME.match(k):
                raise vars_table.error(
                    k, "variable names are letters, digits and '_', not starting with a digit"
                )
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise vars_table.error(k, f"expected string or number, got {type_name(type(v))}")
            variables[k] = str(v)
            vars_table.used.add(k)
    return variables


def _helm(r: TableReader, release_name: str) -> HelmSettings | None:
    h = r.sub("helm")
    if h is None:
        return None
    helm = HelmSettings(
        chart=_repo_relative(h, "chart", h.get("chart", str, required=True)),
        release_name=h.get("release_name", str, release_name),
        namespace=h.get("namespace", str, ""),
        values_files=tuple(_repo_relative(h, "values_files", v) for v in h.string_list("values_files") or ()),
    )
    h.finish()
    return helm


def _cluster(r: TableReader, base: ClusterSettings, base_dir: Path) -> ClusterConfig:
    name = r.get("name", str, required=True)
    if not _DNS_LABEL.match(name):
        raise r.error("name", f"must be a DNS label (lowercase letters, digits, '-'), got {name!r}")
    # Without path/paths the entry only connects; [[apps]] name it (check_apps: it must serve one).
    all_paths = _paths(r) or ()
    in_cluster = r.get("in_cluster", bool, False)
    kubeconfig = r.get("kubeconfig", str, "")
    context = r.get("context", str, "")
    if in_cluster and kubeconfig:
        raise r.error("kubeconfig", "set either kubeconfig or in_cluster = true, not both")
    if not in_cluster:
        if not kubeconfig:
            raise r.error("kubeconfig", "required key is missing (or set in_cluster = true)")
        kubeconfig = str((base_dir / os.path.expanduser(kubeconfig)).resolve())
    variables = _vars(r)
    helm = _helm(r, name)
    if helm is not None and not all_paths:
        raise r.error("helm", "needs path or paths (the chart renders with this entry's own app)")
    settings = _settings(r, base, base_dir)
    r.finish()
    return ClusterConfig(
        name=name,
        paths=all_paths,
        settings=settings,
        kubeconfig=kubeconfig,
        context=context,
        in_cluster=in_cluster,
        vars=variables,
        helm=helm,
    )


def _source(r: TableReader, base_dir: Path) -> SourceConfig:
    url = r.get("url", str, required=True)
    if not url.strip():
        raise r.error("url", "must not be empty")
    if "://" not in url and not url.startswith("git@") and not os.path.isabs(url):
        url = str((base_dir / url).resolve())
    refs = {k: r.get(k, str, "") for k in ("branch", "tag", "commit")}
    given = [k for k, v in refs.items() if v]
    if len(given) > 1:
        raise r.error(given[1], f"set only one of branch, tag, commit (got {' and '.join(given)})")
    if refs["commit"] and not re.fullmatch(r"[0-9a-f]{7,40}", refs["commit"]):
        raise r.error("commit", f"must be a hexadecimal commit SHA, got {refs['commit']!r}")
    d = SourceConfig(url=url)
    auth = d.auth
    if (a := r.sub("auth")) is not None:
        auth = SourceAuth(**{f.name: a.get(f.name, str, getattr(d.auth, f.name)) for f in fields(SourceAuth)})
        a.finish()
    verify = d.verify
    if (v := r.sub("verify")) is not None:
        verify = SourceVerify(
            **{f.name: v.get(f.name, str, getattr(d.verify, f.name)) for f in fields(SourceVerify)}
        )
        v.finish()
    keep = r.get("keep_checkouts", int, d.keep_checkouts)
    if keep < 1:
        raise r.error("keep_checkouts", f"must be at least 1, got {keep}")
    cfg = SourceConfig(
        url=url,
        branch=refs["branch"] or ("" if given else DEFAULT_BRANCH),
        tag=refs["tag"],
        commit=refs["commit"],
        poll_interval=r.duration("poll_interval", d.poll_interval, minimum=1.0),
        timeout=r.duration("timeout", d.timeout),
        shallow=r.get("shallow", bool, d.shallow),
        keep_checkouts=keep,
        auth=auth,
        verify=verify,
    )
    r.finish()
    return cfg


def _agent(r: TableReader, base_dir: Path) -> AgentSettings:
    d = AGENT_DEFAULTS
    name = r.get("name", str, d.name)
    if not _DNS_LABEL.match(name):
        raise r.error("name", f"must be a DNS label, got {name!r}")
    namespace = r.get("namespace", str, d.namespace)
    if not _DNS_LABEL.match(namespace):
        raise r.error("namespace", f"not a valid namespace name: {namespace!r}")
    log_format = _member(r, "log_format", r.get("log_format", str, d.log_format), LogFormat)
    log_level = _member(r, "log_level", r.get("log_level", str, d.log_level).lower(), LogLevel)
    listen = r.get("listen", str, d.listen)
    if listen and not re.fullmatch(r"[^\s:]*:\d{1,5}", listen):
        raise r.error("listen", f"must be host:port (or empty to disable), got {listen!r}")
    ui_token_file = r.get("ui_token_file", str, d.ui_token_file)
    if ui_token_file:
        ui_token_file = str((base_dir / os.path.expanduser(ui_token_file)).resolve())
    leases = _member(r, "leases", r.get("leases", str, d.leases), Leases)
    management = r.get("management_kubeconfig", str, d.management_kubeconfig)
    if management:
        management = str((base_dir / os.path.expanduser(management)).resolve())
    public_url = r.get("public_url", str, d.public_url)
    if public_url:
        public_url = notify.http_url(r, "public_url", public_url)
    lease_namespace = r.get("lease_namespace", str, d.lease_namespace)
    if lease_namespace and not _DNS_LABEL.match(lease_namespace):
        raise r.error("lease_namespace", f"not a valid namespace name: {lease_namespace!r}")
    timings: dict[str, Any] = {
        name: r.duration(name, getattr(d, name), minimum=minimum)
        for name, minimum in (
            ("lease_duration", 1.0),
            ("renew_deadline", 0.001),
            ("retry_period", 0.001),
            ("shutdown_grace", 0.0),
            ("stuck_after", 1.0),
            ("backoff_base", 0.001),
            ("backoff_cap", 0.001),
            ("reload_interval", 0.0),
            ("sync_interval", 0.0),
        )
    }
    if not timings["retry_period"] < timings["renew_deadline"] < timings["lease_duration"]:
        raise r.error("renew_deadline", "leases need retry_period < renew_deadline < lease_duration")
    if timings["backoff_cap"] < timings["backoff_base"]:
        raise r.error("backoff_cap", "must be at least backoff_base")
    cfg = AgentSettings(
        name=name,
        namespace=namespace,
        cache_dir=r.get("cache_dir", str, d.cache_dir),
        log_format=log_format,
        log_level=log_level,
        listen=listen,
        ui_token_file=ui_token_file,
        leases=leases,
        management_kubeconfig=management,
        management_context=r.get("management_context", str, d.management_context),
        lease_namespace=lease_namespace,
        replica_id=r.get("replica_id", str, d.replica_id),
        public_url=public_url,
        **timings,
        **listener_keys(r, d),
    )
    r.finish()
    return cfg


def _conflict_rule(r: TableReader) -> ConflictRule:
    manager = r.get("manager", str, required=True)
    action = r.get("action", str, required=True)
    if action not in ("force", "yield"):
        raise r.error("action", f"must be force or yield, got {action!r}")
    operation = r.get("operation", str, "*")
    if operation not in ("*", "Apply", "Update"):
        raise r.error("operation", f"must be Apply, Update or *, got {operation!r}")
    rule = ConflictRule(
        manager=manager, action=action, operation=operation, subresource=r.get("subresource", str, "*")
    )
    r.finish()
    return rule


def _sources(top: TableReader, base_dir: Path) -> tuple[NamedSource, ...]:
    """`[source]` (named `default`) and the `[[sources]]` entries; at least one, names unique."""
    found: list[NamedSource] = []
    where: dict[str, str] = {}
    if (s := top.sub("source")) is not None:
        found.append(NamedSource(DEFAULT_SOURCE, _source(s, base_dir)))
        where[DEFAULT_SOURCE] = "[source]"
    for i, table in enumerate(top.get("sources", list) or ()):
        r = TableReader(table, f"sources[{i}]", top.file)
        name = r.get("name", str, required=True)
        if not _DNS_LABEL.match(name):
            raise r.error("name", f"must be a DNS label (lowercase letters, digits, '-'), got {name!r}")
        if name in where:
            raise r.error("name", f"duplicate source {name!r} (also {where[name]})")
        where[name] = r.path
        found.append(NamedSource(name, _source(r, base_dir)))
    if not found:
        raise top.error("source", "required table is missing ([source] with url, or [[sources]] entries)")
    return tuple(sorted(found, key=lambda s: s.name != DEFAULT_SOURCE))


class _AppReader(TableReader):
    """An `[[apps]]` table: of the `[defaults]` keys only ``APP_SETTING_KEYS`` exist.

    ``_settings`` reads every settings key; here the cluster's own ones read as unset (so the
    app keeps the cluster's value) and stay unused, so ``finish`` rejects them.
    """

    def get(
        self, name: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False
    ) -> Any:
        if name in _SETTING_KEYS - APP_SETTING_KEYS:
            return default
        return super().get(name, kind, default, required=required)


def _app(
    r: _AppReader,
    clusters: dict[str, ClusterConfig],
    sources: tuple[NamedSource, ...],
    rules: tuple[ConflictRule, ...],
    checks: tuple[HealthCheck, ...],
    base_dir: Path,
) -> list[AppConfig]:
    """One `[[apps]]` entry: one AppConfig per cluster it names, settings merged over each's."""
    name = r.get("name", str, required=True)
    if not _DNS_LABEL.match(name):
        raise r.error("name", f"must be a DNS label (lowercase letters, digits, '-'), got {name!r}")
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
    source = r.get("source", str, DEFAULT_SOURCE)
    if source not in {s.name for s in sources}:
        raise r.error("source", f"no source named {source!r} (have: {', '.join(s.name for s in sources)})")
    paths = _paths(r)
    if paths is None:
        raise r.error("path", "required key is missing (the directory of this app's manifests)")
    variables = _vars(r)
    helm = _helm(r, name)
    depends_on = r.string_list("depends_on") or ()
    for i, dep in enumerate(depends_on):
        if dep in depends_on[:i]:
            raise r.error("depends_on", f"{dep!r} is listed twice")
    suspend = r.get("suspend", bool, False)
    renamed_from = r.get("renamed_from", str, "")
    if renamed_from and not _DNS_LABEL.match(renamed_from):
        raise r.error("renamed_from", f"must be a DNS label (an app's name), got {renamed_from!r}")
    if (rules_raw := r.get("conflict_rules", list)) is not None:
        rules = tuple(
            _conflict_rule(TableReader(t, f"{r.path}.conflict_rules[{i}]", r.file))
            for i, t in enumerate(rules_raw)
        )
    if (checks_raw := r.get("health_checks", list)) is not None:
        checks = health_checks(checks_raw, f"{r.path}.health_checks", r.file, app=name)
    if cluster_only := sorted(set(r.table) & (_SETTING_KEYS - APP_SETTING_KEYS)):
        raise r.error(
            cluster_only[0],
            "is the cluster's setting, shared by all its apps "
            "(set it on the [[clusters]] entry or in [defaults])",
        )
    apps = [
        AppConfig(
            name=name,
            cluster=cluster,
            paths=paths,
            settings=_settings(r, clusters[cluster].settings, base_dir),
            conflict_rules=rules,
            health_checks=checks,
            source=source,
            vars={**clusters[cluster].vars, **variables},
            helm=helm,
            depends_on=depends_on,
            suspend=suspend,
            renamed_from=renamed_from,
        )
        for _, cluster in targets
    ]
    r.finish()
    return apps


#: Arrays and inline tables a config may nest (``tomlreader.too_deep``); a config needs a few.
MAX_TOML_NESTING = 32


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, parse and validate a config file; raises ``ConfigError``."""
    file = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError("", "config file not found", file=file) from None
    except OSError as e:
        raise ConfigError("", f"cannot read config file: {e.strerror}", file=file) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("", "config file is not UTF-8 text", file=file) from None
    if (at := too_deep(text, MAX_TOML_NESTING)) is not None:
        where = f"(at line {at[0]}, column {at[1]})"
        message = (
            f"invalid TOML: arrays or inline tables nested more than {MAX_TOML_NESTING} levels deep {where}"
        )
        raise ConfigError("", message, file=file)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("", f"invalid TOML: {e}", file=file) from None
    return parse_config(data, file=file, base_dir=Path(path).resolve().parent)


def parse_config(data: dict[str, Any], *, file: str = "", base_dir: Path | None = None) -> Config:
    base_dir = base_dir or Path.cwd()
    top = TableReader(data, "", file)
    agent_table = top.sub("agent")
    agent = _agent(agent_table, base_dir) if agent_table else AGENT_DEFAULTS
    sources = _sources(top, base_dir)
    defaults = CLUSTER_DEFAULTS
    if (d := top.sub("defaults")) is not None:
        defaults = _settings(d, defaults, base_dir)
        d.finish()
    clusters_raw = top.get("clusters", list, required=True)
    if not clusters_raw:
        raise top.error("clusters", "at least one [[clusters]] entry is required")
    clusters: list[ClusterConfig] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(clusters_raw):
        c = _cluster(TableReader(table, f"clusters[{i}]", file), defaults, base_dir)
        if c.name in seen:
            raise ConfigError(
                f"clusters[{i}].name",
                f"duplicate cluster name {c.name!r} (also clusters[{seen[c.name]}])",
                file=file,
            )
        seen[c.name] = i
        clusters.append(c)
    rules = DEFAULT_CONFLICT_RULES
    rules_raw = top.get("conflict_rules", list)
    if rules_raw is not None:
        rules = tuple(
            _conflict_rule(TableReader(t, f"conflict_rules[{i}]", file)) for i, t in enumerate(rules_raw)
        )
    checks = health_checks(top.get("health_checks", list) or [], "health_checks", file)
    apps = _apps(top, clusters, sources, rules, checks, base_dir)
    sinks = notify.notifications(top)
    alert_settings = notify.alerts(top)
    receiver = notify.receiver(top, agent.listen)
    hooks = notify.receivers(top, sources, receiver)
    # Before the apps are checked together: `[[app]]` is a typo, not a cluster serving no app.
    top.finish()
    check_apps(apps, clusters, file=file)
    return Config(
        agent=agent,
        source=sources[0].config,
        clusters=tuple(clusters),
        conflict_rules=rules,
        health_checks=checks,
        file=file,
        sources=sources,
        apps=tuple(p.app for p in apps),
        notifications=sinks,
        alerts=alert_settings,
        receiver=receiver,
        receivers=hooks,
    )


def _apps(
    top: TableReader,
    clusters: list[ClusterConfig],
    sources: tuple[NamedSource, ...],
    rules: tuple[ConflictRule, ...],
    checks: tuple[HealthCheck, ...],
    base_dir: Path,
) -> list[Placed]:
    """The implicit apps of `[[clusters]]` entries, then each `[[apps]]` entry's, in config order."""
    placed: list[Placed] = []
    has_default = sources[0].name == DEFAULT_SOURCE
    for i, c in enumerate(clusters):
        if not c.paths:
            continue
        if not has_default:
            raise ConfigError(
                f"clusters[{i}]",
                f"its own app (path/paths) comes from the source named {DEFAULT_SOURCE!r}, and there is "
                "none: add [source], or name a [[sources]] entry default",
                file=top.file,
            )
        placed.append(Placed(implicit_app(c, rules, checks), f"clusters[{i}]"))
    by_name = {c.name: c for c in clusters}
    for i, table in enumerate(top.get("apps", list) or ()):
        entry = f"apps[{i}]"
        placed.extend(
            Placed(a, entry)
            for a in _app(_AppReader(table, entry, top.file), by_name, sources, rules, checks, base_dir)
        )
    return placed


def check_access(config: Config, clusters: Iterable[str] | None = None, *, management: bool = True) -> None:
    """The files a command needs to reach clusters exist; raises ``ConfigError`` naming the key.

    Checks the kubeconfig of each cluster in ``clusters`` (all when None) and, with
    ``management``, ``[agent] management_kubeconfig``. Kept out of ``load_config`` so
    that commands that never connect (``render``, ``diff --offline``) work with the
    production config on a machine without these files, such as a CI runner.
    """
    wanted = None if clusters is None else set(clusters)
    for i, c in enumerate(config.clusters):
        if (wanted is None or c.name in wanted) and not c.in_cluster and not os.path.isfile(c.kubeconfig):
            raise ConfigError(
                f"clusters[{i}].kubeconfig", f"file not found: {c.kubeconfig}", file=config.file
            )
    path = config.agent.management_kubeconfig
    if management and path and not os.path.isfile(path):
        raise ConfigError("agent.management_kubeconfig", f"file not found: {path}", file=config.file)


def setting_keys() -> set[str]:
    """Keys a `[defaults]` table accepts (used by the docs test)."""
    return set(_SETTING_KEYS)
