"""The ``[agent]`` keys of the HTTP listeners (``allowed_hosts``, deadlines, caps); called by
``load._agent``. Defaults live in ``types.AgentSettings``."""

from __future__ import annotations

import re
from typing import Any

from agent.config.tomlreader import TableReader
from agent.config.types import AgentSettings

# A host name (RFC 1123 labels) or an IP literal; no port, no scheme, no wildcard.
_HOST = re.compile(
    r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?"
)


def listener_keys(r: TableReader, d: AgentSettings) -> dict[str, Any]:
    hosts = r.string_list("allowed_hosts")
    for h in hosts or ():
        if not _HOST.fullmatch(h.lower()) and not re.fullmatch(r"[0-9a-fA-F:.]+", h):
            raise r.error("allowed_hosts", f"must be host names (no port, scheme or wildcard), got {h!r}")
    ints: dict[str, int] = {}
    for name in ("max_connections", "http_threads"):
        v = r.get(name, int, getattr(d, name))
        if v < 1:
            raise r.error(name, f"must be at least 1, got {v}")
        ints[name] = v
    return {
        "allowed_hosts": tuple(h.lower().rstrip(".") for h in hosts or ()),
        "header_timeout": r.duration("header_timeout", d.header_timeout, minimum=0.1),
        "body_timeout": r.duration("body_timeout", d.body_timeout, minimum=0.1),
        **ints,
    }
