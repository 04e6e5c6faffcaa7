"""Charts from HTTP(S) chart repositories, fetched beside the Git source, never by a render.

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
import the render), after its size is capped.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import os
import shutil
import ssl
import tarfile
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import IO, Any

import structlog

from agent.config.chart_versions import Version, newest, parse_constraint, parse_version
from agent.config.types import HelmRepository, HelmSettings
from agent.errors import ChartError, ChartProblem
from agent.model import ChartPin

__all__ = ["MAX_CHART_FILES", "MAX_INDEX_BYTES", "ChartFetcher", "repository_for"]

log = structlog.get_logger("agent.source.charts")

#: Largest ``index.yaml`` read (large public repositories' are a few tens of MiB).
MAX_INDEX_BYTES = 64 << 20
#: Most files (and directories) a chart archive may unpack to.
MAX_CHART_FILES = 10_000
#: Redirects followed for one request.
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
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


def _origin(url: str) -> tuple[str, str, int | None]:
    p = urllib.parse.urlsplit(url)
    return (p.scheme, p.hostname or "", p.port)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by ``_Http.get`` itself, deciding per hop whether credentials go."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Http:
    """GETs to one repository with its trust and credentials, bounded in size."""

    def __init__(self, repo: HelmRepository, url: str, timeout: float) -> None:
        self.repo = repo
        self.url = url  # the app's repository URL: every message names it
        self.timeout = timeout
        ctx: ssl.SSLContext | None = None
        if url.startswith("https://") or repo.ca_file or repo.insecure_skip_tls_verify:
            ctx = ssl.create_default_context(cafile=repo.ca_file or None)
            if repo.insecure_skip_tls_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        self._opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=ctx))

    def _authorization(self) -> str:
        r = self.repo
        if not r.username:
            return ""
        if r.password_file:
            try:
                password = Path(r.password_file).read_text("utf-8").rstrip("\r\n")
            except OSError as e:
                raise self.error(
                    ChartProblem.UNAUTHORIZED, f"cannot read password_file: {e.strerror}"
                ) from None
        elif r.password_env:
            if r.password_env not in os.environ:
                raise self.error(
                    ChartProblem.UNAUTHORIZED, f"environment variable {r.password_env} is not set"
                )
            password = os.environ[r.password_env]
        else:
            password = ""
        token = base64.b64encode(f"{r.username}:{password}".encode()).decode()
        return f"Basic {token}"

    def error(self, problem: ChartProblem, message: str) -> ChartError:
        return ChartError(problem, message, url=self.url)

    def get(
        self,
        url: str,
        limit: int,
        headers: dict[str, str] | None = None,
        *,
        too_large: ChartProblem = ChartProblem.ARCHIVE,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of ``url``: 200 or 304; anything else raises ``ChartError``."""
        auth = self._authorization()
        trusted = _origin(self.repo.url) if self.repo.url else _origin(self.url)
        shown = urllib.parse.urlsplit(url)._replace(query="", fragment="").geturl()
        for _ in range(MAX_REDIRECTS + 1):
            sent = dict(headers or {})
            if auth and _origin(url) == trusted:
                sent["Authorization"] = auth
            req = urllib.request.Request(url, headers={"User-Agent": "gitops-agent", **sent})
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    return resp.status, dict(resp.headers.items()), self._read(resp, limit, shown, too_large)
            except urllib.error.HTTPError as e:
                with e:
                    if e.code == 304:
                        return 304, dict(e.headers.items()), b""
                    location = e.headers.get("Location") if e.code in _REDIRECTS else None
                    if location:
                        url = urllib.parse.urljoin(url, location)
                        continue
                    raise self._http_error(e.code, shown) from None
            except urllib.error.URLError as e:
                raise self._transport_error(e.reason, shown) from None
            except OSError as e:  # TimeoutError and ssl.SSLError included
                raise self._transport_error(e, shown) from None
        raise self.error(ChartProblem.HTTP, f"GET {shown}: more than {MAX_REDIRECTS} redirects")

    def _read(self, resp: IO[bytes], limit: int, shown: str, too_large: ChartProblem) -> bytes:
        length = getattr(resp, "headers", {}).get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise self.error(too_large, f"GET {shown}: {length} bytes, more than the limit of {limit} bytes")
        body = resp.read(limit + 1)
        if len(body) > limit:
            raise self.error(too_large, f"GET {shown}: more than the limit of {limit} bytes")
        return body

    def _http_error(self, code: int, shown: str) -> ChartError:
        if code in (401, 403):
            who = "credentials refused" if self.repo.username else "credentials required"
            return self.error(ChartProblem.UNAUTHORIZED, f"GET {shown}: HTTP {code} ({who})")
        if code >= 500:
            return self.error(ChartProblem.UNREACHABLE, f"GET {shown}: HTTP {code}")
        return self.error(ChartProblem.HTTP, f"GET {shown}: HTTP {code}")

    def _transport_error(self, reason: object, shown: str) -> ChartError:
        if isinstance(reason, ssl.SSLError | ssl.CertificateError):
            return self.error(
                ChartProblem.TLS, f"GET {shown}: TLS: {getattr(reason, 'reason', None) or reason}"
            )
        if isinstance(reason, TimeoutError):
            return self.error(ChartProblem.UNREACHABLE, f"GET {shown}: timed out after {self.timeout:g}s")
        text = getattr(reason, "strerror", None) or str(reason)
        return self.error(ChartProblem.UNREACHABLE, f"GET {shown}: {text}")


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
        #: Requests made, for tests and the benchmark: (method, URL without query).
        self.requests: list[str] = []

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

    def fetch(self, helm: HelmSettings) -> ChartPin:
        """The chart ``helm`` names at the newest version its constraint allows; ``ChartError``
        naming the repository and the constraint."""
        return self._checked(helm, None)

    def _checked(self, helm: HelmSettings, polled: Polled | None) -> ChartPin:
        try:
            return self._fetch(helm, polled)
        except ChartError as e:
            if e.constraint:
                raise
            raise ChartError(e.problem, e.detail, url=e.url, constraint=helm.version or "*") from None

    def _fetch(self, helm: HelmSettings, polled: Polled | None) -> ChartPin:
        repo = repository_for(helm.repository, self.repositories)
        http = _Http(repo, helm.repository, self.timeout)
        try:
            constraint = parse_constraint(helm.version)
        except ValueError as e:  # the loader refuses these; a constraint built in code may not
            raise ChartError(
                ChartProblem.NO_MATCH, str(e), url=helm.repository, constraint=helm.version
            ) from None
        with self._lock:
            index = self._index(http, helm.repository, polled)
        entries = index.charts.get(helm.chart)
        if not entries:
            raise ChartError(
                ChartProblem.INDEX, f"the index lists no chart {helm.chart!r}", url=helm.repository
            )
        by_version: dict[str, tuple[Version, dict[str, Any]]] = {}
        for item in entries:
            text = item.get("version")
            if isinstance(text, str):
                try:
                    by_version.setdefault(text, (parse_version(text), item))
                except ValueError:
                    continue  # as Helm: an entry whose version is not semver is never picked
        chosen = by_version.get(helm.version) if helm.version else None
        if chosen is None:
            best = newest(constraint, (v for v, _ in by_version.values()))
            chosen = by_version.get(best.text) if best is not None else None
        if chosen is None:
            have = sorted(
                (v for v, _ in by_version.values()), key=functools.cmp_to_key(Version.compare), reverse=True
            )[:5]
            listed = ", ".join(str(v) for v in have) or "none"
            raise ChartError(
                ChartProblem.NO_MATCH,
                f"no version of chart {helm.chart!r} matches (newest: {listed})",
                url=helm.repository,
                constraint=str(constraint),
            )
        version, entry = chosen
        pin = self._download(http, helm, str(version), entry, repo.max_chart_bytes)
        self._last[key_of(helm)] = pin
        return pin

    def _index(self, http: _Http, url: str, memo: Polled | None) -> _Index:
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

    def _read_index(self, http: _Http, url: str) -> _Index:
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
        self, http: _Http, helm: HelmSettings, version: str, entry: dict[str, Any], limit: int
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
        target = self.root / digest
        pin = ChartPin(helm.repository, helm.chart, helm.version, version, digest, target / helm.chart)
        if (target / _COMPLETE).is_file():
            return pin
        url = urllib.parse.urljoin(helm.repository + "/", urls[0])
        self.requests.append(f"GET {url}")
        _, _, body = http.get(url, limit)
        got = hashlib.sha256(body).hexdigest()
        if got != digest:
            raise ChartError(
                ChartProblem.DIGEST,
                f"{helm.chart}@{version}: the archive's sha256 is {got[:12]}…, the index says {digest[:12]}…",
                url=helm.repository,
            )
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
