"""Parse YAML and JSON manifest text into validated Kubernetes objects, with lines.

Called by ``agent.render`` for plain files and for the output of ``kustomize
build`` and ``helm template``. Nothing here touches the disk or a process: it
takes text and returns objects or ``RenderProblem``s, never a partial answer
disguised as a whole one -- a caller that gets any problem discards the lot.

Stricter than PyYAML's defaults, on purpose, so that what reaches a cluster is
what the author meant:

* scalars are typed as Kubernetes types them (``sigs.k8s.io/yaml``: ``agent.render.yamltypes``),
  so are number and boolean keys (``80:`` is ``"80"``); unquoted dates stay strings;
* duplicate mapping keys are errors (PyYAML keeps the last one silently), a key a merge
  (``<<``) sets and the mapping sets again too, as Kubernetes' strict reading refuses them;
* null and collection keys, ``!!binary``/``!!set``/timestamps-by-tag, custom tags, ``.nan``
  and ``.inf`` are errors: a manifest is JSON, and Kubernetes would disagree about them;
* alias "bombs" and recursive aliases are refused before being expanded;
* ``${VAR}`` is substituted per scalar before its type is resolved, where the app substitutes
  (``variables`` not ``None``; see ``agent.render.substitute``);
* every object needs string ``apiVersion``, ``kind`` and ``metadata.name``;
  ``kind: List`` (and ``*List`` with ``items``) is flattened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from agent.errors import RenderProblem
from agent.model import Manifest, Provenance
from agent.render import fastyaml, yamltypes
from agent.render.substitute import (
    OPT_OUT_VALUE,
    SubstitutionProblem,
    first_of_each,
    opted_out,
    place,
    substitute_tree,
)

#: Expanded node count above which a document is refused (a "billion laughs" alias bomb).
MAX_EXPANDED_NODES = 1_000_000
#: Nesting levels an object may have: the planner's and the diff's walks recurse, and real
#: objects (CRD schemas included) stay well under a hundred.
MAX_DEPTH = 200
#: Lists (``kind: ...List``) that may nest around an object, each two levels (``items``, an item).
MAX_LIST_NESTING = 5
#: Levels the parsers descend (the root is level 1) before refusing a document: room for an object
#: of ``MAX_DEPTH`` levels inside ``MAX_LIST_NESTING`` Lists, and its scalars. They stop here, not
#: at Python's recursion limit: whatever runs meanwhile needs stack too, and a cycle collection
#: there once ran finalisers with three frames to spare, which failed. At 2-3 frames a level
#: this leaves a few hundred of the limit's 1,000.
MAX_PARSE_DEPTH = MAX_DEPTH + 2 * MAX_LIST_NESTING + 2
_NAME_FORBIDDEN = ("/", "%")


@dataclass(frozen=True)
class Origin:
    """Maps line numbers of a parsed text back to what the user can open.

    For a plain file this is the identity. For tool output (``label`` such as
    ``apps/prod (kustomize build output)``) ``sections`` lists ``(first_line,
    source_file)`` pairs, e.g. Helm's ``# Source:`` comments: a line inside a
    section is reported relative to that section, under the source's name.
    """

    file: str
    label: str = ""
    sections: tuple[tuple[int, str], ...] = ()
    provenance_lines: bool = True

    def locate(self, line: int | None) -> tuple[str, int | None]:
        """(file for an error message, line in it) for a 1-based ``line`` of the text."""
        if line is None:
            return self.label or self.file, None
        best: tuple[int, str] | None = None
        for start, source in self.sections:
            if start <= line:
                best = (start, source)
        if best is not None:
            return f"{best[1]} (rendered)", line - best[0]
        return self.label or self.file, line

    def provenance(self, document: int, line: int | None) -> Provenance:
        file = self.file
        for start, source in self.sections:
            if line is not None and start <= line:
                file = source
        return Provenance(file, document, line if self.provenance_lines else None)

    def problem(self, message: str, line: int | None = None, column: int | None = None) -> RenderProblem:
        file, at = self.locate(line)
        return RenderProblem(file, message, at, column if at is not None else None)


@dataclass
class Document:
    """One parsed document: its value, index in the stream and first line (1-based)."""

    value: Any
    index: int
    line: int | None
    #: ``id(dict) -> line`` for every mapping in ``value``, so List items keep their lines.
    lines: dict[int, int] = field(default_factory=dict)
    #: ``value`` is JSON as krender printed it (``agent.render.tooljson``): JSON values only, at most
    #: 100 levels deep, so ``validate`` need not look at every value again.
    json: bool = False


# ---------------------------------------------------------------------------
# YAML


_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"


class TooDeep(yaml.MarkedYAMLError):
    """A document nests deeper than ``MAX_PARSE_DEPTH``; ``mark`` is where (0-based line, column)."""

    def __init__(self, mark: yaml.Mark) -> None:
        super().__init__(problem=_TOO_DEEP, problem_mark=mark)
        self.mark = mark


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that raises ``TooDeep`` past ``MAX_PARSE_DEPTH`` levels (see there).

    For every YAML the agent reads from Git: ``yaml.load(text, BoundedLoader)`` is ``safe_load``.
    """

    depth = 0  # of the node being composed

    # The composer calls these around every node it composes. Counting here rather than in an
    # override of the recursive ``compose_node`` adds no frame a level: one made large files
    # parse ~30% slower (argo-cd's install.yaml, 2 MB: 1.9 s -> 2.5 s).
    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        self.depth += 1
        if self.depth > MAX_PARSE_DEPTH:
            parser: Any = self  # PyYAML's parser methods are untyped
            raise TooDeep(parser.peek_event().start_mark)
        super().descend_resolver(current_node, current_index)

    def ascend_resolver(self) -> None:
        self.depth -= 1
        super().ascend_resolver()


class _Loader(yamltypes.Resolver, BoundedLoader):
    """SafeLoader with Kubernetes' scalar types and keys, strict keys, and collected problems."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        # (message, line, column, line of an earlier definition), 1-based
        self.problems: list[tuple[str, int, int, int | None]] = []
        self.lines: dict[int, int] = {}
        #: ids of the scalars written plain without a tag, that hold a "$" (substitution retypes them).
        self.plain: set[int] = set()

    def compose_scalar_node(self, anchor: Any) -> Any:
        parser: Any = self  # PyYAML's parser methods are untyped
        event = parser.peek_event()
        if event.tag == "!":  # go-yaml reads "! 1" as the string "1" (PyYAML: the int 1)
            event.tag = yamltypes.STR
        plain = event.tag is None and event.implicit[0] and "$" in event.value
        node = super().compose_scalar_node(anchor)
        if plain:
            self.plain.add(id(node))
        return node

    def flatten_mapping(self, node: MappingNode) -> None:
        """Merged keys first, each merge's in full (PyYAML drops repeats): a repeat is a duplicate."""
        merged: list[tuple[Node, Node]] = []
        own: list[tuple[Node, Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != yamltypes.MERGE:
                own.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            for source in sources:
                if not isinstance(source, MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"expected a mapping or list of mappings for merging, but found {source.id}",
                        source.start_mark,
                    )
                self.flatten_mapping(source)
                merged.extend(source.value)
        if merged or len(own) != len(node.value):
            node.value = merged + own

    def construct_yaml_map(self, node: MappingNode) -> Any:
        data: dict[Any, Any] = {}
        self.lines[id(data)] = node.start_mark.line + 1
        yield data
        data.update(self.construct_mapping(node))

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)  # merged keys first, then the mapping's own: all must differ
        data: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
            name = yamltypes.json_key(key, key_node.tag, key_node.value)
            if name is None:
                what = "null" if key is None else repr(key)
                message = f"mapping key {what} is not a string, number or boolean (quote it)"
                self.problems.append((message, line, column, None))
                continue
            if name in seen:
                message = f"duplicate mapping key {name!r} (YAML would keep only one)"
                self.problems.append((message, line, column, seen[name]))
                continue
            seen[name] = line
            data[name] = self.construct_object(value_node, deep=deep)
        return data

    def construct_typed(self, node: Node) -> Any:
        """A scalar of a standard tag (``!!int "1"``, or a plain one resolved so), or a problem."""
        mark = node.start_mark
        if not isinstance(node, yaml.ScalarNode):
            what = "mapping" if isinstance(node, MappingNode) else "sequence"
            self.problems.append(
                (f"a {what} cannot have the tag {node.tag!r}", mark.line + 1, mark.column + 1, None)
            )
            return None
        if node.tag == yamltypes.MERGE:
            return node.value  # "<<" where it is not a key is a string (go-yaml)
        try:
            return yamltypes.tagged(node.tag, node.value)
        except yamltypes.TypeMismatch as e:
            self.problems.append((f"{e} (tag {node.tag!r})", mark.line + 1, mark.column + 1, None))
            return None

    def construct_undefined(self, node: Node) -> Any:
        mark = node.start_mark
        self.problems.append((f"unsupported YAML tag {node.tag!r}", mark.line + 1, mark.column + 1, None))
        return None


_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_yaml_map)
for _tag in (yamltypes.INT, yamltypes.FLOAT, yamltypes.BOOL, yamltypes.NULL, yamltypes.MERGE):
    _Loader.add_constructor(_tag, _Loader.construct_typed)
_Loader.add_constructor(None, _Loader.construct_undefined)
for _tag in ("binary", "set", "omap", "pairs", "timestamp", "value"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _Loader.construct_undefined)


def _expanded_size(root: Node) -> str | None:
    """Refuse alias bombs and recursive aliases by sizing the node graph as it would be expanded."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _Recursive
        active.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(size(n) for n in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = min(total, MAX_EXPANDED_NODES + 1)
        return sizes[key]

    try:
        if size(root) > MAX_EXPANDED_NODES:
            return f"document expands to more than {MAX_EXPANDED_NODES} nodes through aliases (alias bomb?)"
    except _Recursive:
        return "recursive YAML alias (a node contains itself)"
    except RecursionError:
        return "document is nested too deeply"
    return None


class _Recursive(Exception):
    pass


def parse_yaml(
    text: str, origin: Origin, variables: Mapping[str, str] | None
) -> tuple[list[Document], list[RenderProblem]]:
    """Every document of a YAML stream, or the problems that make the stream unusable.

    libyaml parses ordinary streams (``agent.render.fastyaml``, ~6x faster); any stream it hands back --
    one with a problem to report, aliases, merge keys or unusual tags -- is parsed again by the
    pure-Python loader below, the reference for every message, line and column.
    """
    fast = fastyaml.load(text, variables, max_nodes=MAX_EXPANDED_NODES, max_depth=MAX_PARSE_DEPTH)
    if fast is not None:
        return [Document(value, index, line, lines) for value, index, line, lines in fast], []
    return _parse_yaml_python(text, origin, variables)


def _parse_yaml_python(
    text: str, origin: Origin, variables: Mapping[str, str] | None
) -> tuple[list[Document], list[RenderProblem]]:
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as e:
        prefix = text[: e.position]
        line, column = prefix.count("\n") + 1, e.position - (prefix.rfind("\n") + 1) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        message = f"YAML syntax error: control character U+{code:04X} is not allowed in YAML text"
        return [], [origin.problem(message, line, column)]
    docs: list[Document] = []
    problems: list[RenderProblem] = []
    unsubstituted: list[tuple[SubstitutionProblem, Node]] = []
    index = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            assert node is not None  # check_node() said a document follows
            start = node.start_mark.line + 1
            if (bad := _expanded_size(node)) is not None:
                problems.append(origin.problem(bad, start))
                index += 1
                continue
            before = len(loader.problems), len(unsubstituted)
            if variables is not None and "${" in text:
                skip = opted_out(node) if OPT_OUT_VALUE in text else set()
                unsubstituted += substitute_tree(node, variables, lambda n: id(n) in loader.plain, skip)
            loader.lines = {}
            value = loader.construct_document(node)
            if (len(loader.problems), len(unsubstituted)) == before:
                docs.append(Document(value, index, start, loader.lines))
            index += 1
    except TooDeep as e:
        mark = e.mark
        problems.append(origin.problem(f"document is {_TOO_DEEP}", mark.line + 1, mark.column + 1))
    except yaml.MarkedYAMLError as e:
        problems.append(_syntax_problem(e, origin))
    except yaml.YAMLError as e:
        problems.append(origin.problem(f"YAML error: {e}"))
    except RecursionError:
        problems.append(origin.problem("document is nested too deeply"))
    finally:
        loader.dispose()
    found = []
    for message, line, column, first in loader.problems:
        if first is not None:
            message += f" (first at line {origin.locate(first)[1]})"
        found.append(origin.problem(message, line, column))
    for problem, node in first_of_each(unsubstituted):  # one per name and file, not per use
        found.append(origin.problem(problem.message, *place(text, node, problem)))
    found.sort(key=lambda p: (p.line or 0, p.column or 0))
    problems[:0] = found
    return docs, problems


def _syntax_problem(e: yaml.MarkedYAMLError, origin: Origin) -> RenderProblem:
    mark = e.problem_mark or e.context_mark
    problem = e.problem or "invalid YAML"
    if "'\\t'" in problem:
        problem = "tab character where YAML expects indentation or a token (indent with spaces)"
    message = f"YAML syntax error: {problem}"
    if e.context:
        message += f" ({e.context}"
        if e.context_mark is not None and e.context_mark is not mark:
            message += f" at line {e.context_mark.line + 1}"
        message += ")"
    if mark is None:
        return origin.problem(message)
    return origin.problem(message, mark.line + 1, mark.column + 1)


# ---------------------------------------------------------------------------
# Objects


def objects_of(
    docs: list[Document], origin: Origin
) -> tuple[list[tuple[Manifest, Provenance]], list[RenderProblem]]:
    """Validated objects of parsed documents: empty documents dropped, Lists flattened."""
    found: list[tuple[Manifest, Provenance]] = []
    problems: list[RenderProblem] = []
    for doc in docs:
        _collect(doc.value, doc, doc.line, origin, found, problems, depth=0)
    return found, problems


def _collect(
    value: Any,
    doc: Document,
    line: int | None,
    origin: Origin,
    found: list[tuple[Manifest, Provenance]],
    problems: list[RenderProblem],
    *,
    depth: int,
) -> None:
    if value is None and depth == 0:
        return  # an empty document
    if not isinstance(value, dict):
        what = "a list" if isinstance(value, list) else f"a {type(value).__name__} ({_short(value)})"
        problems.append(
            origin.problem(f"document {doc.index} is {what}, not a mapping (a Kubernetes object)", line)
        )
        return
    kind = value.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in value:
        items = value["items"]
        if items is None:
            return
        if not isinstance(items, list):
            problems.append(origin.problem(f"{kind}.items must be a list, got {type(items).__name__}", line))
            return
        if depth >= MAX_LIST_NESTING:
            problems.append(origin.problem(f"{kind} nested too deeply", line))
            return
        for i, item in enumerate(items):
            item_line = doc.lines.get(id(item), line) if isinstance(item, dict) else line
            if item is None:
                problems.append(origin.problem(f"{kind}.items[{i}] is empty", line))
                continue
            _collect(item, doc, item_line, origin, found, problems, depth=depth + 1)
        return
    errors = validate(value, json_values=doc.json)
    if errors:
        problems.extend(origin.problem(e, line) for e in errors)
        return
    found.append((value, origin.provenance(doc.index, line)))


def validate(obj: dict[str, Any], *, json_values: bool = False) -> list[str]:
    """Problems that keep ``obj`` from being a Kubernetes object we can apply.

    ``json_values``: ``obj`` came from JSON within ``MAX_DEPTH`` levels (its values are not checked)."""
    errors: list[str] = []
    where = _describe(obj)
    for key in ("apiVersion", "kind"):
        v = obj.get(key)
        if key not in obj or v is None:
            errors.append(f"{where}: {key} is missing")
        elif not isinstance(v, str):
            errors.append(f"{where}: {key} must be a string, got {type(v).__name__} {_short(v)}")
        elif not v.strip():
            errors.append(f"{where}: {key} is empty")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        errors.append(
            f"{where}: metadata is missing" if meta is None else f"{where}: metadata must be a mapping"
        )
    else:
        for key in ("name", "namespace"):
            v = meta.get(key)
            if v is None:
                if key == "name" and _generated_hook(meta):
                    continue  # created with a POST when its hook runs (docs/ordering.md)
                if key == "name":
                    hint = (
                        " (generateName is not supported: objects need a stable name)"
                        if "generateName" in meta
                        else ""
                    )
                    errors.append(f"{where}: metadata.name is missing{hint}")
                continue
            if not isinstance(v, str):
                errors.append(f"{where}: metadata.{key} must be a string, got {type(v).__name__} {_short(v)}")
            elif not v or v in (".", "..") or any(c in v for c in _NAME_FORBIDDEN):
                errors.append(f"{where}: metadata.{key} {v!r} is not a valid object name")
        # The agent adds its membership label and reads its annotations before any request: a
        # shape the server would refuse anyway must not reach that code (found by fuzzing).
        errors.extend(
            _string_map(meta.get(key), f"{where}: metadata.{key}") for key in ("labels", "annotations")
        )
    if obj.get("kind") == "Secret" and obj.get("apiVersion") == "v1":
        errors.extend(_string_map(obj.get(key), f"{where}: {key}") for key in ("data", "stringData"))
    bad = None if json_values else _non_json(obj, "")
    if bad:
        errors.append(f"{where}: {bad}")
    return [e for e in errors if e]


def _string_map(value: Any, what: str) -> str:
    """Why ``value`` is not a mapping of strings (labels, annotations, a Secret's data), or ``""``.

    Absent, null and null values are left to the server, which takes them as empty.
    """
    if value is None:
        return ""
    if not isinstance(value, dict):
        return f"{what} must be a mapping of strings, got {type(value).__name__} {_short(value)}"
    for key, item in value.items():
        if item is not None and not isinstance(item, str):
            return f"{what}.{key} must be a string, got {type(item).__name__} {_short(item)} (quote it)"
    return ""


def _non_json(value: Any, path: str) -> str | None:
    """The first value that JSON (and so Kubernetes) cannot carry, if any, or the first nested
    more than ``MAX_DEPTH`` levels deep."""
    if _plain_json(value):
        return None
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        v, p, depth = stack.pop()
        if depth > MAX_DEPTH and isinstance(v, dict | list):
            return f"{p[:80]}...: nested more than {MAX_DEPTH} levels deep"
        if isinstance(v, dict):
            stack.extend((item, f"{p}.{k}" if p else str(k), depth + 1) for k, item in v.items())
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]", depth + 1) for i, item in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            return f"{p}: {v} is not a JSON number"
        elif v is not None and not isinstance(v, (str, int, float, bool)):
            return f"{p}: a {type(v).__name__} is not a JSON value"
    return None


def _plain_json(value: Any) -> bool:
    """Whether ``value`` holds only JSON values, at most ``MAX_DEPTH`` levels deep: ``_non_json``'s
    usual answer, found level by level without the path of every value (a sixth of a chart's
    render after helm's run, for cert-manager's CRDs). ``False`` where in doubt: ``_non_json`` decides."""
    level = [value]
    for _ in range(MAX_DEPTH + 1):
        below: list[Any] = []
        for v in level:
            t = type(v)
            if t is dict:
                below.extend(v.values())
            elif t is list:
                below.extend(v)
            elif t is float:
                if not math.isfinite(v):
                    return False
            elif not (t is str or t is int or t is bool or v is None):
                return False
        if not below:
            return True
        level = below
    return False


def _describe(obj: dict[str, Any]) -> str:
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "object"
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{kind}/{name}" if isinstance(name, str) and name else f"{kind} (unnamed)"


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def decode_bytes(data: bytes, origin: Origin) -> tuple[str | None, RenderProblem | None]:
    """UTF-8 text of a file, refusing binary content with where it starts."""
    if b"\x00" in data:
        offset = data.index(b"\x00")
        line = data.count(b"\n", 0, offset) + 1
        return None, origin.problem("binary content (NUL byte): not a text manifest", line)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        return None, origin.problem(f"not UTF-8 text (byte 0x{data[e.start]:02x})", line, column)
    return text.removeprefix("\ufeff"), None


def _generated_hook(meta: dict[str, Any]) -> bool:
    """An Argo CD or Helm hook named by ``generateName``: the server names each run of it."""
    annotations = meta.get("annotations")
    generate = meta.get("generateName")
    return (
        isinstance(annotations, dict)
        and any(isinstance(annotations.get(a), str) for a in ("argocd.argoproj.io/hook", "helm.sh/hook"))
        and isinstance(generate, str)
        and bool(generate)
        and not any(c in generate for c in _NAME_FORBIDDEN)
    )
