"""The sandbox around kustomize and helm: timeouts, output caps, no network, injected runners."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.errors import RenderError
from agent.render.binaries import tool
from agent.render.kustomize import Graph, kustomize_build
from agent.render.manifests import MAX_DEPTH, _non_json
from agent.render.process import RunResult, run_subprocess
from agent.render.renderer import RenderSpec, render
from agent.render.tools import helm_sections, sandbox_env, source_comments

FIXTURES = Path(__file__).parent / "fixtures" / "render"
KUSTOMIZE = RenderSpec("prod", ("kustomize/overlays/staging",), {})
HELM = RenderSpec("prod", ("helm/charts/web",), {})


def test_the_subprocess_runner_kills_a_command_that_outlives_its_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    argv = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
    res = run_subprocess(argv, cwd=tmp_path, env={}, timeout=0.5, max_output=1024)
    assert res.timed_out and time.monotonic() - start < 5
    assert res.stdout == b"started\n"


def test_the_subprocess_runner_stops_at_the_output_cap(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"]
    res = run_subprocess(argv, cwd=tmp_path, env={}, timeout=20, max_output=100_000)
    assert res.truncated and not res.timed_out and len(res.stdout) == 100_000


def test_the_subprocess_runner_returns_exit_code_stdout_and_stderr(tmp_path: Path) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    res = run_subprocess([sys.executable, "-c", code], cwd=tmp_path, env={}, timeout=20, max_output=1024)
    assert (res.returncode, res.stdout, res.stderr, res.timed_out, res.truncated) == (
        3,
        b"out\n",
        b"err\n",
        False,
        False,
    )


def test_the_subprocess_runner_feeds_stdin_larger_than_a_pipe_while_reading_stdout(tmp_path: Path) -> None:
    """sops reads ciphertext from stdin: input and output both past a pipe's buffer never deadlock."""
    data = bytes(range(256)) * 8192  # 2 MiB
    code = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"
    argv = [sys.executable, "-c", code]
    res = run_subprocess(argv, cwd=tmp_path, env={}, timeout=30, max_output=len(data), stdin=data)
    assert (res.returncode, res.timed_out, res.truncated) == (0, False, False)
    assert res.stdout == data


def test_the_subprocess_runner_survives_a_command_that_stops_reading_its_stdin(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; sys.exit(7)"]
    res = run_subprocess(argv, cwd=tmp_path, env={}, timeout=30, max_output=1024, stdin=b"x" * (1 << 20))
    assert (res.returncode, res.timed_out) == (7, False)


class FakeRunner:
    """Answers every command with one canned result, recording what it was asked."""

    def __init__(self, result: RunResult) -> None:
        self.result = result
        self.calls: list[tuple[list[str], float, int]] = []

    def __call__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
        max_output: int,
        then: Sequence[str] | None = None,
    ) -> RunResult:
        self.calls.append((list(argv), timeout, max_output))
        return self.result


@pytest.mark.parametrize(
    ("spec", "result", "fragment", "file"),
    [
        (
            KUSTOMIZE,
            RunResult(-9, b"", timed_out=True),
            "kustomize build kustomize/overlays/staging timed out after 7s",
            "kustomize/overlays/staging",
        ),
        (
            HELM,
            RunResult(-9, b"", timed_out=True),
            "helm template helm/charts/web timed out after 7s",
            "helm/charts/web/Chart.yaml",
        ),
        (
            KUSTOMIZE,
            RunResult(-9, b"x" * 10, truncated=True),
            "output exceeds the limit of 1048576 bytes",
            "kustomize/overlays/staging",
        ),
        (HELM, RunResult(0, b"\xff\xfe"), "produced output that is not UTF-8", "helm/charts/web/Chart.yaml"),
        (
            HELM,
            RunResult(1, b"", b"Error: something broke\n"),
            "failed (exit 1): Error: something broke",
            "helm/charts/web/Chart.yaml",
        ),
    ],
    ids=["kustomize timeout", "helm timeout", "output cap", "not utf-8", "exit status"],
)
def test_tool_failures_fail_the_render_with_their_reason(
    spec: RenderSpec, result: RunResult, fragment: str, file: str
) -> None:
    tool("kustomize"), tool("helm")
    runner = FakeRunner(result)
    # The cap also bounds what helm reads (the chart): large enough for the fixture's.
    spec = RenderSpec(spec.cluster, spec.paths, spec.vars, timeout=7, max_output_bytes=1 << 20)
    with pytest.raises(RenderError) as caught:
        render(FIXTURES, spec, runner=runner)
    ((problem),) = caught.value.problems
    assert fragment in problem.message and problem.file == file
    assert runner.calls[0][1:] == (7, 1 << 20)  # the spec's timeout and cap reach the runner


def test_a_real_kustomize_build_past_its_timeout_fails_the_render(tmp_path: Path) -> None:
    tool("kustomize")

    def slow(
        argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float, max_output: int
    ) -> RunResult:
        wrapped = [sys.executable, "-c", "import time, subprocess, sys; time.sleep(30)"]
        return run_subprocess(wrapped, cwd=cwd, env=env, timeout=timeout, max_output=max_output)

    start = time.monotonic()
    with pytest.raises(RenderError, match=r"timed out after 0\.3s"):
        render(FIXTURES, RenderSpec("s", KUSTOMIZE.paths, {}, timeout=0.3), runner=slow)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    "resource",
    [
        "https://raw.githubusercontent.com/kubernetes-sigs/kustomize/master/examples/helloWorld/configMap.yaml",
        "github.com/kubernetes-sigs/kustomize//examples/helloWorld?ref=v5.0.0",
    ],
)
def test_kustomize_itself_cannot_reach_the_network_even_past_our_checks(
    tmp_path: Path, resource: str
) -> None:
    """Second wall: run the kustomize sandbox directly on a remote resource, without the pre-check."""
    (tmp_path / "kustomization.yaml").write_text(f"resources:\n  - {resource}\n")
    start = time.monotonic()
    out = kustomize_build(
        tool("krender"),
        tmp_path,
        tmp_path,
        Graph(mounted_dirs={tmp_path}),
        timeout=30,
        max_output=1 << 20,
        max_file=1 << 20,
        runner=run_subprocess,
    )
    assert time.monotonic() - start < 10
    ((problem),) = out.problems
    assert "failed (exit 1)" in problem.message and out.text == ""


def test_a_shared_base_or_file_elsewhere_in_the_repository_is_allowed(tmp_path: Path) -> None:
    tool("krender")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "kustomization.yaml").write_text("resources:\n  - cm.yaml\n")
    (tmp_path / "base" / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\n")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text("resources:\n  - ../base\n")
    assert [o.key.name for o in render(tmp_path, RenderSpec("c", ("overlay",), {})).objects] == ["shared"]
    # A plain file from another directory of the checkout too (paths outside it: test_render_sandbox).
    (tmp_path / "overlay" / "kustomization.yaml").write_text("resources:\n  - ../base/cm.yaml\n")
    assert [o.key.name for o in render(tmp_path, RenderSpec("c", ("overlay",), {})).objects] == ["shared"]


def test_the_sandbox_environment_carries_nothing_of_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    env = sandbox_env(tmp_path)
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["PATH"] == "" and env["HOME"] == str(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        "---\n# Source: c/templates/a.yaml\na: 1\n---\n# Source: c/templates/b.yaml\n",
        "x# Source: c/a\n# Source: \n# Source: c/q  \n# Source: c/last",
        "# Source: c/a\r\n# Source: c/b\u2028# Source: c/c\n\x0c# Source: c/d\n",
        "",
    ],
    ids=["helm's", "odd comments", "other line breaks", "empty"],
)
def test_helm_sections_count_lines_as_splitlines_does(text: str) -> None:
    expected = [
        (i, f"chart/{line.removeprefix('# Source: ').strip().split('/', 1)[1]}")
        for i, line in enumerate(text.splitlines(), start=1)
        if line.startswith("# Source: ") and line[10:11].strip()
    ]
    assert list(helm_sections(source_comments(text), "chart")) == expected


def nest(levels: int) -> dict[str, Any]:
    """A mapping ``levels`` deep: ``{"x": {"x": ... {}}}``."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, "x", None, True, 1.5, {"b": {}}]}, None),
        ({"a": [1, {"b": float("nan")}]}, "a[1].b: nan is not a JSON number"),
        ({"a": {"b": b"x"}}, "a.b: a bytes is not a JSON value"),
        ({"a": nest(MAX_DEPTH)}, None),
        ({"a": nest(MAX_DEPTH + 1)}, f"{('a' + '.x' * MAX_DEPTH)[:80]}...: nested more than 200 levels deep"),
    ],
)
def test_a_value_json_cannot_carry_is_named_with_its_path(value: dict[str, Any], problem: str | None) -> None:
    assert _non_json(value, "") == problem
