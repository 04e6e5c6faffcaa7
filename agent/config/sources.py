"""The source tables: ``[source]`` (the one named ``default``) and ``[[sources]]`` entries.

Called by ``load``. What each key accepts is declared on ``SourceConfig``'s fields.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from agent.config.tomlreader import TableReader
from agent.config.types import (
    DEFAULT_BRANCH,
    DEFAULT_SOURCE,
    NamedSource,
    SourceAuth,
    SourceConfig,
    SourceVerify,
)


def sources(top: TableReader, base_dir: Path) -> tuple[NamedSource, ...]:
    """`[source]` (named `default`) and the `[[sources]]` entries; at least one, names unique."""
    found: list[NamedSource] = []
    where: dict[str, str] = {}
    if (s := top.sub("source")) is not None:
        found.append(NamedSource(DEFAULT_SOURCE, _source(s, base_dir)))
        where[DEFAULT_SOURCE] = "[source]"
    for i, table in enumerate(top.get("sources", list) or ()):
        r = TableReader(table, f"sources[{i}]", top.file)
        name = r.setting(NamedSource, "name", required=True)
        if name in where:
            raise r.error("name", f"duplicate source {name!r} (also {where[name]})")
        where[name] = r.path
        found.append(NamedSource(name, _source(r, base_dir)))
    if not found:
        raise top.error("source", "required table is missing ([source] with url, or [[sources]] entries)")
    return tuple(sorted(found, key=lambda s: s.name != DEFAULT_SOURCE))


def _source(r: TableReader, base_dir: Path) -> SourceConfig:
    url = r.get("url", str, required=True)
    if not url.strip():
        raise r.error("url", "must not be empty")
    if "://" not in url and not url.startswith("git@") and not os.path.isabs(url):
        url = str((base_dir / url).resolve())
    refs = {k: r.get(k, str, "") for k in ("branch", "tag")}
    refs["commit"] = r.setting(SourceConfig, "commit", "")
    given = [k for k, v in refs.items() if v]
    if len(given) > 1:
        raise r.error(given[1], f"set only one of branch, tag, commit (got {' and '.join(given)})")
    d = SourceConfig(url=url)
    auth = d.auth if (a := r.sub("auth")) is None else SourceAuth(**_every_key(a, SourceAuth, d.auth))
    verify = (
        d.verify if (v := r.sub("verify")) is None else SourceVerify(**_every_key(v, SourceVerify, d.verify))
    )
    cfg = SourceConfig(
        url=url,
        branch=refs["branch"] or ("" if given else DEFAULT_BRANCH),
        tag=refs["tag"],
        commit=refs["commit"],
        poll_interval=r.setting(SourceConfig, "poll_interval", d.poll_interval),
        timeout=r.setting(SourceConfig, "timeout", d.timeout),
        shallow=r.setting(SourceConfig, "shallow", d.shallow),
        keep_checkouts=r.setting(SourceConfig, "keep_checkouts", d.keep_checkouts),
        auth=auth,
        verify=verify,
    )
    r.finish()
    return cfg


def _every_key(r: TableReader, owner: type, base: object) -> dict[str, Any]:
    """Each field of ``owner`` as ``r`` sets it, else as ``base`` has it; no other key."""
    values = {f.name: r.setting(owner, f.name, getattr(base, f.name)) for f in fields(owner)}
    r.finish()
    return values
