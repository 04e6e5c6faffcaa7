"""The one module stages use to talk to Kubernetes: a thin, raw-JSON client per cluster.

Every stage that needs a cluster gets a ``KubeClient``; nothing else imports ``kubernetes``
(``agent.kube.connection`` holds the official client). Objects stay plain dicts: no model
deserialisation on the hot path, and any kind -- CRDs included -- works through discovery
(``agent.kube.discovery``).

A client is composed, not subclassed:

- its ``Connection`` (pool, credentials, timeouts, the request loop), shared by its views;
- a ``WriteGate`` asked before every request (``lease.Fence`` refuses writes while this replica
  may not write to the cluster; the default lets everything through);
- an identity: ``impersonating(sa)`` is a view of the same client acting as an app's
  ServiceAccount. Its requests carry ``Impersonate-User`` (the server adds the account's
  groups), while the connection, credentials, gate, discovery and OpenAPI stay the agent's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, Unpack

from agent.config.types import ClusterConfig
from agent.errors import ApiError, Transport
from agent.kube.connection import Connection
from agent.kube.discovery import AGGREGATED, Discovery, DiscoveryCache, ResourceInfo, parse_aggregated
from agent.kube.listjson import each_item
from agent.model import Manifest

__all__ = [
    "OPEN",
    "Discovery",
    "KubeClient",
    "ListResult",
    "RequestOptions",
    "ResourceInfo",
    "WarningSink",
    "WriteGate",
    "service_account_user",
]

#: Where a request's ``Warning`` headers are appended (a name: ``KubeClient.list`` shadows ``list``).
WarningSink = list[str]


class WriteGate(Protocol):
    """Asked before every request a client sends; raises to refuse it (``lease.Fence``)."""

    def check(self, method: str) -> None: ...


class _Open:
    """The gate of a client nobody fences: every request goes."""

    def check(self, method: str) -> None:
        return None


OPEN: WriteGate = _Open()


class RequestOptions(TypedDict, total=False):
    """The keyword arguments of ``KubeClient.request_bytes`` (and so of ``request``)."""

    query: Mapping[str, str | None] | None
    body: Any
    content_type: str
    accept: str
    timeout: float | None
    warnings: list[str] | None


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


class KubeClient:
    """Raw-JSON requests to one cluster through a ``Connection``, past a gate, as an identity."""

    def __init__(
        self,
        connection: Connection,
        *,
        gate: WriteGate = OPEN,
        service_account: str = "",
        cache: DiscoveryCache | None = None,
    ) -> None:
        self.connection = connection
        self.gate = gate
        #: ``ns/name`` of the ServiceAccount this client acts as; "": the agent itself.
        self.service_account = service_account
        #: The user name sent as ``Impersonate-User`` ("": none).
        self.user = service_account_user(service_account) if service_account else ""
        self._cache = cache if cache is not None else DiscoveryCache()

    # -- construction ---------------------------------------------------------

    @classmethod
    def from_config(cls, cluster: ClusterConfig, *, gate: WriteGate = OPEN) -> KubeClient:
        return cls(Connection.from_config(cluster), gate=gate)

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
        gate: WriteGate = OPEN,
    ) -> KubeClient:
        connection = Connection.connect(
            name,
            kubeconfig=kubeconfig,
            context=context,
            in_cluster=in_cluster,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
            pool_size=pool_size,
        )
        return cls(connection, gate=gate)

    def with_gate(self, gate: WriteGate) -> KubeClient:
        """This client (same connection, identity and cache) with its requests asked of ``gate``.

        Both hold one connection: whichever the caller keeps as the owner closes it.
        """
        return KubeClient(self.connection, gate=gate, service_account=self.service_account, cache=self._cache)

    def impersonating(self, service_account: str) -> KubeClient:
        """This client acting as ``service_account`` (``ns/name``; "": the agent itself).

        A view: it shares the connection, gate and discovery cache, so closing it closes nothing.
        """
        if service_account == self.service_account:
            return self
        return KubeClient(self.connection, gate=self.gate, service_account=service_account, cache=self._cache)

    @property
    def name(self) -> str:
        return self.connection.name

    @property
    def api(self) -> Any:  # the official ``ApiClient`` (untyped)
        """The official client of the connection (its configuration: TLS files, tokens)."""
        return self.connection.api

    @property
    def connect_timeout(self) -> float:
        return self.connection.connect_timeout

    @property
    def request_timeout(self) -> float:
        return self.connection.request_timeout

    @property
    def requests(self) -> int:
        """Requests sent on the connection, by this client and its views (read from any thread)."""
        return self.connection.requests

    def close(self) -> None:
        """Close the connection; a view acting as a ServiceAccount has none of its own to close."""
        if not self.service_account:
            self.connection.close()

    def refresh_credentials(self) -> bool:
        return self.connection.refresh_credentials()

    # -- raw requests ---------------------------------------------------------

    def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> Any:
        """Send one request; returns the decoded JSON body or raises ``ApiError``."""
        raw = self.request_bytes(method, path, **options)
        return json.loads(raw) if raw else None

    def request_bytes(self, method: str, path: str, **options: Unpack[RequestOptions]) -> bytes:
        """Send one request past the gate, as this client's identity; returns the raw body of a
        2xx answer or raises ``ApiError`` (``Connection.send`` says how 401 and 429 are handled).

        ``warnings``: the server's ``Warning`` headers of the answer are appended there
        (deprecated API versions, unknown or duplicate fields).
        """
        self.gate.check(method)
        return self.connection.send(method, path, impersonate=self.user, **options)

    def _own(self) -> KubeClient:
        """The agent's own identity: discovery, OpenAPI and the cluster's identity are never a tenant's."""
        return self.impersonating("")

    # -- discovery ------------------------------------------------------------

    def discovery(self, *, refresh: bool = False) -> Discovery:
        """Served resources (aggregated discovery: two requests); cached until ``refresh`` or
        ``DISCOVERY_TTL`` (a cluster upgraded under a long-running agent stops serving versions)."""
        cached = None if refresh else self._cache.fresh()
        if cached is not None:
            return cached
        own = self._own()
        resources: list[ResourceInfo] = []
        for root in ("/api", "/apis"):
            resources += parse_aggregated(self.name, own.request("GET", root, accept=AGGREGATED))
        disc = Discovery(resources)
        self._cache.store(disc)
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
        result: Manifest = self._own().request("GET", path)
        return result

    def server_version(self) -> str:
        """The API server's ``gitVersion`` (``v1.35.4``); cached as long as discovery is."""
        if self._cache.server_version is None:
            doc = self._own().request("GET", "/version")
            self._cache.server_version = str(doc.get("gitVersion", ""))
        return self._cache.server_version

    def cluster_uid(self, *, timeout: float | None = None) -> str | None:
        """The UID of the ``kube-system`` namespace: which cluster this is, whatever URL reached it.

        One GET, then cached for the client's lifetime (a client talks to one API server).
        ``None`` when RBAC hides the namespace (403: the namespaced install) or it does not
        exist (404); any other failure raises ``ApiError`` like every request.
        """
        if self._cache.cluster_uid is not None:
            return self._cache.cluster_uid
        try:
            ns = self._own().request("GET", "/api/v1/namespaces/kube-system", timeout=timeout)
        except ApiError as e:
            if e.status in (403, 404):
                return None
            raise
        uid = str((ns.get("metadata") or {}).get("uid") or "") or None
        self._cache.cluster_uid = uid
        return uid
