"""``[[helm_repositories]]``: credentials and trust for HTTP(S) chart repositories and OCI
registries (``oci://`` URLs: also ``docker_config_file`` and cosign's ``verify``); ``verify``
with ``keyring_file`` for HTTP(S) ones (``.prov`` files); ``name`` for charts' dependencies.

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
            keyring_file=r.setting(HelmRepository, "keyring_file", ""),
            max_chart_bytes=r.setting(HelmRepository, "max_chart_bytes", HelmRepository.max_chart_bytes),
            plain_http=r.setting(HelmRepository, "plain_http", False),
            docker_config_file=r.setting(HelmRepository, "docker_config_file", ""),
            verify=r.setting(HelmRepository, "verify", False),
            cosign_public_key_file=r.setting(HelmRepository, "cosign_public_key_file", ""),
        )
        r.finish()
        _check_oci_keys(r, entry)
        if entry.password_file and entry.password_env:
            raise r.error("password_env", "set either password_file or password_env, not both")
        if (entry.password_file or entry.password_env) and not entry.username:
            raise r.error("username", "required with a password")
        if (twin := next((j for j, e in enumerate(found) if e.url == entry.url), None)) is not None:
            raise ConfigError(f"{path}[{i}].url", f"{entry.url!r} is {path}[{twin}] already", file=file)
        if (
            entry.name
            and (twin := next((j for j, e in enumerate(found) if e.name == entry.name), None)) is not None
        ):
            raise ConfigError(f"{path}[{i}].name", f"{entry.name!r} is {path}[{twin}] already", file=file)
        found.append(entry)
    return tuple(found)


def _check_oci_keys(r: TableReader, entry: HelmRepository) -> None:
    """The keys only an OCI registry has (or only an HTTP(S) one), and ``verify`` with what it
    verifies against."""
    oci = entry.url.startswith("oci://")
    for key in ("plain_http", "docker_config_file", "cosign_public_key_file"):
        if getattr(entry, key) and not oci:
            raise r.error(key, "only for an oci:// url")
    if entry.keyring_file and oci:
        raise r.error("keyring_file", "only for an http(s):// url (an oci:// one: cosign_public_key_file)")
    if entry.docker_config_file and entry.username:
        raise r.error("docker_config_file", "set either username or docker_config_file, not both")
    if entry.verify and oci and not entry.cosign_public_key_file:
        raise r.error("verify", "needs cosign_public_key_file (an oci:// url)")
    if entry.verify and not oci and not entry.keyring_file:
        raise r.error("verify", "needs keyring_file (the keys that sign the charts' .prov files)")
