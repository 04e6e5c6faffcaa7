"""The settings tables: ``[defaults]``, and the same keys on a ``[[clusters]]`` or ``[[apps]]``
entry, read over the settings they inherit (``ClusterSettings``); with their ``decryption`` table.

Called by ``clusters``, ``app_entries`` and ``load``. What each key accepts is declared on its
field in ``agent.config.types``; here are only the keys read apart (``wait``, ``decryption``)
and the checks across keys.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from agent.config.health_checks import wait_setting
from agent.config.tomlreader import TableReader
from agent.config.types import ClusterSettings, Decryption

#: Keys a `[defaults]` table accepts: a field of ``ClusterSettings`` each.
SETTING_KEYS = frozenset(f.name for f in fields(ClusterSettings))
#: Read apart: ``wait`` (``true`` or a list of objects) and the ``decryption`` table.
_APART = frozenset({"wait", "decryption"})


def cluster_settings(r: TableReader, base: ClusterSettings, base_dir: Path) -> ClusterSettings:
    """``base`` with the keys ``r`` sets (each as its field declares it)."""
    values: dict[str, Any] = {}
    for name in (f.name for f in fields(ClusterSettings) if f.name not in _APART):
        if (v := r.setting(ClusterSettings, name)) is not None:
            values[name] = v
    if (wait := wait_setting(r)) is not None:
        values["wait"] = wait
    if (dec := r.sub("decryption")) is not None:
        values["decryption"] = _decryption(dec, base_dir)
    return replace(base, **values)


def _decryption(r: TableReader, base_dir: Path) -> Decryption:
    """A `decryption` table: it replaces the inherited one as a whole (``Decryption``)."""
    d = Decryption()
    values = {f.name: r.setting(Decryption, f.name, getattr(d, f.name)) for f in fields(Decryption)}
    if values["age_key_file"]:
        values["age_key_file"] = str((base_dir / os.path.expanduser(values["age_key_file"])).resolve())
    if values["secret_namespace"] and not values["secret_name"]:
        raise r.error("secret_namespace", "needs secret_name (the Secret holding the age identities)")
    r.finish()
    return Decryption(**values)
