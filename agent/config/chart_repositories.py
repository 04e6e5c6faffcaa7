"""``[[helm_repositories]]``: credentials and trust for HTTP(S) chart repositories.

Called by ``load``. An app's `[apps.helm] repository` uses the entry whose ``url`` is the
longest prefix of it (``agent.source.charts``); a repository no entry matches is read
anonymously with the system's certificate authorities.
"""

from __future__ import annotations

from typing import Any

from agent.config.tomlreader import TableReader
from agent.config.types import HelmRepository
from agent.errors import ConfigError


def helm_repositories(raw: list[Any], path: str, file: str) -> tuple[HelmRepository, ...]:
    """The entries of the array at ``path``, in order; each URL once."""
    found: list[HelmRepository] = []
    for i, table in enumerate(raw):
        r = TableReader(table, f"{path}[{i}]", file)
        entry = HelmRepository(
            url=r.setting(HelmRepository, "url", required=True).rstrip("/"),
            name=r.setting(HelmRepository, "name", ""),
            username=r.setting(HelmRepository, "username", ""),
            password_file=r.setting(HelmRepository, "password_file", ""),
            password_env=r.setting(HelmRepository, "password_env", ""),
            ca_file=r.setting(HelmRepository, "ca_file", ""),
            insecure_skip_tls_verify=r.setting(HelmRepository, "insecure_skip_tls_verify", False),
            verify=r.setting(HelmRepository, "verify", False),
            keyring_file=r.setting(HelmRepository, "keyring_file", ""),
            max_chart_bytes=r.setting(HelmRepository, "max_chart_bytes", HelmRepository.max_chart_bytes),
        )
        r.finish()
        if entry.password_file and entry.password_env:
            raise r.error("password_env", "set either password_file or password_env, not both")
        if (entry.password_file or entry.password_env) and not entry.username:
            raise r.error("username", "required with a password")
        if (twin := next((j for j, e in enumerate(found) if e.url == entry.url), None)) is not None:
            raise ConfigError(f"{path}[{i}].url", f"{entry.url!r} is {path}[{twin}] already", file=file)
        if entry.verify and not entry.keyring_file:
            raise r.error("verify", "needs keyring_file (the keys that sign the charts' .prov files)")
        if (
            entry.name
            and (twin := next((j for j, e in enumerate(found) if e.name == entry.name), None)) is not None
        ):
            raise ConfigError(f"{path}[{i}].name", f"{entry.name!r} is {path}[{twin}] already", file=file)
        found.append(entry)
    return tuple(found)
