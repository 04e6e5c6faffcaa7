"""The status page's HTML: Jinja2 templates over typed views, every value escaped.

Pure: ``run.statuspage`` builds the views (``FleetView`` of ``ClusterView`` of ``AppView``, each
around an ``AppRecord``) and asks for one page; nothing here reads a cluster or a clock but the
``now`` it is given. Autoescaping is on for every template and nothing is marked safe: names and
messages come from Git and from clusters (an object name, a server's message, a commit subject
may hold markup), and the page shows them as text. The pages load only their own stylesheet and
refresh script (the server's Content-Security-Policy allows nothing else).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, urlencode

import jinja2

from agent.config.types import PAGE_REFRESH
from agent.model import app_page
from agent.plan.windows import WindowVerdict
from agent.ui.records import AppRecord, EventEntry, PassEntry

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
#: The only files ``/ui/static/`` serves, with their content types.
STATIC_FILES = {"page.css": "text/css; charset=utf-8", "refresh.js": "text/javascript; charset=utf-8"}


def app_path(cluster: str, app: str) -> str:
    """The deep link of one app: ``/ui/clusters/<cluster>/apps/<app>`` (each part quoted; the
    notifications' links name the same page)."""
    return app_page(cluster, app)


def cluster_path(cluster: str) -> str:
    return f"/ui/clusters/{quote(cluster, safe='')}"


def feed_path(feed: str, cluster: str = "", app: str = "") -> str:
    """``/ui/history`` or ``/ui/events``, for the fleet, one cluster or one app."""
    query = {k: v for k, v in (("cluster", cluster), ("app", app)) if v}
    return f"/ui/{feed}" + (f"?{urlencode(query)}" if query else "")


@dataclass(frozen=True)
class AppView:
    """One app as a replica sees it: its record, and what only the holder of its cluster knows."""

    record: AppRecord
    #: When its last pass ended, as this replica saw it ("" for a cluster another replica holds).
    last_run_at: str = ""
    #: The latest revision of its source this replica polled ("" when none yet).
    head: str = ""
    #: The change windows that match it and whether they block writes now (None: none matches).
    windows: WindowVerdict | None = None

    @property
    def behind(self) -> bool:
        """Its source has moved past what it last synced."""
        return bool(self.head) and self.record.synced_revision != self.head


@dataclass(frozen=True)
class ClusterView:
    name: str
    state: str
    apps: tuple[AppView, ...]
    #: The replica holding its Lease ("" without Leases); whether that is the replica serving the page.
    holder: str = ""
    local: bool = True
    next_run: str = ""


@dataclass(frozen=True)
class FleetView:
    agent: str
    clusters: tuple[ClusterView, ...]
    replica: str = ""
    sources: tuple[tuple[str, str, str], ...] = ()  # (name, revision, error)
    #: Why clusters other replicas hold may be out of date ("" when they are not).
    shared_error: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def app(self, cluster: str, app: str) -> tuple[ClusterView, AppView] | None:
        for c in self.clusters:
            if c.name == cluster:
                for a in c.apps:
                    if a.record.app == app:
                        return c, a
        return None

    def cluster(self, name: str) -> ClusterView | None:
        return next((c for c in self.clusters if c.name == name), None)


def _parse(t: str) -> datetime | None:
    try:
        return datetime.fromisoformat(t) if t else None
    except ValueError:
        return None


def age(t: str, now: datetime) -> str:
    """``3m 12s ago`` (``""`` for no time)."""
    when = _parse(t)
    if when is None:
        return ""
    s = max(0, int((now - when).total_seconds()))
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m {s % 60}s ago"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m ago"
    return f"{s // 86400}d {s % 86400 // 3600}h ago"


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["first_line"] = first_line
_env.filters["short"] = lambda sha: (sha or "")[:12]
_env.globals.update(app_path=app_path, cluster_path=cluster_path, feed_path=feed_path)


def _render(template: str, now: datetime, **context: object) -> str:
    return _env.get_template(template).render(
        now=now, age=lambda t: age(t, now), refresh=int(PAGE_REFRESH), **context
    )


def grid(fleet: FleetView, now: datetime) -> str:
    return _render("grid.html", now, fleet=fleet, title="Fleet")


def cluster(fleet: FleetView, view: ClusterView, now: datetime) -> str:
    return _render("cluster.html", now, fleet=fleet, cluster=view, title=f"Cluster {view.name}")


def app(fleet: FleetView, view: ClusterView, a: AppView, now: datetime) -> str:
    r = a.record
    return _render(
        "app.html",
        now,
        fleet=fleet,
        cluster=view,
        a=a,
        r=r,
        history_rows=[(r, h) for h in reversed(r.history[-10:])],
        event_rows=[(r, e) for e in reversed(r.events[-10:])],
        title=f"{r.app} on {r.cluster}",
    )


def history(
    fleet: FleetView,
    rows: list[tuple[AppRecord, PassEntry]],
    now: datetime,
    *,
    scope: str = "",
    app_scope: bool = False,
) -> str:
    """Passes, newest first; ``scope`` names the cluster or app they are of (``app_scope``: one app)."""
    return _render(
        "history.html", now, fleet=fleet, rows=rows, scope=scope, app_scope=app_scope, title="History"
    )


def event_feed(
    fleet: FleetView,
    rows: list[tuple[AppRecord, EventEntry]],
    now: datetime,
    *,
    scope: str = "",
    app_scope: bool = False,
) -> str:
    return _render(
        "events.html", now, fleet=fleet, rows=rows, scope=scope, app_scope=app_scope, title="Events"
    )


def login(now: datetime, *, error: str = "", next_path: str = "/ui/") -> str:
    return _render("login.html", now, error=error, next_path=next_path, title="Sign in", fleet=None)


def message(now: datetime, *, title: str, text: str) -> str:
    return _render("message.html", now, text=text, title=title, fleet=None)
