"""What a server-side apply 409 says about who holds which field, for the re-plan (docs/safety.md rule 5).

The plan predicts conflicts from live ``managedFields``; the server can know more
than the object shows. After managedFields were cleared (``[{}]``, restores,
migrations) the object lists no managers, yet an apply that changes a field is
refused with ``conflict with "before-first-apply" using v1``: the server
synthesises that Update-operation manager for every field present before the
first apply. A re-read shows no managers either, so the 409 itself must say who
owns what: its ``Status.details.causes``, one ``FieldManagerConflict`` per
(manager, field).

The manager is named only in a cause's ``message`` (kube-apiserver v1.35,
``k8s.io/apimachinery/pkg/util/managedfields/internal/conflict.go``,
``printManager``; answers of the pinned server are kept in ``tests/fixtures/status``)::

    conflict with "<manager>"[ with subresource "<sub>"][ using <apiVersion>[ at <RFC 3339 time>]]

``using`` is printed exactly for Update-operation entries, so its presence is the
operation. ``parse_owner`` reads that one grammar, anchored at both ends; it never
reads the top-level message. The cause's ``field`` is structured-merge-diff's
``Path.String()`` (``.data.k``, ``.spec.containers[name="app"].image``), which
cannot be split back unambiguously (label keys contain dots), so it is matched by
spelling our candidate paths the same way (``server_field``).

``with_named_owners`` adds the named owners to a copy of the live object's
``managedFields`` as synthetic entries; ``plan.plan_object`` then applies the
conflict rules to them like to any other entry (force, or yield and leave the field
out of the body): ``replan_after_conflict``. Pure; called by ``reconcile``'s re-planner
after ``apply`` got a 409, within the same pass.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.errors import StatusCause
from agent.model import Change, DesiredObject, FieldPath, Manifest
from agent.plan.fields import (
    encode_fields_v1,
    managed_entries,
    name_list,
    parse_element,
    prefixes,
    render_path,
)
from agent.plan.planner import PlanOptions, plan_object

FIELD_MANAGER_CONFLICT = "FieldManagerConflict"

_QUOTED = r'"((?:[^"\\]|\\.)*)"'
_OWNER = re.compile(
    rf"conflict with {_QUOTED}(?: with subresource {_QUOTED})?(?: using (\S+)(?: at \S+)?)?",
    re.DOTALL,
)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


@dataclass(frozen=True)
class NamedOwner:
    """A field the server says another manager holds: one ``FieldManagerConflict`` cause."""

    #: The server's spelling of the field (``.data.k``).
    field: str
    manager: str
    #: ``Update`` or ``Apply``, as in ``managedFields``.
    operation: str
    subresource: str = ""
    #: The apiVersion of an Update entry; empty for Apply.
    api_version: str = ""


def parse_owner(cause: StatusCause) -> NamedOwner | None:
    """The owner a ``FieldManagerConflict`` cause names; ``None`` for other causes or another grammar."""
    if cause.type != FIELD_MANAGER_CONFLICT or not cause.field:
        return None
    m = _OWNER.fullmatch(cause.message)
    if m is None:
        return None
    manager, subresource, api_version = m.group(1), m.group(2), m.group(3)
    return NamedOwner(
        field=cause.field,
        manager=_go_unquote(manager),
        operation="Update" if api_version else "Apply",
        subresource=_go_unquote(subresource) if subresource else "",
        api_version=api_version or "",
    )


def named_owners(causes: Sequence[StatusCause]) -> tuple[NamedOwner, ...]:
    """Every owner the causes name (causes of other types are not about ownership)."""
    return tuple(o for c in causes if (o := parse_owner(c)) is not None)


def replan_after_conflict(
    desired: DesiredObject, live: Manifest | None, options: PlanOptions, causes: Sequence[StatusCause]
) -> Change:
    """The verdict for ``desired`` from a fresh read of ``live`` and the owners a 409 named.

    The named owners' fields are placed on the paths we would send (and their ancestors,
    for an atomic field the server holds whole); the conflict rules then decide each one.
    """
    change = plan_object(desired, live, options)
    owners = named_owners(causes)
    if live is None or not owners:
        return change
    candidates = set(change.declared) | {c.path for c in change.conflicts}
    augmented, unplaced = with_named_owners(live, owners, candidates | prefixes(candidates))
    change = plan_object(desired, augmented, options)
    named = {(o.manager, o.operation, o.subresource) for o in owners}
    said = [
        f"{render_path(c.path)} held by {c.manager} ({c.operation}): {c.resolution.value}"
        for c in change.conflicts
        if (c.manager, c.operation, c.subresource) in named
    ]
    said += [f"{o.field} held by {o.manager} ({o.operation}): matches no path we send" for o in unplaced]
    if not said:
        return change
    note = "the server's 409 named " + name_list(said)
    return replace(change, reason=f"{change.reason}; {note}" if change.reason else note)


def with_named_owners(
    live: Manifest, owners: Sequence[NamedOwner], candidates: Iterable[FieldPath]
) -> tuple[Manifest, tuple[NamedOwner, ...]]:
    """``live`` with a synthetic managedFields entry per named owner, and the owners not placed.

    An owner's field is placed on the candidate path (what we declare, and its ancestors)
    spelled the same way; a path live already attributes to the same (manager, operation,
    subresource) is not added twice. ``live`` itself is not changed.
    """
    by_spelling = {server_field(p): p for p in candidates}
    known: dict[tuple[str, str, str], set[FieldPath]] = {}
    for e in managed_entries(live):
        known.setdefault((e.manager, e.operation, e.subresource), set()).update(e.paths)
    added: dict[tuple[str, str, str, str], set[FieldPath]] = {}
    unplaced: list[NamedOwner] = []
    for owner in owners:
        path = by_spelling.get(owner.field)
        if path is None:
            unplaced.append(owner)
            continue
        if path in known.get((owner.manager, owner.operation, owner.subresource), ()):
            continue
        key = (owner.manager, owner.operation, owner.subresource, owner.api_version)
        added.setdefault(key, set()).add(path)
    if not added:
        return live, tuple(unplaced)
    out = copy.copy(live)
    meta = dict(out.get("metadata") or {})
    entries: list[dict[str, Any]] = [e for e in meta.get("managedFields") or () if e]
    for (manager, operation, subresource, api_version), paths in sorted(added.items()):
        entry: dict[str, Any] = {
            "manager": manager,
            "operation": operation,
            "apiVersion": api_version or str(live.get("apiVersion", "")),
            "fieldsType": "FieldsV1",
            "fieldsV1": encode_fields_v1(paths),
        }
        if subresource:
            entry["subresource"] = subresource
        entries.append(entry)
    meta["managedFields"] = entries
    out["metadata"] = meta
    return out, tuple(unplaced)


def server_field(path: FieldPath) -> str:
    """structured-merge-diff's ``Path.String()`` of our path: ``.spec.ports[port=80,protocol="TCP"]``."""
    out = []
    for element in path:
        kind, payload = parse_element(element)
        if kind == "f":
            out.append(f".{payload}")
        elif kind == "k":
            # Key fields sorted by name, as both sides keep them.
            out.append("[" + ",".join(f"{k}={_value_string(v)}" for k, v in sorted(payload.items())) + "]")
        elif kind == "v":
            out.append(f"[={_value_string(payload)}]")
        else:
            out.append(f"[{payload}]")
    return "".join(out)


def _value_string(value: Any) -> str:
    """structured-merge-diff's ``value.ToString`` for the scalars list keys and set items hold."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _go_quote(value)
    # Floats, lists and maps as keys: not seen in Kubernetes schemas; an unmatched spelling
    # only leaves that owner unplaced (the object then fails with the server's message).
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _go_quote(text: str) -> str:
    """Go's ``%q`` (``strconv.Quote``) of a string."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif (short := next((k for k, v in _SIMPLE_ESCAPES.items() if v == ch), None)) is not None:
            out.append("\\" + short)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def _go_unquote(body: str) -> str:
    """The inside of a Go ``%q`` string, escapes resolved."""

    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if len(code) > 1:
            return chr(int(code[1:], 16))
        return _SIMPLE_ESCAPES.get(code, code)

    return _ESCAPE.sub(one, body)


__all__ = [
    "FIELD_MANAGER_CONFLICT",
    "NamedOwner",
    "named_owners",
    "parse_owner",
    "replan_after_conflict",
    "server_field",
    "with_named_owners",
]
