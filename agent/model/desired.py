"""What Git declares: ``Revision`` (source), ``DesiredSet`` of ``DesiredObject`` (render).

A render also says what Helm was told about the cluster (``Capabilities``) and whether it
used the cluster at all, so the render cache knows which clusters may share it.

With where each object came from (``Provenance``) and why an encrypted file did not
decrypt (``DecryptFault``).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from agent.model.keys import Manifest, ObjectKey


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a desired object came from: repository-relative file, document index (from 0), line."""

    file: str
    document: int = 0
    line: int | None = None

    def __str__(self) -> str:
        where = f":{self.line}" if self.line is not None else f" (document {self.document + 1})"
        return self.file + where  # never file#N: users read a line number in it


@dataclass(frozen=True, eq=False)
class DesiredObject:
    """One object Git declares for a cluster, with where it was declared.

    ``manifest`` is never edited once the object exists (``reconcile.prepare`` builds new
    objects from copies), so its key is computed once: a pass looks it up ~10 times per object.
    """

    manifest: Manifest
    provenance: Provenance

    @functools.cached_property
    def key(self) -> ObjectKey:
        return ObjectKey.of(self.manifest)

    @property
    def api_version(self) -> str:
        return str(self.manifest.get("apiVersion", ""))


class DecryptFault(enum.StrEnum):
    """Why an encrypted (SOPS) file did not decrypt: read by tests and reports, never parsed from text."""

    #: The file is encrypted and the app has no decryption keys configured.
    NO_KEYS = "no-keys"
    #: None of the app's age identities opens the file's data key (sops exit 128).
    NO_MATCHING_KEY = "no-matching-key"
    #: The file changed after it was encrypted: its MAC does not match (sops exit 51, 24).
    MAC_MISMATCH = "mac-mismatch"
    #: An encrypted value does not authenticate: it was altered (sops exit 25).
    TAMPERED = "tampered"
    #: Not a file sops can read (no MAC, broken metadata, mixed documents...).
    MALFORMED = "malformed"
    #: Rendered output carries ciphertext that no encrypted file of the repository explains.
    UNRESOLVED = "unresolved"
    #: The pinned sops could not run (missing, timed out, output over the limit).
    TOOL = "tool"
    #: The file names key services other than age (KMS, Vault, PGP...): a render reaches none.
    KEY_SERVICE = "key-service"


@dataclass(frozen=True)
class EncryptedSource:
    """A SOPS-encrypted repository file a render read, and the age recipients it is encrypted to."""

    file: str
    recipients: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What ``helm template`` is told about the cluster a chart goes to: its version
    (``.Capabilities.KubeVersion``) and what it serves (``.Capabilities.APIVersions``), so a
    chart that chooses its apiVersions picks the ones that cluster serves."""

    kube_version: str = ""
    #: ``group/version`` and ``group/version/Kind`` entries (``--api-versions``).
    api_versions: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class DesiredSet:
    """A cluster's complete render. Only a render without error produces one."""

    cluster: str
    revision: str
    objects: tuple[DesiredObject, ...]
    #: The SOPS-encrypted files the objects came from (``diff --offline`` checks their recipients).
    encrypted: tuple[EncryptedSource, ...] = ()
    #: Rendered without decrypting (``diff --offline``): encrypted values are ciphertext, so
    #: this set is for reports only and ``prepare`` refuses to send it anywhere.
    sealed: bool = False
    #: What Helm was told about the cluster (``None``: no chart, or Helm's default): a cached
    #: render holds only while the cluster still says so (``render.RenderCache``).
    capabilities: Capabilities | None = None
    #: The render used neither the cluster's name nor its capabilities: clusters rendering the
    #: same spec may share it.
    cluster_neutral: bool = False

    @property
    def empty(self) -> bool:
        return not self.objects

    def keys(self) -> set[ObjectKey]:
        return {o.key for o in self.objects}


@dataclass(frozen=True)
class ChartPin:
    """A chart fetched from a repository for a constraint: what the apps asking for
    (``repository``, ``chart``, ``constraint``) render, unpacked at ``directory``."""

    repository: str
    chart: str
    constraint: str
    version: str
    #: The archive's sha256 (hex), as the index gives it and as downloaded.
    digest: str
    directory: Path
    #: Why this poll's fetch failed (the fields above: the last good chart, or empty): the apps
    #: asking for it fail closed with reason ``chart``.
    error: str = ""
    #: The dependencies fetched into its ``charts/`` (``name@version (sha256:…)``), when it had
    #: unvendored ones; a pin with ``repository`` "" is a chart in Git built so.
    dependencies: tuple[str, ...] = ()
    #: What the fetch stage says about it besides (a stale ``Chart.lock``).
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.repository, self.chart, self.constraint)

    def __str__(self) -> str:
        deps = f" with {', '.join(self.dependencies)}" if self.dependencies else ""
        return f"{self.chart}@{self.version} (sha256:{self.digest[:12]}){deps}"


@dataclass(frozen=True)
class Revision:
    """A commit the source resolved and checked out; ``tree`` is read-only for later stages."""

    sha: str
    ref: str
    tree: Path
    author: str = ""
    date: datetime | None = None
    subject: str = ""
    #: The charts the apps on this source fetch from repositories, as the poll resolved them: a
    #: newly published version is a new revision of those apps, at the same commit.
    charts: tuple[ChartPin, ...] = ()

    @property
    def short(self) -> str:
        return self.sha[:12]

    def chart(self, repository: str, chart: str, constraint: str) -> ChartPin | None:
        """The pin for this (repository, chart, constraint), if the poll resolved one."""
        return next((p for p in self.charts if p.key == (repository, chart, constraint)), None)

    def of_app(self, repository: str = "", chart: str = "", constraint: str = "") -> str:
        """What an app renders at this revision, as one string: the commit, and for an app
        whose chart comes from a repository (or whose chart in Git has dependencies fetched from
        one) its ``chart@version (digest)`` (the due check and the status compare these)."""
        pin = self.chart(repository, chart, constraint) if repository or chart else None
        return f"{self.sha} {pin}" if pin is not None else self.sha
