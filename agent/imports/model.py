"""What an import found, as typed values: sources, Helm repositories, clusters and apps, each
with the notes on what could not be carried over and why.

Built by ``flux`` and ``argocd``, written out by ``toml_text``. Keys and values are the agent
config's own (``docs/configuration.md``), so writing them is spelling, not translating.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agent.config.tomlreader import parse_duration


class Tool(StrEnum):
    """The tool whose objects are read."""

    FLUX = "flux"
    ARGOCD = "argocd"


@dataclass(frozen=True)
class Note:
    """One field not carried over: which (``Kustomization flux-system/apps spec.patches``) and why."""

    what: str
    why: str

    def comment(self) -> str:
        return f"# not carried over: {self.what} because {self.why}"


@dataclass(frozen=True)
class Source:
    """A ``[[sources]]`` entry: a Git repository and the one ref it follows."""

    name: str
    url: str
    branch: str = ""
    tag: str = ""
    commit: str = ""
    poll_interval: str = ""
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class HelmRepository:
    """A ``[[helm_repositories]]`` entry (credentials are named in notes, never copied)."""

    url: str
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class Cluster:
    """A ``[[clusters]]`` entry that only says how the cluster is reached; apps name it."""

    name: str
    kubeconfig: str
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class Helm:
    """An app's ``[apps.helm]``: a chart in the app's Git source, or ``chart`` of ``repository``."""

    chart: str
    repository: str = ""
    version: str = ""
    release_name: str = ""
    namespace: str = ""
    values_files: tuple[str, ...] = ()
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Ignore:
    """An ``[[apps.ignore]]`` rule (Argo CD's ``ignoreDifferences`` entry)."""

    group: str = ""
    kind: str = ""
    name: str = ""
    namespace: str = ""
    json_pointers: tuple[str, ...] = ()
    managers: tuple[str, ...] = ()


@dataclass(frozen=True)
class App:
    """An ``[[apps]]`` entry on one cluster.

    ``settings`` holds the app settings of ``[defaults]`` that differ from what the agent would do
    anyway (``prune``, ``reconcile_interval``, ``default_namespace``, ``create_namespace``, ...),
    in the order they are written.
    """

    name: str
    cluster: str
    source: str
    origin: str
    paths: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    suspend: bool = False
    vars: Mapping[str, str] = field(default_factory=dict)
    helm: Helm | None = None
    ignore: tuple[Ignore, ...] = ()
    notes: tuple[Note, ...] = ()
    #: Why the app cannot be expressed yet (its chart's source): written commented out, so the
    #: rest of the config loads and the entry is there to finish by hand.
    unsupported: str = ""


@dataclass(frozen=True)
class Imported:
    """Everything one import found; ``notes`` are those that belong to no entry (a skipped
    object), ``warnings`` what the CLI logs (files that did not parse)."""

    tool: Tool
    sources: tuple[Source, ...] = ()
    helm_repositories: tuple[HelmRepository, ...] = ()
    clusters: tuple[Cluster, ...] = ()
    apps: tuple[App, ...] = ()
    notes: tuple[Note, ...] = ()
    warnings: tuple[str, ...] = ()


#: Where a cluster's kubeconfig goes when ``--kubeconfig`` is not given (a comment says so).
KUBECONFIG_PLACEHOLDER = "/etc/gitops-agent/{name}.kubeconfig"

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


def label(text: str) -> str:
    """``text`` as a DNS label (app, cluster and source names): lowercase, runs of anything else
    as one ``-``, at most 63 characters; ``x`` when nothing is left."""
    spelled = _NOT_LABEL.sub("-", text.lower()).strip("-")[:63].strip("-")
    return spelled or "x"


def duration(text: Any) -> str | None:
    """A Go duration (``1h``, ``10m0s``) as the agent spells it, or None when it cannot."""
    if not isinstance(text, str):
        return None
    try:
        seconds = parse_duration(text)
    except ValueError:
        return None
    if seconds <= 0:
        return None
    return text.strip()


def repo_path(path: Any) -> str:
    """A repository-relative directory (``./apps/production/`` → ``apps/production``; root ``.``)."""
    parts = [p for p in str(path or "").replace("\\", "/").split("/") if p not in ("", ".")]
    return "/".join(parts) or "."


def unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name-2``, ``name-3``, ... when taken; the result is added to ``taken``."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        suffix = f"-{n}"
        candidate = name[: 63 - len(suffix)].rstrip("-") + suffix
    taken.add(candidate)
    return candidate
