"""Run the pinned ``kustomize`` and ``helm`` binaries for ``agent.render``, sandboxed.

Rendering must run no code from the repository and reach no network. What
this module does about it:

* ``kustomize build --load-restrictor LoadRestrictionsRootOnly`` without
  ``--enable-exec``, ``--enable-alpha-plugins`` or ``--enable-helm``: files a
  kustomization loads must lie under its own root, while bases and components
  (directories with their own kustomization) may live anywhere *in the
  repository* -- ``check_kustomization`` walks that graph first, refusing
  remote URLs, references that leave the repository, ``helmCharts`` and
  symlinks pointing outside. As a second wall the process runs with an empty
  ``PATH`` (kustomize clones remote bases with ``git``) and a dead HTTP proxy.
* ``helm template`` with a throw-away ``HELM_CACHE_HOME``/``CONFIG``/``DATA``
  (so no repository list, registry login or plugin of the host is seen), no
  ``--post-renderer``, ``--include-crds`` and ``--skip-tests``; chart
  dependencies must be vendored under ``charts/`` (checked before running).
* every process has a timeout and an output cap, enforced by the ``Runner``;
  tests inject their own runner.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from agent.errors import RenderProblem
from agent.render.manifests import BoundedLoader

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_STDERR_KEEP = 8 * 1024
# Looks like a URL or a go-getter/git spec rather than a local path.
_REMOTE = re.compile(
    r"^([a-z][a-z0-9+.-]*://|git@|git::|[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,}(:\d+)?/)", re.IGNORECASE
)
# A proxy nobody listens on: a Go HTTP client that tries the network fails at once.
_DEAD_PROXY = "http://127.0.0.1:9"


@dataclass(frozen=True)
class RunResult:
    """What a tool run produced; ``stdout`` is at most the cap (``truncated`` says it was hit)."""

    returncode: int
    stdout: bytes
    stderr: bytes = b""
    timed_out: bool = False
    truncated: bool = False


class Runner(Protocol):
    """Runs one command; must honour ``timeout`` (seconds) and ``max_output`` (stdout bytes).

    ``stdin``: bytes written to the command's standard input (``sops`` reads ciphertext there,
    so that no file is written); ``None``: no input.
    """

    def __call__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
        max_output: int,
        stdin: bytes | None = None,
    ) -> RunResult: ...


def run_subprocess(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    max_output: int,
    stdin: bytes | None = None,
) -> RunResult:
    """The real ``Runner``: kills the whole process group on timeout or when stdout passes the cap."""
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    timed_out = truncated = False
    deadline = time.monotonic() + timeout
    pending = memoryview(stdin or b"")
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        if proc.stdin is not None:
            # Written as the command reads, beside its output: a full pipe never deadlocks.
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE, None)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                if key.data is None:
                    pending = _feed(key, pending, sel)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf: bytearray = key.data
                buf += chunk
                if buf is err and len(err) > 2 * _STDERR_KEEP:
                    del err[: len(err) - _STDERR_KEEP]
            if len(out) > max_output:
                truncated = True
                del out[max_output:]
                break
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if timed_out or truncated:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        # Output closed early but the process lingers past the deadline.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        code, timed_out = proc.wait(), True
    proc.stdout.close()
    proc.stderr.close()
    return RunResult(code, bytes(out), bytes(err[-_STDERR_KEEP:]), timed_out, truncated)


def _feed(key: selectors.SelectorKey, pending: memoryview, sel: selectors.BaseSelector) -> memoryview:
    """Write what the command's stdin takes now; close it when all is written or it stopped reading."""
    try:
        written = os.write(key.fd, pending[:65536])
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        written = len(pending)  # the command exited without reading it all: its exit code says why
    pending = pending[written:]
    if not pending:
        sel.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]
    return pending


def sandbox_env(home: Path) -> dict[str, str]:
    """A minimal environment: nothing of the agent's (credentials, kubeconfig, proxies) leaks in."""
    return {
        "PATH": "",
        "HOME": str(home),
        "TMPDIR": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-kubeconfig"),
        "KUSTOMIZE_PLUGIN_HOME": str(home / "no-plugins"),
        "HTTP_PROXY": _DEAD_PROXY,
        "HTTPS_PROXY": _DEAD_PROXY,
        "ALL_PROXY": _DEAD_PROXY,
        "http_proxy": _DEAD_PROXY,
        "https_proxy": _DEAD_PROXY,
        "NO_PROXY": "",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "",
        "LANG": "C",
    }


def helm_env(home: Path) -> dict[str, str]:
    env = sandbox_env(home)
    env.update(
        HELM_CACHE_HOME=str(home / "helm-cache"),
        HELM_CONFIG_HOME=str(home / "helm-config"),
        HELM_DATA_HOME=str(home / "helm-data"),
        HELM_PLUGINS=str(home / "helm-plugins"),
        HELM_REGISTRY_CONFIG=str(home / "helm-config" / "registry.json"),
        HELM_REPOSITORY_CONFIG=str(home / "helm-config" / "repositories.yaml"),
        HELM_REPOSITORY_CACHE=str(home / "helm-cache" / "repository"),
    )
    return env


@dataclass(frozen=True)
class ToolOutput:
    """Stdout of a successful run, or the problems of a failed one."""

    text: str
    problems: tuple[RenderProblem, ...] = ()


def _run(
    what: str,
    file: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    max_output: int,
    runner: Runner,
    stdin: bytes | None = None,
) -> tuple[RunResult | None, list[RenderProblem]]:
    try:
        if stdin is None:
            res = runner(argv, cwd=cwd, env=env, timeout=timeout, max_output=max_output)
        else:
            res = runner(argv, cwd=cwd, env=env, timeout=timeout, max_output=max_output, stdin=stdin)
    except OSError as e:
        return None, [RenderProblem(file, f"{what} could not be started: {e.strerror or e}")]
    if res.timed_out:
        return res, [RenderProblem(file, f"{what} timed out after {timeout:g}s")]
    if res.truncated or len(res.stdout) > max_output:
        return res, [RenderProblem(file, f"{what} output exceeds the limit of {max_output} bytes")]
    if res.returncode != 0:
        return res, [RenderProblem(file, f"{what} failed (exit {res.returncode}): {_stderr(res.stderr)}")]
    return res, []


def _stderr(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-6:]) if lines else "(no message)"


def _decode(res: RunResult, file: str, what: str) -> ToolOutput:
    try:
        return ToolOutput(res.stdout.decode("utf-8"))
    except UnicodeDecodeError:
        return ToolOutput("", (RenderProblem(file, f"{what} produced output that is not UTF-8"),))


# ---------------------------------------------------------------------------
# Kustomize


def kustomization_file(directory: Path) -> Path | None:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    return None


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_symlinks(directory: Path, tree: Path, rel: str) -> list[RenderProblem]:
    """Every symlink under ``directory`` that points outside the repository (or nowhere)."""
    problems: list[RenderProblem] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                shown = f"{rel}/{p.relative_to(directory).as_posix()}".lstrip("./") or rel
                if not _inside(target, tree):
                    problems.append(
                        RenderProblem(shown, f"symlink points outside the repository ({os.readlink(p)})")
                    )
                elif not target.exists():
                    problems.append(RenderProblem(shown, f"dangling symlink ({os.readlink(p)})"))
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    return problems


def check_kustomization(directory: Path, tree: Path, seen: set[Path] | None = None) -> list[RenderProblem]:
    """Refuse what would make ``kustomize build directory`` leave the repository or run code."""
    seen = set() if seen is None else seen
    directory = directory.resolve()
    if directory in seen:
        return []
    seen.add(directory)
    kfile = kustomization_file(directory)
    rel_dir = directory.relative_to(tree).as_posix()
    if kfile is None:
        return [RenderProblem(rel_dir, "referenced as a kustomize base but has no kustomization.yaml")]
    rel = kfile.relative_to(tree).as_posix()
    problems = check_symlinks(directory, tree, rel_dir)
    try:
        text = kfile.read_text("utf-8")
        data: Any = yaml.load(text, BoundedLoader)
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        return [
            *problems,
            RenderProblem(rel, f"invalid kustomization: {getattr(e, 'problem', None) or e}", line),
        ]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return [*problems, RenderProblem(rel, "kustomization must be a mapping")]
    for key in ("helmCharts", "helmChartInflationGenerator", "helmGlobals"):
        if key in data:
            problems.append(
                RenderProblem(
                    rel,
                    f"{key} is refused (it runs helm inside kustomize and may download "
                    "charts); render the chart through the cluster's helm settings",
                )
            )
    for key in ("resources", "bases", "components", "generators", "transformers", "validators", "crds"):
        entries = data.get(key) or []
        if not isinstance(entries, list):
            problems.append(RenderProblem(rel, f"{key} must be a list"))
            continue
        for entry in entries:
            if not isinstance(entry, str) or "\n" in entry:
                continue  # an inline generator/transformer config: validated by kustomize itself
            found = _check_reference(entry, key, directory, tree, rel, seen)
            problems.extend(_at_line(p, text, entry) if p.file == rel else p for p in found)
    for patch in [*(data.get("patches") or []), *(data.get("patchesJson6902") or [])]:
        if isinstance(patch, dict) and isinstance(patch.get("path"), str):
            found = _check_reference(patch["path"], "patches", directory, tree, rel, seen, file_only=True)
            problems.extend(_at_line(p, text, patch["path"]) for p in found)
    return problems


def _at_line(problem: RenderProblem, text: str, needle: str) -> RenderProblem:
    """The problem pointed at the first line of ``text`` that mentions ``needle``."""
    for i, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return replace(problem, line=i)
    return problem


def _check_reference(
    entry: str, key: str, directory: Path, tree: Path, rel: str, seen: set[Path], *, file_only: bool = False
) -> list[RenderProblem]:
    target = (directory / entry).resolve()
    local = target.exists() and not os.path.isabs(entry)
    if not local and (_REMOTE.match(entry) or "?ref=" in entry or "//" in entry.strip("/")):
        return [
            RenderProblem(
                rel,
                f"{key}: remote reference {entry!r} is refused (render has no network; "
                "vendor it into the repository)",
            )
        ]
    if os.path.isabs(entry) or not _inside(target, tree):
        return [RenderProblem(rel, f"{key}: {entry!r} leaves the repository")]
    if not target.exists():
        return [RenderProblem(rel, f"{key}: {entry!r} does not exist (remote references are refused)")]
    if target.is_dir() and not file_only:
        return check_kustomization(target, tree, seen)
    return []


def kustomize_build(
    kustomize: Path, directory: Path, tree: Path, *, timeout: float, max_output: int, runner: Runner
) -> ToolOutput:
    """``kustomize build`` of ``directory`` (already checked with ``check_kustomization``)."""
    rel = directory.relative_to(tree).as_posix()
    argv = [str(kustomize), "build", str(directory), "--load-restrictor", "LoadRestrictionsRootOnly"]
    with tempfile.TemporaryDirectory(prefix="gitops-agent-kustomize-") as home:
        res, problems = _run(
            f"kustomize build {rel}",
            rel,
            argv,
            cwd=directory,
            env=sandbox_env(Path(home)),
            timeout=timeout,
            max_output=max_output,
            runner=runner,
        )
    if res is None or problems:
        return ToolOutput("", tuple(problems))
    return _decode(res, rel, f"kustomize build {rel}")


# ---------------------------------------------------------------------------
# Helm


def check_chart(chart: Path, tree: Path) -> list[RenderProblem]:
    """Refuse chart dependencies that are not vendored under ``charts/`` (helm would need the network)."""
    rel = chart.relative_to(tree).as_posix()
    problems = check_symlinks(chart, tree, rel)
    chart_file = chart / "Chart.yaml"
    try:
        meta: Any = yaml.load(chart_file.read_text("utf-8"), BoundedLoader)
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        mark = getattr(e, "problem_mark", None)
        return [
            *problems,
            RenderProblem(
                f"{rel}/Chart.yaml",
                f"invalid Chart.yaml: {getattr(e, 'problem', None) or e}",
                mark.line + 1 if mark is not None else None,
            ),
        ]
    deps: Any = meta.get("dependencies") if isinstance(meta, dict) else None
    req = chart / "requirements.yaml"
    if req.is_file():  # apiVersion v1 charts
        with contextlib.suppress(yaml.YAMLError, UnicodeDecodeError, OSError, AttributeError):
            requirements = yaml.load(req.read_text("utf-8"), BoundedLoader) or {}
            deps = (deps or []) + requirements.get("dependencies", [])
    for dep in deps or []:
        if not isinstance(dep, dict) or not isinstance(dep.get("name"), str):
            problems.append(RenderProblem(f"{rel}/Chart.yaml", "dependencies: every entry needs a name"))
            continue
        name = dep["name"]
        vendored = (chart / "charts" / name / "Chart.yaml").is_file() or any(
            (chart / "charts").glob(f"{name}-*.tgz")
        )
        if not vendored:
            problems.append(
                RenderProblem(
                    f"{rel}/Chart.yaml",
                    f"chart dependency {name!r} ({dep.get('repository') or 'no repository'}) is not "
                    f"vendored under {rel}/charts/; render does not download charts "
                    "(run `helm dependency build` and commit charts/)",
                )
            )
    return problems


_HELM_LOCATION = re.compile(
    r"(?P<file>[\w.-]+(?:/[\w.-]+)*/templates/[\w./-]+?):(?P<line>\d+)(?::(?P<col>\d+))?"
)


def helm_template(
    helm: Path,
    chart: Path,
    tree: Path,
    *,
    release: str,
    namespace: str,
    values: Sequence[Path],
    timeout: float,
    max_output: int,
    runner: Runner,
    kube_version: str = "",
    api_versions: Sequence[str] = (),
) -> ToolOutput:
    """``helm template`` of a chart directory with the given values files, offline.

    ``kube_version`` and ``api_versions`` are the cluster's (``.Capabilities``): without them
    Helm assumes its own built-in version and API list, not the cluster's.
    """
    rel = chart.relative_to(tree).as_posix()
    argv = [str(helm), "template", release, str(chart), "--include-crds", "--skip-tests"]
    if namespace:
        argv += ["--namespace", namespace]
    if kube_version:
        argv += ["--kube-version", kube_version]
    for av in api_versions:
        argv += ["--api-versions", av]
    for v in values:
        argv += ["--values", str(v)]
    with tempfile.TemporaryDirectory(prefix="gitops-agent-helm-") as home:
        res, problems = _run(
            f"helm template {rel}",
            f"{rel}/Chart.yaml",
            argv,
            cwd=chart,
            env=helm_env(Path(home)),
            timeout=timeout,
            max_output=max_output,
            runner=runner,
        )
    if res is None:
        return ToolOutput("", tuple(problems))
    if problems and res.returncode != 0 and not res.timed_out:
        m = _HELM_LOCATION.search(res.stderr.decode("utf-8", "replace"))
        if m:  # helm names the template as <chart name>/templates/...: point at it in the repository
            file = f"{rel}/{m.group('file').split('/', 1)[1]}"
            col = int(m.group("col")) if m.group("col") else None
            problems = [RenderProblem(file, problems[0].message, int(m.group("line")), col)]
    if problems:
        return ToolOutput("", tuple(problems))
    return _decode(res, f"{rel}/Chart.yaml", f"helm template {rel}")


_SOURCE = re.compile(r"^# Source: (?P<path>\S.*)$")


def helm_sections(text: str, chart_rel: str) -> tuple[tuple[int, str], ...]:
    """``(line, repository path)`` of every ``# Source:`` comment in helm's output."""
    out: list[tuple[int, str]] = []
    for i, line in enumerate(text.splitlines(), start=1):
        if m := _SOURCE.match(line):
            path = m.group("path").strip()
            inner = path.split("/", 1)[1] if "/" in path else path
            out.append((i, f"{chart_rel}/{inner}" if chart_rel not in ("", ".") else inner))
    return tuple(out)
