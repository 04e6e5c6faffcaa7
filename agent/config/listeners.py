"""The ``[agent]`` keys of the HTTP listeners (``allowed_hosts``, deadlines, caps); called by
``agent_settings``. Defaults and bounds live on ``types.AgentSettings``."""

from __future__ import annotations

import re
from typing import Any

from agent.config.tomlreader import TableReader
from agent.config.types import AgentSettings

# A host name (RFC 1123 labels) or an IP literal; no port, no scheme, no wildcard.
_HOST = re.compile(
    r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?"
)
LISTENER_KEYS = ("allowed_hosts", "header_timeout", "body_timeout", "max_connections", "http_threads")


def listener_keys(r: TableReader, d: AgentSettings) -> dict[str, Any]:
    hosts = r.string_list("allowed_hosts")
    for h in hosts or ():
        if not _HOST.fullmatch(h.lower()) and not re.fullmatch(r"[0-9a-fA-F:.]+", h):
            raise r.error("allowed_hosts", f"must be host names (no port, scheme or wildcard), got {h!r}")
    return {
        "allowed_hosts": tuple(h.lower().rstrip(".") for h in hosts or ()),
        **{name: r.setting(AgentSettings, name, getattr(d, name)) for name in LISTENER_KEYS[1:]},
    }
