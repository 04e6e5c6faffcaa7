"""The charts an app fetches from a repository, as the pass and the daemon's polls see them.

``ChartPolls.attach`` runs after a source's poll (``run.polling``): the charts of the apps on
that source are fetched (``source.charts``, with the render's bounded YAML loader for
``index.yaml``) and pinned on the source's revision, so a newly published version the
constraint allows is a new revision of those apps (``Revision.of_app``). A chart whose
``dependencies`` are not all vendored (fetched, or a directory in the app's Git checkout) is
built with them in the cache (``source.chart_deps``) and pinned too, so a chart in Git pins when
its dependencies come from repositories. ``chart_refusal`` is the pass's check before a render:
an app whose chart could not be fetched fails closed with reason ``chart``, nothing applied or
pruned; ``with_charts`` points a render spec at what was pinned.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import structlog

from agent.config.types import AppConfig, Config, HelmSettings
from agent.errors import ChartError
from agent.model import ChartPin, Revision
from agent.reconcile.apps import cluster_apps
from agent.render.renderer import RenderSpec
from agent.render.tools import load_chart_yaml
from agent.source import chart_cache
from agent.source.chart_deps import DependencyBuilder, pin_of
from agent.source.charts import ChartFetcher, Polled

__all__ = ["ChartPolls", "chart_key", "chart_refusal", "fetch_chart", "of_app", "with_charts", "with_pin"]

log = structlog.get_logger("agent.reconcile.charts")


def chart_key(helm: HelmSettings) -> tuple[str, str, str]:
    """The pin's key: (repository, chart, constraint); ("", directory, "") for a chart in Git."""
    return (helm.repository, helm.chart, helm.version if helm.repository else "")


def of_app(revision: Revision, app: AppConfig) -> str:
    """What ``app`` renders at ``revision``: the commit, and its chart's pin if it has one."""
    helm = app.helm
    return revision.of_app(*chart_key(helm)) if helm is not None and helm.chart else revision.sha


def with_charts(spec: RenderSpec, app: AppConfig, revision: Revision) -> RenderSpec:
    """``spec`` rendering the chart ``revision`` pinned for ``app``: a repository's (its
    directory in the cache), or a chart in Git built with its dependencies."""
    helm = app.helm
    return with_pin(spec, app, revision.chart(*chart_key(helm)) if helm is not None and helm.chart else None)


def with_pin(spec: RenderSpec, app: AppConfig, pin: ChartPin | None) -> RenderSpec:
    """``spec`` rendering ``app``'s chart as ``pin`` has it (``None``, or one that failed: a
    repository chart has no directory, a chart in Git renders from the checkout)."""
    good = pin.directory if pin is not None and pin.version and not pin.error else None
    if app.helm is not None and app.helm.repository:
        return replace(spec, chart_dir=good)
    return replace(spec, chart_built=good) if good is not None else spec


def fetch_chart(config: Config, app: AppConfig, tree: Path) -> ChartPin | None:
    """``app``'s chart as a poll would pin it, fetched now for a checkout at ``tree`` (a render
    of a local directory has no source poll to pin it): its repository chart, or its chart in
    ``tree`` built with its dependencies; ``None`` when it has neither. A failure is a pin with
    ``error`` set."""
    if app.helm is None or not app.helm.chart:
        return None
    return ChartPolls(config).attach_helm([app.helm], Revision("", "", tree)).chart(*chart_key(app.helm))


def chart_refusal(app: AppConfig, revision: Revision) -> tuple[str, str] | None:
    """Why ``app`` may not render at ``revision`` (its chart or a dependency was not fetched),
    and the last good pin's name ("": none); ``None`` when it may."""
    helm = app.helm
    if helm is None or not helm.chart:
        return None
    pin = revision.chart(*chart_key(helm))
    if pin is None and not helm.repository:
        return None  # a chart in Git whose dependencies are all vendored
    if pin is not None and pin.version and not pin.error:
        return None
    wanted = f"chart {helm.chart!r} (version {helm.version or '*'!r}) from {helm.repository}"
    if not helm.repository:
        wanted = f"the dependencies of chart {helm.chart!r}"
    why = pin.error if pin is not None and pin.error else f"{wanted} was not fetched by the source's poll"
    kept = f"; {pin} stays in force" if pin is not None and pin.version else ""
    return f"{why}{kept}; nothing applied or pruned", str(pin) if pin is not None and pin.version else ""


class ChartPolls:
    """The repository charts of a config's apps, by source; one fetcher (and cache) for all."""

    def __init__(self, config: Config, *, timeout: float = 60.0, collect: bool = False) -> None:
        self.timeout = timeout
        self.config = config
        #: Collect the chart cache after each source's poll (the running agent: it alone knows
        #: every source's pins; ``source.chart_cache``).
        self.collect = collect
        #: Unused copies kept, and how long a new one is left alone (``source.chart_cache``).
        self.spare, self.min_age = chart_cache.SPARE, chart_cache.MIN_AGE
        #: Each source's current pins, for the collection.
        self._current: dict[str, tuple[ChartPin, ...]] = {}
        self._collecting = threading.Lock()
        self.fetcher = self._fetcher(config)

    def _fetcher(self, config: Config) -> ChartFetcher:
        cache = Path(config.agent.cache_dir).expanduser()
        fetcher = ChartFetcher(
            config.helm_repositories, cache, load_index=load_chart_yaml, timeout=self.timeout
        )
        self.builder = DependencyBuilder(fetcher, load_yaml=load_chart_yaml)
        #: The last good pin of each chart in Git (its key), kept in force when a build fails.
        self._built: dict[tuple[str, str, str], ChartPin] = {}
        return fetcher

    def configure(self, config: Config) -> None:
        """A reloaded config: the fetcher (its indexes, last good pins) kept unless the
        repositories' settings or the cache moved."""
        old, self.config = self.config, config
        if (old.helm_repositories, old.agent.cache_dir) != (config.helm_repositories, config.agent.cache_dir):
            self.fetcher = self._fetcher(config)

    def wanted(self, source: str) -> list[HelmSettings]:
        """The `helm` tables of the apps on ``source`` that render a chart."""
        apps = [a for c in self.config.clusters for a in cluster_apps(self.config, c)]
        return [a.helm for a in apps if a.source == source and a.helm is not None and a.helm.chart]

    def attach(self, source: str, revision: Revision) -> Revision:
        """``revision`` with the pins of the charts its apps fetch (never raises for a chart)."""
        pinned = self.attach_helm(self.wanted(source), revision)
        if self.collect:
            with self._collecting:
                self._current[source] = pinned.charts
                self._collect()
        return pinned

    def in_use(self) -> list[Path]:
        """The chart directories the apps use: each source's current pins, each chart's last good
        one (a repository's, a dependency's, a chart in Git built)."""
        pins = [p for pins in self._current.values() for p in pins]
        pins += [*self.fetcher.last_good(), *self._built.values()]
        return [p.directory for p in pins if p.version]

    def _collect(self) -> None:
        try:
            chart_cache.collect(self.fetcher.root, self.in_use(), spare=self.spare, min_age=self.min_age)
        except OSError as e:  # a cache that cannot be cleaned is not a failed poll
            log.warning("chart cache not collected", error=str(e))

    def attach_helm(self, wanted: list[HelmSettings], revision: Revision) -> Revision:
        """``revision`` with the pins of the charts of ``wanted``: each repository chart, and
        each chart whose dependencies were fetched."""
        polled: Polled = {}  # the dependencies' indexes: one request per repository this poll
        pins = [
            self._with_dependencies(p, polled) for p in self.fetcher.pins(h for h in wanted if h.repository)
        ]
        for helm in dict.fromkeys(h for h in wanted if not h.repository):
            if (pin := self._in_git(revision, helm, polled)) is not None:
                pins.append(pin)
        return replace(revision, charts=tuple(pins)) if pins else revision

    def _with_dependencies(self, pin: ChartPin, polled: Polled) -> ChartPin:
        """A fetched chart with its unvendored dependencies built in (the pin as it was if none)."""
        if pin.error or not pin.version:
            return pin
        label = f"{pin.chart}@{pin.version}"
        try:
            built = self.builder.build(pin.directory, root=pin.directory, label=label, polled=polled)
        except ChartError as e:
            log.warning(
                "chart dependencies not fetched; nothing applied or pruned", chart=label, error=str(e)
            )
            return replace(pin, error=str(e))
        if built is None:
            return pin
        return pin_of(
            built, repository=pin.repository, chart=pin.chart, constraint=pin.constraint, digest=pin.digest
        )

    def _in_git(self, revision: Revision, helm: HelmSettings, polled: Polled) -> ChartPin | None:
        """The chart in Git ``helm`` names, built with its dependencies; ``None`` when it needs
        no build (all vendored, or not a chart here: the render says what is wrong)."""
        directory = revision.tree / helm.chart.strip("/")
        key = chart_key(helm)
        inside = directory.resolve().is_relative_to(revision.tree.resolve())
        if not inside or not (directory / "Chart.yaml").is_file() or not self.builder.missing(directory):
            return None
        try:
            built = self.builder.build(
                directory, root=revision.tree, label=helm.chart.strip("/"), polled=polled
            )
        except ChartError as e:
            log.warning(
                "chart dependencies not fetched; nothing applied or pruned", chart=helm.chart, error=str(e)
            )
            last = self._built.get(key)
            return replace(last, error=str(e)) if last else ChartPin(*key, "", "", Path(), error=str(e))
        if built is None:
            return None
        pin = pin_of(built, repository="", chart=helm.chart, constraint="")
        self._built[key] = pin
        return pin
