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
* every process has a timeout and an output cap, enforced by the ``Runner``
  (``agent.render.process``); tests inject their own runner.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.errors import LocalClusterError, RenderLimit, RenderProblem
from agent.render import fastyaml
from agent.render.binaries import tool
from agent.render.manifests import MAX_EXPANDED_NODES, MAX_PARSE_DEPTH, BoundedLoader
from agent.render.process import Runner, RunResult

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
# A proxy nobody listens on: a Go HTTP client that tries the network fails at once.
_DEAD_PROXY = "http://127.0.0.1:9"


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
    then: Sequence[str] | None = None,
) -> tuple[RunResult | None, list[RenderProblem]]:
    # Only what is given is passed: a test's runner need not take what it never gets.
    extra: dict[str, Any] = {"stdin": stdin} if stdin is not None else {}
    extra |= {"then": then} if then is not None else {}
    try:
        res = runner(argv, cwd=cwd, env=env, timeout=timeout, max_output=max_output, **extra)
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


def converter() -> Path | None:
    """krender, which reads helm's output as helm writes it (``helm_template``); ``None`` without
    it (the output is then parsed by ``manifests.parse_yaml``)."""
    try:
        return tool("krender")
    except LocalClusterError:
        return None


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
    converter: Path | None = None,
    item_lines: bool = False,
) -> ToolOutput:
    """``helm template`` of a chart directory with the given values files, offline.

    ``converter``: krender, which reads helm's output through a pipe as helm writes it and prints
    it as JSON documents with its ``# Source:`` comments where it can
    (``agent.render.tooljson.helm_json``), else as helm printed it; ``item_lines``: as helm
    printed it where it has a List (its items' lines are kept).

    ``is_upgrade``: rendered as a later revision of the release (``.Release.IsUpgrade``), not
    its first install. ``tests``: with the chart's ``test`` hooks (else ``--skip-tests``).

    ``kube_version`` and ``api_versions`` are the cluster's (``.Capabilities``): without them
    Helm assumes its own built-in version and API list, not the cluster's. ``values_json``: the
    app's `[helm.values]` table, given after the files (JSON is YAML).
    """
    rel = chart.relative_to(tree).as_posix()
    then = [str(converter), "-helm-output", "-max-input", str(max_output)] if converter else None
    if then and item_lines:
        then.append("-yaml-if-list")
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
            then=then,
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


_SOURCE = "# Source: "
#: What ``str.splitlines`` breaks a line at besides "\n".
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def source_comments(text: str) -> list[tuple[int, str]]:
    """``(line, rest of the line)`` of every line of helm's output that starts with ``# Source: ``.

    Lines are ``str.splitlines``'s; where "\n" is the only break, the comments are searched in
    the whole text (matching each of cert-manager's 30,000 lines took 5 ms). krender finds the
    same where it converts the output (``krender -helm-output``)."""
    if any(c in text for c in _OTHER_BREAKS):
        lines = enumerate(text.splitlines(), start=1)
        return [(i, line[len(_SOURCE) :]) for i, line in lines if line.startswith(_SOURCE)]
    found, line, last = [], 1, 0
    at = text.find(_SOURCE)
    while at >= 0:
        end = text.find("\n", at)
        if at == 0 or text[at - 1] == "\n":
            line += text.count("\n", last, at)
            last = at
            found.append((line, text[at + len(_SOURCE) : len(text) if end < 0 else end]))
        at = text.find(_SOURCE, at + 1)
    return found


def helm_sections(comments: Iterable[tuple[int, str]], chart_rel: str) -> tuple[tuple[int, str], ...]:
    """``(line, repository path)`` of helm's ``# Source: <chart>/<path>`` comments (``source_comments``)."""
    out: list[tuple[int, str]] = []
    for i, rest in comments:
        if not rest or rest[0].isspace():
            continue
        path = rest.strip()
        inner = path.split("/", 1)[1] if "/" in path else path
        out.append((i, f"{chart_rel}/{inner}" if chart_rel not in ("", ".") else inner))
    return tuple(out)
