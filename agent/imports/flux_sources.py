"""Flux's sources as the agent's: ``GitRepository`` → ``[[sources]]``, ``HelmRepository`` →
``[[helm_repositories]]``, ``OCIRepository`` → a note, and where an ``ExternalArtifact`` of an
``ArtifactGenerator`` puts a Git directory.

Called by ``flux``.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.imports.common import other_fields, table
from agent.imports.model import HelmRepository, Note, Source, duration, label, repo_path, unique
from agent.imports.reading import Found

_GIT_KNOWN = ("url", "ref", "interval", "timeout", "secretRef", "suspend")
_HELM_KNOWN = ("url", "type", "secretRef", "interval", "certSecretRef", "insecure")
_NO_PEER = "the agent has no equivalent"
_PLACEHOLDER_URL = "https://git.invalid/{name}.git"


def git_source(repo: Found, taken: set[str]) -> Source:
    """A ``GitRepository`` as a ``[[sources]]`` entry, named after it."""
    spec, what = repo.spec, repo.label()
    notes = other_fields(spec, _GIT_KNOWN, what, _NO_PEER)
    ref = table(spec, "ref")
    keys = {
        "branch": str(ref.get("branch", "")),
        "tag": str(ref.get("tag", "")),
        "commit": str(ref.get("commit", "")),
    }
    if ref.get("semver"):
        why = "the agent follows one branch, tag or commit, not a semver range: pin a tag"
        notes.append(Note(f"{what} spec.ref.semver {ref['semver']!r}", why))
        keys["tag"] = keys["branch"] = ""
    if ref.get("name"):
        notes.append(
            Note(f"{what} spec.ref.name {ref['name']!r}", "the agent follows a branch, tag or commit")
        )
    if keys["commit"]:
        keys["branch"] = keys["tag"] = ""
    elif keys["tag"]:
        keys["branch"] = ""
    poll = duration(spec.get("interval"))
    if spec.get("interval") and poll is None:
        notes.append(
            Note(f"{what} spec.interval {spec['interval']!r}", "it is not a duration the agent reads")
        )
    if spec.get("suspend"):
        notes.append(Note(f"{what} spec.suspend", "a source is not suspended: suspend its apps"))
    if isinstance(secret := spec.get("secretRef"), dict):
        notes.append(
            _secret_note(what, secret, repo.namespace, ssh=str(spec.get("url", "")).startswith("ssh"))
        )
    return Source(
        name=unique(label(repo.name), taken),
        url=str(spec.get("url", "")) or _PLACEHOLDER_URL.format(name=label(repo.name)),
        poll_interval=poll or "",
        notes=tuple(notes),
        **keys,
    )


def missing_source(name: str, taken: set[str]) -> Source:
    """A source for a ``GitRepository`` that is not in PATH (``flux bootstrap`` keeps its own in
    the cluster): a placeholder URL, said so."""
    why = (
        "the GitRepository is not in PATH (flux bootstrap writes it to the cluster, gotk-sync.yaml): "
        "the url is a placeholder, set it to the repository PATH was checked out from"
    )
    return Source(
        unique(label(name), taken),
        _PLACEHOLDER_URL.format(name=label(name)),
        notes=(Note(f"GitRepository {name} url", why),),
    )


def _secret_note(what: str, secret: dict[str, object], namespace: str, *, ssh: bool) -> Note:
    keys = (
        "ssh_private_key_file and ssh_known_hosts_file"
        if ssh
        else "username with password_file or password_env (or token_file/token_env)"
    )
    where = f"{namespace}/{secret.get('name')}" if namespace else str(secret.get("name"))
    return Note(
        f"{what} spec.secretRef {where}",
        f"credentials are never copied: put the Secret's values in files and set [sources.auth] {keys}",
    )


def helm_repository(repo: Found) -> HelmRepository:
    """A ``HelmRepository`` as a ``[[helm_repositories]]`` entry (``type: oci`` → ``oci://``)."""
    spec, what = repo.spec, repo.label()
    notes = other_fields(spec, _HELM_KNOWN, what, _NO_PEER)
    url = str(spec.get("url", ""))
    if spec.get("type") == "oci" and not url.startswith("oci://"):
        url = "oci://" + url.split("://", 1)[-1]
    if isinstance(secret := spec.get("secretRef"), dict):
        notes.append(
            Note(
                f"{what} spec.secretRef {secret.get('name')}",
                "credentials are never copied: set this entry's username with password_file or password_env",
            )
        )
    if isinstance(cert := spec.get("certSecretRef"), dict):
        notes.append(
            Note(f"{what} spec.certSecretRef {cert.get('name')}", "set ca_file to the CA in that Secret")
        )
    if spec.get("insecure"):
        notes.append(
            Note(
                f"{what} spec.insecure",
                "plain http:// URLs work as they are; TLS is checked unless insecure_skip_tls_verify",
            )
        )
    if spec.get("interval"):
        notes.append(Note(f"{what} spec.interval", "a chart is polled at its app's source's interval"))
    return HelmRepository(url=url, notes=tuple(notes))


#: The media type of a Helm chart's layer in an OCI artifact: the one the agent reads.
HELM_CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"


def oci_chart(repo: Found, notes: list[Note]) -> tuple[str, str, str]:
    """An ``OCIRepository`` a HelmRelease's ``chartRef`` names, as ``[apps.helm]`` spells it:
    (repository, chart, version). Its URL is the chart's own artifact (``oci://host/path/NAME``):
    the agent's repository is the path above it, the chart its last segment."""
    spec, what = repo.spec, repo.label()
    url = str(spec.get("url", "")).rstrip("/")
    repository, _, chart = url.rpartition("/")
    ref = table(spec, "ref")
    version = str(ref.get("semver") or ref.get("tag") or "")
    layer = table(spec, "layerSelector")
    if layer and layer.get("mediaType") != HELM_CHART_LAYER:
        notes.append(Note(f"{what} spec.layerSelector", "the agent takes the Helm chart layer"))
    for key in ("digest", "semverFilter"):
        if ref.get(key):
            notes.append(Note(f"{what} spec.ref.{key}", "a chart is chosen by version (semver or tag) only"))
    for key, why in (
        (
            "secretRef",
            "credentials go in a [[helm_repositories]] entry (username, password_file, docker_config_file)",
        ),
        ("verify", "set verify = true and cosign_public_key_file on a [[helm_repositories]] entry"),
        ("insecure", "set plain_http = true on a [[helm_repositories]] entry"),
        ("certSecretRef", "set ca_file on a [[helm_repositories]] entry"),
        ("provider", "cloud credentials: set docker_config_file on a [[helm_repositories]] entry"),
    ):
        if spec.get(key):
            notes.append(Note(f"{what} spec.{key}", why))
    return repository, chart, version


def oci_note(repo: Found) -> Note:
    return Note(
        f"{repo.label()} ({repo.spec.get('url', '')})",
        "OCI sources are not supported as Git sources (a chart in a registry is: [apps.helm] repository)",
    )


@dataclass(frozen=True)
class Copy:
    """One ``copy`` of an ``ArtifactGenerator`` artifact: ``@alias/<src>/**`` to ``@artifact/<dest>``."""

    repository: str
    src: str
    dest: str


def artifact_copies(generators: list[Found]) -> dict[str, list[Copy]]:
    """Artifact name → the Git directories it copies (only ``@alias/dir/**`` → ``@artifact/dir/``)."""
    found: dict[str, list[Copy]] = {}
    for g in generators:
        aliases = {
            str(s.get("alias")): str(s.get("name"))
            for s in g.spec.get("sources") or ()
            if isinstance(s, dict) and s.get("kind") == "GitRepository"
        }
        for artifact in g.spec.get("artifacts") or ():
            if not isinstance(artifact, dict):
                continue
            for c in artifact.get("copy") or ():
                src, dest = str(c.get("from", "")), str(c.get("to", ""))
                alias, _, rest = src.partition("/")
                if alias[1:] not in aliases or not rest.endswith("**") or not dest.startswith("@artifact/"):
                    continue
                copy = Copy(aliases[alias[1:]], repo_path(rest[:-2]), repo_path(dest[len("@artifact/") :]))
                found.setdefault(str(artifact.get("name")), []).append(copy)
    return found


def artifact_path(copies: list[Copy], path: str) -> tuple[str, str] | None:
    """(GitRepository name, repository directory) of ``path`` inside an artifact, if one copy holds it."""
    for c in sorted(copies, key=lambda c: -len(c.dest)):
        if c.dest == "." or path == c.dest or path.startswith(c.dest + "/"):
            rest = path if c.dest == "." else path[len(c.dest) :].lstrip("/")
            return c.repository, repo_path(f"{c.src}/{rest}")
    return None
