"""The libyaml fast path of YAML parsing (``agent/render/fastyaml.py``) against the reference loader.

The fast path must give exactly what the pure-Python loader of ``agent/render/manifests.py``
gives for every stream it accepts (values, document indexes, lines), and hand every other
stream over to it: problems, aliases, merge keys, rare tags, nesting deep enough to reach
the C stack.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from yaml.nodes import MappingNode, Node, SequenceNode

from agent.render import fastyaml, manifests
from agent.render.manifests import Origin, parse_yaml
from tests.fuzzkit import collections_everywhere, fuzz_settings

ORIGIN = Origin("f.yaml")
LIMITS = {"max_nodes": manifests.MAX_EXPANDED_NODES, "max_depth": manifests.MAX_PARSE_DEPTH}
VARS = {"N": "3", "T": "true", "S": "x y", "E": ""}

ORDINARY = [
    "a: ${N}\nb: \"${N}\"\nc: ${T}\nd: x-${N}\ne: $${N}\nf: '${S}'\ng: ${E}\n",
    "# ${NOWHERE} in a comment\nk: v # ${NOR} here\n",
    "s: !!str ${N}\nt: &anchor !!str ${N}\ni: !!int '7'\nv: &w ${N}\nw: !!float '1'\n",
    "d: 2024-01-31\nf: 1.5\ne: 1e3\nh: 0x1F\no: 0o17\nn: ~\nb: yes\nx: .inf\n",
    '---\n---\nk: [1, two, {t: "${T}"}]\n...\n---\n- a\n- {b: c}\n',
    'block: |\n  line ${N}\n  $${KEEP}\nfolded: >-\n  a\n  b\nquoted: "tab\\there \\u00e9"\n',
    "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: A\n  metadata: {name: a}\n",
    "ünï: cödé 😀\nk: ${N}\n",
    "",
    "key with spaces: v\n? complex\n: value\n",
    "script: |\n  if ! command -v jq; then exit 1; fi\nnote: wow! [a, b!]\n",  # no bare "!" tag
    # CRD text: "*" and "&" in descriptions and CEL rules are neither aliases nor anchors
    "description: '*optional*, see **Foo** & Bar'\n"
    "rule: self.a && !has(self.b) || self.c != 'x'\nglob: a/*\n",
]

HANDED_OVER = {
    "duplicate key": "a: 1\na: 2\n",
    "undefined variable": "a: ${MISSING}\n",
    "malformed reference": "a: ${a-b}\n",
    "alias": "a: &x {b: 1}\nc: *x\n",
    "alias of a scalar": "a: &x 1\nb: *x\n",
    "alias as a key": "a: &k x\n*k : 1\n",
    "alias in a later document": "a: 1\n---\nb: &x [1]\nc: [*x, *x]\n",
    "merge key": "base: &b {a: 1}\nspec:\n  <<: *b\n",
    "null key": "~: a\n",
    "bare ! tag (Kubernetes: a string, libyaml: resolved)": "u: ! ${N}\nq: ! 1\n",
    "tab": "a:\n\tb: 1\n",
    "syntax error": "a: b: c\n",
    "binary tag": "a: !!binary aGk=\n",
    "${X} in a flow mapping (libyaml: braces end it)": "a: {b: ${N}}\n",
    "deep nesting": "[" * 50_000 + "]" * 50_000,
}


def _python(text: str, variables: dict[str, str] | None) -> list[tuple[Any, int, int | None, list[int]]]:
    docs, problems = manifests._parse_yaml_python(text, ORIGIN, variables)
    assert problems == []
    return [(d.value, d.index, d.line, sorted(d.lines.values())) for d in docs]


def test_yaml_is_parsed_by_libyaml_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fastyaml.AVAILABLE, "PyYAML without libyaml: install PyYAML wheels built with it"

    def refuse(*args: object) -> object:
        raise AssertionError("an ordinary stream went to the pure-Python loader")

    monkeypatch.setattr(manifests, "_parse_yaml_python", refuse)
    docs, problems = parse_yaml('a: ${N}\nb: "${N}"\n', ORIGIN, VARS)
    assert problems == [] and docs[0].value == {"a": 3, "b": "3"}


@pytest.mark.parametrize("text", ORDINARY)
@pytest.mark.parametrize("variables", [VARS, None], ids=["vars", "no-vars"])
def test_libyaml_path_gives_exactly_what_the_python_loader_gives(
    text: str, variables: dict[str, str] | None
) -> None:
    fast = fastyaml.load(text, variables, **LIMITS)
    assert fast is not None, "an ordinary stream was handed over"
    got = [(value, index, line, sorted(lines.values())) for value, index, line, lines in fast]
    assert got == _python(text, variables)
    assert [type(v) for d in got if isinstance(d[0], dict) for v in d[0].values()] == [
        type(v) for d in _python(text, variables) if isinstance(d[0], dict) for v in d[0].values()
    ]


@pytest.mark.parametrize("text", list(HANDED_OVER.values()), ids=list(HANDED_OVER))
def test_streams_with_problems_or_rare_yaml_go_to_the_reference_loader(text: str) -> None:
    assert fastyaml.load(text, {}, **LIMITS) is None


def test_deep_nesting_is_refused_without_reaching_the_c_stack() -> None:
    box: dict[str, Any] = {}
    text = "- " * 40_000 + "x\n"  # would overflow libyaml's recursive composer on an 8 MB stack
    t = threading.Thread(target=lambda: box.update(r=parse_yaml(text, ORIGIN, None)))
    t.start()
    t.join()
    docs, problems = box["r"]
    too_deep = f"document is nested more than {manifests.MAX_DEPTH} levels deep"
    assert docs == [] and problems[0].message == too_deep


@pytest.mark.parametrize(
    "levels", [300, 40_000], ids=["libyaml composes, the walk hands over", "pure-Python loader only"]
)
def test_deep_nesting_is_refused_with_room_left_on_the_stack(levels: int) -> None:
    """Before: both loaders recursed until Python's recursion limit, and a cycle collection that
    came at the deepest point ran finalisers with 3 frames to spare; they failed ("Exception
    ignored in"), and their cleanup with them (a CI run failed on exactly that)."""
    text = "- " * levels + "x\n"
    with collections_everywhere() as finaliser:
        docs, problems = parse_yaml(text, ORIGIN, None)
    assert finaliser.least >= 250, f"a finaliser had {finaliser.least} frames to spare"
    first_too_deep = 2 * manifests.MAX_PARSE_DEPTH + 1  # the column of level MAX_PARSE_DEPTH + 1
    assert docs == [] and [(p.line, p.column) for p in problems] == [(1, first_too_deep)]


def test_the_deepest_object_a_render_accepts_is_parsed_on_both_paths() -> None:
    """The parsers stop deeper than MAX_DEPTH levels inside MAX_LIST_NESTING Lists, so an object
    that deep is refused by the object checks (naming its path), not by a parser."""
    levels = manifests.MAX_DEPTH + 2 * manifests.MAX_LIST_NESTING
    text = "- " * levels + "x\n"
    fast = fastyaml.load(text, None, **LIMITS)
    assert fast is not None
    assert parse_yaml(text, ORIGIN, None)[0][0].value == fast[0][0]
    assert manifests._parse_yaml_python(text, ORIGIN, None)[1] == []


def test_a_document_with_more_colons_than_max_c_depth_but_short_lines_takes_the_fast_path() -> None:
    """Before: a large CRD (a colon per key; argo-cd's ApplicationSet has 24,386) went to the
    pure-Python loader, ~6x slower: argo-cd's install.yaml parsed in 2.2 s instead of 0.36 s."""
    keys = "".join(f"    k{i}: {{type: string, description: 'a: b - c'}}\n" for i in range(4_000))
    text = "kind: CustomResourceDefinition\nspec:\n  properties:\n" + keys
    assert sum(text.count(c) for c in "[{-?:") > fastyaml.MAX_C_DEPTH
    fast = fastyaml.load(text, None, **LIMITS)
    assert fast is not None and len(fast[0][0]["spec"]["properties"]) == 4_000


def _composed_depth(node: Node) -> int:
    """Collections nested in the composed node (libyaml's composer recurses once per level)."""
    deepest, stack = 0, [(node, 0)]
    while stack:
        n, depth = stack.pop()
        if isinstance(n, SequenceNode):
            stack.extend((c, depth + 1) for c in n.value)
        elif isinstance(n, MappingNode):
            stack.extend((c, depth + 1) for pair in n.value for c in pair)
        deepest = max(deepest, depth)
    return deepest + 1


_TREES = st.recursive(
    st.one_of(st.integers(), st.text("ab :-[", max_size=4), st.none()),
    lambda kids: st.one_of(
        st.lists(kids, min_size=1, max_size=3),
        st.dictionaries(st.text("ab", min_size=1, max_size=2), kids, min_size=1, max_size=3),
    ),
    max_leaves=80,
)


@fuzz_settings(300)
@given(
    tree=_TREES,
    flow=st.sampled_from([False, True, None]),  # block, flow, block with flow leaves
    indent=st.integers(2, 5),
)
def test_the_indentation_bound_is_never_below_the_depth_libyaml_composes(
    tree: Any, flow: bool | None, indent: int
) -> None:
    """The fast path trusts it to keep libyaml's recursive composer off deep documents."""
    text = yaml.safe_dump(tree, default_flow_style=flow, indent=indent)
    assert fastyaml.indent_bound(text) >= _composed_depth(yaml.compose(text, Loader=yaml.CSafeLoader))


@pytest.mark.parametrize(
    "text",
    [
        "- " * 60 + "x\n",  # compact sequences: one level per two columns
        "k:\n"
        + "".join(f"{'  ' * i}- k:\n" for i in range(40))
        + " " * 80
        + "- x\n",  # k's sequence at k's column
        "? " * 30 + "x\n",  # complex keys
        "k:\n" + " [a:\n" * 50 + " b\n" + " ]\n" * 50,  # single-pair mappings in flow sequences
        "k:\n" + " {a:\n" * 50 + " b\n" + " }\n" * 50,
        "- " * 20 + "{a: " * 30 + "[" * 30 + "]" * 30 + "}" * 30 + "\n",
    ],
)
def test_the_indentation_bound_holds_for_the_densest_nestings(text: str) -> None:
    assert fastyaml.indent_bound(text) >= _composed_depth(yaml.compose(text, Loader=yaml.CSafeLoader))


def test_many_shallow_documents_still_take_the_fast_path() -> None:
    one = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: n, labels: {a: b}}\ndata: {k: v-1}\n"
    text = "---\n".join([one] * 3_000)  # far more level characters than MAX_C_DEPTH, in all
    fast = fastyaml.load(text, None, **LIMITS)
    assert fast is not None and len(fast) == 3_000


def test_a_star_in_text_does_not_hand_over_many_documents() -> None:
    # A "*" anywhere turns on alias detection by node id; ids of an earlier document's freed
    # nodes are reused, which once handed every CronJob file ("*/30 * * * *") to the slow loader.
    one = 'kind: CronJob\nmetadata: {name: n}\nspec: {schedule: "*/30 * * * *", a: [1, 2, {b: c}]}\n'
    text = "---\n".join([one] * 500)
    fast = fastyaml.load(text, None, **LIMITS)
    assert fast is not None and len(fast) == 500


def test_documents_share_one_string_per_key_and_per_short_value() -> None:
    """10,000 rendered objects held "metadata", "name", "apps/v1"... once per object each (a third
    of a render's memory); equal keys and short values are one string now, long ones stay apart."""
    text = "".join(
        f"---\napiVersion: apps/v1\nmetadata:\n  name: n{i}\n  note: {'x' * 40}\n" for i in range(2)
    )
    docs = fastyaml.load(text, None, max_nodes=1000, max_depth=manifests.MAX_PARSE_DEPTH)
    assert docs is not None
    (a, *_), (b, *_) = docs
    key_a = next(k for k in a if k == "metadata")
    key_b = next(k for k in b if k == "metadata")
    assert key_a is key_b
    assert a["apiVersion"] is b["apiVersion"]
    assert a["metadata"]["note"] == b["metadata"]["note"]
    assert a["metadata"]["note"] is not b["metadata"]["note"]  # long values are not interned


def test_a_large_shallow_document_whose_bounds_fail_is_scanned_and_takes_the_fast_path() -> None:
    """kube-prometheus's Grafana dashboards: JSON in block scalars, long lines full of brackets.
    Both bounds exceeded MAX_C_DEPTH, so the 1 MB file went to the pure-Python loader (~10x
    slower); libyaml's event parser, which does not recurse, measures the real depth."""
    dashboard = "[" * 11_000 + "{}" + "]" * 11_000
    text = "".join(f"---\nkind: ConfigMap\ndata:\n  d{i}.json: |-\n    {dashboard}\n" for i in range(3))
    assert fastyaml.indent_bound(text) > fastyaml.MAX_C_DEPTH
    fast = fastyaml.load(text, None, **LIMITS)
    assert fast is not None and fast[2][0]["data"] == {"d2.json": dashboard}


def test_an_alias_bomb_is_handed_over_after_walking_no_more_nodes_than_were_composed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The walk stops once it visits more nodes than libyaml composed (an alias followed), not
    after ``max_nodes`` of expansion: a bomb of 60 composed nodes costs about 60 visits."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: bomb", "x0: &a0 [lol]"]
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 4) + "]" for i in range(1, 14)]
    visits = 0
    tree = fastyaml._Walk.tree

    def counted(self: Any, node: Node) -> Any:
        nonlocal visits
        visits += 1
        return tree(self, node)

    monkeypatch.setattr(fastyaml._Walk, "tree", counted)
    text = "\n".join(lines) + "\n"
    assert fastyaml.load(text, None, max_nodes=1_000_000, max_depth=100) is None
    assert visits < 200, visits
    _, problems = parse_yaml(text, Origin("a.yaml"), None)
    assert problems and "alias" in str(problems[0]), problems
