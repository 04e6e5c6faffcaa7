"""Strict ``${VAR}`` substitution of per-cluster variables (``[clusters.vars]``).

Called by ``agent.render.manifests`` on every scalar (keys and values) of every
document it parses, *before* the scalar's YAML type is resolved, so that
``replicas: ${REPLICAS}`` becomes the integer 3 while ``"${REPLICAS}"`` stays
the string "3" -- the same outcome as Flux's post-build substitution, without
its text-level risks (a value can never inject YAML structure, and comments
are never substituted).

Rules, in full:

* ``${NAME}`` with ``NAME`` matching ``[A-Za-z_][A-Za-z0-9_]*`` is replaced by
  the variable's value. An undefined name is an error; there are no defaults.
* ``$${NAME}`` is an escape and yields the literal text ``${NAME}``.
* Any other ``${`` (``${}``, ``${a-b}``, an unclosed ``${``) is an error, so a
  typo never passes through silently. Write ``$${`` to keep such text.
* ``$NAME`` without braces and a lone ``$`` are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# One alternation so that an escape is consumed before the reference it contains.
_TOKEN = re.compile(r"\$\$\{|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}|\$\{")


@dataclass(frozen=True)
class SubstitutionProblem:
    """One bad reference in one string; ``offset`` is the 0-based index in that string."""

    offset: int
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
            if name in variables:
                out.append(variables[name])
            else:
                problems.append(SubstitutionProblem(m.start(), f"undefined variable ${{{name}}}"))
                out.append(token)
        else:
            snippet = text[m.start() : m.start() + 24].split("\n", 1)[0]
            problems.append(
                SubstitutionProblem(
                    m.start(),
                    f"malformed variable reference {snippet!r} (use ${{NAME}}, or $${{ for a literal ${{)",
                )
            )
            out.append(token)
        pos = m.end()
    out.append(text[pos:])
    return "".join(out), problems


def references(text: str) -> set[str]:
    """Names referenced by ``text`` (escapes excluded); used by tests and error hints."""
    return {m.group("name") for m in _TOKEN.finditer(text) if m.group("name")}
