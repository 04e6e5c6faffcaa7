"""Chart versions and Helm's version constraints (the Masterminds semver v3 rules), pure.

Called by ``agent.source.charts`` to pick the version an app's ``[apps.helm] version`` resolves
to in a repository's index, and by the config loader to refuse a constraint Helm would refuse.
No library on PyPI reads constraints as Helm does (comma or space for "and", ``||`` for "or",
``x``/``*`` wildcards, ``~``/``^`` ranges, hyphen ranges, and prereleases only where a
comparison names one), so this module implements those documented rules:

* ``1.2.3`` (or ``=1.2.3``) is that version; ``1.2``, ``1.2.x``, ``1.x`` are ``~`` ranges;
  ``*`` or no constraint at all is any release;
* ``~1.2.3`` is ``>=1.2.3, <1.3.0``; ``~1`` is ``>=1, <2``;
* ``^1.2.3`` is ``>=1.2.3, <2.0.0``; ``^0.2.3`` is ``>=0.2.3, <0.3.0``; ``^0.0.3`` is ``0.0.3``;
* ``1.2 - 1.4.5`` is ``>=1.2, <=1.4.5``; ``<=1.4`` takes every ``1.4.z``;
* a prerelease (``1.3.0-rc.1``) matches a comparison only if that comparison names a
  prerelease itself (``>=1.3.0-0``), as ``helm pull`` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

__all__ = ["Constraint", "Version", "newest", "parse_constraint", "parse_version"]

_PRE = r"[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*"
_VERSION = re.compile(rf"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-({_PRE}))?(?:\+({_PRE}))?\Z")
#: One version of a comparison: each of its three parts a number or a wildcard (x, X, *).
_PART = r"(?:\d+|[xX*])"
_CONSTRAINT_VERSION = rf"v?{_PART}(?:\.{_PART})?(?:\.{_PART})?(?:-{_PRE})?(?:\+{_PRE})?"
_OPS = r"!=|>=|=>|<=|=<|~>|>|<|=|~|\^"
_COMPARISON = re.compile(rf"\s*({_OPS})?\s*({_CONSTRAINT_VERSION})")
_HYPHEN = re.compile(rf"\s*({_CONSTRAINT_VERSION})\s+-\s+({_CONSTRAINT_VERSION})\s*")
_SEPARATOR = re.compile(r"\s*,\s*|\s+")


@dataclass(frozen=True)
class Version:
    """A chart version as written in ``Chart.yaml`` and the index (``v`` prefix and missing
    minor or patch accepted, as Helm accepts them); ordered by semver precedence."""

    major: int
    minor: int
    patch: int
    prerelease: str = ""
    #: As written (``v1.2``), for messages and the index lookup.
    text: str = ""

    def _pre_key(self) -> tuple[tuple[int, int, str], ...]:
        # Numeric identifiers sort before alphanumeric ones and numerically among themselves.
        return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.prerelease.split("."))

    def compare(self, other: Version) -> int:
        """-1, 0 or 1 by semver precedence (build metadata ignored)."""
        a, b = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if a != b:
            return -1 if a < b else 1
        if self.prerelease == other.prerelease:
            return 0
        if not self.prerelease or not other.prerelease:
            return 1 if not self.prerelease else -1  # a release is above its prereleases
        pa, pb = self._pre_key(), other._pre_key()
        return 0 if pa == pb else (-1 if pa < pb else 1)

    def __str__(self) -> str:
        return self.text or f"{self.major}.{self.minor}.{self.patch}" + (
            f"-{self.prerelease}" if self.prerelease else ""
        )


def parse_version(text: str) -> Version:
    """``text`` as a version; ``ValueError`` when it is none."""
    m = _VERSION.match(text.strip())
    if m is None:
        raise ValueError(f"not a semantic version: {text!r}")
    major, minor, patch, pre, _ = m.groups()
    return Version(int(major), int(minor or 0), int(patch or 0), pre or "", text.strip())


class _Wild(IntEnum):
    """How much of a comparison's version is a wildcard (or missing)."""

    NONE = 0
    PATCH = 1  # 1.2.x, 1.2
    MINOR = 2  # 1.x, 1
    MAJOR = 3  # *, x


@dataclass(frozen=True)
class _Comparison:
    op: str
    version: Version
    wild: _Wild

    def allows(self, v: Version) -> bool:
        c, wild = self.version, self.wild
        if v.prerelease and not c.prerelease and not (self.op == "!=" and wild is _Wild.NONE):
            return False  # only a comparison naming a prerelease matches prereleases
        op = {"": "=", "=>": ">=", "=<": "<=", "~>": "~"}.get(self.op, self.op)
        if op == "=":
            return self._tilde(v) if wild else v.compare(c) == 0
        if op == "~":
            return self._tilde(v)
        if op == "^":
            return self._caret(v)
        if op == "<":
            return v.compare(c) < 0
        if op == ">=":
            return v.compare(c) >= 0
        if op == ">":
            return self._greater(v)
        if op == "<=":
            return self._at_most(v)
        return self._not_equal(v)

    def _tilde(self, v: Version) -> bool:
        c = self.version
        if v.compare(c) < 0:
            return False
        if (c.major, c.minor, c.patch) == (0, 0, 0) and self.wild in (_Wild.NONE, _Wild.MAJOR):
            return True  # ~0.0.0 and * are any version
        return v.major == c.major and (v.minor == c.minor or self.wild is _Wild.MINOR)

    def _caret(self, v: Version) -> bool:
        c = self.version
        if v.compare(c) < 0:
            return False
        if c.major > 0 or self.wild is _Wild.MINOR:
            return v.major == c.major
        if v.major > 0:
            return False
        if c.minor > 0 or self.wild is _Wild.PATCH:
            return v.minor == c.minor
        return v.minor == 0 and v.patch == c.patch

    def _greater(self, v: Version) -> bool:
        c = self.version
        if self.wild is _Wild.NONE or self.wild is _Wild.MAJOR:
            return v.compare(c) > 0
        if v.major != c.major:
            return v.major > c.major
        return self.wild is _Wild.PATCH and v.minor > c.minor

    def _at_most(self, v: Version) -> bool:
        c = self.version
        if self.wild is _Wild.NONE:
            return v.compare(c) <= 0
        if v.major != c.major:
            return v.major < c.major
        return v.minor <= c.minor or self.wild is _Wild.MINOR

    def _not_equal(self, v: Version) -> bool:
        c = self.version
        if self.wild in (_Wild.NONE, _Wild.MAJOR):
            return v.compare(c) != 0
        if v.major != c.major:
            return True
        if self.wild is _Wild.MINOR:
            return False
        if v.minor != c.minor:
            return True
        return bool(v.prerelease or c.prerelease) and v.prerelease != c.prerelease


def _comparison(op: str, text: str) -> _Comparison:
    body = text[1:] if text[:1] in "vV" else text
    core, _, _ = body.partition("+")
    core, _, pre = core.partition("-")
    parts = core.split(".") + [""] * (3 - len(core.split(".")))
    wild = next((_Wild(3 - i) for i, p in enumerate(parts) if p in ("", "x", "X", "*")), _Wild.NONE)
    numbers = [int(p) if i < 3 - wild else 0 for i, p in enumerate(parts)]
    return _Comparison(op, Version(numbers[0], numbers[1], numbers[2], prerelease=pre, text=text), wild)


@dataclass(frozen=True)
class Constraint:
    """A parsed constraint: alternatives (``||``), each a conjunction of comparisons."""

    text: str
    alternatives: tuple[tuple[_Comparison, ...], ...]

    def allows(self, version: Version) -> bool:
        return any(all(c.allows(version) for c in group) for group in self.alternatives)

    @property
    def exact(self) -> bool:
        """A pin to one version (``1.2.3``, ``=1.2.3``)."""
        only = self.alternatives[0] if len(self.alternatives) == 1 else ()
        return len(only) == 1 and only[0].op in ("", "=") and only[0].wild is _Wild.NONE

    def __str__(self) -> str:
        return self.text or "*"


def parse_constraint(text: str) -> Constraint:
    """``text`` as Helm reads a ``--version`` (``""``: any release); ``ValueError`` naming the part
    it cannot read."""
    groups: list[tuple[_Comparison, ...]] = []
    for part in (text or "*").split("||"):
        part = _HYPHEN.sub(lambda m: f" >={m.group(1)}, <={m.group(2)} ", part).strip()
        if not part:
            raise ValueError(f"empty alternative in version constraint {text!r}")
        comparisons: list[_Comparison] = []
        pos = 0
        while pos < len(part):
            m = _COMPARISON.match(part, pos)
            if m is None or not m.group(2):
                raise ValueError(f"improper version constraint {text!r} (at {part[pos:]!r})")
            comparisons.append(_comparison(m.group(1) or "", m.group(2)))
            pos = m.end()
            sep = _SEPARATOR.match(part, pos)
            if sep is not None and pos < sep.end() < len(part):
                pos = sep.end()
            elif pos < len(part):
                raise ValueError(f"improper version constraint {text!r} (at {part[pos:]!r})")
        groups.append(tuple(comparisons))
    return Constraint(text.strip(), tuple(groups))


def newest(constraint: Constraint, versions: Iterable[Version]) -> Version | None:
    """The highest of ``versions`` the constraint allows (an exact pin: the one written so)."""
    allowed = [v for v in versions if constraint.allows(v)]
    best: Version | None = None
    for v in allowed:
        if best is None or v.compare(best) > 0:
            best = v
    return best
