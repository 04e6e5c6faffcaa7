"""The `helm` table of an app and `[[helm_repositories]]` as types (re-exported by ``types``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.config.chart_versions import parse_constraint
from agent.config.constraints import (
    CHART_REPO_URL,
    REPO_NAME,
    VAR_NAME,
    Parsed,
    Pattern,
    Size,
    accepts,
    declare,
)

_URL_MESSAGE = "must be an http://, https:// or oci:// URL, got {value!r}"


@dataclass(frozen=True)
class HelmSettings:
    """An app's `helm` table: a chart directory in Git, or (``repository``) a chart in an HTTP(S)
    chart repository or an OCI registry at the newest version ``version`` allows
    (docs/configuration.md)."""

    #: With ``repository``: the chart's name in it; without: a directory in the app's source.
    chart: str = ""
    release_name: str = ""
    namespace: str = ""
    #: Values files in the app's source, in order.
    values_files: tuple[str, ...] = ()
    #: An HTTP(S) chart repository (its `index.yaml` is at ``<repository>/index.yaml``), or
    #: ``oci://host/path``: the chart is the OCI repository ``path/<chart>``, one tag a version.
    repository: str = declare("", Pattern(CHART_REPO_URL, _URL_MESSAGE))
    #: A Helm version constraint (``1.2.x``, ``~1.2``, ``>=1.2, <2``, an exact version); "": the
    #: newest release (no prerelease), as ``helm pull`` picks.
    version: str = declare("", Parsed(parse_constraint))
    #: The `[apps.helm.values]` table as canonical JSON ("": none), merged after ``values_files``.
    values: str = ""


@dataclass(frozen=True)
class HelmRepository:
    """A `[[helm_repositories]]` entry: how to reach the chart repositories its ``url`` prefixes."""

    url: str = field(metadata=accepts(Pattern(CHART_REPO_URL, _URL_MESSAGE, optional=False)))
    #: What a chart's ``dependencies`` call this repository (``repository: "@name"`` or
    #: ``"alias:name"``, as ``helm repo add NAME`` would); "": none.
    name: str = declare("", Pattern(REPO_NAME, "not a repository name: {value!r}"))
    username: str = ""
    password_file: str = ""
    password_env: str = declare("", Pattern(VAR_NAME, "not an environment variable name: {value!r}"))
    #: PEM file of the certificate authorities trusted for this repository (besides none else).
    ca_file: str = ""
    insecure_skip_tls_verify: bool = False
    #: HTTP(S): OpenPGP public keys (a binary keyring, ``gpg --export``) that sign the charts' ``.prov``.
    keyring_file: str = ""
    #: Largest chart archive downloaded, and largest total of its unpacked files.
    max_chart_bytes: int = declare(20 << 20, Size(1 << 20))
    #: OCI: the registry speaks plain HTTP (a registry on loopback or inside the cluster network).
    plain_http: bool = False
    #: OCI: a Docker ``config.json`` whose ``auths[<host>]`` gives the credentials (instead of
    #: ``username``); read at every fetch, like ``password_file``.
    docker_config_file: str = ""
    #: Refuse a chart that is not signed, before any render: by a key of ``keyring_file`` (its
    #: ``.prov``, HTTP(S)) or by ``cosign_public_key_file`` (OCI).
    verify: bool = False
    #: OCI: PEM public key (ECDSA P-256) of `cosign sign --key`; checked offline, no transparency log.
    cosign_public_key_file: str = ""
