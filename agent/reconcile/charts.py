"""The charts an app fetches from a repository, as the pass and the daemon's polls see them.

``ChartPolls.attach`` runs after a source's poll (``run.polling``): the charts of the apps on
that source are fetched (``source.charts``, with the render's bounded YAML loader for
``index.yaml``) and pinned on the source's revision, so a newly published version the
constraint allows is a new revision of those apps (``Revision.of_app``). ``chart_refusal`` is
the pass's check before a render: an app whose chart could not be fetched fails closed with
reason ``chart``, nothing applied or pruned.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from agent.config.types import AppConfig, Config, HelmSettings
from agent.model import ChartPin, Revision
from agent.reconcile.apps import cluster_apps
from agent.render.tools import load_chart_yaml
from agent.source.charts import ChartFetcher

__all__ = ["ChartPolls", "chart_key", "chart_refusal", "fetch_chart", "of_app"]


def chart_key(helm: HelmSettings) -> tuple[str, str, str]:
    return (helm.repository, helm.chart, helm.version)


def of_app(revision: Revision, app: AppConfig) -> str:
    """What ``app`` renders at ``revision``: the commit, and its repository chart's pin."""
    helm = app.helm
    return revision.of_app(*chart_key(helm)) if helm is not None and helm.repository else revision.sha


def chart_refusal(app: AppConfig, revision: Revision) -> tuple[str, str] | None:
    """Why ``app`` may not render at ``revision`` (its chart was not fetched), and the last good
    pin's name ("": none); ``None`` when it may."""
    helm = app.helm
    if helm is None or not helm.repository:
        return None
    pin = revision.chart(*chart_key(helm))
    if pin is not None and pin.version and not pin.error:
        return None
    wanted = f"chart {helm.chart!r} (version {helm.version or '*'!r}) from {helm.repository}"
    why = pin.error if pin is not None and pin.error else f"{wanted} was not fetched by the source's poll"
    kept = f"; {pin} stays in force" if pin is not None and pin.version else ""
    return f"{why}{kept}; nothing applied or pruned", str(pin) if pin is not None and pin.version else ""


def fetch_chart(config: Config, app: AppConfig) -> ChartPin | None:
    """``app``'s repository chart fetched now (a render of a local checkout has no source poll to
    pin it); ``None`` for an app without one. A failed fetch is a pin with ``error`` set."""
    if app.helm is None or not app.helm.repository:
        return None
    (pin,) = ChartPolls(config).fetcher.pins([app.helm])
    return pin


class ChartPolls:
    """The repository charts of a config's apps, by source; one fetcher (and cache) for all."""

    def __init__(self, config: Config, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.config = config
        self.fetcher = self._fetcher(config)

    def _fetcher(self, config: Config) -> ChartFetcher:
        cache = Path(config.agent.cache_dir).expanduser()
        return ChartFetcher(config.helm_repositories, cache, load_index=load_chart_yaml, timeout=self.timeout)

    def configure(self, config: Config) -> None:
        """A reloaded config: the fetcher (its indexes, last good pins) kept unless the
        repositories' settings or the cache moved."""
        old, self.config = self.config, config
        if (old.helm_repositories, old.agent.cache_dir) != (config.helm_repositories, config.agent.cache_dir):
            self.fetcher = self._fetcher(config)

    def wanted(self, source: str) -> list[HelmSettings]:
        """The `helm` tables of the apps on ``source`` that name a repository."""
        apps = [a for c in self.config.clusters for a in cluster_apps(self.config, c)]
        return [a.helm for a in apps if a.source == source and a.helm is not None and a.helm.repository]

    def attach(self, source: str, revision: Revision) -> Revision:
        """``revision`` with the pins of the charts its apps fetch (never raises for a chart)."""
        wanted = self.wanted(source)
        return replace(revision, charts=self.fetcher.pins(wanted)) if wanted else revision
