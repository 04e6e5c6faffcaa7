"""The one module that talks to Kubernetes: a thin, raw-JSON client per cluster.

Every stage that needs a cluster gets a ``KubeClient``; nothing else imports
``kubernetes``. It uses the official client only for what it is good at
(kubeconfig/in-cluster loading, credential refresh for exec plugins and
rotated token files, TLS, the connection pool) and sends raw requests, so that
objects stay plain dicts: no model deserialisation on the hot path, and any
kind — CRDs included — works through discovery.

Each cluster has its own client, pool, timeouts and 429 handling, so one slow
or broken cluster never borrows anything another needs (docs/safety.md rule 6).
Failures become ``ApiError`` with the HTTP status and the server's ``Status``
(reason, message, details), or status 0 and a ``Transport`` read from the
exception's type when there was no answer.

``KubeClient.impersonating`` is the same client acting as an app's ServiceAccount: its
requests carry ``Impersonate-User`` (the server adds the account's groups), while the pool,
credentials, write fence, discovery and OpenAPI stay the agent's own.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config import kube_config as k8s_kube_config

from agent.config.types import DISCOVERY_TTL, ClusterConfig
from agent.errors import ApiError, ClusterError, Transport
from agent.kube import status as kube_status
from agent.kube.listjson import each_item
from agent.kube.status import parse_status
from agent.model import FailureReason, Manifest, split_api_version


def _write_credential_files_whole() -> None:
    """Make the official loader's credential files whole before anyone can read them.

    The loader writes a kubeconfig's embedded certificates and keys to files it caches by content,
    and it publishes a file's name in that cache before writing the file: two clusters loading the
    same certificate at once (one cluster reached by two URLs, two contexts with one user) could
    hand one of them an empty file, whose TLS setup then fails with "[SSL] PEM lib". Only the file
    step is serialised: the rest of loading runs exec plugins, and one cluster's slow plugin must
    not hold up the others' credentials (docs/safety.md rule 6).
    """
    write = k8s_kube_config._create_temp_file_with_content
    lock = threading.Lock()

    def written_whole(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return write(*args, **kwargs)

    k8s_kube_config._create_temp_file_with_content = written_whole


_write_credential_files_whole()

_AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
_MAX_429_RETRIES = 3


def _encode(body: Any) -> bytes | None:
    """A request body as sent: bytes as they are, text as UTF-8, anything else as compact JSON."""
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


#: Where a request's ``Warning`` headers are appended (a name: ``KubeClient.list`` shadows ``list``).
WarningSink = list[str]


@dataclass(frozen=True)
class ResourceInfo:
    """One served resource: where to send requests for a group/version/kind."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: frozenset[str]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def base_path(self, namespace: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{root}/{self.plural}"

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = self.base_path(namespace)
        return f"{base}/{quote(name, safe='')}" if name else base


class RequestOptions(TypedDict, total=False):
    """The keyword arguments of ``KubeClient.request_bytes`` (and so of ``request``)."""

    query: Mapping[str, str | None] | None
    body: Any
    content_type: str
    accept: str
    timeout: float | None
    warnings: list[str] | None
    impersonate: str | None


def service_account_user(service_account: str) -> str:
    """``ns/name`` → ``system:serviceaccount:ns:name``, the user name the server gives a ServiceAccount."""
    namespace, _, name = service_account.partition("/")
    return f"system:serviceaccount:{namespace}:{name}"


@dataclass(frozen=True)
class ListResult:
    """A LIST of one kind. ``complete`` is the prune guard's evidence (docs/safety.md rule 1)."""

    items: tuple[Manifest, ...]
    complete: bool
    resource_version: str = ""


class Discovery:
    """Served resources by (group, kind) with each group's preferred version first."""

    def __init__(self, resources: list[ResourceInfo]) -> None:
        self._by_gvk = {(r.group, r.version, r.kind): r for r in resources}
        self._by_gk: dict[tuple[str, str], ResourceInfo] = {}
        for r in resources:  # first seen is the preferred version (discovery order)
            self._by_gk.setdefault((r.group, r.kind), r)

    def find(self, api_version: str, kind: str) -> ResourceInfo | None:
        group, version = split_api_version(api_version)
        return self._by_gvk.get((group, version, kind))

    def find_group_kind(self, group: str, kind: str) -> ResourceInfo | None:
        return self._by_gk.get((group, kind))

    def served(self) -> dict[tuple[str, str], list[str]]:
        """(group, kind) → the versions served, the preferred first (``plan.apis`` reads it)."""
        out: dict[tuple[str, str], list[str]] = {}
        for r in self._by_gvk.values():
            versions = out.setdefault((r.group, r.kind), [])
            if r.version not in versions:
                versions.append(r.version)
        return out

    def api_versions(self) -> list[str]:
        """``group/version`` and ``group/version/Kind`` of everything served: Helm's ``--api-versions``."""
        gvs = {r.api_version for r in self._by_gvk.values()}
        gvks = {f"{r.api_version}/{r.kind}" for r in self._by_gvk.values() if r.kind}
        return sorted(gvs | gvks)

    def all(self) -> list[ResourceInfo]:
        return list(self._by_gvk.values())

    def __len__(self) -> int:
        return len(self._by_gvk)


class KubeClient:
    """Raw-JSON requests to one cluster, with its own pool, timeouts and discovery cache."""

    def __init__(
        self,
        name: str,
        api: k8s_client.ApiClient,
        *,
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        reload: Callable[[], k8s_client.ApiClient] | None = None,
    ) -> None:
        self.name = name
        self.api = api
        #: Rebuilds ``api`` from its source (kubeconfig file, exec plugin, token file) after a 401.
        self._reload = reload
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._discovery: Discovery | None = None
        self._discovered_at = 0.0
        self._server_version: str | None = None
        self._cluster_uid: str | None = None
        self._lock = threading.Lock()
        self.requests = 0  # requests sent, for tests and debug logs (benchmarks count at the server)

    # -- construction ---------------------------------------------------------

    @classmethod
    def from_config(cls, cluster: ClusterConfig) -> KubeClient:
        s = cluster.settings
        return cls.connect(
            cluster.name,
            kubeconfig=cluster.kubeconfig or None,
            context=cluster.context or None,
            in_cluster=cluster.in_cluster,
            connect_timeout=s.connect_timeout,
            request_timeout=s.request_timeout,
            pool_size=max(2, s.concurrency),
        )

    @classmethod
    def connect(
        cls,
        name: str,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        pool_size: int = 4,
    ) -> KubeClient:

        def build() -> k8s_client.ApiClient:
            cfg = k8s_client.Configuration()
            try:
                if in_cluster:
                    k8s_config.load_incluster_config(client_configuration=cfg, try_refresh_token=True)
                else:
                    k8s_config.load_kube_config(
                        config_file=kubeconfig,
                        context=context,
                        client_configuration=cfg,
                        persist_config=False,
                    )
            except Exception as e:  # the loader raises many types; all mean "cannot build credentials"
                raise ClusterError(
                    name,
                    f"cannot load credentials: {e}",
                    retryable=False,
                    failure_reason=FailureReason.CREDENTIALS,
                ) from e
            cfg.connection_pool_maxsize = pool_size
            cfg.retries = False  # retries are ours: bounded, per cluster, honouring Retry-After
            return k8s_client.ApiClient(cfg)

        return cls(
            name, build(), connect_timeout=connect_timeout, request_timeout=request_timeout, reload=build
        )

    def close(self) -> None:
        self.api.close()

    def refresh_credentials(self) -> bool:
        """Load the credentials again from where they came from; True if a new client is in place.

        The official client refreshes an exec plugin's token only when the plugin reported an
        expiry, re-reads the in-cluster token file once a minute, and never re-reads a kubeconfig
        file or its ``tokenFile``. A 401 after a rotation is therefore answered by rebuilding the
        configuration (which runs the exec plugin again and reads the files again).
        """
        if self._reload is None:
            return False
        try:
            fresh = self._reload()
        except ClusterError:
            return False
        old, self.api = self.api, fresh
        old.close()  # in-flight requests finish; their connections are then dropped, not reused
        return True

    # -- raw requests ---------------------------------------------------------

    def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> Any:
        """Send one request; returns the decoded JSON body or raises ``ApiError``."""
        raw = self.request_bytes(method, path, **options)
        return json.loads(raw) if raw else None

    def check_send(self, method: str) -> None:
        """Raise to refuse sending a ``method`` request (``lease.FencedClient`` gates writes here)."""

    def request_bytes(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | None] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float | None = None,
        warnings: list[str] | None = None,
        impersonate: str | None = None,
    ) -> bytes:
        """Send one request; returns the raw body of a 2xx answer or raises ``ApiError``.

        ``warnings``: the server's ``Warning`` headers of the answer are appended there
        (deprecated API versions, unknown or duplicate fields). ``impersonate``: the user name
        to act as (``Impersonate-User``).
        """
        self.check_send(method)
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": accept, "Content-Type": content_type}
        if impersonate:
            headers["Impersonate-User"] = impersonate
        data = _encode(body)
        target = path
        refreshed = False
        attempt = 0
        while True:
            self.requests += 1
            try:
                resp = self._send(method, path, params, headers, data, timeout or self.request_timeout)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                transport, said = kube_status.transport(e)
                raise ApiError(self.name, 0, said, verb=method, target=target, transport=transport) from e
            raw: bytes = resp.data
            if 200 <= resp.status < 300:
                if warnings is not None:
                    warnings.extend(kube_status.warnings(resp.headers.getlist("Warning")))
                return raw
            if resp.status == 401 and not refreshed:
                refreshed = True  # once per request: a revoked credential must not loop
                if self.refresh_credentials():
                    continue
            retry_after = kube_status.retry_after(resp.headers.get("Retry-After"))
            if resp.status == 429 and attempt < _MAX_429_RETRIES:
                attempt += 1
                time.sleep(min(retry_after or 1.0, 10.0))
                continue
            status = parse_status(raw, resp.reason or "")
            raise ApiError(
                self.name,
                resp.status,
                status.message,
                reason=status.reason,
                verb=method,
                target=target,
                retry_after=retry_after,
                details=status.details,
            )

    def _send(
        self,
        method: str,
        path: str,
        params: list[tuple[str, str]],
        headers: dict[str, str],
        data: bytes | None,
        read_timeout: float,
    ) -> urllib3.BaseHTTPResponse:
        """One request on the official client's connection pool (its TLS settings, client
        certificate and proxy), with its headers and credentials.

        Its ``param_serialize`` and ``call_api`` are skipped: they sanitize, re-encode and
        content-type-match every request, ~15% of a request's client CPU, and an initial apply
        sends one request per object. The credentials still come from ``update_params_for_auth``,
        which runs the configuration's token refresh hook (exec plugins, in-cluster tokens).
        """
        api = self.api
        hdrs = {**api.default_headers, **headers}
        queries = list(params)
        api.update_params_for_auth(hdrs, queries, ["BearerToken"], path, method, data)
        url = api.configuration.host + path
        if queries:
            url += "?" + urlencode(queries)
        return api.rest_client.pool_manager.request(
            method,
            url,
            body=data,
            headers=hdrs,
            timeout=urllib3.Timeout(connect=self.connect_timeout, read=read_timeout),
            retries=False,
            preload_content=True,
        )

    def impersonating(self, service_account: str) -> KubeClient:
        """This client acting as ``service_account`` (``ns/name``); itself for ""."""
        return Impersonated(self, service_account) if service_account else self

    # -- discovery ------------------------------------------------------------

    def discovery(self, *, refresh: bool = False) -> Discovery:
        """Served resources (aggregated discovery: two requests); cached until ``refresh`` or
        ``DISCOVERY_TTL`` (a cluster upgraded under a long-running agent stops serving versions)."""
        with self._lock:
            fresh = time.monotonic() - self._discovered_at < DISCOVERY_TTL
            if self._discovery is not None and not refresh and fresh:
                return self._discovery
        resources: list[ResourceInfo] = []
        for root in ("/api", "/apis"):
            doc = self.request("GET", root, accept=_AGGREGATED)
            if doc.get("kind") != "APIGroupDiscoveryList":
                raise ClusterError(
                    self.name, "server does not serve aggregated discovery (Kubernetes < 1.30?)"
                )
            for group in doc.get("items", []):
                gname = (group.get("metadata") or {}).get("name", "")
                for ver in group.get("versions", []):
                    for res in ver.get("resources", []):
                        rk = res.get("responseKind") or {}
                        resources.append(
                            ResourceInfo(
                                group=gname,
                                version=ver["version"],
                                kind=rk.get("kind", ""),
                                plural=res["resource"],
                                namespaced=res.get("scope") == "Namespaced",
                                verbs=frozenset(res.get("verbs", [])),
                            )
                        )
        disc = Discovery(resources)
        with self._lock:
            self._discovery = disc
            self._discovered_at = time.monotonic()
            self._server_version = None  # an upgrade changes both: read it again when asked
        return disc

    def resource(self, api_version: str, kind: str) -> ResourceInfo:
        """Resolve a kind, refreshing discovery once when unknown (a CRD applied this pass)."""
        info = self.discovery().find(api_version, kind)
        if info is None:
            info = self.discovery(refresh=True).find(api_version, kind)
        if info is None:
            raise ApiError(
                self.name, 404, f"the server does not serve {kind} in {api_version}", reason="NotFound"
            )
        return info

    def resource_for(self, manifest: Manifest) -> ResourceInfo:
        return self.resource(str(manifest.get("apiVersion", "")), str(manifest.get("kind", "")))

    # -- verbs ----------------------------------------------------------------

    def get(self, info: ResourceInfo, namespace: str | None, name: str) -> Manifest | None:
        try:
            result: Manifest = self.request("GET", info.path(namespace, name))
            return result
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(
        self,
        info: ResourceInfo,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> ListResult:
        """Paginated LIST. Complete only if it ended without a continue token and without a 410."""
        items: list[Manifest] = []
        complete, rv = self.scan(
            info, items.append, namespace=namespace, label_selector=label_selector, page_size=page_size
        )
        return ListResult(tuple(items), complete=complete, resource_version=rv)

    def scan(
        self,
        info: ResourceInfo,
        on_item: Callable[[Manifest], None],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[bool, str]:
        """Paginated LIST handing each item to ``on_item`` as it is decoded: (complete, resourceVersion).

        Items come page by page and one at a time (``listjson``), so a caller that keeps only what
        it needs never holds a whole kind. Incomplete (a continue token expired: 410) means the
        items handed over are not a snapshot of the kind; the caller must not treat what it did not
        see as absent.
        """
        token: str | None = None
        rv = ""
        api_version, kind = info.api_version, info.kind

        def take(it: Manifest) -> None:
            # LIST items carry no apiVersion/kind; fill them so they are full manifests.
            it.setdefault("apiVersion", api_version)
            it.setdefault("kind", kind)
            on_item(it)

        while True:
            query = {"limit": str(page_size), "continue": token, "labelSelector": label_selector}
            try:
                raw = self.request_bytes("GET", info.base_path(namespace), query=query)
            except ApiError as e:
                if e.status == 410:  # continue token expired: the listing is not a snapshot any more
                    return False, rv
                raise
            text = raw.decode("utf-8")
            del raw
            try:
                page = each_item(text, take)
            except ValueError as e:
                where = info.base_path(namespace)
                raise ApiError(
                    self.name,
                    0,
                    f"malformed LIST response: {e}",
                    verb="GET",
                    target=where,
                    transport=Transport.MALFORMED,
                ) from e
            del text
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion", rv)
            token = meta.get("continue") or None
            if not token:
                return True, rv

    def apply(
        self,
        manifest: Manifest,
        *,
        field_manager: str,
        force: bool = False,
        dry_run: bool = False,
        info: ResourceInfo | None = None,
        warnings: WarningSink | None = None,
    ) -> Manifest:
        """Server-side apply (``application/apply-patch+yaml``): only the fields in ``manifest``.

        ``warnings`` collects the server's ``Warning`` headers (a deprecated version says so here).
        """
        info = info or self.resource_for(manifest)
        meta = manifest.get("metadata") or {}
        query = {
            "fieldManager": field_manager,
            "force": "true" if force else None,
            "dryRun": "All" if dry_run else None,
        }
        result: Manifest = self.request(
            "PATCH",
            info.path(meta.get("namespace") if info.namespaced else None, meta["name"]),
            query=query,
            body=json.dumps(manifest, separators=(",", ":")),  # JSON is YAML: sent as is
            content_type="application/apply-patch+yaml",
            warnings=warnings,
        )
        return result

    def patch(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        patch_type: str = "merge",
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Manifest:
        """A plain (non-apply) patch: used to orphan objects and edit managedFields on purpose."""
        ctype = {"merge": "application/merge-patch+json", "json": "application/json-patch+json"}[patch_type]
        query = {"fieldManager": field_manager, "dryRun": "All" if dry_run else None}
        result: Manifest = self.request(
            "PATCH",
            info.path(namespace, name),
            query=query,
            body=patch,
            content_type=ctype,
        )
        return result

    def create(self, info: ResourceInfo, manifest: Manifest, *, field_manager: str | None = None) -> Manifest:
        ns = (manifest.get("metadata") or {}).get("namespace")
        result: Manifest = self.request(
            "POST",
            info.base_path(ns if info.namespaced else None),
            query={"fieldManager": field_manager},
            body=manifest,
        )
        return result

    def delete(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str = "Background",
        dry_run: bool = False,
    ) -> Manifest | None:
        """Delete, with a ``uid`` precondition so we never delete a re-created namesake (and a
        ``resource_version`` one, to delete only the state that was read)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        preconditions = {"uid": uid, "resourceVersion": resource_version}
        if uid or resource_version:
            body["preconditions"] = {k: v for k, v in preconditions.items() if v}
        if dry_run:
            body["dryRun"] = ["All"]
        result: Manifest | None = self.request("DELETE", info.path(namespace, name), body=body)
        return result

    def openapi_v3(self, group: str, version: str) -> Manifest:
        """The OpenAPI v3 document of one group-version (list types, int-or-string, ...)."""
        path = f"/openapi/v3/apis/{group}/{version}" if group else f"/openapi/v3/api/{version}"
        result: Manifest = self.request("GET", path)
        return result

    def server_version(self) -> str:
        """The API server's ``gitVersion`` (``v1.35.4``); cached as long as discovery is."""
        if self._server_version is None:
            doc = self.request("GET", "/version")
            self._server_version = str(doc.get("gitVersion", ""))
        return self._server_version

    def cluster_uid(self, *, timeout: float | None = None) -> str | None:
        """The UID of the ``kube-system`` namespace: which cluster this is, whatever URL reached it.

        One GET, then cached for the client's lifetime (a client talks to one API server).
        ``None`` when RBAC hides the namespace (403: the namespaced install) or it does not
        exist (404); any other failure raises ``ApiError`` like every request.
        """
        if self._cluster_uid is not None:
            return self._cluster_uid
        try:
            ns = self.request("GET", "/api/v1/namespaces/kube-system", timeout=timeout)
        except ApiError as e:
            if e.status in (403, 404):
                return None
            raise
        uid = str((ns.get("metadata") or {}).get("uid") or "") or None
        self._cluster_uid = uid
        return uid


class Impersonated(KubeClient):
    """A ``KubeClient`` whose requests act as one ServiceAccount (an app's identity).

    It shares everything else with the agent's client it was made from: connection pool,
    credentials and their refresh, the write fence (``check_send``), discovery, OpenAPI and
    the cluster's identity, which are the agent's own reads and never impersonated.
    """

    def __init__(self, base: KubeClient, service_account: str) -> None:  # no super(): nothing of its own
        self.base = base
        self.service_account = service_account
        self.user = service_account_user(service_account)
        self.name = base.name
        self.connect_timeout = base.connect_timeout
        self.request_timeout = base.request_timeout
        self.requests = 0

    @property
    def api(self) -> k8s_client.ApiClient:  # type: ignore[override]  # always the base's current one
        return self.base.api

    def close(self) -> None:
        """Nothing to close: the pool is the base client's."""

    def refresh_credentials(self) -> bool:
        return self.base.refresh_credentials()

    def check_send(self, method: str) -> None:
        self.base.check_send(method)

    def impersonating(self, service_account: str) -> KubeClient:
        return self.base.impersonating(service_account)

    def request_bytes(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | None] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float | None = None,
        warnings: list[str] | None = None,
        impersonate: str | None = None,
    ) -> bytes:
        self.requests += 1
        return self.base.request_bytes(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            accept=accept,
            timeout=timeout,
            warnings=warnings,
            impersonate=self.user,
        )

    def discovery(self, *, refresh: bool = False) -> Discovery:
        return self.base.discovery(refresh=refresh)

    def openapi_v3(self, group: str, version: str) -> Manifest:
        return self.base.openapi_v3(group, version)

    def server_version(self) -> str:
        return self.base.server_version()

    def cluster_uid(self, *, timeout: float | None = None) -> str | None:
        return self.base.cluster_uid(timeout=timeout)
