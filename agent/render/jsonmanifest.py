"""Parse a JSON manifest file into a document, with lines, the way ``parse_yaml`` parses YAML.

Called by ``agent.render.renderer`` for ``*.json`` files and by ``agent.render.sops`` for
encrypted JSON. Stricter than ``json.loads``: duplicate keys and NaN/Infinity are problems with
their line and column, nesting is bounded (``MAX_PARSE_DEPTH``), ``${VAR}`` is substituted in
strings where the app substitutes, and a whole float is the integer Kubernetes reads.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from collections.abc import Mapping
from typing import Any

import yaml

from agent.errors import RenderProblem
from agent.render import yamltypes
from agent.render.manifests import _TOO_DEEP, MAX_PARSE_DEPTH, Document, Origin, TooDeep
from agent.render.substitute import (
    OPT_OUT_VALUE,
    SubstitutionProblem,
    first_of_each,
    opted_out_values,
    substitute,
)

_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]
_json_object: Any = json.decoder.JSONObject  # type: ignore[attr-defined]
_json_array: Any = json.decoder.JSONArray  # type: ignore[attr-defined]
_py_make_scanner: Any = json.scanner.py_make_scanner  # type: ignore[attr-defined]


def parse_json(
    text: str, origin: Origin, variables: Mapping[str, str] | None
) -> tuple[list[Document], list[RenderProblem]]:
    """One JSON document (whitespace only: none), with duplicate keys and NaN refused.

    Objects that opt out of substitution are found by a first parse without it.
    """
    skip: tuple[tuple[int, int], ...] = ()
    if variables is not None and "${" in text and OPT_OUT_VALUE in text:
        spans: dict[int, tuple[int, int]] = {}
        docs, problems = _parse_json(text, origin, None, (), spans)
        if problems or not docs:
            return docs, problems
        skip = tuple(spans[id(obj)] for obj in opted_out_values(docs[0].value))
    return _parse_json(text, origin, variables, skip, None)


def _parse_json(
    text: str,
    origin: Origin,
    variables: Mapping[str, str] | None,
    skip: tuple[tuple[int, int], ...],
    spans: dict[int, tuple[int, int]] | None,
) -> tuple[list[Document], list[RenderProblem]]:
    if not text.strip():
        return [], []
    problems: list[RenderProblem] = []
    unsubstituted: list[tuple[SubstitutionProblem, int]] = []
    lines: dict[int, int] = {}
    depth = 0  # of the object or array being parsed (see MAX_PARSE_DEPTH)

    def enter(s: str, idx: int) -> None:
        nonlocal depth
        depth += 1
        if depth > MAX_PARSE_DEPTH:
            raise TooDeep(yaml.Mark(origin.file, idx, line_of(s, idx) - 1, column_of(s, idx) - 1, None, 0))

    def line_of(s: str, idx: int) -> int:
        return s.count("\n", 0, idx) + 1

    def column_of(s: str, idx: int) -> int:
        return idx - (s.rfind("\n", 0, idx) + 1) + 1

    def sub(s: str, value: str, idx: int) -> str:
        if variables is None or any(a <= idx < b for a, b in skip):
            return value
        out, found = substitute(value, variables)
        unsubstituted.extend((p, idx) for p in found)
        return out

    def parse_string(s: str, end: int, strict: bool) -> tuple[str, int]:
        value, new_end = _scanstring(s, end, strict)
        return sub(s, value, end - 1), new_end

    def parse_object(
        s_and_end: tuple[str, int],
        strict: bool,
        scan_once: Any,
        object_hook: Any,
        object_pairs_hook: Any,
        memo: Any = None,
    ) -> tuple[dict[str, Any], int]:
        nonlocal depth
        s, end = s_and_end
        enter(s, end - 1)
        pairs, new_end = _json_object(s_and_end, strict, scan_once, None, list, memo)
        depth -= 1
        data: dict[str, Any] = {}
        for key, value in pairs:
            key = sub(s, key, end - 1)
            if key in data:
                problems.append(
                    origin.problem(
                        f"duplicate key {key!r} in JSON object", line_of(s, end - 1), column_of(s, end - 1)
                    )
                )
            data[key] = value
        lines[id(data)] = line_of(s, end - 1)
        if spans is not None:
            spans[id(data)] = (end - 1, new_end)
        return data, new_end

    def parse_array(s_and_end: tuple[str, int], scan_once: Any) -> tuple[list[Any], int]:
        nonlocal depth
        s, end = s_and_end
        enter(s, end - 1)
        found: tuple[list[Any], int] = _json_array(s_and_end, scan_once)
        depth -= 1
        return found

    def parse_constant(name: str) -> None:
        problems.append(origin.problem(f"{name} is not valid JSON for Kubernetes"))

    # The pure-Python scanner calls these hooks, which see positions the C scanner hides.
    # A whole float is the integer Kubernetes reads (``1.0`` is 1: agent.render.yamltypes).
    decoder: Any = json.JSONDecoder(
        parse_constant=parse_constant, parse_float=lambda t: yamltypes.json_number(float(t))
    )
    decoder.parse_object = parse_object
    decoder.parse_array = parse_array
    decoder.parse_string = parse_string
    decoder.scan_once = _py_make_scanner(decoder)
    try:
        value = decoder.decode(text)
    except json.JSONDecodeError as e:
        return [], [origin.problem(f"JSON syntax error: {e.msg}", e.lineno, e.colno)]
    except TooDeep as e:
        mark = e.mark
        return [], [origin.problem(f"JSON is {_TOO_DEEP}", mark.line + 1, mark.column + 1)]
    except RecursionError:
        return [], [origin.problem("JSON is nested too deeply")]
    for p, idx in first_of_each(unsubstituted):
        problems.append(origin.problem(p.message, line_of(text, idx), column_of(text, idx)))
    if problems:
        return [], problems
    start = line_of(text, len(text) - len(text.lstrip()))
    return [Document(value, 0, start, lines)], []
