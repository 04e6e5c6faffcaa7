"""The ``[agent]`` table: the agent's name and namespace, logging, its HTTP server, Leases and
timings (``AgentSettings``).

Called by ``load``. What each key accepts is declared on ``AgentSettings``' fields; here are the
paths made absolute, ``public_url``, the listener keys (``listeners``) and the checks across keys.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

from agent.config import notify
from agent.config.listeners import LISTENER_KEYS, listener_keys
from agent.config.tomlreader import TableReader
from agent.config.types import AGENT_DEFAULTS, AgentSettings

#: Keys holding a file's path, made absolute from the config file's directory.
_PATHS = ("ui_token_file", "management_kubeconfig")


def agent_settings(r: TableReader, base_dir: Path) -> AgentSettings:
    d = AGENT_DEFAULTS
    values = {
        f.name: r.setting(AgentSettings, f.name, getattr(d, f.name))
        for f in fields(AgentSettings)
        if f.name not in LISTENER_KEYS
    }
    for name in _PATHS:
        if values[name]:
            values[name] = str((base_dir / os.path.expanduser(values[name])).resolve())
    if values["public_url"]:
        values["public_url"] = notify.http_url(r, "public_url", values["public_url"])
    if not values["retry_period"] < values["renew_deadline"] < values["lease_duration"]:
        raise r.error("renew_deadline", "leases need retry_period < renew_deadline < lease_duration")
    if values["backoff_cap"] < values["backoff_base"]:
        raise r.error("backoff_cap", "must be at least backoff_base")
    cfg = AgentSettings(**values, **listener_keys(r, d))
    r.finish()
    return cfg
