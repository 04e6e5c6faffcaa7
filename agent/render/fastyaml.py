"""The fast path of YAML parsing: libyaml composes, a small Python walk builds the values.

Called by ``agent.render.manifests.parse_yaml`` only. ``load(text, variables)``
returns the documents of an *ordinary* stream -- or ``None``, and then the
caller parses the same text with its pure-Python loader, which is the
reference for every behaviour (error messages, line/column of problems, alias
bombs, merge keys, unusual tags). So this module never reports a problem
itself: anything it does not handle exactly like that loader (a syntax error,
a duplicate or refused key, a bad ``${...}``, an alias, an explicit tag
other than the JSON scalar ones or a bare ``!``, a merge key) is a reason to hand over.

Why: PyYAML's pure-Python scanner/parser took ~1 s per 1,000 documents, most
of an initial apply. libyaml (``yaml.cyaml.CParser``) builds the node tree in
C with marks on every node; the only Python left is the resolver it calls per
scalar, the substitution pass, and the walk below (duplicate keys, lines, values).

``${VAR}`` is substituted in a composed document before its values are built, as in the
pure-Python loader (``agent.render.substitute.substitute_tree``): a substituted plain scalar
without an explicit tag gets its tag resolved again, so ``replicas: ${N}`` is an int and
``"${N}"`` a str. Scalars are typed as Kubernetes types them (``agent.render.yamltypes``).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import yaml
from yaml.events import CollectionEndEvent, CollectionStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from agent.render import yamltypes
from agent.render.substitute import OPT_OUT_VALUE, opted_out, substitute_tree

#: libyaml is compiled into this PyYAML: the fast path is used (a test asserts it on our machines).
AVAILABLE: bool = bool(getattr(yaml, "__with_libyaml__", False))

#: A document with more possible nesting levels than this goes to the pure-Python loader: the
#: libyaml composer recurses on the C stack (~300 bytes a level; 8 MB stacks crash at ~25,000
#: levels, a segfault no ``except`` can catch), while the Python one stops at a set depth.
MAX_C_DEPTH = 10_000
# Every nesting level starts with one of these characters of its own (flow opener, block
# sequence entry, complex key, or the value indicator of a mapping's first key), so their count in
# a document bounds its depth. Anything else (scalars, comments) only makes the bound looser.
_LEVEL_CHARS = "[{-?:"

_STR = yamltypes.STR
_TYPED = frozenset({yamltypes.INT, yamltypes.FLOAT, yamltypes.BOOL, yamltypes.NULL})
# A non-specific tag "!" standing alone: PyYAML and libyaml resolve "! 1" as the int 1, go-yaml
# (Kubernetes) as the string "1"; the pure-Python loader reads it the Kubernetes way.
# Where a node starts: a line's start, after an indicator (": ", "- ", "? ", "[", "{", ",") or
# an anchor; so a shell "if ! cmd" in a block scalar does not hand a file over.
_BARE_TAG = re.compile(r"(?:^|[:\-?\[{,]|&\S+)[ \t]*!(?=[\s,\]}]|$)", re.MULTILINE)
# A "!" standing alone (what ``_BARE_TAG`` ends with), found first: tried at every position of a
# large stream, ``_BARE_TAG``'s alternatives took as long as building the stream's values.
_LONE_BANG = re.compile(r"!(?=[\s,\]}]|$)")
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_PLAIN = (None, "")  # ScalarNode.style of a plain scalar (libyaml: "", PyYAML: None)
#: Strings up to this length are interned (one "apps/v1" for every object held, not one each).
_INTERNED = 32
_intern = sys.intern

#: (value, index in the stream, first line, {id(dict): line}) per document.
FastDocument = tuple[Any, int, int, dict[int, int]]


class _Handover(Exception):
    """The stream needs the pure-Python loader (a problem to report, or YAML we do not build here)."""


if AVAILABLE:
    from yaml import cyaml

    _CParser: Any = cyaml.__dict__["CParser"]  # not in cyaml's __all__, and untyped

    #: The resolver's answer, without a Python call when it is known: libyaml's composer asks it
    #: for every node, and the same scalars recur (``type: string``, ``true``, ``apps/v1``). The
    #: resolver holds no state its answer depends on (no path resolvers), so one serves all.
    _cached_resolve = functools.lru_cache(maxsize=4096)(yamltypes.Resolver().resolve)

    class _Composer(_CParser, yamltypes.Resolver):  # type: ignore[misc]
        def __init__(self, text: str) -> None:
            _CParser.__init__(self, text)
            yamltypes.Resolver.__init__(self)
            self.resolve = _cached_resolve  # type: ignore[method-assign]  # per instance, on purpose
            #: Nodes composed since it was last set to 0 (an alias composes none: it is its anchor's).
            self.composed = 0

        def descend_resolver(self, current_node: Any, current_index: Any) -> None:
            # libyaml's composer calls this once for every node it makes, never for an alias; the
            # resolver has no path resolvers, the only use PyYAML has for it.
            self.composed += 1


def load(
    text: str, variables: Mapping[str, str] | None, *, max_nodes: int, max_depth: int
) -> list[FastDocument] | None:
    """Every document of ``text``, or ``None`` when the pure-Python loader must parse it.

    ``max_nodes``, ``max_depth``: a document with more nodes, or more levels (the root is level 1),
    is handed over too (the reference loader refuses it).
    """
    if not AVAILABLE or not _shallow(text) or _bare_tag(text):
        return None
    walk = _Walk(text, max_nodes, max_depth)
    substituting = variables is not None and "${" in text
    may_opt_out = OPT_OUT_VALUE in text
    composer = _Composer(text)
    docs: list[FastDocument] = []
    try:
        while composer.check_node():
            composer.composed = 0
            node = composer.get_node()
            walk.lines, walk.nodes, walk.depth = {}, 0, 0
            # Visiting more nodes than were composed means an alias was followed: stop there, so
            # an alias bomb costs its few composed nodes, never max_nodes of walking.
            walk.max_nodes = min(max_nodes, composer.composed)
            if substituting:
                assert variables is not None
                skip = opted_out(node) if may_opt_out else set()
                if substitute_tree(node, variables, walk.plain, skip):
                    raise _Handover  # the reference loader reports them, at their lines
            value = walk.build(node)
            if walk.nodes != composer.composed:
                raise _Handover  # an alias made a node reachable twice: the reference loader sizes those
            docs.append((value, len(docs), node.start_mark.line + 1, walk.lines))
    except (_Handover, yaml.YAMLError, RecursionError, ValueError, TypeError, KeyError):
        return None  # the reference loader says what is wrong, in its own words and places
    finally:
        composer.dispose()
    return docs


def _bare_tag(text: str) -> bool:
    """Whether ``_BARE_TAG`` matches in ``text``: tried only on the line of each lone "!" found."""
    for m in _LONE_BANG.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        if _BARE_TAG.search(text, start, m.end() + 1):
            return True
    return False


def _shallow(text: str) -> bool:
    """Whether no document of ``text`` can nest deeper than ``MAX_C_DEPTH`` levels."""
    if sum(text.count(c) for c in _LEVEL_CHARS) <= MAX_C_DEPTH:
        return True
    # A "---" or "..." at column 0 always ends a document (even inside a block or quoted scalar),
    # so each document lies within one piece between such lines.
    cuts = [0]
    for marker in ("\n---", "\n..."):
        at = text.find(marker)
        while at >= 0:
            cuts.append(at + 1)
            at = text.find(marker, at + 1)
    cuts.sort()
    cuts.append(len(text))
    if all(_depth_bound(text, a, b) <= MAX_C_DEPTH for a, b in pairwise(cuts)):
        return True
    return _scanned_shallow(text)


def _scanned_shallow(text: str) -> bool:
    """Whether libyaml's event parser, which keeps its own stack and does not recurse, finds no
    collection nested deeper than ``MAX_C_DEPTH`` (``False`` on a syntax error: the reference
    loader reports it).

    For what both bounds overestimate: Grafana dashboards as JSON in block scalars (long lines
    full of brackets, one event each) sent kube-prometheus's 1 MB file to the pure-Python loader,
    10x slower than composing it; the scan costs a fiftieth of that.
    """
    parser = _CParser(text)
    depth = 0
    try:
        while (event := parser.get_event()) is not None:
            if isinstance(event, CollectionStartEvent):
                depth += 1
                if depth > MAX_C_DEPTH:
                    return False
            elif isinstance(event, CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return False
    finally:
        parser.dispose()
    return True


def _depth_bound(text: str, start: int, end: int) -> int:
    """An upper bound of the nesting depth of the document in ``text[start:end]``: the smaller of two.

    The count of ``_LEVEL_CHARS``, tight for small documents but not for a large CRD (a colon per
    key: argo-cd's ApplicationSet counts 24,386), and a bound from indentation: block collections
    come outermost, and along any path of them the column where one starts grows at least every
    second level (only a mapping's value may be a sequence at the mapping's own column), so they
    nest at most twice (longest line + 1) deep; inside them, each ``{`` opens one flow level and
    each ``[`` at most two (a sequence, and a single-pair mapping ``[a: b]`` in it).
    """
    by_chars = sum(text.count(c, start, end) for c in _LEVEL_CHARS)
    return by_chars if by_chars <= MAX_C_DEPTH else min(by_chars, indent_bound(text[start:end]))


def indent_bound(document: str) -> int:
    """The bound from indentation of ``_depth_bound`` (see there)."""
    longest = max(map(len, document.split("\n")))
    return 2 * (longest + 1) + 2 * document.count("[") + document.count("{")


class _Walk:
    """Builds one document's value from its node tree: types, duplicate keys, lines.

    Each node visited is counted; ``load`` compares the count with the nodes libyaml composed, so
    a node reached twice (an alias) hands the stream over; ``load`` bounds the walk by that count,
    so an alias bomb stops after its few composed nodes.
    """

    def __init__(self, text: str, max_nodes: int, max_depth: int) -> None:
        self.text = text
        self.max_nodes = max_nodes
        self.nodes = 0
        # Levels of the collection being built: the walk recurses, and must stop where the
        # reference loader does, far from Python's recursion limit (see manifests.MAX_PARSE_DEPTH).
        self.max_depth = max_depth
        self.depth = 0
        self.lines: dict[int, int] = {}

    def build(self, node: Node) -> Any:
        """The value of a document's root ``node``."""
        self.nodes += 1
        return self.tree(node)

    def tree(self, node: Node) -> Any:
        """The value of ``node``, already counted. A collection counts and makes its scalars in
        its own loop: most nodes are scalars, and a call for each was a third of the walk."""
        if isinstance(node, ScalarNode):
            return self.scalar(node)
        cls = node.__class__  # exact classes below: libyaml makes no subclasses
        self.depth += 1  # no need to undo it on _Handover: the whole stream is handed over
        if self.depth >= self.max_depth:  # its scalars would be one level deeper still
            raise _Handover
        children = node.value
        if cls is MappingNode:
            if node.tag != _MAP:
                raise _Handover
            self.nodes += 2 * len(children)
            if self.nodes > self.max_nodes:
                raise _Handover
            data: dict[str, Any] = {}
            self.lines[id(data)] = node.start_mark.line + 1
            for key_node, value_node in children:
                if key_node.__class__ is not ScalarNode:
                    raise _Handover  # a list or mapping as a key: refused
                tag = key_node.tag
                if tag == _STR:
                    key = key_node.value
                else:  # 80 -> "80", as Kubernetes reads it
                    key = yamltypes.json_key(self.scalar(key_node), tag, key_node.value)
                if key is None or key in data:
                    raise _Handover  # a refused or duplicate key (a merge key, "<<", is tagged merge)
                key = _intern(key)  # one "metadata" for every object held, not one each
                if value_node.__class__ is ScalarNode and value_node.tag == _STR:
                    value = value_node.value
                    data[key] = _intern(value) if len(value) <= _INTERNED else value
                elif value_node.__class__ is ScalarNode:
                    data[key] = self.scalar(value_node)
                else:
                    data[key] = self.tree(value_node)
            self.depth -= 1
            return data
        if cls is SequenceNode:
            if node.tag != _SEQ:
                raise _Handover
            self.nodes += len(children)
            if self.nodes > self.max_nodes:
                raise _Handover
            items = [self.tree(n) for n in children]
            self.depth -= 1
            return items
        raise _Handover

    def scalar(self, node: ScalarNode) -> Any:
        tag = node.tag
        if tag == _STR:
            return _intern(node.value) if len(node.value) <= _INTERNED else node.value
        if tag in _TYPED:
            try:
                return yamltypes.tagged(tag, node.value)
            except yamltypes.TypeMismatch:
                raise _Handover from None
        raise _Handover  # merge keys, binary, set, custom tags: the reference loader decides

    def plain(self, node: ScalarNode) -> bool:
        """Whether ``node`` was written plain without a tag (its type is resolved from its text)."""
        return node.style in _PLAIN and self._written_tag(node) is None

    def _written_tag(self, node: ScalarNode) -> str | None:
        """The tag written before the scalar (``!!str ${N}``, ``&a ! ${N}``), if any: no resolving then."""
        text, i = self.text, node.start_mark.index  # libyaml marks count characters, like str indices
        if text.startswith("&", i):  # an anchor comes first: skip it and the blanks after it
            while i < len(text) and text[i] not in " \t\r\n":
                i += 1
            while i < len(text) and text[i] in " \t":
                i += 1
        if not text.startswith("!", i):
            return None
        end = i
        while end < len(text) and text[end] not in " \t\r\n":
            end += 1
        return text[i:end]
