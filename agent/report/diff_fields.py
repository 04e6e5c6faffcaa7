"""Field-level diff of two versions of one object, for reports: only what changes, masked.

``diff_objects(before, after)`` is where a report's diff is made, so it is
where Secrets are masked (docs/safety.md rule 11): both sides go through
``masking.mask_pair`` before anything is compared or printed; a value that
changes shows as ``*** (before)`` → ``*** (after)``, nothing else. Server
bookkeeping (``managedFields``, ``resourceVersion``, ``generation``, ``uid``,
``creationTimestamp``, ``status``) is dropped first.

The two sides are then *trimmed* to the fields that differ, plus the parents
and list-item identities (``name``, ``mountPath``, ...) that say where they
are; a label that another manager added appears on both sides alike and so
not at all. The trimmed trees are printed as YAML and compared line by line
(``difflib``). ``scrub`` removes known secret strings from free text such as
a server's error message.

Called by ``agent.report.diff`` (live: live object → server dry-run result) and
``agent.report.diff_offline`` (base manifest → head manifest).
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterable
from typing import Any

import yaml

from agent.model import Manifest
from agent.plan import masking
from agent.plan.masking import scrub, secret_strings
from agent.report.model import FieldChange

__all__ = ["diff_objects", "scrub", "secret_strings"]

_SERVER_METADATA = ("managedFields", "resourceVersion", "generation", "uid", "creationTimestamp", "selfLink")
#: Fields that identify an item of a list of objects, tried in order.
_ITEM_KEYS = ("name", "mountPath", "devicePath", "containerPort", "port", "key", "type", "ip", "topologyKey")


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


class _Context(dict[str, Any]):
    """A mapping kept only to place what changes below it (never printed as ``{}``)."""


class _Item(list[Any]):
    """A list trimmed to the items that changed, matched by an identity field."""


def strip_server_fields(obj: Manifest) -> Manifest:
    """A copy without status and server bookkeeping: the parts a diff report never shows."""
    out = copy.deepcopy(obj)
    out.pop("status", None)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        for k in _SERVER_METADATA:
            meta.pop(k, None)
    return out


def masked_pair(before: Manifest | None, after: Manifest | None) -> tuple[Manifest | None, Manifest | None]:
    """Both sides stripped, and masked when either holds secrets (a Secret, decrypted fields)."""
    b = strip_server_fields(before) if before is not None else None
    a = strip_server_fields(after) if after is not None else None
    if masking.masks_of(b, a):
        mb, ma = masking.mask_pair(b, a)
        return (mb if b is not None else None), (ma if a is not None else None)
    return b, a


def diff_objects(
    before: Manifest | None, after: Manifest | None, *, from_label: str, to_label: str
) -> tuple[str, tuple[FieldChange, ...]]:
    """(unified YAML diff of only the changing fields, the leaf changes); both masked."""
    b, a = masked_pair(before, after)
    tb, ta = trim(MISSING if b is None else b, MISSING if a is None else a)
    fields = tuple(_leaves(tb, ta, ""))
    if not fields:
        return "", ()
    before_lines = to_yaml_lines(tb) if tb is not MISSING else []
    after_lines = to_yaml_lines(ta) if ta is not MISSING else []
    text = "\n".join(
        line.rstrip("\n")
        for line in difflib.unified_diff(
            before_lines, after_lines, fromfile=from_label, tofile=to_label, n=3, lineterm=""
        )
    )
    return text, fields


# -- trimming -------------------------------------------------------------------------


def trim(before: Any, after: Any) -> tuple[Any, Any]:
    """The parts of ``before`` and ``after`` that differ (``MISSING`` for nothing or absent)."""
    if before == after and type(before) is type(after):
        return MISSING, MISSING
    if isinstance(before, dict) and isinstance(after, dict):
        tb, ta = _Context(), _Context()
        for k in [*before, *(k for k in after if k not in before)]:
            x, y = trim(before.get(k, MISSING), after.get(k, MISSING))
            if x is not MISSING:
                tb[k] = x
            if y is not MISSING:
                ta[k] = y
        return tb, ta
    if isinstance(before, list) and isinstance(after, list) and (key := _item_key(before, after)):
        return _trim_items(before, after, key)
    return before, after


def _item_key(before: list[Any], after: list[Any]) -> str | None:
    items = [*before, *after]
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    for key in _ITEM_KEYS:
        if all(key in i for i in items):
            b_ids = [json.dumps(i[key], sort_keys=True) for i in before]
            a_ids = [json.dumps(i[key], sort_keys=True) for i in after]
            if len(set(b_ids)) == len(b_ids) and len(set(a_ids)) == len(a_ids):
                return key
    return None


def _trim_items(before: list[Any], after: list[Any], key: str) -> tuple[Any, Any]:
    by_id = {json.dumps(i[key], sort_keys=True): i for i in after}
    b_ids = {json.dumps(i[key], sort_keys=True) for i in before}
    tb, ta = _Item(), _Item()
    for item in before:
        ident = json.dumps(item[key], sort_keys=True)
        other = by_id.get(ident, MISSING)
        x, y = trim(item, other)
        if x is not MISSING:
            tb.append(_with_identity(x, key, item[key]))
        if y is not MISSING:
            ta.append(_with_identity(y, key, item[key]))
    for item in after:
        if json.dumps(item[key], sort_keys=True) not in b_ids:
            ta.append(item)
    return (tb if tb else MISSING), (ta if ta else MISSING)


def _with_identity(trimmed: Any, key: str, value: Any) -> Any:
    if isinstance(trimmed, _Context):
        out = _Context({key: value})
        out.update((k, v) for k, v in trimmed.items() if k != key)
        return out
    return trimmed


def _leaves(before: Any, after: Any, path: str) -> Iterable[FieldChange]:
    if isinstance(before, _Context) or isinstance(after, _Context):
        b = before if isinstance(before, dict) else {}
        a = after if isinstance(after, dict) else {}
        for k in [*b, *(k for k in a if k not in b)]:
            yield from _leaves(b.get(k, MISSING), a.get(k, MISSING), f"{path}.{k}" if path else str(k))
        return
    if isinstance(before, _Item) or isinstance(after, _Item):
        items = [*(before if isinstance(before, list) else []), *(after if isinstance(after, list) else [])]
        key = next(k for k in _ITEM_KEYS if all(isinstance(i, dict) and k in i for i in items))
        b_items = {_ident(i[key]): i for i in (before if isinstance(before, list) else [])}
        a_items = {_ident(i[key]): i for i in (after if isinstance(after, list) else [])}
        for ident in [*b_items, *(i for i in a_items if i not in b_items)]:
            x, y = b_items.get(ident, MISSING), a_items.get(ident, MISSING)
            sub = f"{path}[{key}={ident}]"
            if x is not MISSING and y is not MISSING:
                # Identity fields are printed on both sides for context only.
                x = _Context({k: v for k, v in x.items() if k != key})
                y = _Context({k: v for k, v in y.items() if k != key})
            yield from _leaves(x, y, sub)
        return
    if before is MISSING and after is MISSING:
        return
    op = "add" if before is MISSING else "remove" if after is MISSING else "replace"
    yield FieldChange(
        path or ".",
        op,
        None if before is MISSING else _plain(before),
        None if after is MISSING else _plain(after),
    )


def _ident(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _plain(value: Any) -> Any:
    """Back to plain JSON values (the marker subclasses are for printing only)."""
    return json.loads(json.dumps(value))


# -- printing ---------------------------------------------------------------------------


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def to_yaml_lines(value: Any, indent: int = 0) -> list[str]:
    """YAML lines of a (trimmed) tree; context mappings print their keys without ``{}``."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        if not value:
            return [] if isinstance(value, _Context) else [pad + "{}"]
        for k, v in value.items():
            lines.extend(_entry(f"{pad}{_scalar(k)}:", v, indent))
        return lines
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        for item in value:
            sub = to_yaml_lines(item, indent + 2) if isinstance(item, dict | list) and item else None
            if sub:
                first = sub[0]
                lines.append(pad + "- " + first[indent + 2 :])
                lines.extend(sub[1:])
            else:
                lines.append(pad + "- " + _scalar(item))
        return lines
    return [pad + _scalar(value)]


def _entry(head: str, value: Any, indent: int) -> list[str]:
    if isinstance(value, str) and "\n" in value:
        block = "|-" if not value.endswith("\n") else "|"
        body = value[:-1] if value.endswith("\n") else value
        return [f"{head} {block}", *(" " * (indent + 2) + line for line in body.split("\n"))]
    if isinstance(value, dict | list) and (value or isinstance(value, _Context | _Item)):
        return [head, *to_yaml_lines(value, indent + 2)]
    return [f"{head} {_scalar(value)}"]
