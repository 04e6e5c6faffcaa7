"""One cluster's connection: credentials, the connection pool, and the request loop.

``KubeClient`` sends every request through its ``Connection`` (and the views of a client, acting
as ServiceAccounts, share it). The official client is used only for what it is good at
(kubeconfig/in-cluster loading, credential refresh for exec plugins and rotated token files,
TLS, the connection pool); requests are sent raw, so bodies stay bytes. Each cluster has its own
connection, pool, timeouts and 429 handling, so one slow or broken cluster never borrows anything
another needs (docs/safety.md rule 6). Failures become ``ApiError`` with the HTTP status and the
server's ``Status``, or status 0 and a ``Transport`` read from the exception's type when there
was no answer.

``install_credential_patch`` is a start-up step (``gitops-agent run`` calls it, and so does every
``connect``): it makes the official loader write credential files whole.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config import kube_config as k8s_kube_config

from agent.config.types import ClusterConfig
from agent.errors import ApiError, ClusterError
from agent.kube import status as kube_status
from agent.model import FailureReason

_MAX_429_RETRIES = 3
#: Marks the loader's file writer once it is wrapped, so installing twice wraps once.
_WHOLE = "_gitops_agent_whole_files"
_installing = threading.Lock()


def install_credential_patch() -> None:
    """Make the official loader's credential files whole before anyone can read them (idempotent).

    The loader writes a kubeconfig's embedded certificates and keys to files it caches by content,
    and it publishes a file's name in that cache before writing the file: two clusters loading the
    same certificate at once (one cluster reached by two URLs, two contexts with one user) could
    hand one of them an empty file, whose TLS setup then fails with "[SSL] PEM lib". Only the file
    step is serialised: the rest of loading runs exec plugins, and one cluster's slow plugin must
    not hold up the others' credentials (docs/safety.md rule 6).
    """
    with _installing:
        write = k8s_kube_config._create_temp_file_with_content
        if getattr(write, _WHOLE, False):
            return
        lock = threading.Lock()

        def written_whole(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return write(*args, **kwargs)

        setattr(written_whole, _WHOLE, True)
        k8s_kube_config._create_temp_file_with_content = written_whole


def credential_patch_installed() -> bool:
    """Whether ``install_credential_patch`` has run in this process."""
    return bool(getattr(k8s_kube_config._create_temp_file_with_content, _WHOLE, False))


def _encode(body: Any) -> bytes | None:
    """A request body as sent: bytes as they are, text as UTF-8, anything else as compact JSON."""
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


class Connection:
    """One cluster's pool, credentials and timeouts; sends requests and counts them."""

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
        #: Requests are sent from many threads (apply workers, health reads) and counted here.
        self._count_lock = threading.Lock()
        self._requests = 0

    @classmethod
    def from_config(cls, cluster: ClusterConfig) -> Connection:
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
    ) -> Connection:
        install_credential_patch()

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

    @property
    def requests(self) -> int:
        """Requests sent (each retry counts), for tests and debug logs; benchmarks count at the server."""
        with self._count_lock:
            return self._requests

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

    def send(
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
        impersonate: str = "",
    ) -> bytes:
        """Send one request; returns the raw body of a 2xx answer or raises ``ApiError``.

        A 401 reloads the credentials once; a 429 waits its ``Retry-After`` (at most 10 s) up to
        three times. ``warnings``: the answer's ``Warning`` headers are appended there.
        ``impersonate``: the user name to act as (``Impersonate-User``).
        """
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": accept, "Content-Type": content_type}
        if impersonate:
            headers["Impersonate-User"] = impersonate
        data = _encode(body)
        refreshed = False
        attempt = 0
        while True:
            with self._count_lock:
                self._requests += 1
            try:
                resp = self._send(method, path, params, headers, data, timeout or self.request_timeout)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                transport, said = kube_status.transport(e)
                raise ApiError(self.name, 0, said, verb=method, target=path, transport=transport) from e
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
            status = kube_status.parse_status(raw, resp.reason or "")
            raise ApiError(
                self.name,
                resp.status,
                status.message,
                reason=status.reason,
                verb=method,
                target=path,
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
