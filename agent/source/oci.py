"""Charts in OCI registries (``oci://host/path``), as `helm push` stores them.

Called by ``source.charts`` for an app whose repository is ``oci://``: the chart ``web`` of
``oci://host/charts`` is the OCI repository ``charts/web``, one tag per version (Helm writes a
version's ``+`` as ``_``). ``resolve`` picks the version (``source.chart_pick``, the rules of an
HTTP repository), reads its manifest (a Helm config and one chart layer, its size within
``max_chart_bytes``) and, with ``verify``, checks its cosign signature (``source.cosign``);
``blob`` downloads the chart layer, its size and sha256 checked.

What a poll costs: the manifest read for a tag is kept, so an unchanged tag list is one request
and no download. Tags are mutable, but a chart version is not meant to be re-pushed (Helm
treats versions as immutable): under a range a re-pushed tag is not read again until another
version is picked. An exact pin (``version = "1.2.3"``) is the exception: each poll asks the
tag's manifest digest with a HEAD instead of listing tags (still one request), so a re-pushed
pin is followed (and verified again). A signature verified once per (manifest, key) is not
asked again.

Registry auth: the entry's basic credentials (``username``/``password_file``/``password_env``,
or ``docker_config_file``'s ``auths[host]``) go with each request; a ``401`` with a ``Bearer``
challenge is answered with the token flow (those credentials, if any, sent to the challenge's
``realm`` for ``service`` and ``scope``); tokens are kept until they expire.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass
from typing import Any

from agent.config.chart_versions import parse_version
from agent.config.types import HelmSettings
from agent.errors import ChartProblem
from agent.source import cosign
from agent.source.chart_http import ChartHttp, Response, basic
from agent.source.chart_pick import constraint_of, pick

__all__ = ["CHART_LAYER", "HELM_CONFIG", "OCI_MANIFEST", "OciChart", "OciCharts"]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
#: cosign writes its signature manifests with Docker's media type when asked to.
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
#: Largest manifest, page of tags, token answer and signature payload read.
MAX_MANIFEST_BYTES = 4 << 20
MAX_TAGS_BYTES = 16 << 20
MAX_TOKEN_BYTES = 1 << 20
MAX_SIGNATURE_BYTES = 1 << 20
MAX_KEY_BYTES = 64 << 10
#: Tags asked per page (``?n=``); 0: the registry's own page size (distribution's: all).
TAGS_PAGE = 0
#: Pages of a tag list followed (``Link: <...>; rel="next"``).
MAX_TAG_PAGES = 100
#: A token without ``expires_in`` lives this long (the distribution spec's default).
DEFAULT_TOKEN_SECONDS = 60
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
_NEXT = re.compile(r'<([^>]*)>\s*;\s*rel="?next"?')
_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class OciChart:
    """A chart version's manifest as read: where its chart layer is, and what it is."""

    version: str
    tag: str
    #: The manifest's digest (``sha256:<hex>``): what cosign signs.
    manifest: str
    #: The chart layer's sha256 (hex): the archive's, as an HTTP repository's index gives it.
    digest: str
    size: int


@dataclass(frozen=True)
class _Ref:
    """Where a chart lives: the registry's base URL and the OCI repository's name."""

    base: str
    name: str

    def url(self, kind: str, reference: str) -> str:
        return f"{self.base}/v2/{self.name}/{kind}/{reference}"


def _ref(http: ChartHttp, helm: HelmSettings) -> _Ref:
    p = urllib.parse.urlsplit(helm.repository)
    scheme = "http" if http.repo.plain_http else "https"
    path = p.path.strip("/")
    return _Ref(f"{scheme}://{p.netloc}", f"{path}/{helm.chart}" if path else helm.chart)


def _json(body: bytes, what: str, http: ChartHttp, problem: ChartProblem) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise http.error(problem, f"{what} is not a JSON object")
    return data


class OciCharts:
    """Reads charts from OCI registries; keeps manifests by tag, tokens, verified signatures."""

    def __init__(self, requests: deque[str]) -> None:
        #: Shared with ``ChartFetcher.requests``: (method, URL without query) of each request.
        self.requests = requests
        self._by_tag: dict[tuple[str, str, str], OciChart] = {}
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}
        self._verified: set[tuple[str, str]] = set()

    def resolve(self, http: ChartHttp, helm: HelmSettings) -> OciChart:
        """The manifest of the version ``helm.version`` picks (signature checked with ``verify``)."""
        ref = _ref(http, helm)
        constraint_of(helm)
        chart = self._pinned(http, ref, helm) if _exact(helm.version) else None
        if chart is None:
            by_version = {t.replace("_", "+"): t for t in self._tags(http, ref)}
            version = pick(helm, by_version)
            tag = by_version[version]
            chart = self._by_tag.get((ref.base, ref.name, tag)) or self._manifest(http, ref, version, tag)
        if http.repo.verify:
            self._verify(http, ref, helm, chart)
        return chart

    def blob(self, http: ChartHttp, helm: HelmSettings, chart: OciChart) -> bytes:
        """The chart layer of ``chart``, its size and sha256 checked."""
        ref = _ref(http, helm)
        _, _, body = self._get(
            http, ref, ref.url("blobs", f"sha256:{chart.digest}"), chart.size, ChartProblem.DIGEST
        )
        got = hashlib.sha256(body).hexdigest()
        if got != chart.digest or len(body) != chart.size:
            raise http.error(
                ChartProblem.DIGEST,
                f"{helm.chart}@{chart.version}: the layer's sha256 is {got[:12]}…, "
                f"the manifest says {chart.digest[:12]}…",
            )
        return body

    def _pinned(self, http: ChartHttp, ref: _Ref, helm: HelmSettings) -> OciChart | None:
        """An exact version's manifest, its tag asked with a HEAD (``None``: no such tag)."""
        tag = helm.version.replace("+", "_")
        url = ref.url("manifests", tag)
        status, answer, _ = self._get(
            http, ref, url, 0, ChartProblem.MANIFEST, accept=OCI_MANIFEST, method="HEAD", also=(404,)
        )
        if status == 404:
            return None
        kept = self._by_tag.get((ref.base, ref.name, tag))
        if kept is not None and answer.get("Docker-Content-Digest") == kept.manifest:
            return kept
        return self._manifest(http, ref, helm.version, tag)

    def _tags(self, http: ChartHttp, ref: _Ref) -> list[str]:
        """Every tag of the repository, page after page."""
        url, tags = ref.url("tags", "list") + (f"?n={TAGS_PAGE}" if TAGS_PAGE else ""), []
        for _ in range(MAX_TAG_PAGES):
            status, answer, body = self._get(http, ref, url, MAX_TAGS_BYTES, ChartProblem.INDEX, also=(404,))
            if status == 404:
                raise http.error(ChartProblem.INDEX, f"the registry has no repository {ref.name!r}")
            listed = _json(body, "the tag list", http, ChartProblem.INDEX).get("tags") or []
            if not isinstance(listed, list):
                raise http.error(ChartProblem.INDEX, "the tag list has no tags array")
            tags += [t for t in listed if isinstance(t, str)]
            found = _NEXT.search(answer.get("Link", ""))
            if found is None:
                return tags
            url = urllib.parse.urljoin(url, found.group(1))
            if not url.startswith(ref.base + "/"):
                raise http.error(ChartProblem.INDEX, "the tag list's next page is on another host")
        raise http.error(ChartProblem.INDEX, f"the tag list has more than {MAX_TAG_PAGES} pages")

    def _manifest(self, http: ChartHttp, ref: _Ref, version: str, tag: str) -> OciChart:
        """The tag's manifest, checked to be a Helm chart's; kept for the next poll."""
        _, answer, body = self._get(
            http,
            ref,
            ref.url("manifests", tag),
            MAX_MANIFEST_BYTES,
            ChartProblem.MANIFEST,
            accept=OCI_MANIFEST,
        )
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if answer.get("Docker-Content-Digest", digest) != digest:
            raise http.error(
                ChartProblem.MANIFEST, f"tag {tag}: the manifest's digest is not the one the registry names"
            )
        manifest = _json(body, f"the manifest of tag {tag}", http, ChartProblem.MANIFEST)
        config = manifest.get("config")
        kind = config.get("mediaType") if isinstance(config, dict) else None
        if manifest.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST or kind != HELM_CONFIG:
            raise http.error(
                ChartProblem.MANIFEST, f"tag {tag} is not a Helm chart (config media type {kind!r})"
            )
        layers = [
            x
            for x in manifest.get("layers") or ()
            if isinstance(x, dict) and x.get("mediaType") == CHART_LAYER
        ]
        if len(layers) != 1:
            raise http.error(ChartProblem.MANIFEST, f"tag {tag} has {len(layers)} chart layers, not one")
        layer_digest, size = layers[0].get("digest"), layers[0].get("size")
        if not isinstance(layer_digest, str) or not _DIGEST.match(layer_digest):
            raise http.error(ChartProblem.DIGEST, f"tag {tag}: the chart layer has no sha256 digest")
        limit = http.repo.max_chart_bytes
        if not isinstance(size, int) or size < 0 or size > limit:
            raise http.error(
                ChartProblem.ARCHIVE,
                f"tag {tag}: the chart layer is {size} bytes, more than the limit of {limit} bytes",
            )
        chart = OciChart(version, tag, digest, layer_digest.removeprefix("sha256:"), size)
        self._by_tag[(ref.base, ref.name, tag)] = chart
        return chart

    def _verify(self, http: ChartHttp, ref: _Ref, helm: HelmSettings, chart: OciChart) -> None:
        """Refuses ``chart`` unless a cosign signature of its manifest verifies with the key."""
        file = http.repo.cosign_public_key_file
        try:
            with open(file, "rb") as f:
                key = f.read(MAX_KEY_BYTES)
        except OSError as e:
            raise http.error(
                ChartProblem.SIGNATURE, f"cannot read cosign_public_key_file: {e.strerror}"
            ) from None
        mark = (chart.manifest, hashlib.sha256(key).hexdigest())
        if mark in self._verified:
            return
        what = f"{helm.chart}@{chart.version} ({chart.manifest[:19]}…)"
        tag = cosign.signature_tag(chart.manifest)
        status, _, body = self._get(
            http,
            ref,
            ref.url("manifests", tag),
            MAX_MANIFEST_BYTES,
            ChartProblem.SIGNATURE,
            accept=f"{OCI_MANIFEST}, {DOCKER_MANIFEST}",
            also=(404,),
        )
        if status == 404:
            raise http.error(ChartProblem.SIGNATURE, f"{what} is not signed (no {tag})")
        layers = (
            _json(body, f"the signature manifest {tag}", http, ChartProblem.SIGNATURE).get("layers") or ()
        )
        why = "no cosign signature layer"
        for layer in layers if isinstance(layers, list) else ():
            annotations = layer.get("annotations") if isinstance(layer, dict) else None
            signature = (
                annotations.get(cosign.SIGNATURE_ANNOTATION) if isinstance(annotations, dict) else None
            )
            digest = layer.get("digest") if isinstance(layer, dict) else None
            if layer.get("mediaType") != cosign.PAYLOAD_TYPE or not isinstance(signature, str):
                continue
            if not isinstance(digest, str) or not _DIGEST.match(digest):
                why = "a signature layer has no sha256 digest"
                continue
            _, _, payload = self._get(
                http, ref, ref.url("blobs", digest), MAX_SIGNATURE_BYTES, ChartProblem.SIGNATURE
            )
            if "sha256:" + hashlib.sha256(payload).hexdigest() != digest:
                why = "a signature payload is not its digest"
                continue
            why = cosign.check(key, chart.manifest, payload, signature)
            if not why:
                self._verified.add(mark)
                return
        raise http.error(ChartProblem.SIGNATURE, f"{what}: {why}")

    def _get(
        self,
        http: ChartHttp,
        ref: _Ref,
        url: str,
        limit: int,
        too_large: ChartProblem,
        *,
        accept: str = "",
        method: str = "GET",
        also: tuple[int, ...] = (),
    ) -> Response:
        """One request to the registry, a bearer challenge answered (and its token kept)."""
        scope = f"repository:{ref.name}:pull"
        headers = {"Accept": accept} if accept else {}
        shown = url.split("?")[0]
        for attempt in range(2):
            token = self._token(ref.base, scope)
            self.requests.append(f"{method} {shown}")
            status, answer, body = http.get(
                url,
                limit,
                headers,
                method=method,
                too_large=too_large,
                authorization=token,
                also=(401, *also),
            )
            if status != 401:
                return status, answer, body
            challenge = answer.get("WWW-Authenticate", "")
            if attempt or not challenge.lower().startswith("bearer "):
                break
            self._tokens.pop((ref.base, scope), None)
            self._fetch_token(http, ref, challenge, scope)
        who = "credentials refused" if http.credentials() else "credentials required"
        raise http.error(ChartProblem.UNAUTHORIZED, f"{method} {shown}: HTTP 401 ({who})")

    def _token(self, base: str, scope: str) -> str | None:
        kept = self._tokens.get((base, scope))
        return f"Bearer {kept[0]}" if kept is not None and kept[1] > time.monotonic() else None

    def _fetch_token(self, http: ChartHttp, ref: _Ref, challenge: str, scope: str) -> None:
        """A token from the challenge's realm, with the entry's credentials if it has any."""
        params = dict(_PARAM.findall(challenge))
        realm = params.get("realm", "")
        if not realm.startswith("https://") and not (http.repo.plain_http and realm.startswith("http://")):
            raise http.error(ChartProblem.UNAUTHORIZED, f"the registry's token realm {realm!r} is not https")
        query = {
            "scope": params.get("scope") or scope,
            **({"service": params["service"]} if "service" in params else {}),
        }
        url = f"{realm}{'&' if '?' in realm else '?'}{urllib.parse.urlencode(query)}"
        creds = http.credentials()
        self.requests.append(f"GET {realm}")
        _, _, body = http.get(
            url,
            MAX_TOKEN_BYTES,
            authorization=basic(*creds) if creds else "",
            origin=realm,
            too_large=ChartProblem.UNAUTHORIZED,
        )
        answer = _json(body, "the token answer", http, ChartProblem.UNAUTHORIZED)
        token = answer.get("token") or answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise http.error(ChartProblem.UNAUTHORIZED, "the token answer has no token")
        seconds = answer.get("expires_in")
        life = seconds if isinstance(seconds, int) and seconds > 0 else DEFAULT_TOKEN_SECONDS
        self._tokens[(ref.base, scope)] = (token, time.monotonic() + max(life - 5, 1))


def _exact(version: str) -> bool:
    """Whether ``version`` names one version (its tag is asked directly) rather than a range."""
    if not version or any(c in version for c in "<>=~^*xX|, "):
        return False
    try:
        parse_version(version)
    except ValueError:
        return False
    return True
