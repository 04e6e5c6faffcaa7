"""The HTTP request each kind of sink makes for an alert or a commit status.

Called by ``delivery.Delivery`` for each message it sends. Pure apart from reading the sink's
secrets (``secrets.Secret``):

- ``webhook``: Flux's event JSON (``involvedObject``, ``severity``, ``timestamp``, ``message``,
  ``reason``, ``metadata`` with ``revision``, ``reportingController``), signed
  ``X-Signature: sha256=<hex>`` when a secret is set, and with ``timestamped`` also
  ``X-Gitops-Timestamp`` and ``X-Gitops-Signature`` (HMAC over timestamp and body);
- ``slack``: an incoming-webhook message (``text`` and one coloured attachment);
- ``github``: ``POST {api}/repos/{owner}/{repo}/statuses/{sha}`` with ``state``, ``context``,
  ``description`` and ``target_url``, ``Authorization: Bearer <token>``;
- ``gitlab``: ``POST {api}/api/v4/projects/{id}/statuses/{sha}`` with ``state``, ``name``,
  ``description`` and ``target_url``, ``PRIVATE-TOKEN: <token>``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

from agent.config.types import STATUS_SINKS, NotificationConfig, SecretRef, Severity, SinkKind
from agent.notify import signing
from agent.notify.policy import CommitState, Notice, NoticeKind, StatusUpdate, app_link, context
from agent.notify.secrets import Masker, Secret, show_target

GITHUB_API = "https://api.github.com"
GITLAB_API = "https://gitlab.com"
USER_AGENT = "gitops-agent"
_GITLAB_STATES = {
    CommitState.PENDING: "pending",
    CommitState.SUCCESS: "success",
    CommitState.FAILURE: "failed",
}
_SLACK_COLOURS = {NoticeKind.FIRING: "danger", NoticeKind.REMINDER: "warning", NoticeKind.RESOLVED: "good"}

Message = Notice | StatusUpdate


@dataclass(frozen=True)
class Request:
    """One HTTP request to a sink; ``what`` names it in logs (never its address)."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    what: str


def _key(prefix: str, ref: SecretRef, stem: str) -> str:
    suffix = "_file" if ref.file else "_env" if ref.env else ""
    return f"{prefix}.{stem}{suffix}"


def repository_of(url: str, kind: SinkKind) -> str:
    """``owner/repo`` (GitLab: the whole project path) from a Git URL; "" when it names none."""
    if "://" in url:
        path = urlsplit(url).path
    elif re.match(r"^[^/@]+@[^/:]+:", url):  # scp-like git@host:owner/repo.git
        path = url.split(":", 1)[1]
    else:
        return ""
    parts = [p for p in path.removesuffix("/").removesuffix(".git").split("/") if p]
    if len(parts) < 2:
        return ""
    return "/".join(parts[-2:] if kind is SinkKind.GITHUB else parts)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Sink:
    """One ``[[notifications]]`` entry: what it takes, and the request for each message."""

    def __init__(
        self,
        cfg: NotificationConfig,
        index: int,
        *,
        masker: Masker,
        agent: str,
        instance: str,
        public_url: str,
        source_url: Callable[[str, str], str],
        file: str = "",
    ) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.kind = cfg.kind
        self.agent = agent
        self.instance = instance
        self.public_url = public_url
        #: (cluster, app) → the app's source URL (for the repository of its commit statuses).
        self.source_url = source_url
        prefix = f"notifications[{index}]"
        self.url = Secret(cfg.url, _key(prefix, cfg.url, "url"), masker, file=file)
        self.token = Secret(cfg.token, _key(prefix, cfg.token, "token"), masker, file=file)
        self.secret = Secret(cfg.secret, _key(prefix, cfg.secret, "secret"), masker, file=file)
        self.masker = masker

    def check(self) -> None:
        """Read every secret once: a missing one is a ``ConfigError`` when the agent starts."""
        for s in (self.url, self.token, self.secret):
            if s:
                s.get()

    @property
    def target(self) -> str:
        """Where it sends, as it may be shown (``/status``): scheme and host, nothing secret."""
        if self.kind is SinkKind.GITHUB:
            return self.cfg.api_url or GITHUB_API
        if self.kind is SinkKind.GITLAB:
            return self.cfg.api_url or GITLAB_API
        try:
            return show_target(self.url.get())
        except Exception:  # unreadable now: say where from, not what
            return self.url.ref.where

    def takes(self, m: Message) -> bool:
        if not self.cfg.wants(m.cluster, m.app):
            return False
        if isinstance(m, StatusUpdate):
            return self.kind in STATUS_SINKS
        if self.kind in STATUS_SINKS:
            return False
        if self.cfg.severity is Severity.ERROR and m.severity is not Severity.ERROR:
            return False
        return not self.cfg.reasons or m.reason in self.cfg.reasons

    def request(self, m: Message) -> Request:
        """The request for ``m``; ``ConfigError`` when a secret cannot be read, ``ValueError``
        when a status has no repository to go to."""
        if isinstance(m, StatusUpdate):
            return self._status(m)
        body = self._slack(m) if self.kind is SinkKind.SLACK else self._event(m)
        raw = json.dumps(body, sort_keys=True).encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if self.kind is SinkKind.WEBHOOK and self.secret:
            key = self.secret.get().encode()
            headers[signing.SIGNATURE] = signing.body_signature(key, raw)
            if self.cfg.timestamped:
                ts = str(int(time.time()))
                headers[signing.TIMESTAMP] = ts
                headers[signing.TIMESTAMPED_SIGNATURE] = signing.timestamped_signature(key, ts, raw)
        what = f"{m.kind.value} {m.reason} {m.cluster}/{m.app}"
        return Request("POST", self.url.get(), headers, raw, what)

    def _event(self, m: Notice) -> dict[str, Any]:
        """Flux's event shape (``eventv1.Event``), so that existing receivers read it."""
        metadata = {
            "revision": m.revision,
            "cluster": m.cluster,
            "app": m.app,
            "condition": m.condition.value,
            "notification": m.kind.value,
            "failures": str(m.failures),
        }
        if m.cause:
            metadata["cause"] = m.cause
        if m.since:
            metadata["since"] = _iso(m.since)
        if link := app_link(self.public_url, m.cluster, m.app):
            metadata["url"] = link
        return {
            "involvedObject": {
                "apiVersion": "gitops-agent.io/v1",
                "kind": "App",
                "namespace": m.cluster,
                "name": m.app,
            },
            "severity": m.severity.value,
            "timestamp": _iso(m.at),
            "message": m.message,
            "reason": m.reason,
            "metadata": metadata,
            "reportingController": self.agent,
            "reportingInstance": self.instance,
        }

    def _slack(self, m: Notice) -> dict[str, Any]:
        title = f"{m.reason}: {m.cluster}/{m.app}" + (" (reminder)" if m.kind is NoticeKind.REMINDER else "")
        attachment: dict[str, Any] = {
            "color": _SLACK_COLOURS[m.kind],
            "title": title,
            "text": m.message,
            "fields": [
                {"title": "cluster", "value": m.cluster, "short": True},
                {"title": "app", "value": m.app, "short": True},
                {"title": "revision", "value": m.revision[:12], "short": True},
            ],
            "footer": self.agent,
            "ts": int(m.at),
        }
        if link := app_link(self.public_url, m.cluster, m.app):
            attachment["title_link"] = link
        return {"text": f"[{m.kind.value}] {title}", "attachments": [attachment]}

    def _status(self, m: StatusUpdate) -> Request:
        repo = self.cfg.repository or repository_of(self.source_url(m.cluster, m.app), self.kind)
        if not repo:
            raise ValueError(f"no repository for app {m.cluster}/{m.app}: set repository on this sink")
        token = self.token.get()
        ctx = context(self.agent, m.cluster, m.app)
        link = app_link(self.public_url, m.cluster, m.app)
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if self.kind is SinkKind.GITHUB:
            url = f"{self.cfg.api_url or GITHUB_API}/repos/{repo}/statuses/{m.revision}"
            body: dict[str, Any] = {"state": m.state.value, "context": ctx, "description": m.description}
            headers |= {
                "Accept": "application/vnd.github+json",
                "Authorization": f"Bearer {token}",
                "X-GitHub-Api-Version": "2022-11-28",
            }
        else:
            project = quote(repo, safe="")
            url = f"{self.cfg.api_url or GITLAB_API}/api/v4/projects/{project}/statuses/{m.revision}"
            body = {"state": _GITLAB_STATES[m.state], "name": ctx, "description": m.description}
            headers["PRIVATE-TOKEN"] = token
        if link:
            body["target_url"] = link
        raw = json.dumps(body, sort_keys=True).encode()
        return Request("POST", url, headers, raw, f"status {m.state.value} {ctx} {m.revision[:12]}")
