"""Charts from HTTP(S) chart repositories and OCI registries, fetched beside the Git source,
never by a render.

``ChartFetcher.pins`` is called after a source's poll for the charts its apps name
(``[apps.helm] repository``): for each (repository, chart, constraint) it reads the
repository's ``index.yaml`` (a conditional GET: an unchanged index costs one request and no
download), picks the newest version the constraint allows (``agent.config.chart_versions``),
downloads that archive once per digest, checks its sha256 against the index, and unpacks it
within bounds into ``<cache_dir>/charts/<digest>/<chart>``: the render reads that directory as
it reads a chart in Git, without network. A pin is ``model.ChartPin``; one that failed carries
its ``ChartError`` message beside the last good version (kept in force, never pruned from).

Credentials (``[[helm_repositories]]``, matched by URL prefix) go only to the entry's own
origin: a redirect or an archive URL elsewhere is asked without them. ``index.yaml`` is read
with the loader the caller hands in (the render's bounded YAML loader: this stage may not
import the render), after its size is capped. An ``oci://`` repository is read by
``source.oci`` (tags instead of an index, the chart layer's digest from its manifest) and
stored the same way.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import tempfile
import threading
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from agent.config.chart_versions import parse_version
from agent.config.types import HelmRepository, HelmSettings
from agent.errors import ChartError, ChartProblem
from agent.model import ChartPin
from agent.source.chart_http import ChartHttp
from agent.source.chart_pick import constraint_of, pick
from agent.source.oci import OciCharts
from agent.source.provenance import ProvenanceChecker

__all__ = ["MAX_CHART_FILES", "MAX_INDEX_BYTES", "ChartFetcher", "Polled", "repository_for"]

log = structlog.get_logger("agent.source.charts")

#: Largest ``index.yaml`` read (large public repositories' are a few tens of MiB).
MAX_INDEX_BYTES = 64 << 20
#: Most files (and directories) a chart archive may unpack to.
MAX_CHART_FILES = 10_000
#: Requests kept in ``ChartFetcher.requests`` (the latest; a daemon polls for months).
MAX_LOGGED_REQUESTS = 256
_DEFAULT_REPOSITORY = HelmRepository(url="")
#: Written last into an unpacked chart's directory: a directory without it is incomplete.
_COMPLETE = ".complete"

Key = tuple[str, str, str]
IndexLoader = Callable[[str], Any]


def repository_for(url: str, entries: Iterable[HelmRepository]) -> HelmRepository:
    """The ``[[helm_repositories]]`` entry whose ``url`` is the longest prefix of ``url`` (on a
    path boundary), else anonymous defaults."""
    best = _DEFAULT_REPOSITORY
    for e in entries:
        prefix = e.url.rstrip("/")
        if (url == prefix or url.startswith(prefix + "/")) and len(prefix) > len(best.url):
            best = e
    return best


def key_of(helm: HelmSettings) -> Key:
    return (helm.repository, helm.chart, helm.version)


@dataclass(frozen=True)
class _Index:
    """A repository's parsed index: chart name → its entries, and the validators to ask again."""

    charts: dict[str, list[dict[str, Any]]]
    etag: str = ""
    last_modified: str = ""


#: The indexes one poll has read, or why they could not be, by repository URL.
Polled = dict[str, _Index | ChartError]


class ChartFetcher:
    """Resolves, downloads and unpacks repository charts; keeps each key's last good pin."""

    def __init__(
        self,
        repositories: tuple[HelmRepository, ...],
        cache_dir: Path,
        *,
        load_index: IndexLoader,
        timeout: float = 60.0,
    ) -> None:
        self.repositories = repositories
        self.root = cache_dir / "charts"
        self.timeout = timeout
        self._load_index = load_index
        self._indexes: dict[str, _Index] = {}
        self._last: dict[Key, ChartPin] = {}
        self._lock = threading.Lock()
        #: The latest requests made, for tests and the benchmark: (method, URL without query).
        self.requests: deque[str] = deque(maxlen=MAX_LOGGED_REQUESTS)
        self._oci = OciCharts(self.requests)
        self._provenance = ProvenanceChecker(load_index, timeout=timeout)

    def pins(self, wanted: Iterable[HelmSettings]) -> tuple[ChartPin, ...]:
        """One pin per distinct (repository, chart, constraint) of ``wanted``: the version fetched
        now, or the last good one with this fetch's error (``error`` set; no directory when
        there never was a good one)."""
        out: dict[Key, ChartPin] = {}
        polled: Polled = {}  # one request per repository this poll, however many charts it serves
        for helm in wanted:
            if not helm.repository or key_of(helm) in out:
                continue
            try:
                out[key_of(helm)] = self._checked(helm, polled)
            except ChartError as e:
                log.warning("chart fetch failed; last good chart stays in force", url=e.url, error=str(e))
                last = self._last.get(key_of(helm))
                out[key_of(helm)] = replace(last, error=str(e)) if last else _failed(helm, str(e))
        return tuple(out.values())

    def last_good(self) -> tuple[ChartPin, ...]:
        """The last chart each (repository, chart, constraint) fetched, dependencies included."""
        return tuple(self._last.values())

    def fetch(self, helm: HelmSettings, polled: Polled | None = None) -> ChartPin:
        """The chart ``helm`` names at the newest version its constraint allows; ``ChartError``
        naming the repository and the constraint. ``polled``: the indexes this poll read already."""
        return self._checked(helm, polled)

    def _checked(self, helm: HelmSettings, polled: Polled | None) -> ChartPin:
        try:
            return self._fetch(helm, polled)
        except ChartError as e:
            if e.constraint:
                raise
            raise ChartError(e.problem, e.detail, url=e.url, constraint=helm.version or "*") from None

    def _fetch(self, helm: HelmSettings, polled: Polled | None) -> ChartPin:
        repo = repository_for(helm.repository, self.repositories)
        if helm.repository.startswith("oci://"):
            return self._fetch_oci(helm, repo)
        http = ChartHttp(repo, helm.repository, self.timeout)
        constraint_of(helm)
        with self._lock:
            index = self._index(http, helm.repository, polled)
        entries = index.charts.get(helm.chart)
        if not entries:
            raise ChartError(
                ChartProblem.INDEX, f"the index lists no chart {helm.chart!r}", url=helm.repository
            )
        by_version: dict[str, dict[str, Any]] = {}
        for item in entries:
            if isinstance(text := item.get("version"), str):
                by_version.setdefault(text, item)
        version = pick(helm, by_version)
        if (kept := self._kept(helm, version)) is not None:
            return kept
        pin = self._download(http, helm, version, by_version[version], repo.max_chart_bytes)
        self._last[key_of(helm)] = pin
        return pin

    def _kept(self, helm: HelmSettings, version: str) -> ChartPin | None:
        """The pin in force when ``version`` is older than it: charts roll forward only. A newest
        release withdrawn from the repository (or a tag deleted) never takes an app back by itself;
        a ``version`` that asks for an older one does (it is another constraint, another key)."""
        last = self._last.get(key_of(helm))
        if last is None or not last.version or not last.directory.is_dir():
            return None
        if parse_version(version).compare(parse_version(last.version)) >= 0:
            return None
        log.warning(
            "chart version in force is no longer the newest listed; kept (charts roll forward only)",
            url=helm.repository,
            chart=helm.chart,
            listed=version,
            kept=last.version,
        )
        return last

    def _fetch_oci(self, helm: HelmSettings, repo: HelmRepository) -> ChartPin:
        """The chart from its OCI repository: tags → version → manifest (signature checked when
        ``verify``) → the chart layer, downloaded only for a digest not unpacked yet."""
        http = ChartHttp(repo, helm.repository, self.timeout, tls=not repo.plain_http)
        chart = self._oci.resolve(http, helm)
        if (kept := self._kept(helm, chart.version)) is not None:
            return kept
        pin = self._store(helm, chart.version, chart.digest, lambda: self._oci.blob(http, helm, chart))
        self._last[key_of(helm)] = pin
        return pin

    def _index(self, http: ChartHttp, url: str, memo: Polled | None) -> _Index:
        """The repository's index, asked again with its validators (a 304 reuses the parsed one),
        once per poll (``memo``: what this poll read) however many charts come from it."""
        if memo is None:
            return self._read_index(http, url)
        polled = memo.get(url)
        if isinstance(polled, ChartError):
            raise polled
        if polled is not None:
            return polled
        try:
            index = self._read_index(http, url)
        except ChartError as e:
            memo[url] = e
            raise
        memo[url] = index
        return index

    def _read_index(self, http: ChartHttp, url: str) -> _Index:
        cached = self._indexes.get(url)
        headers = {}
        if cached is not None and cached.etag:
            headers["If-None-Match"] = cached.etag
        if cached is not None and cached.last_modified:
            headers["If-Modified-Since"] = cached.last_modified
        self.requests.append(f"GET {url}/index.yaml")
        status, answer, body = http.get(
            f"{url}/index.yaml", MAX_INDEX_BYTES, headers, too_large=ChartProblem.INDEX
        )
        if status == 304 and cached is not None:
            return cached
        try:
            data = self._load_index(body.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ChartError(ChartProblem.INDEX, f"index.yaml is not UTF-8: {e.reason}", url=url) from None
        except Exception as e:  # the loader's YAML errors: the index does not parse
            why = getattr(e, "problem", None) or e
            raise ChartError(ChartProblem.INDEX, f"index.yaml does not parse: {why}", url=url) from None
        charts = data.get("entries") if isinstance(data, dict) else None
        if not isinstance(charts, dict) or not all(isinstance(v, list) for v in charts.values()):
            raise ChartError(ChartProblem.INDEX, "index.yaml has no entries table", url=url)
        index = _Index(
            {k: [e for e in v if isinstance(e, dict)] for k, v in charts.items() if isinstance(k, str)},
            etag=answer.get("ETag", ""),
            last_modified=answer.get("Last-Modified", ""),
        )
        self._indexes[url] = index
        return index

    def _download(
        self, http: ChartHttp, helm: HelmSettings, version: str, entry: dict[str, Any], limit: int
    ) -> ChartPin:
        """The archive of ``entry``, unpacked once per digest (a kept one is not asked again)."""
        digest = entry.get("digest")
        urls = entry.get("urls")
        if (
            not isinstance(digest, str)
            or len(digest) != 64
            or not all(c in "0123456789abcdef" for c in digest)
        ):
            raise ChartError(
                ChartProblem.DIGEST,
                f"the index gives no sha256 digest for {helm.chart}@{version}",
                url=helm.repository,
            )
        if not isinstance(urls, list) or not urls or not isinstance(urls[0], str):
            raise ChartError(
                ChartProblem.INDEX, f"the index gives no URL for {helm.chart}@{version}", url=helm.repository
            )
        url = urllib.parse.urljoin(helm.repository + "/", urls[0])

        def download() -> bytes:
            self.requests.append(f"GET {url}")
            _, _, body = http.get(url, limit)
            if (got := hashlib.sha256(body).hexdigest()) != digest:
                raise ChartError(
                    ChartProblem.DIGEST,
                    f"{helm.chart}@{version}: the archive's sha256 is {got[:12]}…, "
                    f"the index says {digest[:12]}…",
                    url=helm.repository,
                )
            return body

        if http.repo.verify:  # signed by the keyring, or nothing of it is used (a kept copy neither)

            def get(u: str, limit: int) -> bytes:
                self.requests.append(f"GET {u}")
                return http.get(u, limit)[2]

            self._provenance.check(get, url, digest, http.repo.keyring_file, url=helm.repository)
        return self._store(helm, version, digest, download)

    def _store(
        self, helm: HelmSettings, version: str, digest: str, download: Callable[[], bytes]
    ) -> ChartPin:
        """The chart archive of sha256 ``digest`` unpacked under the cache, once: ``download``
        (which checks the digest) is called only when no complete copy is there."""
        target = self.root / digest
        pin = ChartPin(helm.repository, helm.chart, helm.version, version, digest, target / helm.chart)
        if (target / _COMPLETE).is_file():
            return pin
        body = download()
        limit = repository_for(helm.repository, self.repositories).max_chart_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        try:
            problem = unpack(body, work, chart=helm.chart, limit=limit)
            if problem:
                raise ChartError(
                    ChartProblem.ARCHIVE, f"{helm.chart}@{version}: {problem}", url=helm.repository
                )
            (work / _COMPLETE).write_text(f"{helm.chart}@{version}\n")
            try:
                work.rename(target)
            except OSError:
                if not (target / _COMPLETE).is_file():  # not another fetch's complete copy
                    shutil.rmtree(target, ignore_errors=True)
                    work.rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("chart fetched", chart=helm.chart, version=version, digest=digest[:12], url=helm.repository)
        return pin


def _failed(helm: HelmSettings, error: str) -> ChartPin:
    return ChartPin(helm.repository, helm.chart, helm.version, "", "", Path(), error=error)


def unpack(archive: bytes, into: Path, *, chart: str, limit: int) -> str:
    """Unpack a chart archive under ``into``; "" or what is wrong with it. Only regular files and
    directories under ``<chart>/``, no ``..`` nor absolute paths, at most ``limit`` bytes in all
    and ``MAX_CHART_FILES`` entries: refused as a whole otherwise (the caller removes ``into``)."""
    total = count = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            for member in tar:
                count += 1
                name = member.name
                parts = PurePosixPath(name).parts
                if name.startswith("/") or ".." in parts or "\\" in name:
                    return f"entry {name!r} leaves the chart's directory"
                if not parts or parts[0] != chart:
                    return f"entry {name!r} is not under {chart}/"
                if not (member.isfile() or member.isdir()):
                    return f"entry {name!r} is a link or a special file"
                if count > MAX_CHART_FILES:
                    return f"more than {MAX_CHART_FILES} entries"
                total += member.size
                if total > limit:
                    return f"unpacks to more than {limit} bytes"
                path = into.joinpath(*parts)
                if member.isdir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:
                    return f"entry {name!r} cannot be read"
                with source, open(path, "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 16)
    except (tarfile.TarError, OSError, EOFError) as e:
        return f"not a chart archive: {e}"
    if not (into / chart / "Chart.yaml").is_file():
        return f"no {chart}/Chart.yaml in the archive"
    return ""
