"""``${VAR}`` substitution of an app's variables (``[clusters.vars]``, ``[apps.vars]``), Flux's syntax.

Called by ``agent.render.manifests`` and ``agent.render.fastyaml`` on every scalar (keys and
values) of every document they parse when substitution is on for the app (``substitute``, see
docs/configuration.md), *before* the scalar's YAML type is resolved, so that
``replicas: ${REPLICAS}`` becomes the integer 3 while ``"${REPLICAS}"`` stays the string "3" --
the outcome of Flux's post-build substitution, without its text-level risks (a value can never
inject YAML structure, and comments are never substituted).

Rules, in full (Flux's post-build forms; an undefined name is an error here, where Flux writes
an empty string):

* ``${NAME}`` with ``NAME`` matching ``[A-Za-z_][A-Za-z0-9_]*`` is replaced by the variable's
  value; an undefined name is an error.
* ``${NAME:=default}`` and ``${NAME:-default}`` give the variable's value when it is defined and
  not empty, else ``default`` (any text without ``}`` or ``${``).
* ``$${`` is an escape and yields the literal text ``${``.
* Any other ``${`` (``${}``, ``${a-b}``, ``${v:0:3}``, an unclosed ``${``) is an error naming
  the supported forms, so a typo never passes through silently. Write ``$${`` to keep such text.
* ``$NAME`` without braces and a lone ``$`` are left alone.

An object annotated ``gitops-agent.io/substitute: disabled`` (or Flux's
``kustomize.toolkit.fluxcd.io/substitute: disabled``) is left as written (``opted_out``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from agent.render.yamltypes import resolve

# One alternation so that an escape is consumed before the reference it contains.
_TOKEN = re.compile(
    r"\$\$\{|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:[=-])(?P<default>(?:[^}$]|\$(?!\{))*))?\}|\$\{"
)
SUPPORTED = "${NAME}, ${NAME:=default} or ${NAME:-default}; $${ for a literal ${"
#: Annotations (either one) whose value ``disabled`` keeps an object's text as written.
OPT_OUT_ANNOTATIONS = ("gitops-agent.io/substitute", "kustomize.toolkit.fluxcd.io/substitute")
OPT_OUT_VALUE = "disabled"


_Where = TypeVar("_Where")


class Reason(StrEnum):
    """Why a reference could not be substituted."""

    UNDEFINED = "UndefinedVariable"
    MALFORMED = "MalformedReference"


@dataclass(frozen=True)
class SubstitutionProblem:
    """One bad reference in one string; ``offset`` is the 0-based index in that string."""

    offset: int
    reason: Reason
    #: The variable's name (undefined) or the reference as written (malformed).
    reference: str
    #: The reference's text, to find it where the string was written.
    token: str
    message: str


def substitute(text: str, variables: Mapping[str, str]) -> tuple[str, list[SubstitutionProblem]]:
    """Return ``text`` with every reference replaced, and every problem found in it.

    The returned text is only meaningful when the problem list is empty.
    """
    if "$" not in text:
        return text, []
    out: list[str] = []
    problems: list[SubstitutionProblem] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        out.append(text[pos : m.start()])
        token = m.group(0)
        if token == "$${":
            out.append("${")
        elif (name := m.group("name")) is not None:
            value = variables.get(name)
            if m.group("op") is not None and not value:
                out.append(m.group("default"))
            elif value is not None:
                out.append(value)
            else:
                message = f"undefined variable ${{{name}}}"
                problems.append(SubstitutionProblem(m.start(), Reason.UNDEFINED, name, token, message))
                out.append(token)
        else:
            snippet = text[m.start() : m.start() + 64].split("\n", 1)[0]
            close = snippet.find("}")
            written = snippet[: close + 1] if close >= 0 else snippet
            message = f"malformed variable reference {written!r} (supported: {SUPPORTED})"
            problems.append(SubstitutionProblem(m.start(), Reason.MALFORMED, written, written, message))
            out.append(token)
        pos = m.end()
    out.append(text[pos:])
    return "".join(out), problems


def references(text: str) -> set[str]:
    """Names referenced by ``text`` (escapes excluded); used by tests and error hints."""
    return {m.group("name") for m in _TOKEN.finditer(text) if m.group("name")}


def first_of_each(
    problems: Iterable[tuple[SubstitutionProblem, _Where]],
) -> list[tuple[SubstitutionProblem, _Where]]:
    """One problem per variable name (or malformed reference) of a file: the first, with its place.

    A Grafana dashboard holds ``${datasource}`` hundreds of times: one line says it all.
    """
    seen: set[tuple[Reason, str]] = set()
    kept: list[tuple[SubstitutionProblem, _Where]] = []
    for problem, where in problems:
        key = (problem.reason, problem.reference)
        if key not in seen:
            seen.add(key)
            kept.append((problem, where))
    return kept


# ---------------------------------------------------------------------------
# The per-object opt-out, on composed YAML nodes (both loaders) and on parsed values (JSON)


def _get(node: MappingNode, key: str) -> Node | None:
    for k, v in node.value:
        if isinstance(k, ScalarNode) and k.value == key:
            found: Node = v
            return found
    return None


def _objects(node: Node, depth: int = 0) -> Iterable[MappingNode]:
    """The objects of a document: itself, or the items of a ``*List`` (nested ones too)."""
    if not isinstance(node, MappingNode):
        return
    kind, items = _get(node, "kind"), _get(node, "items")
    if (
        depth < 6  # objects_of flattens at most MAX_LIST_NESTING Lists
        and isinstance(kind, ScalarNode)
        and kind.value.endswith("List")
        and isinstance(items, SequenceNode)
    ):
        for item in items.value:
            yield from _objects(item, depth + 1)
    else:
        yield node


def opted_out(root: Node) -> set[int]:
    """Ids of the object nodes of a document annotated to keep their text as written."""
    found: set[int] = set()
    for obj in _objects(root):
        meta = _get(obj, "metadata")
        notes = _get(meta, "annotations") if isinstance(meta, MappingNode) else None
        if isinstance(notes, MappingNode):
            for name in OPT_OUT_ANNOTATIONS:
                value = _get(notes, name)
                if isinstance(value, ScalarNode) and value.value == OPT_OUT_VALUE:
                    found.add(id(obj))
    return found


def opted_out_values(value: Any, depth: int = 0) -> list[dict[str, Any]]:
    """The objects of a parsed document (itself, or a List's items) that carry the opt-out."""
    if not isinstance(value, dict):
        return []
    kind, items = value.get("kind"), value.get("items")
    if depth < 6 and isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        return [obj for item in items for obj in opted_out_values(item, depth + 1)]
    meta = value.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, dict) else None
    if isinstance(notes, dict) and any(notes.get(n) == OPT_OUT_VALUE for n in OPT_OUT_ANNOTATIONS):
        return [value]
    return []


# ---------------------------------------------------------------------------
# Substitution in a composed document (both YAML loaders)


def substitute_tree(
    root: Node, variables: Mapping[str, str], plain: Callable[[ScalarNode], bool], skip: set[int]
) -> list[tuple[SubstitutionProblem, ScalarNode]]:
    """Substitutes every scalar of a composed document in place, in document order.

    ``plain(node)``: the scalar was written plain without a tag, so its type is resolved again
    from the new text (``replicas: ${N}`` an int, ``"${N}"`` a str). ``skip``: ids of opted-out
    objects (``opted_out``), left as written. Returns every problem with its scalar; a scalar
    with a problem is left unchanged.
    """
    problems: list[tuple[SubstitutionProblem, ScalarNode]] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen or id(node) in skip:
            continue
        seen.add(id(node))  # an alias reaches a node twice: substitute it once
        if isinstance(node, ScalarNode):
            if "$" not in node.value:
                continue
            new, found = substitute(node.value, variables)
            if found:
                problems.extend((p, node) for p in found)
            elif new != node.value:
                retype = plain(node)
                node.value = new
                if retype:
                    node.tag = resolve(new)[0]
        elif isinstance(node, MappingNode):
            stack.extend(child for pair in reversed(node.value) for child in reversed(pair))
        elif isinstance(node, SequenceNode):
            stack.extend(reversed(node.value))
    return problems


def place(text: str, node: Node, problem: SubstitutionProblem) -> tuple[int, int]:
    """1-based (line, column) of a problem's reference where it is written in ``text``.

    The scalar's own text is searched, so a reference deep in a block scalar (a dashboard's JSON
    in a ConfigMap) is named at its own line; where it is not written as is (an escape in a
    double-quoted scalar), the scalar's start.
    """
    start, end = node.start_mark, node.end_mark
    raw = text[start.index : end.index]
    at = raw.find(problem.token)
    if at < 0:
        return start.line + 1, start.column + 1
    before = raw[:at]
    newline = before.rfind("\n")
    column = start.column + at + 1 if newline < 0 else at - newline
    return start.line + 1 + before.count("\n"), column
