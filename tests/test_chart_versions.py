"""Helm's version constraints (Masterminds semver v3), as documented, table by table."""

from __future__ import annotations

import itertools

import pytest

from agent.config.chart_versions import newest, parse_constraint, parse_version

# (constraint, versions it allows, versions it refuses): the examples of Masterminds' README and
# Helm's `--version` documentation.
TABLE = [
    ("1.2.3", ["1.2.3", "v1.2.3", "1.2.3+build.5"], ["1.2.4", "1.2.2", "1.2.3-rc.1"]),
    ("=1.2.3", ["1.2.3"], ["1.2.4"]),
    ("!=4.1", ["4.0.9", "4.2.0", "5.1.0"], ["4.1.0", "4.1.7"]),
    ("1.2.x", ["1.2.0", "1.2.99"], ["1.3.0", "1.1.9", "1.2.5-beta"]),
    ("1.2", ["1.2.0", "1.2.7"], ["1.3.0"]),
    ("1.x", ["1.0.0", "1.9.9"], ["2.0.0", "0.9.0"]),
    ("*", ["0.0.1", "1.0.0", "99.1.2"], ["1.0.0-alpha"]),
    ("", ["0.0.1", "3.2.1"], ["3.3.0-rc.1"]),
    ("~1.2.3", ["1.2.3", "1.2.9"], ["1.3.0", "1.2.2"]),
    ("~1", ["1.0.0", "1.9.0"], ["2.0.0"]),
    ("~2.3", ["2.3.0", "2.3.5"], ["2.4.0", "2.2.9"]),
    ("~1.x", ["1.0.0", "1.7.1"], ["2.0.0"]),
    ("~>1.2", ["1.2.0", "1.2.4"], ["1.3.0"]),
    ("^1.2.3", ["1.2.3", "1.9.0"], ["2.0.0", "1.2.2"]),
    ("^1.2", ["1.2.0", "1.99.0"], ["2.0.0", "1.1.0"]),
    ("^1.2.x", ["1.2.0", "1.5.0"], ["2.0.0"]),
    ("^2.x", ["2.0.0", "2.8.1"], ["3.0.0", "1.9.0"]),
    ("^0.2.3", ["0.2.3", "0.2.9"], ["0.3.0", "0.2.2", "1.0.0"]),
    ("^0.2", ["0.2.0", "0.2.9"], ["0.3.0"]),
    ("^0.0.3", ["0.0.3"], ["0.0.4", "0.1.0"]),
    ("^0.0", ["0.0.0", "0.0.9"], ["0.1.0"]),
    ("^0", ["0.0.0", "0.9.9"], ["1.0.0"]),
    (">=1.2, <2", ["1.2.0", "1.9.9"], ["2.0.0", "1.1.9", "2.0.0-rc.1"]),
    (">= 1.2 < 2", ["1.5.0"], ["2.1.0"]),
    (">=1.2 <2", ["1.5.0"], ["2.1.0"]),
    (">1.2", ["1.3.0"], ["1.2.9", "1.2.0"]),
    (">1", ["2.0.0"], ["1.5.0"]),
    (">1.2.3", ["1.2.4"], ["1.2.3"]),
    ("<1.2", ["1.1.9"], ["1.2.0"]),
    ("<=1.4", ["1.4.9", "1.0.0"], ["1.5.0"]),
    ("<=2.x", ["2.9.0", "1.0.0"], ["3.0.0"]),
    ("<=1.4.5", ["1.4.5"], ["1.4.6"]),
    ("1.2 - 1.4.5", ["1.2.0", "1.4.5"], ["1.4.6", "1.1.9"]),
    ("2.3.4 - 4.5", ["2.3.4", "4.5.9"], ["4.6.0", "2.3.3"]),
    ("1.2.3 || 2.x", ["1.2.3", "2.5.0"], ["1.2.4", "3.0.0"]),
    ("^1.0 || ^3.0", ["1.1.0", "3.4.0"], ["2.0.0"]),
    # Prereleases only where a comparison names one.
    (">=1.2.3-0", ["1.2.3-alpha", "1.3.0-rc.1", "2.0.0"], ["1.2.2"]),
    ("1.3.0-rc.1", ["1.3.0-rc.1"], ["1.3.0-rc.2", "1.3.0"]),
    ("~1.3.0-beta", ["1.3.0-beta", "1.3.0-beta.2", "1.3.5"], ["1.4.0-beta"]),
]


@pytest.mark.parametrize(("constraint", "allowed", "refused"), TABLE, ids=[t[0] or "empty" for t in TABLE])
def test_a_constraint_allows_what_helm_allows(
    constraint: str, allowed: list[str], refused: list[str]
) -> None:
    c = parse_constraint(constraint)
    assert [v for v in allowed if not c.allows(parse_version(v))] == []
    assert [v for v in refused if c.allows(parse_version(v))] == []


@pytest.mark.parametrize("text", [">=", "1.2.3.4", "one", "1.2 ||", ">1 garbage", "^^1", "1.2,"])
def test_a_constraint_helm_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="constraint"):
        parse_constraint(text)


def test_versions_order_by_semver_precedence() -> None:
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2"]
    ordered += ["1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0"]
    versions = [parse_version(v) for v in ordered]
    for a, b in itertools.pairwise(versions):
        assert a.compare(b) == -1 and b.compare(a) == 1
    assert parse_version("1.0.0+a").compare(parse_version("1.0.0+b")) == 0


def test_newest_picks_the_highest_allowed_release() -> None:
    versions = [parse_version(v) for v in ["1.2.0", "1.2.5", "1.3.0", "1.2.9-rc.1", "2.0.0"]]
    assert str(newest(parse_constraint("1.2.x"), versions)) == "1.2.5"
    assert str(newest(parse_constraint(""), versions)) == "2.0.0"
    assert str(newest(parse_constraint(">=1.2.9-0, <2"), versions)) == "1.3.0"
    assert newest(parse_constraint("3.x"), versions) is None
    assert parse_constraint("1.2.3").exact and not parse_constraint("1.2.x").exact


def test_a_malformed_version_is_refused() -> None:
    with pytest.raises(ValueError, match="not a semantic version"):
        parse_version("latest")
