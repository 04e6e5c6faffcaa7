"""The `helm` table of an app and `[[helm_repositories]]` as types (re-exported by ``types``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.config.chart_versions import parse_constraint
from agent.config.constraints import HTTP_URL, REPO_NAME, VAR_NAME, Parsed, Pattern, Size, accepts, declare


@dataclass(frozen=True)
class HelmSettings:
    """An app's `helm` table: a chart directory in Git, or (``repository``) a chart in an HTTP(S)
    chart repository at the newest version ``version`` allows (docs/configuration.md)."""

    #: With ``repository``: the chart's name in it; without: a directory in the app's source.
    chart: str = ""
    release_name: str = ""
    namespace: str = ""
    #: Values files in the app's source, in order.
    values_files: tuple[str, ...] = ()
    #: An HTTP(S) chart repository (its `index.yaml` is at ``<repository>/index.yaml``).
    repository: str = declare("", Pattern(HTTP_URL, "must be an http:// or https:// URL, got {value!r}"))
    #: A Helm version constraint (``1.2.x``, ``~1.2``, ``>=1.2, <2``, an exact version); "": the
    #: newest release (no prerelease), as ``helm pull`` picks.
    version: str = declare("", Parsed(parse_constraint))
    #: The `[apps.helm.values]` table as canonical JSON ("": none), merged after ``values_files``.
    values: str = ""


@dataclass(frozen=True)
class HelmRepository:
    """A `[[helm_repositories]]` entry: how to reach the chart repositories its ``url`` prefixes."""

    url: str = field(
        metadata=accepts(
            Pattern(HTTP_URL, "must be an http:// or https:// URL, got {value!r}", optional=False)
        )
    )
    #: What a chart's ``dependencies`` call this repository (``repository: "@name"`` or
    #: ``"alias:name"``, as ``helm repo add NAME`` would); "": none.
    name: str = declare("", Pattern(REPO_NAME, "not a repository name: {value!r}"))
    username: str = ""
    password_file: str = ""
    password_env: str = declare("", Pattern(VAR_NAME, "not an environment variable name: {value!r}"))
    #: PEM file of the certificate authorities trusted for this repository (besides none else).
    ca_file: str = ""
    insecure_skip_tls_verify: bool = False
    #: Refuse a chart whose ``.prov`` file is missing or not signed by a key of ``keyring_file``.
    verify: bool = False
    #: OpenPGP public keys (a binary keyring, ``gpg --export``) that sign the charts' ``.prov``.
    keyring_file: str = ""
    #: Largest chart archive downloaded, and largest total of its unpacked files.
    max_chart_bytes: int = declare(20 << 20, Size(1 << 20))
