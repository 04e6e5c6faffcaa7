"""The code's shape as the architecture issue set it: small modules, short functions where the
pass and the daemon live. Measured from the source itself, so a new long function fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parent.parent / "agent"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
#: The packages whose functions stay short: the pass and the daemon.
SHORT_FUNCTIONS = ("reconcile", "run")


def _modules() -> list[Path]:
    return sorted(AGENT.rglob("*.py"))


def test_no_module_of_the_agent_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(AGENT)): n
        for p in _modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


@pytest.mark.parametrize("package", SHORT_FUNCTIONS)
def test_no_function_of_the_pass_or_daemon_is_over_60_lines(package: str) -> None:
    long = {}
    for path in sorted((AGENT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(AGENT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
