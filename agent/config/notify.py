"""Notification and webhook settings read from TOML: ``[[notifications]]``, ``[alerts]``,
``[receiver]`` and ``[[receivers]]``.

Called by ``agent.config.load``. Every secret (a Slack URL, an API token, an HMAC key) is named
by a ``*_file`` or ``*_env`` key and read only when the agent starts (``agent.notify.secrets``);
what each kind needs is checked here, so a sink without its token or a hook without its secret is
a ``ConfigError`` naming the key (exit 2), not a surprise at the first alert.
"""

from __future__ import annotations

import re
from typing import Any
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
    Severity,
    SinkKind,
    choices,
)
from agent.errors import ConfigError

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_REASON = re.compile(r"^[A-Z][A-Za-z]*$")
_LISTEN = re.compile(r"[^\s:]*:\d{1,5}")


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


def _notification(r: TableReader, seen: dict[str, str]) -> NotificationConfig:
    name = r.get("name", str, required=True)
    if not _DNS_LABEL.match(name):
        raise r.error("name", f"must be a DNS label (lowercase letters, digits, '-'), got {name!r}")
    if name in seen:
        raise r.error("name", f"duplicate notification {name!r} (also {seen[name]})")
    seen[name] = r.path
    raw_kind = r.get("kind", str, required=True)
    if raw_kind not in choices(SinkKind):
        raise r.error("kind", f"must be one of {', '.join(choices(SinkKind))}; got {raw_kind!r}")
    kind = SinkKind(raw_kind)
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
    severity = r.get("severity", str, d.severity)
    if severity not in choices(Severity):
        raise r.error("severity", f"must be one of {', '.join(choices(Severity))}; got {severity!r}")
    reasons = r.string_list("reasons") or ()
    for i, reason in enumerate(reasons):
        if not _REASON.match(reason):
            raise ConfigError(
                f"{r.key('reasons')}[{i}]", f"not a reason (CamelCase): {reason!r}", file=r.file
            )
    retries = r.get("retries", int, d.retries)
    if not 0 <= retries <= 10:
        raise r.error("retries", f"must be 0 to 10, got {retries}")
    queue_size = r.get("queue_size", int, d.queue_size)
    if queue_size < 1:
        raise r.error("queue_size", f"must be at least 1, got {queue_size}")
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
        severity=Severity(severity),
        reasons=reasons,
        timeout=r.duration("timeout", d.timeout),
        retries=retries,
        retry_backoff=r.duration("retry_backoff", d.retry_backoff),
        queue_size=queue_size,
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
    after_failures = r.get("after_failures", int, d.after_failures)
    if after_failures < 1:
        raise r.error("after_failures", f"must be at least 1, got {after_failures}")
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
        after_failures=after_failures, after=r.duration("after", d.after, minimum=0.0), remind=remind
    )
    r.finish()
    return cfg


def receiver(top: TableReader, agent_listen: str) -> ReceiverSettings:
    r = top.sub("receiver")
    if r is None:
        return RECEIVER_DEFAULTS
    d = RECEIVER_DEFAULTS
    listen = r.get("listen", str, d.listen)
    if listen and not _LISTEN.fullmatch(listen):
        raise r.error("listen", f"must be host:port (or empty to disable), got {listen!r}")
    if listen and listen.rpartition(":")[2] == agent_listen.rpartition(":")[2] and agent_listen:
        raise r.error(
            "listen", f"must not share a port with [agent] listen ({agent_listen}): it faces the Git host"
        )
    ints: dict[str, int] = {}
    for name in ("max_body_bytes", "rate_limit", "burst", "max_in_flight"):
        v = r.get(name, int, getattr(d, name))
        if v < 1:
            raise r.error(name, f"must be at least 1, got {v}")
        ints[name] = v
    cfg = ReceiverSettings(
        listen=listen,
        read_timeout=r.duration("read_timeout", d.read_timeout),
        replay_window=r.duration("replay_window", d.replay_window, minimum=1.0),
        timestamp_tolerance=r.duration("timestamp_tolerance", d.timestamp_tolerance, minimum=1.0),
        **ints,
    )
    r.finish()
    return cfg


def _hook(r: TableReader, sources: tuple[NamedSource, ...], seen: dict[str, str]) -> HookConfig:
    name = r.get("name", str, required=True)
    if not _DNS_LABEL.match(name):
        raise r.error("name", f"must be a DNS label (lowercase letters, digits, '-'), got {name!r}")
    if name in seen:
        raise r.error("name", f"duplicate receiver {name!r} (also {seen[name]})")
    seen[name] = r.path
    raw_kind = r.get("kind", str, required=True)
    if raw_kind not in choices(HookKind):
        raise r.error("kind", f"must be one of {', '.join(choices(HookKind))}; got {raw_kind!r}")
    kind = HookKind(raw_kind)
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
    ints: dict[str, Any] = {}
    for key in ("rate_limit", "burst"):
        v = r.get(key, int, getattr(d, key))
        if v < 1:
            raise r.error(key, f"must be at least 1, got {v}")
        ints[key] = v
    cfg = HookConfig(
        name=name,
        kind=kind,
        secret=secret,
        previous_secret=previous,
        sources=wanted,
        allow_sha1=allow_sha1,
        **ints,
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
