"""Notification and webhook settings read from TOML: ``[[notifications]]``, ``[alerts]``,
``[receiver]`` and ``[[receivers]]``.

Called by ``agent.config.load``. Every secret (a Slack URL, an API token, an HMAC key) is named
by a ``*_file`` or ``*_env`` key and read only when the agent starts (``agent.notify.secrets``);
what each kind needs is checked here, so a sink without its token or a hook without its secret is
a ``ConfigError`` naming the key (exit 2), not a surprise at the first alert.
"""

from __future__ import annotations

import re
from dataclasses import fields
from urllib.parse import urlsplit

from agent.config.tomlreader import TableReader, parse_duration
from agent.config.types import (
    ALERT_DEFAULTS,
    RECEIVER_DEFAULTS,
    AlertSettings,
    HookConfig,
    HookKind,
    NamedSource,
    NotificationConfig,
    ReceiverSettings,
    SecretRef,
    SinkKind,
)
from agent.errors import ConfigError


def http_url(r: TableReader, name: str, value: str) -> str:
    """``value`` if it is an http(s) URL with a host, without a trailing slash; else an error."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise r.error(name, "must be an http:// or https:// URL")
    return value.rstrip("/")


def _secret(r: TableReader, prefix: str, *, plain: bool = False) -> SecretRef:
    """``<prefix>_file`` / ``<prefix>_env`` (and ``<prefix>`` itself when ``plain``): at most one."""
    file = r.get(f"{prefix}_file", str, "")
    env = r.get(f"{prefix}_env", str, "")
    value = r.get(prefix, str, "") if plain else ""
    given = [k for k, v in ((prefix, value), (f"{prefix}_file", file), (f"{prefix}_env", env)) if v]
    if len(given) > 1:
        raise r.error(given[1], f"set only one of {' and '.join(given)}")
    return SecretRef(file=file, env=env, value=value)


def _reject(r: TableReader, kind: SinkKind, *keys: str) -> None:
    for k in keys:
        if r.table.get(k) not in (None, "", False):
            raise r.error(k, f"is not used by kind = {kind.value!r}")


def _globs(r: TableReader, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = r.string_list(name)
    if value is None:
        return default
    if not value:
        raise r.error(name, 'must name at least one glob ("*": every one)')
    return value


#: Keys read as ``NotificationConfig`` declares them, with no check across keys.
_DECLARED = ("severity", "reasons", "timeout", "retries", "retry_backoff", "queue_size")


def _notification(r: TableReader, seen: dict[str, str]) -> NotificationConfig:
    name = r.setting(NotificationConfig, "name", required=True)
    if name in seen:
        raise r.error("name", f"duplicate notification {name!r} (also {seen[name]})")
    seen[name] = r.path
    kind: SinkKind = r.setting(NotificationConfig, "kind", required=True)
    d = NotificationConfig(name, kind)
    url = _secret(r, "url", plain=True)
    token = _secret(r, "token")
    secret = _secret(r, "secret")
    api_url = r.get("api_url", str, d.api_url)
    repository = r.get("repository", str, d.repository)
    timestamped = r.get("timestamped", bool, d.timestamped)
    if kind in (SinkKind.WEBHOOK, SinkKind.SLACK):
        if not url:
            raise r.error("url", f"kind = {kind.value!r} needs url, url_file or url_env")
        _reject(r, kind, "token_file", "token_env", "api_url", "repository")
        if kind is SinkKind.SLACK:
            _reject(r, kind, "secret_file", "secret_env", "timestamped")
        if url.value:
            http_url(r, "url", url.value)
        if timestamped and not secret:
            raise r.error("timestamped", "signs with the sink's secret: set secret_file or secret_env")
    else:
        if not token:
            raise r.error("token_file", f"kind = {kind.value!r} needs token_file or token_env")
        _reject(r, kind, "url", "url_file", "url_env", "secret_file", "secret_env", "timestamped")
        if api_url:
            api_url = http_url(r, "api_url", api_url)
        if repository and not re.fullmatch(r"[\w.-]+(/[\w.-]+)+|\d+", repository):
            raise r.error(
                "repository", f"must be owner/name (GitLab: group/project or an id), got {repository!r}"
            )
    cfg = NotificationConfig(
        name=name,
        kind=kind,
        url=url,
        token=token,
        secret=secret,
        api_url=api_url,
        repository=repository,
        clusters=_globs(r, "clusters", d.clusters),
        apps=_globs(r, "apps", d.apps),
        **{k: r.setting(NotificationConfig, k, getattr(d, k)) for k in _DECLARED},
        timestamped=timestamped,
    )
    r.finish()
    return cfg


def notifications(top: TableReader) -> tuple[NotificationConfig, ...]:
    seen: dict[str, str] = {}
    return tuple(
        _notification(TableReader(t, f"notifications[{i}]", top.file), seen)
        for i, t in enumerate(top.get("notifications", list) or ())
    )


def alerts(top: TableReader) -> AlertSettings:
    r = top.sub("alerts")
    if r is None:
        return ALERT_DEFAULTS
    d = ALERT_DEFAULTS
    after_failures = r.setting(AlertSettings, "after_failures", d.after_failures)
    remind = d.remind
    if (raw := r.string_list("remind")) is not None:
        steps = []
        for i, text in enumerate(raw):
            try:
                seconds = parse_duration(text)
            except ValueError as e:
                raise ConfigError(f"{r.key('remind')}[{i}]", str(e), file=r.file) from None
            if seconds < 1:
                raise ConfigError(
                    f"{r.key('remind')}[{i}]", f"must be at least 1s, got {text!r}", file=r.file
                )
            steps.append(seconds)
        remind = tuple(steps)
    cfg = AlertSettings(
        after_failures=after_failures, after=r.setting(AlertSettings, "after", d.after), remind=remind
    )
    r.finish()
    return cfg


def receiver(top: TableReader, agent_listen: str) -> ReceiverSettings:
    r = top.sub("receiver")
    if r is None:
        return RECEIVER_DEFAULTS
    d = RECEIVER_DEFAULTS
    listen = r.setting(ReceiverSettings, "listen", d.listen)
    if listen and listen.rpartition(":")[2] == agent_listen.rpartition(":")[2] and agent_listen:
        raise r.error(
            "listen", f"must not share a port with [agent] listen ({agent_listen}): it faces the Git host"
        )
    cfg = ReceiverSettings(
        listen=listen,
        **{
            f.name: r.setting(ReceiverSettings, f.name, getattr(d, f.name))
            for f in fields(d)
            if f.name != "listen"
        },
    )
    r.finish()
    return cfg


def _hook(r: TableReader, sources: tuple[NamedSource, ...], seen: dict[str, str]) -> HookConfig:
    name = r.setting(HookConfig, "name", required=True)
    if name in seen:
        raise r.error("name", f"duplicate receiver {name!r} (also {seen[name]})")
    seen[name] = r.path
    kind: HookKind = r.setting(HookConfig, "kind", required=True)
    d = HookConfig(name, kind)
    secret = _secret(r, "secret")
    if not secret:
        raise r.error("secret_file", "required: every request is verified (secret_file or secret_env)")
    previous = _secret(r, "previous_secret")
    known = {s.name for s in sources}
    wanted = r.string_list("sources") or ()
    for i, s in enumerate(wanted):
        if s not in known:
            raise ConfigError(
                f"{r.key('sources')}[{i}]",
                f"no source named {s!r} (have: {', '.join(sorted(known))})",
                file=r.file,
            )
    allow_sha1 = r.get("allow_sha1", bool, d.allow_sha1)
    if allow_sha1 and kind is not HookKind.GITHUB:
        raise r.error("allow_sha1", "only GitHub hooks have SHA-1 signatures")
    limits = {k: r.setting(HookConfig, k, getattr(d, k)) for k in ("rate_limit", "burst")}
    cfg = HookConfig(
        name=name,
        kind=kind,
        secret=secret,
        previous_secret=previous,
        sources=wanted,
        allow_sha1=allow_sha1,
        **limits,
    )
    r.finish()
    return cfg


def receivers(
    top: TableReader, sources: tuple[NamedSource, ...], settings: ReceiverSettings
) -> tuple[HookConfig, ...]:
    raw = top.get("receivers", list) or ()
    seen: dict[str, str] = {}
    hooks = tuple(
        _hook(TableReader(t, f"receivers[{i}]", top.file), sources, seen) for i, t in enumerate(raw)
    )
    if hooks and not settings.listen:
        raise top.error("receivers", "need [receiver] listen (host:port of the listener Git hosts reach)")
    return hooks
