"""Generated config files: each wrong one is a ``ConfigError`` naming the file and the key path, never
another exception (docs/reliability.md, "Fuzzing").

Valid TOML that is wrong comes from one mutation of a complete, valid config (every table the
agent reads, two clusters, apps with dependencies, sources, conflict rules, a health check, sinks
and hooks): a value of the wrong type, out of range or huge, an unknown key, a bad enum or
duration, a duplicate or unicode name, a dependency cycle, a missing or misshapen section.
Invalid TOML comes from random edits of the same file's text and from bytes that are not UTF-8.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent.config.load import load_config
from agent.config.types import Config
from agent.errors import ConfigError
from tests.fuzzkit import bounded, fuzz_settings

EXAMPLES = 300
SECONDS = 10.0
PEAK = 64 << 20


def base_config(d: Path) -> dict[str, Any]:
    """A valid config using every table the loader reads; its files exist under ``d``."""
    for name in ("kc-a", "kc-b", "hook", "hmac"):
        (d / name).write_text("secret\n" if name in ("hook", "hmac") else "apiVersion: v1\nkind: Config\n")
    return {
        "agent": {"name": "fuzz-agent", "cache_dir": str(d / "cache"), "listen": "127.0.0.1:8080"},
        "source": {"url": str(d / "repo.git"), "branch": "main", "poll_interval": "1m"},
        "sources": [{"name": "shop", "url": "https://git.example.com/shop.git", "tag": "v1"}],
        "defaults": {
            "prune": True,
            "max_prune_fraction": 0.5,
            "reconcile_interval": "5m",
            "adopt": "if-unowned",
        },
        "clusters": [
            {"name": "a", "kubeconfig": str(d / "kc-a"), "path": "clusters/a", "vars": {"REGION": "eu"}},
            {"name": "b", "kubeconfig": str(d / "kc-b"), "paths": ["clusters/b"], "prune": False},
        ],
        "apps": [
            {"name": "infra", "clusters": ["a", "b"], "path": "infra"},
            {"name": "web", "clusters": ["a", "b"], "path": "web", "source": "shop", "depends_on": ["infra"]},
        ],
        "conflict_rules": [
            {"manager": "kubectl", "action": "force"},
            {"manager": "*", "subresource": "scale", "action": "yield"},
        ],
        "health_checks": [
            {"api_version": "example.com/v1", "kind": "Widget", "current": "status.ready == true"}
        ],
        "alerts": {"after_failures": 3, "remind": ["5m", "30m"]},
        "notifications": [
            {
                "name": "ops",
                "kind": "webhook",
                "url": "https://alerts.example.com/x",
                "secret_file": str(d / "hmac"),
            }
        ],
        "receiver": {"listen": "127.0.0.1:9090", "max_body_bytes": 4096},
        "receivers": [{"name": "github", "kind": "github", "secret_file": str(d / "hook")}],
    }


# -- a small TOML writer (inline tables throughout: valid TOML for any nesting) ---------------------


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, datetime.datetime | datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_string(s: str) -> str:
    """A TOML basic string: JSON's escapes, without surrogate pairs, and DEL escaped too."""
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def to_toml(data: dict[str, Any]) -> str:
    return "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in data.items())


# -- mutations --------------------------------------------------------------------------------------


def leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of ``value`` (tables, arrays and scalars alike), root excluded."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        out.append((*path, k))
        out.extend(leaves(v, (*path, k)))
    return out


def put(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = data
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def parent(data: dict[str, Any], path: tuple[Any, ...]) -> Any:
    node: Any = data
    for k in path[:-1]:
        node = node[k]
    return node


odd_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        [
            "",
            " ",
            "-5s",
            "0s",
            "1e9h",
            "99999999999999999999999999d",
            "5",
            "5 m",
            "1h-",
            "ms",
            "∞",
            "*",
            "..",
            "a/b",
            "x" * 5000,
        ]
    ),
    st.sampled_from(
        [
            "maybe",
            "FORCE",
            "Yield",
            "if_unowned",
            "debug!",
            "json5",
            "orphan",
            "v1.99",
            "1.2.3.4:99999",
            ":0",
            "[::1]:80",
        ]
    ),
    st.sampled_from(
        [datetime.datetime(2026, 12, 3, 12, 0), datetime.date(2026, 12, 3), datetime.time(12, 0)]
    ),
    st.lists(st.integers(), max_size=3),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
)
unicode_names = st.sampled_from(
    ["prød", "ü", "名前", "a\u200bb", "A", "a_b", "-a", "a-", "x" * 64, "ﬁ", "\u0430pp"]
)


@st.composite
def mutated(draw: st.DrawFn, d: Path) -> tuple[str, dict[str, Any], bool]:
    """(what was done, the config data, whether it must be refused)."""
    data = base_config(d)
    kind = draw(
        st.sampled_from(
            [
                "replace",
                "replace",
                "replace",
                "unknown key",
                "drop",
                "duplicate name",
                "cycle",
                "unicode name",
                "self dependency",
                "empty list",
            ]
        )
    )
    if kind == "replace":
        path = draw(st.sampled_from(leaves(data)))
        put(data, path, draw(odd_values))
        return f"replace {path}", data, False
    if kind == "unknown key":
        # Every table but ``vars`` (free-form: its keys are the variables' names).
        tables = [(), *(p for p in leaves(data) if isinstance(_get(data, p), dict) and p[-1] != "vars")]
        path = draw(st.sampled_from(tables))
        table = _get(data, path)
        key = draw(st.sampled_from(["nmae", "prnue", "extra", "Name", "clusters", "üñí", ""]))
        if key in table:
            key += "-x"
        table[key] = draw(odd_values)
        return f"unknown key {key!r} in {path}", data, True
    if kind == "drop":
        path = draw(st.sampled_from(leaves(data)))
        container = parent(data, path)
        del container[path[-1]]
        return f"drop {path}", data, False
    if kind == "duplicate name":
        table = draw(st.sampled_from(["clusters", "apps", "sources", "notifications", "receivers"]))
        data[table].append(copy.deepcopy(data[table][0]))
        return f"duplicate {table}[0]", data, True
    if kind == "cycle":
        data["apps"][0]["depends_on"] = ["web"]
        return "cycle infra -> web -> infra", data, True
    if kind == "self dependency":
        data["apps"][1]["depends_on"] = ["web"]
        return "web depends on itself", data, True
    if kind == "empty list":
        table = draw(st.sampled_from(["clusters", "sources", "receivers", "apps"]))
        data[table] = []
        return f"empty {table}", data, table == "clusters"
    table = draw(st.sampled_from(["clusters", "apps", "sources", "notifications", "receivers"]))
    data[table][0]["name"] = draw(unicode_names)
    return f"unicode name in {table}[0]", data, True


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        data = data[k]
    return data


# -- the tests ----------------------------------------------------------------------------------------


def _warm(d: Path) -> None:
    """Load the valid config once before Hypothesis runs: its health check's CEL environment raises
    the recursion limit (cel-python does, on every use), which Hypothesis warns of inside a test."""
    (d / "warm.toml").write_text(to_toml(base_config(d)))
    load_config(d / "warm.toml")


def _load(path: Path, what: str) -> Config | ConfigError:
    with bounded(what, seconds=SECONDS, peak_bytes=PEAK):
        try:
            return load_config(path)
        except ConfigError as e:
            assert e.file == str(path), f"{what}: the error names {e.file!r}, not the file: {e}"
            assert str(e).startswith(f"{path}: "), str(e)
            return e


def test_a_base_config_for_the_fuzzer_is_valid(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(to_toml(base_config(tmp_path)))
    cfg = load_config(tmp_path / "c.toml")
    assert [c.name for c in cfg.clusters] == ["a", "b"] and len(
        cfg.apps
    ) == 6  # 2 implicit, infra and web on each


def test_every_wrong_but_valid_toml_config_is_a_config_error_naming_file_and_key_path() -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz-config-") as tmp:
        d = Path(tmp)
        _warm(d)
        seen: list[str] = []

        @fuzz_settings(EXAMPLES)
        @given(mutated(d))
        def one(case: tuple[str, dict[str, Any], bool]) -> None:
            what, data, must_fail = case
            seen.append(what)
            path = d / "config.toml"
            path.write_text(to_toml(data))
            got = _load(path, what)
            if isinstance(got, ConfigError):
                assert got.path, f"{what}: a mistake inside valid TOML must name its key path: {got}"
                assert got.message.strip() and "Traceback" not in got.message, got
            else:
                assert not must_fail, f"{what}: loaded, but must be refused"

        one()
        assert len(seen) >= EXAMPLES


@st.composite
def broken_toml(draw: st.DrawFn, text: str) -> bytes:
    """The valid file's text with random edits, or bytes that are not UTF-8 spliced in."""
    raw = text.encode()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(raw)))
        piece = draw(
            st.one_of(
                st.sampled_from(
                    [
                        b"=",
                        b"[",
                        b"]",
                        b"{",
                        b"}",
                        b'"',
                        b"'",
                        b"\n",
                        b"#",
                        b",",
                        b"[[",
                        b"\\",
                        b"\x00",
                        b"\xff",
                        b"\xc3\x28",
                        b"\xed\xa0\x80",
                        b"\t",
                    ]
                ),
                st.binary(max_size=6),
            )
        )
        insert = draw(st.booleans())
        raw = raw[:at] + piece + raw[at:] if insert else raw[:at] + raw[at + len(piece) :]
    return raw


def test_invalid_toml_and_bytes_that_are_not_utf8_are_a_config_error_naming_the_file() -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz-config-") as tmp:
        d = Path(tmp)
        _warm(d)
        text = to_toml(base_config(d))

        @fuzz_settings(EXAMPLES // 2)
        @given(broken_toml(text))
        def one(raw: bytes) -> None:
            path = d / "config.toml"
            path.write_bytes(raw)
            _load(path, f"bytes {raw[:80]!r}")

        one()


def test_an_unknown_key_that_toml_must_quote_is_named_quoted_in_the_error(tmp_path: Path) -> None:
    """Found by the fuzzer: ``"" = 1`` was reported as ``config.toml: unknown key``, naming no key."""
    data = base_config(tmp_path)
    for key, path in (("", '""'), ("a.b", '"a.b"'), ("é", '"é"')):
        data[key] = 1
        (tmp_path / "c.toml").write_text(to_toml(data))
        got = _load(tmp_path / "c.toml", key)
        assert isinstance(got, ConfigError) and got.path == path, got
        del data[key]
    data["agent"][""] = 1
    (tmp_path / "c.toml").write_text(to_toml(data))
    got = _load(tmp_path / "c.toml", "agent")
    assert isinstance(got, ConfigError) and got.path == 'agent.""', got


def test_arrays_or_inline_tables_nested_thousands_deep_are_a_config_error_naming_line_and_column(
    tmp_path: Path,
) -> None:
    """Found by trial, not by the fuzzer: ``a = [[[...`` 5,000 deep crashed every command with
    tomllib's RecursionError (a traceback, no file, no place) and made a config reload raise."""
    path = tmp_path / "c.toml"
    for opener in ("[", "{b = "):
        column = len("a = ") + 32 * len(opener) + 1  # the 33rd opener
        path.write_text('# "[[[" in a comment, and in strings:\nx = "[[[" \na = ' + opener * 5_000 + "\n")
        got = _load(path, opener)
        assert isinstance(got, ConfigError) and got.file == str(path), got
        too_deep = "invalid TOML: arrays or inline tables nested more than 32 levels deep"
        assert got.message == f"{too_deep} (at line 3, column {column})"
    # As deep as allowed, brackets in strings not counted: tomllib parses it, validation goes on.
    path.write_text("x = '''[[[[''' \na = " + "[" * 32 + "1" + "]" * 32 + "\n")
    got = _load(path, "32 deep")
    assert isinstance(got, ConfigError) and got.message.startswith("required table is missing"), got
