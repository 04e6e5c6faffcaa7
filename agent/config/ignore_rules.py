"""``[[ignore]]`` and an app's ``[[apps.ignore]]``: fields of matching objects the agent leaves alone.

Called by ``load`` and ``app_entries``. Everything a rule says is parsed here, when the config is
read, so a bad JSON pointer, path or label selector fails the load with its key path instead of
matching nothing at run time. ``agent.plan.ignore_rules`` resolves the parsed rules against one
object.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from agent.config.tomlreader import TableReader
from agent.model import PART_OF

#: A label key's name part and a label value (``validation.IsQualifiedName``/``IsValidLabelValue``).
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
#: Field paths no rule may cover: the object's identity and its ApplySet membership label
#: (ignored, it would be released and the object could never be pruned nor told apart).
_PROTECTED = (
    ("apiVersion",),
    ("kind",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "labels", PART_OF),
)


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector: ``key`` with ``op`` (``=``, ``!=``, ``in``, ``notin``,
    ``exists``, ``!exists``) over ``values``."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op in ("=", "in"):
            return self.key in labels and labels[self.key] in self.values
        return labels.get(self.key) not in self.values  # "!=", "notin": also true when absent


@dataclass(frozen=True)
class Selector:
    """A label selector as ``kubectl -l`` reads it (``app=web,tier!=db,env in (a,b),!legacy``)."""

    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


#: One step of a ``paths`` entry: ("field", name), ("index", n), ("all", None) or ("match", ((k, v), ...)).
Step = tuple[str, Any]


@dataclass(frozen=True)
class IgnoreRule:
    """Which objects (globs, a label selector over Git's labels) and which of their fields."""

    #: The rule's key path (``ignore[0]``, ``apps[2].ignore[1]``): how reports name it.
    origin: str
    group: str = "*"
    kind: str = "*"
    name: str = "*"
    namespace: str = "*"
    selector: Selector | None = None
    #: RFC 6901 pointers into Git's object (``/spec/replicas``, ``/spec/template/spec/containers/0/image``).
    json_pointers: tuple[str, ...] = ()
    #: Dotted paths as written, and parsed (``spec.template.spec.containers[name=web].image``).
    paths: tuple[str, ...] = ()
    steps: tuple[tuple[Step, ...], ...] = ()
    #: Field manager globs: the declared fields these own in live are left to them.
    managers: tuple[str, ...] = ()

    def applies_to(self, group: str, kind: str, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        return (
            fnmatch.fnmatchcase(group, self.group)
            and fnmatch.fnmatchcase(kind, self.kind)
            and fnmatch.fnmatchcase(namespace, self.namespace)
            and fnmatch.fnmatchcase(name, self.name)
            and (self.selector is None or self.selector.matches(labels))
        )


def ignore_rules(raw: list[Any], path: str, file: str) -> tuple[IgnoreRule, ...]:
    """The entries of the array at ``path``, in order."""
    return tuple(_rule(TableReader(t, f"{path}[{i}]", file)) for i, t in enumerate(raw))


def _rule(r: TableReader) -> IgnoreRule:
    globs = {k: r.get(k, str, "*") for k in ("group", "kind", "name", "namespace")}
    text = r.get("selector", str)
    selector = None
    if text is not None:
        try:
            selector = parse_selector(text)
        except ValueError as e:
            raise r.error("selector", str(e)) from None
    pointers = r.string_list("json_pointers") or ()
    for i, p in enumerate(pointers):
        _check(r, f"json_pointers[{i}]", partial(pointer_fields, p))
    paths = r.string_list("paths") or ()
    steps = tuple(_check(r, f"paths[{i}]", partial(parse_path, p)) for i, p in enumerate(paths))
    managers = r.string_list("managers") or ()
    for i, m in enumerate(managers):
        if not m.strip():
            raise r.error(f"managers[{i}]", "must name a field manager (a glob), got an empty string")
    if not (pointers or paths or managers):
        raise r.error("json_pointers", "a rule must say what to ignore: json_pointers, paths or managers")
    r.finish()
    return IgnoreRule(
        r.path,
        **globs,
        selector=selector,
        json_pointers=pointers,
        paths=paths,
        steps=steps,
        managers=managers,
    )


def _check(r: TableReader, key: str, parse: Callable[[], tuple[Step, ...]]) -> tuple[Step, ...]:
    """``parse()``, its ``ValueError`` as a ``ConfigError`` at ``key``; refuses protected fields."""
    try:
        steps = parse()
    except ValueError as e:
        raise r.error(key, str(e)) from None
    names = tuple(s[1] for s in steps) if all(s[0] == "field" for s in steps) else None
    for protected in _PROTECTED:
        if names is not None and protected[: len(names)] == names:
            raise r.error(
                key,
                f"covers {'.'.join(protected)}: the object's identity and its ApplySet membership "
                "label are never ignored",
            )
    return steps


def pointer_fields(pointer: str) -> tuple[Step, ...]:
    """An RFC 6901 pointer's reference tokens as field steps (a list index is told apart only
    against a document); ``ValueError`` saying what is wrong."""
    if not pointer.startswith("/"):
        raise ValueError(f"must be a JSON pointer starting with '/' (RFC 6901), got {pointer!r}")
    steps: list[Step] = []
    for token in pointer[1:].split("/"):
        if re.search(r"~(?![01])", token):
            raise ValueError(f"'~' must be escaped as '~0' ('/' as '~1') in a JSON pointer, got {pointer!r}")
        steps.append(("field", token.replace("~1", "/").replace("~0", "~")))
    return tuple(steps)


_NAME = re.compile(r'[^.\[\]"]+')
_QUOTED = re.compile(r'\["((?:[^"\\]|\\.)*)"\]')
_BRACKET = re.compile(r"\[([^\]\"]*)\]")


def parse_path(text: str) -> tuple[Step, ...]:
    """``spec.template.spec.containers[name=web].image`` → steps; ``ValueError`` naming the column.

    A field is a name, or ``["a.b/c"]`` (a map key with dots); a list item is ``[0]``,
    ``[name=web]`` (every ``key=value`` of ``[a=1,b=2]`` must hold) or ``[*]`` (every item).
    """
    steps: list[Step] = []
    at = 0
    while at < len(text):
        if m := _QUOTED.match(text, at):
            steps.append(("field", json.loads(f'"{m.group(1)}"')))
        elif m := _BRACKET.match(text, at):
            steps.append(_item_step(m.group(1), text, at))
        elif (m := _NAME.match(text, at)) and (at == 0 or text[at - 1] == "."):
            steps.append(("field", m.group(0)))
        else:
            raise ValueError(f"cannot read the path {text!r} at column {at + 1}")
        at = m.end()
        if at < len(text) and text[at] == ".":
            at += 1
            if at == len(text) or text[at] in ".[":
                raise ValueError(f"a field name must follow '.' in the path {text!r} (column {at + 1})")
    if not steps:
        raise ValueError("must be a dotted field path, got an empty string")
    if steps[0][0] != "field":
        raise ValueError(f"must start with a field name, got {text!r}")
    return tuple(steps)


def _item_step(inside: str, text: str, at: int) -> Step:
    if inside == "*":
        return ("all", None)
    if inside.isdigit():
        return ("index", int(inside))
    pairs: list[tuple[str, str]] = []
    for term in inside.split(","):
        key, eq, value = term.partition("=")
        if not eq or not key.strip():
            raise ValueError(
                f"a list selector is [N], [*] or [key=value,...], got [{inside}] in {text!r}"
                f" (column {at + 1})"
            )
        pairs.append((key.strip(), value.strip()))
    return ("match", tuple(pairs))


_TERM = re.compile(
    r"\s*(?:(?P<not>!)\s*(?P<nkey>[^\s,!=()]+)"
    r"|(?P<key>[^\s,!=()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,!=()]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)\s*(?:,|\Z)"
)


def parse_selector(text: str) -> Selector:
    """A Kubernetes label selector; ``ValueError`` naming the term that is wrong."""
    if not text.strip():
        raise ValueError("an empty selector matches every object: leave selector out instead")
    if text.rstrip().endswith(","):
        raise ValueError(f"a label selector cannot end with ',', got {text!r}")
    requirements: list[Requirement] = []
    at = 0
    while at < len(text):
        m = _TERM.match(text, at)
        if m is None or m.end() == at:
            raise ValueError(f"not a label selector term at column {at + 1} of {text!r}")
        requirements.append(_requirement(m, text))
        at = m.end()
    return Selector(text, tuple(requirements))


def _requirement(m: re.Match[str], text: str) -> Requirement:
    if m.group("not"):
        return Requirement(_label_key(m.group("nkey"), text), "!exists")
    key = _label_key(m.group("key"), text)
    if m.group("op"):
        op = "!=" if m.group("op") == "!=" else "="
        return Requirement(key, op, (_label_value(m.group("value"), text),))
    if m.group("set"):
        values = tuple(_label_value(v.strip(), text) for v in m.group("values").split(","))
        return Requirement(key, "in" if m.group("set") == "in" else "notin", values)
    return Requirement(key, "exists")


def _label_key(key: str, text: str) -> str:
    prefix, slash, name = key.rpartition("/")
    ok = _LABEL_NAME.match(name) and len(name) <= 63
    ok = ok and (not slash or (_DNS_SUBDOMAIN.match(prefix) is not None and len(prefix) <= 253))
    if not ok:
        raise ValueError(f"{key!r} is not a valid label key in the selector {text!r}")
    return key


def _label_value(value: str, text: str) -> str:
    if value and not (_LABEL_NAME.match(value) and len(value) <= 63):
        raise ValueError(f"{value!r} is not a valid label value in the selector {text!r}")
    return value
