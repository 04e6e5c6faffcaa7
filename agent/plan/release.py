"""Which Kubernetes release a render without a cluster is for (``render``, ``diff --offline``, CI).

A pass tells Helm its own cluster's version and served API versions (``ClusterStages``). With
no cluster asked, charts are rendered for ``--kubernetes-version`` if given, else the cluster's
``kubernetes_version`` (``[defaults]`` or ``[[clusters]]``), else the release the agent is
pinned to and tested against: ``KUBERNETES_VERSION`` of tools/versions.env (an installed agent,
which has no tools/, reads the same release from its API table, whose k8s.io/api version
tests/test_removed_apis.py keeps equal to the pin). Never Helm's own default (v1.20.0 in a
build without its ldflags), which fails every chart with a ``kubeVersion`` constraint.
Callers say which release was used and why (``RenderRelease.describe``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path

from agent.config.types import ClusterConfig
from agent.model import parse_release

VERSIONS_ENV = Path(__file__).resolve().parents[2] / "tools" / "versions.env"


class ReleaseSource(StrEnum):
    """Where the release a render is for came from."""

    OPTION = "option"
    CONFIG = "config"
    PINNED = "pinned"


@dataclass(frozen=True)
class RenderRelease:
    #: What ``helm template --kube-version`` is told (``v1.35.4``; ``v1.33.0`` for ``1.33``).
    kube_version: str
    source: ReleaseSource
    #: The cluster whose ``kubernetes_version`` it is (``CONFIG``).
    cluster: str = ""

    def describe(self) -> str:
        why = {
            ReleaseSource.OPTION: "--kubernetes-version",
            ReleaseSource.CONFIG: f"kubernetes_version of cluster {self.cluster!r}",
            ReleaseSource.PINNED: "KUBERNETES_VERSION of tools/versions.env: no kubernetes_version set",
        }[self.source]
        return f"Helm charts rendered for Kubernetes {self.kube_version} ({why})"


def _version(text: str) -> str:
    """``1.33`` or ``v1.33`` → ``v1.33.0``; a full ``v1.33.2`` is kept."""
    text = text.strip()
    if text.lstrip("v").count(".") >= 2:
        return text if text.startswith("v") else f"v{text}"
    major, minor = parse_release(text)
    return f"v{major}.{minor}.0"


@functools.cache
def pinned_version() -> str:
    """``KUBERNETES_VERSION`` of tools/versions.env, else the shipped API table's release."""
    if VERSIONS_ENV.is_file():
        for line in VERSIONS_ENV.read_text().splitlines():
            if line.startswith("KUBERNETES_VERSION="):
                return _version(line.split("=", 1)[1])
    table = json.loads(resources.files("agent.plan").joinpath("data/removed_apis.json").read_text("utf-8"))
    staging: str = table["k8s.io/api"]  # k8s.io/api v0.35.4 is Kubernetes v1.35.4
    return "v1." + staging.removeprefix("v").split(".", 1)[1]


def render_release(cluster: ClusterConfig | None, option: str = "") -> RenderRelease:
    """The release to render ``cluster``'s charts for when no cluster is asked."""
    if option:
        return RenderRelease(_version(option), ReleaseSource.OPTION)
    if cluster is not None and (target := cluster.settings.kubernetes_version):
        return RenderRelease(_version(target), ReleaseSource.CONFIG, cluster.name)
    return RenderRelease(pinned_version(), ReleaseSource.PINNED)
