"""Hostile manifests, generated: every one ends in a typed render error naming its file, or renders
and plans offline; never another exception, in bounded time and memory; and a pass over a batch of
them writes nothing for their apps (docs/reliability.md, "Fuzzing").

What is generated (``hostile()``): wrong types for apiVersion, kind, metadata, name, namespace,
labels and annotations; documents that are not mappings; deep nesting (flow and block); huge
strings; duplicate keys; alias bombs ("billion laughs") and recursive aliases; tags such as
``!!python/object``; bytes that are not UTF-8, NUL and control characters; tabs; streams of many
documents with garbage among them; names that break DNS rules; malformed JSON; ``List`` kinds
with bad items; and random edits of a valid file. Plain directories take most of them; some go
through the pinned ``kustomize``.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agent.dev.demo import commit_directory
from agent.dev.process import LocalCluster
from agent.errors import RenderError
from agent.model import DesiredSet, FailureReason
from agent.plan.planner import PlanOptions, plan
from agent.render.binaries import tool
from agent.render.manifests import MAX_DEPTH
from agent.render.renderer import RenderSpec, render
from agent.report.diff_fields import diff_objects
from tests.agentkit import E2E, Repo, make_repo
from tests.appkit import AppsAgent, counting, members, write_apps_config
from tests.clusters import ClusterPool, kubectl
from tests.fuzzkit import bounded, fuzz_settings

#: Examples of the plain-directory test: each a file of one or more hostile documents.
PLAIN_EXAMPLES = 520
HEAVY_EXAMPLES = 20
KUSTOMIZE_EXAMPLES = 15
#: Bounds of one example (render and plan): far above the usual cost (~10 ms; 2 s for the largest).
SECONDS = 20.0
PEAK = 256 << 20


def base() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": "fuzz", "labels": {"app": "fuzz"}},
        "data": {"k": "v"},
    }


@dataclass(frozen=True)
class Hostile:
    """One generated file: what it holds and what its render must say (``fragment``), if it must fail."""

    category: str
    name: str  # file name inside the app's directory
    content: str | bytes
    must_fail: bool = False
    fragment: str = ""

    def __repr__(self) -> str:  # Hypothesis prints the failing example: keep it readable
        shown = self.content[:600]
        more = f"... ({len(self.content)} in all)" if len(self.content) > 600 else ""
        return f"Hostile({self.category!r}, {self.name!r}, must_fail={self.must_fail}, {shown!r}{more})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis's printer: the same, short
        p.text(repr(self))


def dump(*docs: Any) -> str:
    return "---\n".join(yaml.safe_dump(d, sort_keys=False, allow_unicode=True) for d in docs)


# -- strategies -----------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
not_strings = json_values.filter(lambda v: not isinstance(v, str))
not_mappings = json_values.filter(lambda v: not isinstance(v, dict))


@st.composite
def wrong_type(draw: st.DrawFn) -> Hostile:
    """One of the fields the agent reads replaced by a value of another type."""
    obj = base()
    where = draw(
        st.sampled_from(["apiVersion", "kind", "metadata", "name", "namespace", "labels", "annotations"])
    )
    if where in ("apiVersion", "kind"):
        obj[where] = draw(st.one_of(not_strings, st.just(""), st.just("   ")))
        fragment = where
    elif where == "metadata":
        obj["metadata"] = draw(not_mappings)
        fragment = "metadata"
    elif where in ("name", "namespace"):
        value = draw(st.one_of(not_strings, st.sampled_from(["", ".", "..", "a/b", "50%"])))
        if value is None and where == "namespace":
            obj["metadata"]["namespace"] = None
            return Hostile("wrong type", "a.yaml", dump(obj))  # no namespace: valid
        obj["metadata"][where] = value
        fragment = f"metadata.{where}"
    else:
        value = draw(
            st.one_of(
                not_mappings.filter(lambda v: v is not None),
                st.dictionaries(
                    st.text(max_size=6), not_strings.filter(lambda v: v is not None), min_size=1, max_size=3
                ),
            )
        )
        obj["metadata"][where] = value
        fragment = f"metadata.{where}"
    as_json = draw(st.booleans())
    if as_json:
        return Hostile("wrong type", "a.json", json.dumps(obj), must_fail=True, fragment=fragment)
    return Hostile("wrong type", "a.yaml", dump(obj), must_fail=True, fragment=fragment)


@st.composite
def not_a_mapping(draw: st.DrawFn) -> Hostile:
    """A stream whose document ``i`` is a scalar or a list: the error names document ``i``."""
    before = draw(st.integers(0, 3))
    docs: list[Any] = []
    for i in range(before):
        obj = base()
        obj["metadata"]["name"] = f"cm-{i}"
        docs.append(obj)
    bad = draw(not_mappings.filter(lambda v: v is not None and v != []))
    text = dump(*docs, bad) if docs else dump(bad)
    return Hostile("not a mapping", "a.yaml", text, must_fail=True, fragment=f"document {before} is")


@st.composite
def deep(draw: st.DrawFn) -> Hostile:
    """A value nested ``depth`` levels deep, in flow or block style; deep enough ones are refused."""
    depth = draw(
        st.one_of(st.integers(1, MAX_DEPTH + 5), st.integers(500, 2_600), st.integers(5_000, 60_000))
    )
    style = draw(st.sampled_from(["flow-seq", "flow-map", "block-seq", "block-map"]))
    head = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: deep\ndata:\n  k: v\nspec:"
    if style == "flow-seq":
        # PyYAML's scanner is quadratic in nested flow sequences up to its recursion limit (~4 s
        # at 1,000 levels, bounded): kept shallower here so CI stays fast; the long profile the same.
        depth = min(depth, 500)
        body = " " + "[" * depth + "]" * depth + "\n"
    elif style == "flow-map":
        body = " " + "{a: " * depth + "1" + "}" * depth + "\n"
    elif style == "block-seq":
        depth = min(depth, 600)  # indentation makes block styles quadratic in size
        body = "\n" + "".join(" " * (i + 1) + "-\n" for i in range(depth))
    else:
        depth = min(depth, 600)
        body = "\n" + "".join(" " * (i + 1) + "a:\n" for i in range(depth))
    return Hostile("deep nesting", "a.yaml", head + body, must_fail=depth > MAX_DEPTH, fragment="nested")


@st.composite
def huge_strings(draw: st.DrawFn) -> Hostile:
    size = draw(st.sampled_from([1 << 16, 1 << 18, 1 << 20]))
    where = draw(st.sampled_from(["data", "name", "label", "key"]))
    obj = base()
    big = draw(st.sampled_from(["x", "é", "\U0001f600", "ab\\n"])) * (size // 4)
    if where == "data":
        obj["data"]["big"] = big
    elif where == "name":
        obj["metadata"]["name"] = big
    elif where == "label":
        obj["metadata"]["labels"]["big"] = big
    else:
        obj["data"] = {big: "v"}
    return Hostile("huge string", draw(st.sampled_from(["a.yaml", "a.json"])), json.dumps(obj))


@st.composite
def duplicate_keys(draw: st.DrawFn) -> Hostile:
    where = draw(st.sampled_from(["top", "metadata", "data", "labels"]))
    lines = {
        "top": "apiVersion: v1\nkind: ConfigMap\nkind: Secret\nmetadata:\n  name: d\n",
        "metadata": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: d\n  name: e\n",
        "data": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: d\ndata:\n  k: a\n  k: b\n",
        "labels": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: d\n  labels: {a: x, a: y}\n",
    }
    if draw(st.booleans()):
        key = "kind" if where == "top" else "name" if where == "metadata" else "k" if where == "data" else "a"
        head = '{"apiVersion": "v1", "kind": "ConfigMap", '
        text = (
            head
            + {
                "top": '"kind": "Secret", "metadata": {"name": "d"}}',
                "metadata": '"metadata": {"name": "d", "name": "e"}}',
                "data": '"metadata": {"name": "d"}, "data": {"k": 1, "k": 2}}',
                "labels": '"metadata": {"name": "d", "labels": {"a": "x", "a": "y"}}}',
            }[where]
        )
        return Hostile("duplicate key", "a.json", text, must_fail=True, fragment=f"duplicate key {key!r}")
    return Hostile("duplicate key", "a.yaml", lines[where], must_fail=True, fragment="duplicate mapping key")


@st.composite
def alias_bomb(draw: st.DrawFn) -> Hostile:
    """ "Billion laughs": ``levels`` anchors each aliasing the previous one ``width`` times."""
    levels, width = draw(st.integers(2, 12)), draw(st.integers(2, 10))
    if 2_000 < sum(width**i for i in range(levels + 1)) <= 1_000_000:
        # Accepted, and costly to plan and diff (~0.4 ms a node): only the refused sizes above.
        levels, width = 13, max(width, 3)
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: bomb", "x0: &a0 [lol]"]
    for i in range(1, levels + 1):
        lines.append(f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    text = "\n".join(lines) + "\n"
    if draw(st.booleans()):
        text = "apiVersion: v1\nkind: ConfigMap\nmetadata: &m\n  name: loop\n  self: *m\n"  # recursive
        return Hostile("alias bomb", "a.yaml", text, must_fail=True, fragment="alias")
    expanded = sum(width**i for i in range(levels + 1))
    return Hostile("alias bomb", "a.yaml", text, must_fail=expanded > 1_000_000, fragment="alias bomb")


@st.composite
def tags(draw: st.DrawFn) -> Hostile:
    tag = draw(
        st.sampled_from(
            [
                "!!python/object:os.system",
                "!!python/object/apply:os.system",
                "!!python/name:os.system",
                "!!python/module:os",
                "!!binary",
                "!!set",
                "!!omap",
                "!!timestamp",
                "!custom",
                "!<tag:evil.example,2026:x>",
            ]
        )
    )
    value = draw(st.sampled_from(['"echo pwned"', "[1, 2]", "{a: 1}", "aGVsbG8=", "2026-12-03"]))
    text = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: t\ndata:\n  k: {tag} {value}\n"
    return Hostile("tag", "a.yaml", text, must_fail=True, fragment="unsupported YAML tag")


@st.composite
def bad_bytes(draw: st.DrawFn) -> Hostile:
    good = dump(base()).encode()
    at = draw(st.integers(0, len(good)))
    kind = draw(st.sampled_from(["invalid utf-8", "nul", "control"]))
    if kind == "invalid utf-8":
        junk = draw(
            st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
        )
        fragment = "not UTF-8 text"
    elif kind == "nul":
        junk, fragment = b"\x00", "binary content"
    else:
        junk = draw(st.sampled_from([b"\x01", b"\x07", b"\x1b", b"\x7f", b"\xc2\x85"[:0] + b"\x08"]))
        fragment = ""
    return Hostile(
        kind,
        draw(st.sampled_from(["a.yaml", "a.json"])),
        good[:at] + junk + good[at:],
        must_fail=bool(fragment),
        fragment=fragment,
    )


@st.composite
def tabs(draw: st.DrawFn) -> Hostile:
    text = dump(base())
    lines = text.splitlines(keepends=True)
    i = draw(st.integers(0, len(lines) - 1))
    lines[i] = lines[i].replace("  ", "\t", 1) if lines[i].startswith("  ") else "\t" + lines[i]
    return Hostile("tabs", "a.yaml", "".join(lines))


@st.composite
def garbage_stream(draw: st.DrawFn) -> Hostile:
    """Valid documents with garbage (random text, stray markers) among them."""
    n = draw(st.integers(1, 6))
    parts = []
    for i in range(n):
        obj = base()
        obj["metadata"]["name"] = f"g-{i}"
        parts.append(yaml.safe_dump(obj))
    garbage = draw(
        st.one_of(
            st.text(max_size=80),
            st.sampled_from(
                [
                    "---\n---\n",
                    "...\n...\n",
                    "%YAML 1.1\n",
                    "%TAG ! tag:x,2026:\n",
                    "- - -\n",
                    "? ? ?\n",
                    ": : :\n",
                    "&a *a\n",
                    "{{{{\n",
                    "'\n",
                ]
            ),
        )
    )
    at = draw(st.integers(0, n))
    parts.insert(at, garbage)
    return Hostile("garbage in a stream", "a.yaml", "---\n".join(parts))


@st.composite
def many_documents(draw: st.DrawFn) -> Hostile:
    n = draw(st.integers(100, 1_000))
    twice = draw(st.booleans())
    docs = [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: m-{i}\n  namespace: fuzz\n" for i in range(n)
    ]
    if twice:
        docs.append(docs[draw(st.integers(0, n - 1))])
    return Hostile(
        "many documents", "a.yaml", "---\n".join(docs), must_fail=twice, fragment="duplicate object"
    )


@st.composite
def bad_names(draw: st.DrawFn) -> Hostile:
    name = draw(
        st.one_of(
            st.text(min_size=1, max_size=40),
            st.sampled_from(
                ["UPPER", "a b", "-lead", "trail-", "a..b", "x" * 300, "é", "a\nb", "a:b", "*", "${X}"]
            ),
        )
    )
    obj = base()
    obj["metadata"]["name"] = name
    if draw(st.booleans()):
        obj["metadata"]["namespace"] = name
    forbidden = name in (".", "..") or "/" in name or "%" in name
    return Hostile(
        "DNS-breaking name",
        "a.json" if draw(st.booleans()) else "a.yaml",
        json.dumps(obj),
        must_fail=forbidden,
        fragment="not a valid object name" if forbidden else "",
    )


@st.composite
def bad_json(draw: st.DrawFn) -> Hostile:
    good = json.dumps(base())
    kind = draw(st.sampled_from(["truncated", "nan", "trailing", "two", "comments", "single quotes"]))
    text = {
        "truncated": good[: draw(st.integers(1, len(good) - 1))],
        "nan": good.replace('"v"}', "NaN}"),
        "trailing": good + ",",
        "two": good + good,
        "comments": "// hi\n" + good,
        "single quotes": good.replace('"', "'"),
    }[kind]
    fragment = "is not valid JSON" if kind == "nan" else "JSON syntax error"
    return Hostile("bad JSON", "a.json", text, must_fail=True, fragment=fragment)


@st.composite
def bad_lists(draw: st.DrawFn) -> Hostile:
    items = draw(
        st.one_of(
            not_mappings.filter(lambda v: not isinstance(v, list) and v is not None),
            st.lists(not_mappings, min_size=1, max_size=3),
        )
    )
    obj = {
        "apiVersion": "v1",
        "kind": draw(st.sampled_from(["List", "ConfigMapList", "FooList"])),
        "items": items,
    }
    return Hostile("List with bad items", "a.yaml", dump(obj))


@st.composite
def edits(draw: st.DrawFn) -> Hostile:
    """Random insertions, deletions and replacements of characters in a valid stream."""
    text = dump(base(), {**base(), "metadata": {"name": "two"}})
    for _ in range(draw(st.integers(1, 5))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(
            st.sampled_from(
                [
                    ":",
                    "-",
                    "[",
                    "{",
                    "&",
                    "*",
                    "!",
                    "|",
                    ">",
                    "'",
                    '"',
                    "#",
                    "\t",
                    "\n",
                    " ",
                    "---\n",
                    "%",
                    "@",
                    "`",
                ]
            )
        )
        if op == "insert":
            text = text[:at] + piece + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + 1 :]
        else:
            text = text[:at] + piece + text[at + 1 :]
    return Hostile("random edits", "a.yaml", text)


random_text = st.builds(lambda t: Hostile("random text", "a.yaml", t), st.text(max_size=300))

#: Cheap examples (milliseconds each): the bulk of the generated documents.
HOSTILE = st.one_of(
    wrong_type(),
    not_a_mapping(),
    duplicate_keys(),
    alias_bomb(),
    tags(),
    bad_bytes(),
    tabs(),
    garbage_stream(),
    bad_names(),
    bad_json(),
    bad_lists(),
    edits(),
    random_text,
)
#: Large examples (up to seconds each): fewer of them.
HEAVY = st.one_of(deep(), huge_strings(), many_documents())


# -- what every example must end in --------------------------------------------------------------


def _write(app: Path, h: Hostile) -> None:
    app.mkdir(parents=True, exist_ok=True)
    f = app / h.name
    if isinstance(h.content, bytes):
        f.write_bytes(h.content)
    else:
        f.write_text(h.content, "utf-8", newline="")


def check(tree: Path, h: Hostile, *, expect_file: str, trace: bool = True) -> RenderError | DesiredSet:
    """Render ``tree``'s ``app``: a ``RenderError`` whose every problem names ``expect_file`` (with
    the case's fragment, if it has one), or a set that plans offline; nothing else, within bounds."""
    spec = RenderSpec("fuzz", ("app",), timeout=30.0)
    with bounded(h.category, seconds=SECONDS, peak_bytes=PEAK, trace=trace):
        try:
            ds = render(tree, spec)
        except RenderError as e:
            assert e.problems, "a render error without a problem"
            for p in e.problems:
                assert p.file == expect_file, f"a problem names {p.file!r}, not {expect_file!r}: {p}"
                assert p.message.strip(), p
                assert "Traceback" not in p.message, p
            if h.fragment:
                assert any(h.fragment in p.message for p in e.problems), (
                    h.fragment,
                    [str(p) for p in e.problems],
                )
            return e
        assert not h.must_fail, f"rendered {len(ds.objects)} object(s), but must fail"
        plan_offline(ds)
    return ds


def plan_offline(ds: DesiredSet) -> None:
    """Plan every object as new and as if the cluster held it as declared: typed changes, no error."""
    options = PlanOptions(field_manager="fuzz", rules=())
    created = plan("fuzz", "r", ds.objects, {o.key: None for o in ds.objects}, options)
    live = {}
    for o in ds.objects:
        echo = copy.deepcopy(o.manifest)
        meta = echo["metadata"]
        meta.update(uid="u", resourceVersion="1")
        live[o.key] = echo
    updated = plan("fuzz", "r", ds.objects, live, options)
    assert len(created.changes) == len(updated.changes) == len(ds.objects)
    for o in ds.objects[:20]:
        diff_objects(None, o.manifest, from_label="base", to_label="head")


# -- the tests ------------------------------------------------------------------------------------


def test_every_hostile_manifest_fails_its_render_naming_its_file_or_renders_and_plans_offline() -> None:
    seen: dict[str, int] = {}

    @fuzz_settings(PLAIN_EXAMPLES)
    @given(HOSTILE)
    def one(h: Hostile) -> None:
        seen[h.category] = seen.get(h.category, 0) + 1
        with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
            _write(Path(d) / "app", h)
            check(Path(d), h, expect_file=f"app/{h.name}")

    one()
    assert sum(seen.values()) >= PLAIN_EXAMPLES, seen
    assert len(seen) >= 13, f"categories not generated: {seen}"


def test_deep_huge_and_very_many_documents_fail_naming_their_file_or_render_and_plan_in_bounds() -> None:
    seen: dict[str, int] = {}

    @fuzz_settings(HEAVY_EXAMPLES)
    @given(HEAVY)
    def one(h: Hostile) -> None:
        seen[h.category] = seen.get(h.category, 0) + 1
        with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
            _write(Path(d) / "app", h)
            check(Path(d), h, expect_file=f"app/{h.name}", trace=False)

    one()
    assert len(seen) == 3, seen


def test_hostile_manifests_behind_kustomize_fail_naming_the_kustomization_or_render_and_plan() -> None:
    tool("kustomize")

    @fuzz_settings(KUSTOMIZE_EXAMPLES)
    @given(HOSTILE)
    def one(h: Hostile) -> None:
        with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
            app = Path(d) / "app"
            _write(app, h)
            (app / "kustomization.yaml").write_text(f"resources:\n- {h.name}\n")
            spec = RenderSpec("fuzz", ("app",), timeout=30.0)
            with bounded(h.category, seconds=SECONDS, peak_bytes=PEAK):
                try:
                    ds = render(Path(d), spec)
                except RenderError as e:
                    for p in e.problems:
                        assert p.file.startswith("app"), p  # the kustomization, or its file
                        assert "Traceback" not in p.message and "panic" not in p.message, p
                    return
                plan_offline(ds)

    one()


# -- what the fuzzer found: each a plain example --------------------------------------------------

CM_HEAD = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: found\n"


def _render_one(tmp_path: Path, text: str) -> DesiredSet | RenderError:
    (tmp_path / "app").mkdir(parents=True)
    (tmp_path / "app" / "a.yaml").write_text(text)
    try:
        return render(tmp_path, RenderSpec("fuzz", ("app",)))
    except RenderError as e:
        return e


@pytest.mark.parametrize(
    ("field", "text", "fragment"),
    [
        ("labels", CM_HEAD + "  labels: [a, b]\n", "metadata.labels must be a mapping of strings, got list"),
        ("labels", CM_HEAD + "  labels: app\n", "metadata.labels must be a mapping of strings, got str"),
        (
            "labels",
            CM_HEAD + "  labels: {version: 1.5}\n",
            "metadata.labels.version must be a string, got float",
        ),
        (
            "annotations",
            CM_HEAD + "  annotations: [a]\n",
            "metadata.annotations must be a mapping of strings",
        ),
        (
            "annotations",
            CM_HEAD + "  annotations: {enabled: true}\n",
            "metadata.annotations.enabled must be a string",
        ),
        (
            "data",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\ndata: [1]\n",
            "Secret/s: data must be a mapping",
        ),
        (
            "stringData",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\nstringData: {a: [1]}\n",
            "stringData.a must be a string",
        ),
    ],
)
def test_labels_annotations_or_secret_data_that_are_not_maps_of_strings_fail_the_render_naming_file_and_line(
    tmp_path: Path, field: str, text: str, fragment: str
) -> None:
    """Before: rendered, then the planner (``_adoption``, ``_annotation``, the Secret comparison) or
    the pass's ``prepare`` (adding our label to a list) raised AttributeError/TypeError."""
    got = _render_one(tmp_path, text)
    assert isinstance(got, RenderError), f"{field}: rendered"
    assert [(p.file, p.line) for p in got.problems] == [("app/a.yaml", 1)]
    assert fragment in got.problems[0].message, got.problems[0]


def test_null_labels_and_annotations_render_and_plan_as_if_absent(tmp_path: Path) -> None:
    """Before: ``annotations: null`` made the planner raise AttributeError (``None.get``)."""
    got = _render_one(tmp_path, CM_HEAD + "  labels: null\n  annotations: null\ndata: {k: v}\n")
    assert isinstance(got, DesiredSet) and len(got.objects) == 1
    plan_offline(got)


@pytest.mark.parametrize(
    ("levels", "line"),
    [(MAX_DEPTH + 5, 1), (300, 5)],
    ids=["the object check refuses it (its first line)", "the parser stops (where it goes too deep)"],
)
def test_an_object_nested_more_than_200_levels_deep_fails_its_render_instead_of_the_planners_recursion(
    tmp_path: Path, levels: int, line: int
) -> None:
    """Before: 300 levels rendered (the loaders stopped near Python's recursion limit), then the
    planner's JSON patch of the new object raised RecursionError."""
    got = _render_one(tmp_path, CM_HEAD + "spec: " + "[" * levels + "]" * levels + "\n")
    assert isinstance(got, RenderError)
    assert [(p.file, p.line) for p in got.problems] == [("app/a.yaml", line)]
    assert f"nested more than {MAX_DEPTH} levels deep" in got.problems[0].message
    assert isinstance(
        _render_one(tmp_path / "ok", CM_HEAD + "spec: " + "[" * 150 + "]" * 150 + "\n"), DesiredSet
    )


# -- one real pass over a batch of them: nothing written for their apps, nothing pruned ---------------

_NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
_KEEP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: v\n"
_BOMB = "a0: &a0 [lol]\n" + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 4)}]\n" for i in range(1, 12))

#: (file name, content) that must fail the render of their app; one of each category.
BATCH: list[tuple[str, str | bytes]] = [
    ("cm.yaml", "apiVersion: 1\nkind: ConfigMap\nmetadata: {name: x}\n"),
    ("cm.yaml", "apiVersion: v1\nkind: [ConfigMap]\nmetadata: {name: x}\n"),
    ("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: just-a-string\n"),
    ("cm.yaml", CM_HEAD + "  labels: [a, b]\n"),
    ("cm.yaml", CM_HEAD + "  annotations: [a]\n"),
    ("cm.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: [1]\n"),
    ("cm.yaml", _KEEP.format(name="x", ns="n") + "---\n- a list\n"),
    ("cm.yaml", CM_HEAD + "spec: " + "[" * 300 + "]" * 300 + "\n"),
    ("cm.yaml", CM_HEAD + "data:\n  k: a\n  k: b\n"),
    ("cm.yaml", CM_HEAD + _BOMB),
    ("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: &m\n  name: loop\n  self: *m\n"),
    ("cm.yaml", CM_HEAD + "data:\n  k: !!python/object/apply:os.system ['touch /tmp/pwned']\n"),
    ("cm.yaml", CM_HEAD.encode() + b"data:\n  k: \xff\xfe\n"),
    ("cm.yaml", CM_HEAD.encode() + b"\x00"),
    ("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n\tname: tab\n"),
    ("cm.yaml", _KEEP.format(name="x", ns="n") + "---\n: : :\n"),
    (
        "cm.yaml",
        "---\n".join(
            [_KEEP.format(name=f"m-{i}", ns="n") for i in range(500)] + [_KEEP.format(name="m-7", ns="n")]
        ),
    ),
    ("cm.yaml", CM_HEAD.replace("found", "a/b")),
    ("cm.json", '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"'),
    ("cm.json", '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": NaN}}'),
]


@pytest.mark.cluster
def test_fail_closed_one_pass_over_a_batch_of_hostile_apps_writes_nothing_for_them_and_prunes_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("fuzz")
    bad = [f"bad-{i}" for i in range(len(BATCH))]
    files = {
        "apps/base/ns.yaml": _NS.format(ns=ns),
        # labels and annotations null: valid (before, the pass's prepare raised TypeError on them)
        "apps/good/cm.yaml": _KEEP.format(name="good", ns=ns).replace(
            "  name: good\n", "  name: good\n  labels: null\n  annotations: null\n"
        ),
        **{f"apps/{b}/cm.yaml": _KEEP.format(name=f"keep-{b}", ns=ns) for b in bad},
    }
    repo = make_repo(tmp_path, files)
    cfg = write_apps_config(
        tmp_path, repo, a, [{"name": n, "path": f"apps/{n}"} for n in ["base", "good", *bad]]
    )
    agent = AppsAgent(cfg)
    try:
        first = agent.reconcile()
        assert all(r.ok for r in first.values()), {n: r.error for n, r in first.items() if not r.ok}
        before = {b: members(cfg, a, b) for b in bad}
        uids = _uids(a, ns)
        assert set(uids) == {"good", *(f"keep-{b}" for b in bad)}
        hostile = {k: v for k, v in files.items() if not k.startswith("apps/bad-")}
        for b, (name, content) in zip(bad, BATCH, strict=True):
            hostile[f"apps/{b}/{name}"] = content
        _commit_bytes(repo, hostile)
        with counting(a) as counted:
            results = agent.reconcile()
    finally:
        agent.close()
    for b, (name, _) in zip(bad, BATCH, strict=True):
        r = results[b]
        assert r.reason is FailureReason.RENDER and f"apps/{b}/{name}" in (r.error or ""), (b, r.error)
        assert r.results == [], f"{b}: applied or pruned {r.results}"
    assert results["good"].ok and results["base"].ok
    # Read the server's own count: no write at all but Events (the render failures reported).
    assert {k for k in counted.writes if not k.endswith(" events")} == set(), counted.writes
    assert _uids(a, ns) == uids, "an object of a broken app was deleted or re-created"
    assert {b: members(cfg, a, b) for b in bad} == before, "a broken app's inventory changed"


def _uids(cluster: LocalCluster, ns: str) -> dict[str, str]:
    out = json.loads(kubectl(cluster.kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))
    return {
        i["metadata"]["name"]: i["metadata"]["uid"]
        for i in out["items"]
        if i["metadata"]["name"] != "kube-root-ca.crt"
    }


def _commit_bytes(repo: Repo, files: dict[str, str | bytes]) -> None:
    """``Repo.commit`` for content that may be bytes (not UTF-8) and must not be dedented."""
    shutil.rmtree(repo.work, ignore_errors=True)
    for rel, content in files.items():
        f = repo.work / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            f.write_bytes(content)
        else:
            f.write_text(content, "utf-8", newline="")
    commit_directory(repo.path, repo.work, "hostile")
