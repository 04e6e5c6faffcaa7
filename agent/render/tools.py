"""Run the render tools (kustomize, helm, sops) for ``agent.render``, sandboxed.

Rendering must run no code from the repository and reach no network. What
this module does about it:

* ``kustomize build`` runs in ``agent.render.kustomize`` (a wrapper on the kustomize API
  that sees the checkout in memory and has no network); its children share this runner.
* every child runs with an empty ``PATH`` (kustomize clones remote bases with ``git``), a
  dead HTTP proxy, and a memory limit (``agent.render.limits``).
* ``helm template`` with a throw-away ``HELM_CACHE_HOME``/``CONFIG``/``DATA``
  (so no repository list, registry login or plugin of the host is seen), no
  ``--post-renderer``, ``--include-crds`` and ``--skip-tests``; chart
  dependencies must be vendored under ``charts/`` (checked before running).
* every process has a timeout and an output cap, enforced by the ``Runner``;
  tests inject their own runner.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import resource
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from agent.errors import LocalClusterError, RenderLimit, RenderProblem
from agent.render import fastyaml
from agent.render.binaries import tool
from agent.render.manifests import MAX_EXPANDED_NODES, MAX_PARSE_DEPTH, BoundedLoader

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_STDERR_KEEP = 8 * 1024
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
    #: Largest resident set the process reached, in bytes, as sampled (0: not measured: no limit).
    peak_rss: int = 0
    #: It ran under a memory limit and its runtime reported running out of memory (or it was
    #: killed by the kernel for it): ``agent.render.limits`` turns this into a render error.
    out_of_memory: bool = False


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
    memory: int | None = None,
) -> RunResult:
    """The real ``Runner``: kills the whole process group on timeout or when stdout passes the cap.

    ``memory``: the child's bound in bytes. It runs with that ``RLIMIT_DATA`` (heap and private
    mappings; an address-space limit would kill Go programs at start-up, which reserve far more
    than they use). The kernel does not count a writable mapping laid over a reserved range,
    which is how Go maps a large allocation (one 900 MB string passes the limit in one step), so
    the runner also samples the child's resident memory and kills it past ``_WATCHDOG`` of it.
    """
    launcher = _launcher(argv, cwd) if memory is not None else None
    proc = subprocess.Popen(
        _limited(argv, launcher, memory) if launcher and memory else list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # A C function, so the forked child runs no Python code of ours before exec.
        preexec_fn=None if memory is None or launcher else functools.partial(_limit_data, memory),
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err, head = bytearray(), bytearray(), bytearray()
    timed_out = truncated = False
    peak = _hwm(proc.pid)
    over = False
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
            # Sampled while it runs: a child's own high-water mark is gone once it exits.
            events = sel.select(left if memory is None else min(left, _SAMPLE))
            if memory is not None and (peak := max(peak, _hwm(proc.pid))) > _WATCHDOG * memory:
                over = True
                break
            for key, _ in events:
                if key.data is None:
                    pending = _feed(key, pending, sel)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf: bytearray = key.data
                buf += chunk
                if buf is err and len(head) < _STDERR_KEEP:  # a runtime's fatal error comes first
                    head += chunk[: _STDERR_KEEP - len(head)]
                if buf is err and len(err) > 2 * _STDERR_KEEP:
                    del err[: len(err) - _STDERR_KEEP]
            if len(out) > max_output:
                truncated = True
                del out[max_output:]
                break
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if timed_out or truncated or over:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    peak = max(peak, _hwm(proc.pid)) if memory is not None else 0
    try:
        code = _wait(proc, max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        # Output closed early but the process lingers past the deadline.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        code, timed_out = proc.wait(), True
    proc.stdout.close()
    proc.stderr.close()
    stderr = bytes(err[-_STDERR_KEEP:])
    oom = over or (
        memory is not None
        and code != 0
        and not (timed_out or truncated)
        and _out_of_memory(code, bytes(head), peak, memory)
    )
    return RunResult(code, bytes(out), stderr, timed_out, truncated, peak, oom)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """``proc.wait(timeout)`` without its polling (sleeps of 0.5 ms, 1 ms, 2 ms...: a millisecond or
    two of every tool run after its output closed): a pidfd wakes this wait when it exits."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # exited and reaped already, or a kernel without pidfds
        return proc.wait(timeout=timeout)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait()


def _launcher(argv: Sequence[str], cwd: Path) -> Path | None:
    """krender, which sets the memory limit and becomes the program (``_limited``), if installed.

    Why: for a ``preexec_fn`` CPython forks instead of using vfork, copying the page tables of the
    whole agent (~18 ms a child at 330 MB, twice a chart's render). ``None`` (the limit set by
    ``preexec_fn``) without krender, and for a program named without a directory (looked up on
    ``PATH``) or not executable, whose errors ``Popen`` reports as it always did.
    """
    program = Path(cwd, argv[0])
    if "/" not in argv[0] or not (program.is_file() and os.access(program, os.X_OK)):
        return None
    try:
        return tool("krender")
    except LocalClusterError:
        return None


def _limited(argv: Sequence[str], krender: Path, memory: int) -> list[str]:
    """``argv`` run by ``krender`` with ``memory`` as its ``RLIMIT_DATA``: krender itself sets the
    limit on itself (one start, not two), any other program is executed by it (``-exec``)."""
    limit = ["-limit-data", str(memory)]
    if Path(argv[0]) == krender:
        return [argv[0], *limit, *argv[1:]]
    return [str(krender), *limit, "-exec", "--", *argv]


def _limit_data(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


#: Seconds between two samples of a limited child's memory, and the share of its limit at which
#: the sampler kills it: a child filling memory as fast as it can (~5 GB/s) stays under its limit.
_SAMPLE = 0.01
_WATCHDOG = 0.875


def _hwm(pid: int) -> int:
    """The peak resident memory (``VmHWM``, bytes) of the program ``pid`` runs; 0 once it exited.

    Not ``wait4``'s ``ru_maxrss``: Linux carries into it the memory of the process that forked
    the child (the agent's own), so a small child of a large agent would seem large.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


#: How the runtimes of the render tools say an allocation failed: Go's fatal errors (kustomize,
#: helm, sops) and C's/Python's (test programs). Read only from a child we limited.
_OOM_MARKERS = (b"out of memory", b"cannot allocate memory", b"Cannot allocate memory", b"MemoryError")
#: Go's collector may also crash outright when the kernel refuses it memory (a SIGSEGV in the
#: runtime, exit 2): a failed child whose sampled peak came this close to its limit ran out of it.
_NEAR_LIMIT = 0.75


def _out_of_memory(code: int, stderr_head: bytes, peak: int, limit: int) -> bool:
    return (
        code == -signal.SIGKILL or peak >= _NEAR_LIMIT * limit or any(m in stderr_head for m in _OOM_MARKERS)
    )


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
    if res.out_of_memory:
        return res, [memory_problem(file, what, res)]
    if res.truncated or len(res.stdout) > max_output:
        return res, [RenderProblem(file, f"{what} output exceeds the limit of {max_output} bytes")]
    if res.returncode != 0:
        return res, [RenderProblem(file, f"{what} failed (exit {res.returncode}): {_stderr(res.stderr)}")]
    return res, []


def memory_problem(file: str, what: str, res: RunResult) -> RenderProblem:
    """The render error of a child stopped at its memory limit (kept per revision by the cache)."""
    peak = f" (peak {res.peak_rss / (1 << 20):.0f} MiB)" if res.peak_rss else ""
    return RenderProblem(
        file, f"{what} ran out of memory at the render limit (render_memory){peak}", limit=RenderLimit.MEMORY
    )


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
    for entry in walk_entries(directory):
        if entry.is_symlink():
            p = Path(entry.path)
            target = p.resolve()
            shown = f"{rel}/{p.relative_to(directory).as_posix()}".lstrip("./") or rel
            if not _inside(target, tree):
                problems.append(
                    RenderProblem(shown, f"symlink points outside the repository ({os.readlink(p)})")
                )
            elif not target.exists():
                problems.append(RenderProblem(shown, f"dangling symlink ({os.readlink(p)})"))
    return problems


def walk_entries(directory: Path) -> Iterator[os.DirEntry[str]]:
    """Every entry under ``directory`` in ``os.walk``'s order, each directory's names sorted: its
    entries, then each sub-directory's (in listing order), a symlinked one not entered.

    One ``scandir`` a directory and no ``stat`` but of symlinks: a chart's checks through
    ``os.walk`` and ``Path`` took two or three system calls a file, 5 ms of a small chart's render.
    """
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError:
        return
    yield from sorted(entries, key=lambda e: e.name)
    for e in entries:
        if is_dir(e) and not e.is_symlink():
            yield from walk_entries(Path(e.path))


def is_dir(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a directory or a symlink to one (``False`` where that cannot be told)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


# ---------------------------------------------------------------------------
# Helm


def load_chart_yaml(text: str) -> Any:
    """A chart's Chart.yaml or requirements.yaml, or a chart repository's index.yaml (handed to
    ``source.charts`` by its caller): through libyaml where it can (the pure-Python loader took a
    fifth of a small chart's render), else the bounded loader, which says what is wrong."""
    docs = fastyaml.load(text, None, max_nodes=MAX_EXPANDED_NODES, max_depth=MAX_PARSE_DEPTH)
    if docs is not None and len(docs) == 1:
        return docs[0][0]
    return yaml.load(text, BoundedLoader)


def check_chart(chart: Path, tree: Path) -> list[RenderProblem]:
    """Refuse chart dependencies that are not vendored under ``charts/`` (helm would need the network)."""
    rel = chart.relative_to(tree).as_posix()
    problems = check_symlinks(chart, tree, rel)
    chart_file = chart / "Chart.yaml"
    try:
        meta: Any = load_chart_yaml(chart_file.read_text("utf-8"))
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
            requirements = load_chart_yaml(req.read_text("utf-8")) or {}
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
    values_json: str = "",
    is_upgrade: bool = False,
    tests: bool = False,
) -> ToolOutput:
    """``helm template`` of a chart directory with the given values files, offline.

    ``is_upgrade``: rendered as a later revision of the release (``.Release.IsUpgrade``), not
    its first install. ``tests``: with the chart's ``test`` hooks (else ``--skip-tests``).

    ``kube_version`` and ``api_versions`` are the cluster's (``.Capabilities``): without them
    Helm assumes its own built-in version and API list, not the cluster's. ``values_json``: the
    app's `[helm.values]` table, given after the files (JSON is YAML).
    """
    rel = chart.relative_to(tree).as_posix()
    argv = [str(helm), "template", release, str(chart), "--include-crds"]
    argv += [] if tests else ["--skip-tests"]
    argv += ["--is-upgrade"] if is_upgrade else []
    if namespace:
        argv += ["--namespace", namespace]
    if kube_version:
        argv += ["--kube-version", kube_version]
    for av in api_versions:
        argv += ["--api-versions", av]
    for v in values:
        argv += ["--values", str(v)]
    with tempfile.TemporaryDirectory(prefix="gitops-agent-helm-") as home:
        if values_json:
            (Path(home) / "values.json").write_text(values_json)
            argv += ["--values", str(Path(home) / "values.json")]
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
_SOURCE_LINES = re.compile(r"^# Source: (?P<path>\S.*)$", re.MULTILINE)
#: What ``str.splitlines`` breaks a line at besides "\n".
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def helm_sections(text: str, chart_rel: str) -> tuple[tuple[int, str], ...]:
    """``(line, repository path)`` of every ``# Source:`` comment in helm's output.

    Lines are ``str.splitlines``'s; where "\n" is the only break, the comments are searched in
    the whole text (matching each of cert-manager's 30,000 lines took 5 ms)."""
    if any(c in text for c in _OTHER_BREAKS):
        found = [(i, m) for i, line in enumerate(text.splitlines(), start=1) if (m := _SOURCE.match(line))]
    else:
        found, line, last = [], 1, 0
        at = text.find("# Source: ")
        while at >= 0:
            end = text.find("\n", at)
            if (at == 0 or text[at - 1] == "\n") and (
                m := _SOURCE_LINES.match(text, at, len(text) if end < 0 else end)
            ):
                line += text.count("\n", last, at)
                last = at
                found.append((line, m))
            at = text.find("# Source: ", at + 1)
    out: list[tuple[int, str]] = []
    for i, m in found:
        path = m.group("path").strip()
        inner = path.split("/", 1)[1] if "/" in path else path
        out.append((i, f"{chart_rel}/{inner}" if chart_rel not in ("", ".") else inner))
    return tuple(out)
