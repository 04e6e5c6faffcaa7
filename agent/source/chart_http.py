"""HTTP(S) requests to one chart repository or OCI registry, with its trust and credentials.

Used by ``source.charts`` (index and archives) and ``source.oci`` (tags, manifests, blobs,
tokens). Credentials (``[[helm_repositories]]``: ``username`` with ``password_file`` or
``password_env``, or an OCI entry's ``docker_config_file``) are read at every request, so a
rotated secret needs no restart, and go only to the entry's own origin: a redirect elsewhere is
asked without them. Every body is read within a limit; every failure is a typed ``ChartError``
naming the app's repository URL, never a credential.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

from agent.config.types import HelmRepository
from agent.errors import ChartError, ChartProblem

__all__ = ["MAX_REDIRECTS", "ChartHttp", "Response", "basic"]

#: Redirects followed for one request.
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
#: Largest Docker ``config.json`` read.
_MAX_DOCKER_CONFIG = 1 << 20

#: (status, headers, body) of an answer.
Response = tuple[int, dict[str, str], bytes]


def _origin(url: str, oci_scheme: str = "https") -> tuple[str, str, int | None]:
    p = urllib.parse.urlsplit(url)
    return (oci_scheme if p.scheme == "oci" else p.scheme, p.hostname or "", p.port)


def basic(username: str, password: str) -> str:
    """The ``Authorization`` value of HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by ``ChartHttp.get`` itself, deciding per hop whether credentials go."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class ChartHttp:
    """Requests to one repository with its trust and credentials, bounded in size."""

    def __init__(self, repo: HelmRepository, url: str, timeout: float, *, tls: bool | None = None) -> None:
        self.repo = repo
        self.url = url  # the app's repository URL: every message names it
        self.timeout = timeout
        #: Where credentials may go: the entry's origin (an oci:// one over HTTPS unless ``tls``
        #: is false: ``plain_http``).
        self.trusted = _origin(repo.url or url, "http" if tls is False else "https")
        ctx: ssl.SSLContext | None = None
        if tls or url.startswith("https://") or repo.ca_file or repo.insecure_skip_tls_verify:
            ctx = ssl.create_default_context(cafile=repo.ca_file or None)
            if repo.insecure_skip_tls_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        self._opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=ctx))

    def error(self, problem: ChartProblem, message: str) -> ChartError:
        return ChartError(problem, message, url=self.url)

    def credentials(self) -> tuple[str, str] | None:
        """(username, password) the entry gives, read now; ``None``: anonymous."""
        r = self.repo
        if r.docker_config_file:
            return self._docker_config()
        if not r.username:
            return None
        if r.password_file:
            try:
                return r.username, Path(r.password_file).read_text("utf-8").rstrip("\r\n")
            except OSError as e:
                raise self.error(
                    ChartProblem.UNAUTHORIZED, f"cannot read password_file: {e.strerror}"
                ) from None
        if r.password_env:
            if r.password_env not in os.environ:
                raise self.error(
                    ChartProblem.UNAUTHORIZED, f"environment variable {r.password_env} is not set"
                )
            return r.username, os.environ[r.password_env]
        return r.username, ""

    def _docker_config(self) -> tuple[str, str] | None:
        """The registry host's entry of ``docker_config_file`` (``auth``, or ``username`` and
        ``password``); ``None`` when it has none (the registry is then asked anonymously)."""
        file = self.repo.docker_config_file
        try:
            with open(file, "rb") as f:
                data = json.loads(f.read(_MAX_DOCKER_CONFIG))
        except (OSError, ValueError) as e:
            why = getattr(e, "strerror", None) or "not JSON"
            raise self.error(ChartProblem.UNAUTHORIZED, f"cannot read docker_config_file: {why}") from None
        auths = data.get("auths") if isinstance(data, dict) else None
        host = urllib.parse.urlsplit(self.url).netloc
        entry = None
        for key, value in (auths or {}).items() if isinstance(auths, dict) else ():
            named = urllib.parse.urlsplit(key if "://" in key else f"//{key}").netloc
            if named == host and isinstance(value, dict):
                entry = value
                break
        if entry is None:
            return None
        if isinstance(entry.get("auth"), str) and entry["auth"]:
            try:
                user, sep, password = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                sep = ""
            if not sep:
                raise self.error(
                    ChartProblem.UNAUTHORIZED,
                    f"docker_config_file: auths[{host!r}].auth is not user:password",
                )
            return user, password
        name, secret = entry.get("username"), entry.get("password")
        if isinstance(name, str) and isinstance(secret, str) and name:
            return name, secret
        return None

    def get(
        self,
        url: str,
        limit: int,
        headers: dict[str, str] | None = None,
        *,
        too_large: ChartProblem = ChartProblem.ARCHIVE,
        method: str = "GET",
        authorization: str | None = None,
        also: tuple[int, ...] = (),
        origin: str = "",
    ) -> Response:
        """The answer to ``url``: 200 or 304, and the statuses ``also`` names (a 401 for a caller
        that answers the challenge, a 404 it expects); anything else raises ``ChartError``.
        ``authorization`` replaces the entry's basic credentials (a bearer token); ``origin`` (a
        URL) is where it may go instead of the entry's own (an OCI registry's token service)."""
        trusted = _origin(origin) if origin else self.trusted
        if authorization is None:
            creds = self.credentials()
            authorization = basic(*creds) if creds else ""
        shown = urllib.parse.urlsplit(url)._replace(query="", fragment="").geturl()
        for _ in range(MAX_REDIRECTS + 1):
            sent = dict(headers or {})
            if authorization and _origin(url) == trusted:
                sent["Authorization"] = authorization
            req = urllib.request.Request(url, headers={"User-Agent": "gitops-agent", **sent}, method=method)
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    body = b"" if method == "HEAD" else self._read(resp, limit, shown, too_large)
                    return resp.status, dict(resp.headers.items()), body
            except urllib.error.HTTPError as e:
                with e:
                    if e.code == 304 or e.code in also:
                        return e.code, dict(e.headers.items()), b""
                    location = e.headers.get("Location") if e.code in _REDIRECTS else None
                    if location:
                        url = urllib.parse.urljoin(url, location)
                        continue
                    raise self._http_error(e.code, f"{method} {shown}", bool(authorization)) from None
            except urllib.error.URLError as e:
                raise self._transport_error(e.reason, f"{method} {shown}") from None
            except OSError as e:  # TimeoutError and ssl.SSLError included
                raise self._transport_error(e, f"{method} {shown}") from None
        raise self.error(ChartProblem.HTTP, f"{method} {shown}: more than {MAX_REDIRECTS} redirects")

    def _read(self, resp: IO[bytes], limit: int, shown: str, too_large: ChartProblem) -> bytes:
        length = getattr(resp, "headers", {}).get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise self.error(too_large, f"GET {shown}: {length} bytes, more than the limit of {limit} bytes")
        body = resp.read(limit + 1)
        if len(body) > limit:
            raise self.error(too_large, f"GET {shown}: more than the limit of {limit} bytes")
        return body

    def _http_error(self, code: int, request: str, sent_credentials: bool) -> ChartError:
        if code in (401, 403):
            who = "credentials refused" if sent_credentials else "credentials required"
            return self.error(ChartProblem.UNAUTHORIZED, f"{request}: HTTP {code} ({who})")
        if code >= 500:
            return self.error(ChartProblem.UNREACHABLE, f"{request}: HTTP {code}")
        return self.error(ChartProblem.HTTP, f"{request}: HTTP {code}")

    def _transport_error(self, reason: object, request: str) -> ChartError:
        if isinstance(reason, ssl.SSLError | ssl.CertificateError):
            return self.error(
                ChartProblem.TLS, f"{request}: TLS: {getattr(reason, 'reason', None) or reason}"
            )
        if isinstance(reason, TimeoutError):
            return self.error(ChartProblem.UNREACHABLE, f"{request}: timed out after {self.timeout:g}s")
        text = getattr(reason, "strerror", None) or str(reason)
        return self.error(ChartProblem.UNREACHABLE, f"{request}: {text}")
