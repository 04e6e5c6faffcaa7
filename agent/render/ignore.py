"""Exclusions of the plain-manifest walk of ``agent.render.renderer``, gitignore-like.

A ``.gitops-agent-ignore`` file in any walked directory holds one glob per line (``#``
comments, ``!`` re-includes, a trailing ``/`` matches directories only, a pattern containing
``/`` is anchored to that file's directory, otherwise it matches a name at any depth, ``**``
spans directories); ``RenderSpec.exclude`` takes the same globs, anchored at the root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

IGNORE_FILE = ".gitops-agent-ignore"


@dataclass(frozen=True)
class Rule:
    base: str  # repository-relative directory the rule is anchored at ("" = root)
    regex: re.Pattern[str]
    anchored: bool
    negate: bool
    dir_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        subject = rel if self.anchored else rel.rsplit("/", 1)[-1]
        return self.regex.fullmatch(subject) is not None


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := pattern.find("]", i + 1)) > i:
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


def parse_ignore(text: str, base: str) -> list[Rule]:
    """Rules of one ignore file (or exclude list) anchored at repository-relative ``base``."""
    rules: list[Rule] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        if line:
            rules.append(Rule(base, _glob_regex(line), anchored, negate, dir_only))
    return rules


def ignored(rules: list[Rule], rel: str, is_dir: bool) -> bool:
    verdict = False
    for r in rules:
        if r.matches(rel, is_dir):
            verdict = not r.negate
    return verdict
