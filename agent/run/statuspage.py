"""The read-only status page of the running agent (docs/status-page.md), on the same listener as
``/status``: its records, the whole fleet's view, and its HTTP answers.

``scheduler.Daemon`` builds one when ``listen`` is set, feeds it each pass's results
(``record_passes``) and each reading of a wait (``record_healths``), and hands the server its
``handle``. Records (``ui.records``) are kept per app and written to the store
(``record_store``) only when they changed, so a steady fleet writes nothing. With Leases each
replica records only the clusters it holds, and shows those other replicas hold from their
records in the management cluster (one labelled LIST, reused for ``SHARED_RECORDS_TTL``):
every replica behind the Service shows the whole fleet.

Only GET pages and the sign-in form; nothing here changes a cluster (suspend, resume and sync
stay in the CLI). Every answer carries a Content-Security-Policy that allows the page's own
stylesheet and script and nothing else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

import structlog

from agent.config.types import SHARED_RECORDS_TTL, AgentSettings
from agent.errors import AgentError, ConfigError
from agent.model import AppHealth, ClusterResult, PassState
from agent.plan.windows import WindowVerdict
from agent.run.record_store import RecordStore, save_quietly
from agent.run.status import ClusterStatus, worst_state
from agent.ui import auth, render
from agent.ui.records import AppRecord, EventEntry, PassEntry, after_health, after_pass, encode

log = structlog.get_logger("gitops_agent.status_page")

CSP = (
    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
)
HTML = "text/html; charset=utf-8"
#: The history and event feeds show at most this many rows.
FEED_ROWS = 300
_MAX_FORM = 4096

Key = tuple[str, str]


@dataclass(frozen=True)
class ClusterSnapshot:
    """One cluster as the daemon knows it now."""

    name: str
    status: ClusterStatus
    #: This replica runs its passes (always, without Leases).
    held: bool = True
    holder: str = ""
    #: App → the sha of its source's latest revision this replica polled.
    heads: Mapping[str, str] = field(default_factory=dict)
    #: App → the change windows that match it, now (apps no window matches are left out).
    windows: Mapping[str, WindowVerdict] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """What the daemon tells the page at each request."""

    agent: str
    clusters: tuple[ClusterSnapshot, ...]
    replica: str = ""
    #: (name, revision, error) of each source.
    sources: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Response:
    code: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class StatusPage:
    """Records per app, the fleet's views, and the ``/ui/`` answers."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        store: RecordStore,
        *,
        access: auth.Access,
        token: str = "",
        shared: bool = False,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._snapshot = snapshot
        self.store = store
        self.access = access
        self._token = token
        #: The store is the management cluster's: other replicas' clusters are read from it.
        self.shared = shared
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[Key, AppRecord] = {}
        self._saved: dict[Key, str] = {}
        self._remote: dict[Key, AppRecord] = {}
        self._remote_at = float("-inf")
        self._remote_error = ""
        self._remote_lock = threading.Lock()
        #: Records written to the store since start (tests and the benchmarks count them).
        self.writes = 0

    # -- records --------------------------------------------------------------------

    def load(self) -> None:
        """Records from an unshared store (a restarted agent keeps its history). A shared store is
        read per app when this replica first records it, and for the page."""
        if self.shared:
            return
        for r in self.store.load_all():
            key = (r.cluster, r.app)
            with self._lock:
                self._records[key] = r
                self._saved[key] = encode(r)

    def _previous(self, key: Key) -> AppRecord | None:
        with self._lock:
            if key in self._records:
                return self._records[key]
        if not self.shared:
            return None
        try:
            r = self.store.load(*key)
        except AgentError as e:
            log.warning("status record not read; starting it anew", cluster=key[0], app=key[1], error=str(e))
            return None
        if r is not None:
            with self._lock:
                self._saved[key] = encode(r)
        return r

    def _keep(self, record: AppRecord, may_write: bool) -> None:
        key = (record.cluster, record.app)
        text = encode(record)
        with self._lock:
            self._records[key] = record
            unchanged = self._saved.get(key) == text
        if unchanged or not may_write:
            return
        if save_quietly(self.store, record, text):
            with self._lock:
                self._saved[key] = text
                self.writes += 1

    def record_passes(
        self,
        results: Iterable[ClusterResult],
        subjects: Mapping[str, str],
        *,
        may_write: Callable[[str], bool],
        triggers: Mapping[str, str] | None = None,
    ) -> None:
        """Each app's pass into its record; saved when it changed and ``may_write(cluster)``.
        ``triggers``: app → why its pass ran (``run.triggers``)."""
        now = self._clock()
        for result in results:
            if result.dry_run:
                continue
            key = (result.cluster, result.app or result.cluster)
            record = after_pass(
                self._previous(key),
                result,
                subject=subjects.get(result.revision, ""),
                now=now,
                trigger=(triggers or {}).get(key[1], ""),
            )
            self._keep(record, may_write(result.cluster))

    def record_healths(self, cluster: str, healths: Iterable[AppHealth], *, may_write: bool) -> None:
        now = self._clock()
        for health in healths:
            prev = self._previous((cluster, health.app))
            if prev is None:
                continue  # a wait follows a pass, which made the record
            self._keep(after_health(prev, health, now=now), may_write)

    def forget(self, cluster: str) -> None:
        """Another replica may have recorded ``cluster`` meanwhile: read it again before writing
        (a Lease just acquired)."""
        with self._lock:
            for key in [k for k in self._records if k[0] == cluster]:
                del self._records[key]
                self._saved.pop(key, None)

    def record(self, cluster: str, app: str) -> AppRecord | None:
        with self._lock:
            return self._records.get((cluster, app))

    # -- views ----------------------------------------------------------------------

    def _shared_records(self) -> dict[Key, AppRecord]:
        """Every replica's records, from the management cluster, reused for a few seconds."""
        if time.monotonic() - self._remote_at < SHARED_RECORDS_TTL:
            return self._remote
        if not self._remote_lock.acquire(blocking=False):
            return self._remote  # another request is reading them: the previous ones will do
        try:
            records = {(r.cluster, r.app): r for r in self.store.load_all()}
            self._remote, self._remote_error = records, ""
        except AgentError as e:
            self._remote_error = str(e)
            log.warning("status records of other replicas not read", error=str(e))
        finally:
            self._remote_at = time.monotonic()
            self._remote_lock.release()
        return self._remote

    def fleet(self) -> render.FleetView:
        snap = self._snapshot()
        with self._lock:
            local = dict(self._records)
        need_shared = self.shared and any(
            not c.held or any((c.name, a) not in local for a in c.status.apps) for c in snap.clusters
        )
        remote = self._shared_records() if need_shared else {}
        clusters = []
        for c in snap.clusters:
            apps = []
            for name, st in c.status.apps.items():
                key = (c.name, name)
                mine = local.get(key) if c.held else None
                record = mine or remote.get(key) or AppRecord(c.name, name)
                last = st.last_result.finished if c.held and st.last_result else None
                apps.append(
                    render.AppView(
                        record,
                        last_run_at=last.isoformat() if last else "",
                        head=c.heads.get(name, ""),
                        windows=c.windows.get(name),
                    )
                )
            if c.held:
                state = c.status.state.value
            else:
                state = worst_state({_state(a.record.state) for a in apps}).value
            nxt = c.status.next_run.isoformat() if c.held and c.status.next_run else ""
            clusters.append(
                render.ClusterView(c.name, state, tuple(apps), holder=c.holder, local=c.held, next_run=nxt)
            )
        return render.FleetView(
            agent=snap.agent,
            clusters=tuple(clusters),
            replica=snap.replica,
            sources=snap.sources,
            shared_error=self._remote_error if need_shared else "",
        )

    # -- HTTP -----------------------------------------------------------------------

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes = b"") -> Response:
        """One request for ``/`` or ``/ui/...``."""
        url = urlsplit(target)
        path = url.path
        if path.startswith("/ui/static/"):
            return self._static(path.removeprefix("/ui/static/"))
        if self.access is auth.Access.OFF:
            text = (
                "The status page is off: the agent listens on an address other than loopback and "
                "[agent] ui_token_file is not set (docs/status-page.md)."
            )
            return self._html(403, render.message(self._clock(), title="Status page off", text=text))
        if path == "/ui/login":
            return self._login(method, url.query, body)
        if path == "/ui/logout":
            return Response(303, HTML, b"", (("Location", "/ui/login"), ("Set-Cookie", auth.clear_cookie())))
        if method != "GET":
            return self._html(
                405, render.message(self._clock(), title="Read-only", text="This page only reads.")
            )
        if self.access is auth.Access.TOKEN and not auth.authorized(
            self._token, cookie=headers.get("Cookie"), authorization=headers.get("Authorization")
        ):
            if headers.get("Authorization"):
                return self._html(
                    401, render.message(self._clock(), title="Not signed in", text="Wrong token.")
                )
            return Response(303, HTML, b"", (("Location", "/ui/login?next=" + quote(target, safe="")),))
        if path in ("/", "/ui"):
            return Response(302, HTML, b"", (("Location", "/ui/"),))
        return self._page(path, parse_qs(url.query))

    def _page(self, path: str, query: Mapping[str, list[str]]) -> Response:
        now = self._clock()
        fleet = self.fleet()
        parts = [unquote(p) for p in path.removeprefix("/ui/").split("/")] if path != "/ui/" else []
        if not parts:
            return self._html(200, render.grid(fleet, now))
        if parts[0] == "clusters" and len(parts) == 2:
            view = fleet.cluster(parts[1])
            if view is not None:
                return self._html(200, render.cluster(fleet, view, now))
            return self._not_found(now, f"No cluster named {parts[1]!r} in this agent's config.")
        if parts[0] == "clusters" and len(parts) == 4 and parts[2] == "apps":
            found = fleet.app(parts[1], parts[3])
            if found is not None:
                return self._html(200, render.app(fleet, *found, now))
            return self._not_found(now, f"No app named {parts[3]!r} on cluster {parts[1]!r}.")
        if parts[0] in ("history", "events") and len(parts) == 1:
            cluster = (query.get("cluster") or [""])[0]
            app = (query.get("app") or [""])[0]
            records = [
                a.record
                for c in fleet.clusters
                if not cluster or c.name == cluster
                for a in c.apps
                if not app or a.record.app == app
            ]
            scope = (
                f"app {app} on {cluster}" if app and cluster else (f"cluster {cluster}" if cluster else "")
            )
            one = bool(app and cluster)
            if parts[0] == "history":
                passes: list[tuple[AppRecord, PassEntry]] = [(r, h) for r in records for h in r.history]
                passes.sort(key=lambda p: p[1].at, reverse=True)
                return self._html(
                    200, render.history(fleet, passes[:FEED_ROWS], now, scope=scope, app_scope=one)
                )
            evs: list[tuple[AppRecord, EventEntry]] = [(r, e) for r in records for e in r.events]
            evs.sort(key=lambda p: p[1].at, reverse=True)
            return self._html(200, render.event_feed(fleet, evs[:FEED_ROWS], now, scope=scope, app_scope=one))
        return self._not_found(now, "No such page.")

    def _login(self, method: str, query: str, body: bytes) -> Response:
        now = self._clock()
        if self.access is not auth.Access.TOKEN:
            return Response(303, HTML, b"", (("Location", "/ui/"),))
        if method == "GET":
            nxt = auth.safe_next((parse_qs(query).get("next") or ["/ui/"])[0])
            return self._html(200, render.login(now, next_path=nxt))
        if method != "POST" or len(body) > _MAX_FORM:
            return self._html(400, render.login(now, error="Could not read the form."))
        form = parse_qs(body.decode("utf-8", "replace"))
        nxt = auth.safe_next((form.get("next") or ["/ui/"])[0])
        if not auth.token_matches(self._token, (form.get("token") or [""])[0].strip()):
            return self._html(401, render.login(now, error="Wrong token.", next_path=nxt))
        return Response(303, HTML, b"", (("Location", nxt), ("Set-Cookie", auth.set_cookie(self._token))))

    def _static(self, name: str) -> Response:
        ctype = render.STATIC_FILES.get(name)
        if ctype is None:
            return Response(404, "text/plain; charset=utf-8", b"not found\n", _HEADERS)
        return Response(200, ctype, (render.STATIC / name).read_bytes(), _HEADERS)

    def _not_found(self, now: datetime, text: str) -> Response:
        return self._html(404, render.message(now, title="Not found", text=text))

    def _html(self, code: int, page: str) -> Response:
        return Response(code, HTML, page.encode(), _HEADERS)


def with_security_headers(response: Response) -> tuple[tuple[str, str], ...]:
    """Every header of an answer: its own, and the security headers (once each)."""
    own = {k for k, _ in response.headers}
    return response.headers + tuple((k, v) for k, v in _HEADERS if k not in own)


def _state(text: str) -> PassState:
    try:
        return PassState(text)
    except ValueError:
        return PassState.PENDING


def token_from_file(path: str) -> str:
    """The token ``[agent] ui_token_file`` names; raises ``OSError`` when it cannot be read."""
    return Path(path).read_text().strip() if path else ""


def ui_token(a: AgentSettings) -> str:
    """``[agent] ui_token_file``'s token ("" without one); ``ConfigError`` when it is unreadable or
    empty. The page, ``/status``, ``/sync`` and the CLI that calls them all read it here."""
    try:
        token = token_from_file(a.ui_token_file)
    except OSError as e:
        raise ConfigError("agent.ui_token_file", f"cannot read {a.ui_token_file}: {e}") from e
    if a.ui_token_file and not token:
        raise ConfigError("agent.ui_token_file", f"{a.ui_token_file} is empty")
    return token
