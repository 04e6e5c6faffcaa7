"""Secret masking, done where the diff is made so no later layer can leak a value (docs/safety.md rule 11).

A Secret's ``data``/``stringData`` values, and its
``kubectl.kubernetes.io/last-applied-configuration`` annotation (which holds
the whole Secret as JSON), are replaced by markers. Masking a *pair*
(before, after) keeps what a report needs — which keys were added, removed,
changed or left alone — and nothing else: an unchanged value becomes
``MASK``, a changed one ``MASK_BEFORE``/``MASK_AFTER``. No hash or length is
kept, since a hash of a short password is a dictionary attack away.

Called by ``plan`` on every body, operation and conflict value of a Secret.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agent.model import FieldPath, Manifest

MASK = "***"
MASK_BEFORE = "*** (before)"
MASK_AFTER = "*** (after)"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
SECRET_VALUE_FIELDS = ("data", "stringData")


def is_secret(manifest: Mapping[str, Any] | None) -> bool:
    return (
        bool(manifest)
        and manifest is not None
        and manifest.get("kind") == "Secret"
        and str(manifest.get("apiVersion", "")) in ("v1", "")
    )


def is_secret_path(path: FieldPath) -> bool:
    """Paths whose values are secret: under data/stringData, or the last-applied annotation."""
    if path[:1] in (("f:data",), ("f:stringData",)):
        return True
    return path[:3] == ("f:metadata", "f:annotations", f"f:{LAST_APPLIED}")


def mask_secret(manifest: Manifest) -> Manifest:
    """A copy of a Secret with every secret value replaced by ``MASK`` (non-Secrets returned as they are)."""
    if not is_secret(manifest):
        return manifest
    return mask_pair(manifest, None)[0]


def mask_pair(before: Manifest | None, after: Manifest | None) -> tuple[Manifest, Manifest]:
    """Masked copies of two versions of one Secret; a value that differs gets distinct markers."""
    b = copy.deepcopy(before) if before else {}
    a = copy.deepcopy(after) if after else {}
    for key in SECRET_VALUE_FIELDS:
        bv, av = b.get(key), a.get(key)
        if isinstance(bv, dict) or isinstance(av, dict):
            bd = bv if isinstance(bv, dict) else {}
            ad = av if isinstance(av, dict) else {}
            for k in set(bd) | set(ad):
                changed = k in bd and k in ad and bd[k] != ad[k]
                if k in bd:
                    bd[k] = MASK_BEFORE if changed else MASK
                if k in ad:
                    ad[k] = MASK_AFTER if changed else MASK
    # Compare both annotations before masking either.
    b_ann, a_ann = _annotations(b), _annotations(a)
    b_last, a_last = b_ann.get(LAST_APPLIED), a_ann.get(LAST_APPLIED)
    changed = b_last is not None and a_last is not None and b_last != a_last
    if b_last is not None:
        b_ann[LAST_APPLIED] = MASK_BEFORE if changed else MASK
    if a_last is not None:
        a_ann[LAST_APPLIED] = MASK_AFTER if changed else MASK
    return b, a


def _annotations(manifest: Manifest) -> dict[str, Any]:
    annotations = (manifest.get("metadata") or {}).get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def mask_value(path: FieldPath, value: Any, *, secret: bool) -> Any:
    """A single value at ``path`` of an object, masked when the object is a Secret and the path secret."""
    if not secret or value is None or not is_secret_path(path):
        return value
    if isinstance(value, dict):
        return dict.fromkeys(value, MASK)
    return MASK
