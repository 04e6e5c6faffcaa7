"""What a render refuses of SOPS files before anything is decrypted (``agent.render.sops`` calls it).

* **Age only.** sops opens a file's data key with each master key its metadata names, in turn:
  a file naming a Vault, a KMS or a PGP key makes sops call that service (a loopback Vault got
  a request), so a file naming any key type but age is refused before sops runs.
* **The agent's annotation.** ``gitops-agent.io/decrypted-fields`` lists what the agent
  decrypted, which every report masks: written in Git it would hide any field (an image change)
  from every diff, so an object bringing it from Git is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agent.errors import RenderProblem
from agent.model import DECRYPTED_FIELDS
from agent.render.manifests import Document, Origin

#: A dotenv file's metadata keys (``sops_mac=...``): what a kustomize generator copies into data.
DOTENV_PREFIX = "sops_"


def foreign_key_services(dotenv_keys: Iterable[str] | None, meta: Any) -> list[str]:
    """The key types other than age that a file's metadata names (sops would call each one).

    Master keys are the metadata's non-empty lists (``kms``, ``hc_vault``, ``pgp``...), at the top
    or in ``key_groups``; a dotenv file (``dotenv_keys``: its keys) flattens them as
    ``sops_<type>__list_<i>__...``.
    """
    found: set[str] = set()
    if dotenv_keys is not None:
        for key in dotenv_keys:
            parts = key.removeprefix(DOTENV_PREFIX).split("__") if key.startswith(DOTENV_PREFIX) else []
            if len(parts) > 3 and parts[0] == "key_groups" and parts[3].startswith("list_"):
                found.add(parts[2].removeprefix("map_"))
            elif len(parts) > 1 and parts[1].startswith("list_") and parts[0] != "key_groups":
                found.add(parts[0])
    elif isinstance(meta, dict):
        groups = meta.get("key_groups")
        for group in [meta, *(groups if isinstance(groups, list) else [])]:
            if isinstance(group, dict):
                found |= {k for k, v in group.items() if k != "key_groups" and isinstance(v, list) and v}
    return sorted(found - {"age"})


def without_forged_marks(
    docs: list[Document], origin: Origin, problems: list[RenderProblem]
) -> list[Document]:
    """``docs`` but those that bring ``decrypted-fields`` from Git (each one added to ``problems``)."""
    kept = []
    for d in docs:
        if any(_marked(o) for o in _objects(d.value)):
            problems.append(
                origin.problem(
                    f"sets the annotation {DECRYPTED_FIELDS}, which only the agent writes (it marks "
                    "the values it decrypted, to mask them): remove it from Git",
                    d.line,
                )
            )
        else:
            kept.append(d)
    return kept


def _objects(value: Any) -> list[Any]:
    """``value`` and, for a ``List`` kind, its items (each becomes an object)."""
    is_list = isinstance(value, dict) and str(value.get("kind", "")).endswith("List")
    items = value.get("items") if is_list else None
    return [value, *items] if isinstance(items, list) else [value]


def _marked(value: Any) -> bool:
    meta = value.get("metadata") if isinstance(value, dict) else None
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return isinstance(annotations, dict) and DECRYPTED_FIELDS in annotations
