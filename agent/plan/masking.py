"""Secret masking, done where the diff is made so no later layer can leak a value (docs/safety.md rule 11).

A Secret's ``data``/``stringData`` values, and its
``kubectl.kubernetes.io/last-applied-configuration`` annotation (which holds
the whole Secret as JSON), are replaced by markers. So are, on any kind, the
values Git held encrypted (SOPS): the render lists them in the object's
``gitops-agent.io/decrypted-fields`` annotation (JSON pointers), which the live
object carries too once applied, so even a live-only view (a prune) is masked. Masking a *pair*
(before, after) keeps what a report needs — which keys were added, removed,
changed or left alone — and nothing else: an unchanged value becomes
``MASK``, a changed one ``MASK_BEFORE``/``MASK_AFTER``. No hash or length is
kept, since a hash of a short password is a dictionary attack away.

Called by ``plan`` on every body, operation and conflict value of a Secret.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.model import DECRYPTED_FIELDS, ApplyResult, FieldPath, Manifest

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


def decrypted_paths(manifest: Mapping[str, Any] | None) -> tuple[tuple[str, ...], ...]:
    """The paths the ``decrypted-fields`` annotation lists (each a tuple of map keys)."""
    meta = (manifest or {}).get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    raw = annotations.get(DECRYPTED_FIELDS) if isinstance(annotations, dict) else None
    if not isinstance(raw, str):
        return ()
    try:
        pointers = json.loads(raw)
    except ValueError:
        return ()
    if not isinstance(pointers, list):
        return ()
    out = []
    for p in pointers:
        if isinstance(p, str) and p.startswith("/"):
            out.append(tuple(t.replace("~1", "/").replace("~0", "~") for t in p[1:].split("/")))
    return tuple(out)


@dataclass(frozen=True)
class Masks:
    """What of one object is secret: a Secret's values, and the paths Git held encrypted."""

    secret: bool = False
    paths: tuple[tuple[str, ...], ...] = ()

    def __bool__(self) -> bool:
        return self.secret or bool(self.paths)

    def covers(self, path: FieldPath) -> bool:
        """``path`` (managedFields spelling) holds, or lies inside, a secret value."""
        if self.secret and is_secret_path(path):
            return True
        if self and path[:3] == ("f:metadata", "f:annotations", f"f:{LAST_APPLIED}"):
            return True
        keys = []
        for element in path:
            if not element.startswith("f:"):
                break  # into a list: a list holding secrets is masked whole
            keys.append(element[2:])
        named = tuple(keys)
        return any(named[: len(p)] == p or p[: len(named)] == named for p in self.paths if named)


def masks_of(*manifests: Mapping[str, Any] | None) -> Masks:
    """What must be masked in these versions of one object (the union of what each says)."""
    paths: dict[tuple[str, ...], None] = {}
    for m in manifests:
        paths.update(dict.fromkeys(decrypted_paths(m)))
    return Masks(any(is_secret(m) for m in manifests), tuple(paths))


def is_secret_path(path: FieldPath) -> bool:
    """Paths whose values are secret: under data/stringData, or the last-applied annotation."""
    if path[:1] in (("f:data",), ("f:stringData",)):
        return True
    return path[:3] == ("f:metadata", "f:annotations", f"f:{LAST_APPLIED}")


def mask_secret(manifest: Manifest) -> Manifest:
    """A copy with every secret value replaced by ``MASK`` (an object with none is returned as it is)."""
    if not masks_of(manifest):
        return manifest
    return mask_pair(manifest, None)[0]


def mask_decrypted(manifest: Manifest) -> Manifest:
    """A copy with only the fields decrypted from Git masked (``gitops-agent render``'s default)."""
    paths = decrypted_paths(manifest)
    if not paths:
        return manifest
    out = copy.deepcopy(manifest)
    for path in paths:
        _mask_at(out, {}, path)
    return out


def mask_pair(before: Manifest | None, after: Manifest | None) -> tuple[Manifest, Manifest]:
    """Masked copies of two versions of one object; a value that differs gets distinct markers."""
    b = copy.deepcopy(before) if before else {}
    a = copy.deepcopy(after) if after else {}
    masks = masks_of(b, a)
    for path in masks.paths:
        _mask_at(b, a, path)
    if not masks.secret:
        if masks:
            _mask_last_applied(b, a)
        return b, a
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
    _mask_last_applied(b, a)
    return b, a


def _mask_at(b: Manifest, a: Manifest, path: tuple[str, ...]) -> None:
    """The value at ``path`` on both sides replaced by a marker (distinct ones when they differ)."""
    bp, ap = _parent(b, path), _parent(a, path)
    last = path[-1] if path else None
    has_b = bp is not None and last in bp
    has_a = ap is not None and last in ap
    changed = has_b and has_a and bp[last] != ap[last]  # type: ignore[index]
    if has_b:
        bp[last] = MASK_BEFORE if changed else MASK  # type: ignore[index]
    if has_a:
        ap[last] = MASK_AFTER if changed else MASK  # type: ignore[index]


def _parent(obj: Any, path: tuple[str, ...]) -> dict[str, Any] | None:
    for key in path[:-1]:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj if isinstance(obj, dict) and path else None


def _mask_last_applied(b: Manifest, a: Manifest) -> None:
    # Compare both annotations before masking either.
    b_ann, a_ann = _annotations(b), _annotations(a)
    b_last, a_last = b_ann.get(LAST_APPLIED), a_ann.get(LAST_APPLIED)
    changed = b_last is not None and a_last is not None and b_last != a_last
    if b_last is not None:
        b_ann[LAST_APPLIED] = MASK_BEFORE if changed else MASK
    if a_last is not None:
        a_ann[LAST_APPLIED] = MASK_AFTER if changed else MASK


def _annotations(manifest: Manifest) -> dict[str, Any]:
    annotations = (manifest.get("metadata") or {}).get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def mask_value(path: FieldPath, value: Any, *, secret: bool | Masks) -> Any:
    """A single value at ``path`` of an object, masked when that path of the object is secret
    (``secret``: the object's ``Masks``, or ``True`` for a Secret)."""
    masks = secret if isinstance(secret, Masks) else Masks(secret=secret)
    if value is None or not masks.covers(path):
        return value
    if isinstance(value, dict):
        return dict.fromkeys(value, MASK)
    return MASK


# -- secrets in free text -----------------------------------------------------------------


def secret_strings(objects: Iterable[Manifest | None]) -> set[str]:
    """Every Secret value (base64 and decoded), decrypted value and last-applied annotation
    found in ``objects``."""
    found: set[str] = set()
    for obj in objects:
        masks = masks_of(obj)
        if not masks:
            continue
        assert obj is not None
        for path in masks.paths:
            found.update(_leaf_strings(_at(obj, path)))
        last = ((obj.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
        if last:
            found.add(str(last))
        if not masks.secret:
            continue
        for value in (obj.get("data") or {}).values():
            found.add(str(value))
            with contextlib.suppress(binascii.Error, UnicodeDecodeError, ValueError):
                found.add(base64.b64decode(str(value), validate=True).decode())
        for value in (obj.get("stringData") or {}).values():
            found.add(str(value))
            found.add(base64.b64encode(str(value).encode()).decode())
    # A server quotes a value JSON-escaped (Go's %q): a multi-line value is masked as quoted too.
    found |= {json.dumps(s)[1:-1] for s in found}
    return {s for s in found if len(s) >= 4}


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _leaf_strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _leaf_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _leaf_strings(v)]
    return [] if value is None else [str(value)]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every known secret string replaced by the mask (longest first)."""
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, MASK)
    return text


def scrub_result(result: ApplyResult, secrets: set[str], *, sensitive: bool) -> ApplyResult:
    """``result`` with its server's words (message, warnings) scrubbed of ``secrets``.

    A server's answer may quote any value it was sent (a 422 names the invalid value): masked
    where the result is made, every later output (run table, ``/status``, logs, alerts) is safe.
    ``sensitive``: the object itself holds secret values (Events and the page show no message).
    """
    if not secrets and not sensitive:
        return result
    return replace(
        result,
        message=scrub(result.message, secrets),
        warnings=tuple(scrub(w, secrets) for w in result.warnings),
        sensitive=result.sensitive or sensitive,
    )
