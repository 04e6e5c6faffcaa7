"""What the running agent shows of itself: the ``/status`` document and the status page's view.

``status_json`` is ``GET /status`` (what ``gitops-agent status`` prints): one row per
(cluster, app) with its Lease and the change windows that match it (writes blocked now or not),
every source's revision and error, the config error, the
Leases, notifications and receiver. ``page_snapshot`` is what the status page renders now,
and ``status_page`` builds the page with the store its records live in. Both read an
``Agent`` (``scheduler.Daemon``); they change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from agent.config.types import DEFAULT_SOURCE, Config
from agent.notify.notifier import Notifier
from agent.plan.windows import is_open
from agent.run import record_store
from agent.run.lease import LeaseManager
from agent.run.lease_settings import LeaseSettings
from agent.run.polling import SourcePoller
from agent.run.receiver import Receiver
from agent.run.status import ClusterStatus
from agent.run.statuspage import ClusterSnapshot, Snapshot, StatusPage
from agent.ui.auth import access

__all__ = ["Agent", "page_snapshot", "status_json", "status_page"]


class Agent(Protocol):
    """What the views read of the running agent (``scheduler.Daemon``)."""

    @property
    def config(self) -> Config: ...
    @property
    def leases(self) -> LeaseManager | None: ...
    @property
    def poller(self) -> SourcePoller: ...
    @property
    def notifier(self) -> Notifier | None: ...
    @property
    def receiver(self) -> Receiver | None: ...
    @property
    def config_error(self) -> str | None: ...
    @property
    def stopping(self) -> bool: ...

    def cluster_status(self) -> dict[str, ClusterStatus]: ...

    def sources_of(self, cluster: str) -> dict[str, str]: ...


def status_json(agent: Agent) -> dict[str, Any]:
    """``GET /status``. Its top-level ``revision`` is the default source's (each app's own is in
    its row, each source's in ``sources``)."""
    leases = agent.leases
    apps = {(a.cluster, a.name): a for a in agent.config.apps}
    clusters = []
    now = datetime.now(UTC)
    for name, st in agent.cluster_status().items():
        for d in st.rows():  # one row per (cluster, app)
            if leases:
                d["lease_held"] = leases.holds(name)
                d["holder"] = leases.holder(name)
            d.update(is_open(agent.config.windows, name, d["app"], now).to_json())
            if (app := apps.get((name, d["app"]))) is not None:
                # `gitops-agent wait`: which source's revision the app follows, whether its rollout is.
                d["source"] = app.source
                d["follows_health"] = bool(app.settings.wait)
            clusters.append(d)
    return {
        "agent": agent.config.agent.name,
        "replica": leases.s.identity if leases else None,
        "revision": agent.poller.shas([DEFAULT_SOURCE])[DEFAULT_SOURCE],
        "source_error": "; ".join(agent.poller.errors.values()) or None,
        "sources": agent.poller.to_json(),
        "config_error": agent.config_error,
        "stopping": agent.stopping,
        "leases": leases.to_json() if leases else None,
        "notifications": agent.notifier.to_json() if agent.notifier else None,
        "receiver": agent.receiver.to_json() if agent.receiver else None,
        "clusters": clusters,
    }


def page_snapshot(agent: Agent) -> Snapshot:
    """What the status page shows now: every cluster with its apps, who holds it, each app's
    source head."""
    heads, errors = agent.poller.heads()
    leases = agent.leases
    clusters = []
    now = datetime.now(UTC)
    for name, st in agent.cluster_status().items():
        held = leases is None or leases.holds(name)
        holder = leases.holder(name) if leases else ""
        sources = agent.sources_of(name)
        app_heads = {app: heads[src] for app, src in sources.items() if src in heads}
        verdicts = {app: is_open(agent.config.windows, name, app, now) for app in st.apps}
        windows = {app: v for app, v in verdicts.items() if v.states}
        clusters.append(ClusterSnapshot(name, st, held=held, holder=holder, heads=app_heads, windows=windows))
    return Snapshot(
        agent=agent.config.agent.name,
        clusters=tuple(clusters),
        replica=leases.s.identity if leases else "",
        sources=tuple((n, heads.get(n, ""), errors.get(n, "")) for n in agent.poller.sources.names),
    )


def status_page(
    config: Config, settings: LeaseSettings, token: str, snapshot: Callable[[], Snapshot]
) -> StatusPage:
    """The status page and where its records live: the management cluster with Leases (every
    replica reads them), else ``<cache_dir>/status/`` (docs/status-page.md)."""
    a = config.agent
    store = record_store.records_of(config, settings)
    page = StatusPage(snapshot, store, access=access(a.listen, token), token=token, shared=settings.enabled)
    page.load()
    return page
