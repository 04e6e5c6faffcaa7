"""Unit tests of the pure parts of the render stage: substitution, YAML/JSON parsing, validation."""

from __future__ import annotations

import pytest

from agent.render.jsonmanifest import parse_json
from agent.render.manifests import MAX_DEPTH, MAX_PARSE_DEPTH, Origin, objects_of, parse_yaml
from agent.render.substitute import references, substitute
from tests.fuzzkit import collections_everywhere

ORIGIN = Origin("f.yaml")


# ---------------------------------------------------------------------------
# substitute


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${A}", "1"),
        ("x-${A}-${B}", "x-1-two"),
        ("$${A}", "${A}"),
        ("$$${A}", "$${A}"),  # a lone "$", then the escape "$${A}"
        ("$A and $ alone", "$A and $ alone"),
        ("no dollars", "no dollars"),
        ("${A}${A}", "11"),
    ],
)
def test_substitutes_defined_variables_and_keeps_escapes_literal(text: str, expected: str) -> None:
    out, problems = substitute(text, {"A": "1", "B": "two"})
    assert problems == []
    assert out == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("${MISSING}", "undefined variable ${MISSING}"),
        ("${}", "malformed variable reference"),
        ("${a-b}", "malformed variable reference"),
        ("${UNCLOSED", "malformed variable reference"),
        ("${1ABC}", "malformed variable reference"),
    ],
)
def test_reports_undefined_and_malformed_references(text: str, fragment: str) -> None:
    _, problems = substitute(text, {"A": "1"})
    assert len(problems) == 1
    assert fragment in problems[0].message
    assert problems[0].offset == 0


def test_reports_every_bad_reference_in_a_string_with_its_offset() -> None:
    _, problems = substitute("a ${X} b ${Y}", {})
    assert [p.offset for p in problems] == [2, 9]


def test_references_lists_names_but_not_escapes() -> None:
    assert references("${A} $${B} ${C}") == {"A", "C"}


# ---------------------------------------------------------------------------
# YAML


def _objects(text: str, variables: dict[str, str] | None = None) -> list[dict[str, object]]:
    docs, problems = parse_yaml(text, ORIGIN, variables)
    assert problems == []
    found, invalid = objects_of(docs, ORIGIN)
    assert invalid == []
    return [m for m, _ in found]


def test_a_plain_scalar_substituted_with_a_number_becomes_a_number_but_a_quoted_one_stays_a_string() -> None:
    (obj,) = _objects(
        'apiVersion: v1\nkind: X\nmetadata: {name: x}\nspec:\n  a: ${N}\n  b: "${N}"\n  c: ${T}\n',
        {"N": "3", "T": "true"},
    )
    assert obj["spec"] == {"a": 3, "b": "3", "c": True}


def test_a_variable_value_cannot_inject_yaml_structure() -> None:
    (obj,) = _objects("apiVersion: v1\nkind: X\nmetadata:\n  name: ${V}\n", {"V": "x\nkind: Evil"})
    assert obj["kind"] == "X"
    assert obj["metadata"] == {"name": "x\nkind: Evil"}


def test_comments_are_not_substituted() -> None:
    assert _objects("# uses ${NOWHERE}\napiVersion: v1\nkind: X\nmetadata: {name: x}\n", {})


def test_dates_stay_strings_as_in_kubernetes_yaml() -> None:
    (obj,) = _objects("apiVersion: v1\nkind: X\nmetadata: {name: x}\ndata: {d: 2024-01-31}\n")
    assert obj["data"] == {"d": "2024-01-31"}


def test_merge_keys_merge_keys_the_mapping_does_not_set_itself() -> None:
    text = "apiVersion: v1\nkind: X\nmetadata: {name: x}\nbase: &b {a: 1, b: 2}\nspec:\n  <<: *b\n  c: 3\n"
    (obj,) = _objects(text)
    assert obj["spec"] == {"a": 1, "b": 2, "c": 3}


def test_a_key_set_by_a_merge_and_again_is_a_duplicate_as_kubernetes_reads_it() -> None:
    """sigs.k8s.io/yaml's strict reading refuses it ("key already set in map"); PyYAML let the
    mapping's own value win, so the agent applied what kubectl refuses."""
    text = "apiVersion: v1\nkind: X\nmetadata: {name: x}\nbase: &b {a: 1, b: 2}\nspec:\n  <<: *b\n  b: 3\n"
    docs, problems = parse_yaml(text, ORIGIN, None)
    assert docs == []
    assert [(p.line, p.message) for p in problems] == [
        (7, "duplicate mapping key 'b' (YAML would keep only one) (first at line 4)")
    ]


@pytest.mark.parametrize("tag", ["!!int", "!!float", "!!bool", "!!null", "!!merge"])
def test_a_scalar_tag_on_a_collection_is_a_problem_at_its_line(tag: str) -> None:
    """Kept when the loader took over go-yaml's scalar types: PyYAML's constructors refused it."""
    docs, problems = parse_yaml(f"a: 1\nb: {tag} {{c: 1}}\n", ORIGIN, None)
    assert docs == [] and [(p.line, p.column) for p in problems] == [(2, 4)]
    assert f"cannot have the tag 'tag:yaml.org,2002:{tag[2:]}'" in problems[0].message


def test_each_document_keeps_its_index_and_first_line() -> None:
    text = (
        "---\napiVersion: v1\nkind: A\nmetadata: {name: a}\n"
        "---\n---\n\napiVersion: v1\nkind: B\nmetadata: {name: b}\n"
    )
    docs, problems = parse_yaml(text, ORIGIN, None)
    found, _ = objects_of(docs, ORIGIN)
    assert problems == []
    assert [(p.document, p.line) for _, p in found] == [(0, 2), (2, 8)]


def test_list_items_keep_their_own_lines() -> None:
    text = (
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: A\n  metadata: {name: a}\n"
        "- {apiVersion: v1, kind: B, metadata: {name: b}}\n"
    )
    docs, _ = parse_yaml(text, ORIGIN, None)
    found, _ = objects_of(docs, ORIGIN)
    assert [(m["kind"], p.line) for m, p in found] == [("A", 4), ("B", 7)]


def test_undefined_variable_names_its_line_and_column() -> None:
    _, problems = parse_yaml("a: 1\nb: x-${NOPE}\n", ORIGIN, {})
    assert [(p.line, p.column) for p in problems] == [(2, 6)]
    assert "undefined variable ${NOPE}" in problems[0].message


def test_all_duplicate_keys_of_a_file_are_reported() -> None:
    _, problems = parse_yaml("a: 1\na: 2\nb: {c: 1, c: 2}\n", ORIGIN, None)
    assert [(p.line, "duplicate mapping key" in p.message) for p in problems] == [(2, True), (3, True)]


def test_helm_sections_map_lines_to_their_template() -> None:
    origin = Origin("chart/Chart.yaml", sections=((2, "chart/templates/a.yaml"),), provenance_lines=False)
    text = (
        "---\n# Source: web/templates/a.yaml\n"
        "apiVersion: v1\nkind: A\nmetadata: {name: a}\nspec: {x: 1, x: 2}\n"
    )
    _, problems = parse_yaml(text, origin, None)
    assert [(p.file, p.line) for p in problems] == [("chart/templates/a.yaml (rendered)", 4)]


# ---------------------------------------------------------------------------
# JSON


def test_json_keeps_lines_of_list_items_and_substitutes_strings_only() -> None:
    text = (
        '{"apiVersion": "v1", "kind": "List", "items": [\n'
        '  {"apiVersion": "v1", "kind": "A", "metadata": {"name": "${N}"}, "n": 5}\n]}\n'
    )
    docs, problems = parse_json(text, ORIGIN, {"N": "7"})
    found, invalid = objects_of(docs, ORIGIN)
    assert problems == [] and invalid == []
    ((obj, prov),) = found
    assert obj["metadata"]["name"] == "7"
    assert prov.line == 2


@pytest.mark.parametrize("opener", ["[", '{"a": '])
def test_deeply_nested_json_is_refused_where_it_goes_too_deep_with_stack_left(opener: str) -> None:
    """Before: the parser recursed until Python's recursion limit ("JSON is nested too deeply",
    no place), where a cycle collection's finalisers had no frames to spare and failed."""
    text = "\n" + opener * 5_000
    with collections_everywhere() as finaliser:
        docs, problems = parse_json(text, ORIGIN, None)
    assert finaliser.least >= 250, f"a finaliser had {finaliser.least} frames to spare"
    column = len(opener) * MAX_PARSE_DEPTH + 1  # the opener of level MAX_PARSE_DEPTH + 1
    assert docs == [] and [(p.message, p.line, p.column) for p in problems] == [
        (f"JSON is nested more than {MAX_DEPTH} levels deep", 2, column)
    ]


def test_an_empty_json_file_has_no_objects() -> None:
    assert parse_json("  \n", ORIGIN, None) == ([], [])
