"""Build the gitops-agent container image without a container registry (``scripts/build-image``).

The image is made of what this machine can reach: Debian's packages (``mmdebstrap`` makes the
root filesystem), PyPI's wheels (pinned in ``tools/image/requirements.txt``) and the pinned Go
tools that ``scripts/install-control-plane`` and ``scripts/install-go-tools`` build. The recipe is
``tools/image/recipe.toml``; the Dockerfile builds the same image where a registry is reachable.

The result is an OCI image archive (one gzip layer; ``podman load``, ``skopeo``, ``ctr import``
and ``docker load`` read it). Two caches under ``$GITOPS_AGENT_CACHE/image`` keep re-runs fast:
the Debian root filesystem (``base-<key>.tar``, keyed by the mmdebstrap command: minutes to
make, downloads every package) and the image (``<key>/``, keyed by every input: the recipe, the
lock, the agent's sources, the tool binaries and this file). A second run with the same inputs
does nothing; the newest ``KEEP`` of each stay, so checkouts sharing the cache do not delete
each other's. Needs root (mmdebstrap in root mode, chroot in a private mount namespace).

    build.py [--rebuild]   build (or find) the image; prints the archive's path
    build.py --lock        re-pin tools/image/requirements.txt from pyproject.toml
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "tools" / "image" / "recipe.toml"
LOCK = ROOT / "tools" / "image" / "requirements.txt"
ARCHIVE = "gitops-agent.oci.tar"
#: What the agent's wheel is built from (the Dockerfile's venv stage copies the same).
SOURCES = ("pyproject.toml", "README.md", "agent")
#: Debian's name of this machine's architecture, and the wheels' (a native build only).
ARCHES = {"x86_64": ("amd64", "x86_64"), "aarch64": ("arm64", "aarch64")}
GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
#: How many images (and base root filesystems) the cache keeps: ~125 MiB (~190 MiB) each.
KEEP = 3
CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}


class BuildError(Exception):
    """A step of the build failed; the message says which and why."""


@dataclass(frozen=True)
class Recipe:
    """``tools/image/recipe.toml``."""

    suite: str
    variant: str
    apt_packages: tuple[str, ...]
    dpkg_path_exclude: tuple[str, ...]
    dpkg_path_include: tuple[str, ...]
    wheel_python: str
    wheel_glibc: str
    venv: str
    tools_dir: str
    name: str
    user: dict[str, Any]
    config: dict[str, Any]

    @classmethod
    def load(cls, path: Path = RECIPE) -> Recipe:
        data = tomllib.loads(path.read_text())
        try:
            return cls(
                suite=data["suite"],
                variant=data["variant"],
                apt_packages=tuple(data["apt_packages"]),
                dpkg_path_exclude=tuple(data["dpkg_path_exclude"]),
                dpkg_path_include=tuple(data["dpkg_path_include"]),
                wheel_python=data["wheel_python"],
                wheel_glibc=data["wheel_glibc"],
                venv=data["venv"],
                tools_dir=data["tools_dir"],
                name=data["name"],
                user=data["user"],
                config=data["config"],
            )
        except KeyError as e:
            raise BuildError(f"{path}: missing key {e}") from None

    @property
    def user_commands(self) -> list[list[str]]:
        """The commands that create the user and its group (the Dockerfile runs the same)."""
        u = self.user
        return [
            ["groupadd", "--gid", str(u["gid"]), u["name"]],
            [
                "useradd",
                "--uid",
                str(u["uid"]),
                "--gid",
                str(u["gid"]),
                "--no-create-home",
                "--home-dir",
                u["home"],
                "--shell",
                u["shell"],
                u["name"],
            ],
        ]


def log(message: str) -> None:
    print(f"build-image: {message}", file=sys.stderr, flush=True)


def run(argv: list[str], *, what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run ``argv``; its stdout, or ``BuildError`` naming ``what`` with the tail of its output."""
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-30:])
        raise BuildError(f"{what} failed (exit {out.returncode}): {' '.join(argv[:6])} ...\n{tail}")
    return out.stdout


def arches() -> tuple[str, str]:
    machine = platform.machine()
    if machine not in ARCHES:
        raise BuildError(
            f"no image build for this machine's architecture {machine!r} (known: {list(ARCHES)})"
        )
    return ARCHES[machine]


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


# -- inputs --------------------------------------------------------------------------------


def tool_binaries() -> dict[str, Path]:
    """Name → binary: kustomize and helm (install-control-plane), every install-go-tools tool."""
    bin_dir = Path(
        run([str(ROOT / "scripts" / "install-control-plane")], what="install-control-plane")
        .strip()
        .splitlines()[-1]
    )
    tools = {name: bin_dir / name for name in ("kustomize", "helm")}
    for line in run([str(ROOT / "scripts" / "install-go-tools")], what="install-go-tools").splitlines():
        path = Path(line.strip())
        if path.name in tools:
            raise BuildError(f"two tools named {path.name}: {tools[path.name]} and {path}")
        tools[path.name] = path
    for name, path in tools.items():
        if not os.access(path, os.X_OK):
            raise BuildError(f"tool {name}: {path} is not an executable file")
    return tools


def source_files() -> list[Path]:
    files: list[Path] = []
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            files += [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
        else:
            files.append(p)
    return sorted(files)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def base_argv(recipe: Recipe, out: Path) -> list[str]:
    """The mmdebstrap command making the root filesystem (its text is the base's cache key)."""
    debian_arch, _ = arches()
    blank = " ".join(f'"$1"/etc/{f}' for f in ("resolv.conf", "hostname"))
    user = " && ".join('chroot "$1" ' + " ".join(c) for c in recipe.user_commands)
    return [
        "mmdebstrap",
        "--mode=root",
        "--format=tar",
        f"--variant={recipe.variant}",
        f"--architectures={debian_arch}",
        "--include=" + ",".join(recipe.apt_packages),
        *[f"--dpkgopt=path-exclude={p}" for p in recipe.dpkg_path_exclude],
        *[f"--dpkgopt=path-include={p}" for p in recipe.dpkg_path_include],
        # The build machine's resolver and name are not the image's: the runtime mounts its own.
        f'--customize-hook=for f in {blank}; do : > "$f"; chmod 0644 "$f"; done',
        f"--customize-hook={user}",
        recipe.suite,
        str(out),
    ]


def key_of(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


# -- steps ---------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure_base(recipe: Recipe, cache: Path) -> Path:
    """The Debian root filesystem as a tar, from the cache or made now with mmdebstrap."""
    key = key_of([" ".join(base_argv(recipe, Path("OUT"))).encode()])
    base = cache / f"base-{key}.tar"
    with locked(cache / ".base.lock"):
        if base.is_file():
            log(f"base root filesystem cached ({base.name})")
            return base
        if shutil.which("mmdebstrap") is None:
            raise BuildError("mmdebstrap not found (scripts/build-image installs it with apt-get)")
        start = time.monotonic()
        partial = cache / f"base-{key}.partial"
        partial.unlink(missing_ok=True)  # what a build that died left
        log(f"making the {recipe.suite} root filesystem with mmdebstrap ({', '.join(recipe.apt_packages)})")
        run(base_argv(recipe, partial), what="mmdebstrap")
        partial.rename(base)
        bases = sorted(cache.glob("base-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in bases[KEEP:]:  # older ones are stale; the newest few stay, as for images
            if old != base:
                old.unlink(missing_ok=True)
        log(f"base root filesystem made in {time.monotonic() - start:.0f}s ({base.stat().st_size >> 20} MiB)")
        return base


def platform_args(recipe: Recipe) -> list[str]:
    """pip's target: the image's Python and glibc, whatever the build machine runs."""
    _, wheel_arch = arches()
    major, minor = (int(x) for x in recipe.wheel_glibc.split("."))
    # pip does not widen a given platform to older glibcs: name every one a wheel may target.
    platforms = [f"manylinux_{major}_{m}_{wheel_arch}" for m in range(minor, 4, -1)]
    platforms += [f"{legacy}_{wheel_arch}" for legacy in ("manylinux2014", "manylinux2010", "manylinux1")]
    return [
        "--only-binary=:all:",
        f"--python-version={recipe.wheel_python}",
        "--implementation=cp",
        f"--abi=cp{recipe.wheel_python.replace('.', '')}",
        *[f"--platform={p}" for p in platforms],
    ]


def copy_sources(dest: Path) -> Path:
    for f in source_files():
        target = dest / f.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    return dest


def wheelhouse(recipe: Recipe, work: Path) -> Path:
    """The pinned wheels (from PyPI, through pip's cache) and the agent's own, built here."""
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run(
        [
            *pip,
            "download",
            "--quiet",
            "--no-deps",
            *platform_args(recipe),
            "-r",
            str(LOCK),
            "-d",
            str(wheels),
        ],
        what="downloading the pinned wheels",
    )
    src = copy_sources(work / "src")
    run(
        [*pip, "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(src)],
        what="building the agent's wheel",
    )
    return wheels


def chroot(rootfs: Path, script: str, *, what: str) -> str:
    """``script`` as root inside ``rootfs``, in a private mount namespace (its mounts die with it)."""
    inner = f'mount -t proc proc "$0/proc" && exec chroot "$0" /bin/sh -euc {shell_quote(script)}'
    return run(
        ["unshare", "--mount", "--fork", "--", "/bin/sh", "-euc", inner, str(rootfs)],
        what=what,
        env=CHROOT_ENV,
    )


def shell_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def assemble(recipe: Recipe, base: Path, wheels: Path, tools: dict[str, Path], rootfs: Path) -> None:
    """Base + virtualenv (agent and wheels) + tools, in ``rootfs``."""
    rootfs.mkdir()
    run(["tar", "--numeric-owner", "-xpf", str(base), "-C", str(rootfs)], what="unpacking the base")
    found = chroot(rootfs, "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'", what="python3")
    if found.strip() != recipe.wheel_python:
        raise BuildError(
            f"the {recipe.suite} python3 is {found.strip()}, recipe.toml says {recipe.wheel_python}"
        )
    shutil.copytree(wheels, rootfs / "tmp" / "wheels")
    shutil.copy2(LOCK, rootfs / "tmp" / "requirements.txt")
    venv = recipe.venv
    # The Dockerfile's venv stage runs the same pip commands, with PyPI as its index.
    chroot(
        rootfs,
        f"""
        python3 -m venv {venv}
        {venv}/bin/pip install --quiet --no-cache-dir --no-index --find-links /tmp/wheels \\
          --only-binary=:all: --no-deps -r /tmp/requirements.txt
        {venv}/bin/pip install --quiet --no-cache-dir --no-index --find-links /tmp/wheels \\
          --no-deps gitops-agent
        {venv}/bin/pip check
        rm -rf {venv}/lib/python3*/site-packages/agent/dev
        {venv}/bin/gitops-agent --version
        """,
        what="installing the agent in a virtualenv",
    )
    bin_dir = rootfs / recipe.tools_dir.lstrip("/")
    for name, path in sorted(tools.items()):
        shutil.copyfile(path, bin_dir / name)
        (bin_dir / name).chmod(0o755)
    for scratch in ("tmp", "root", "dev", "run", "var/cache/apt", "var/lib/apt/lists"):
        for entry in (rootfs / scratch).iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def write_blob(blobs: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def layer(rootfs: Path, blobs: Path) -> tuple[str, str, int]:
    """``rootfs`` as one gzip layer: (diff_id, digest, size)."""
    tmp = blobs / "layer.tmp"
    diff = hashlib.sha256()
    tar = subprocess.Popen(
        ["tar", "--create", "--numeric-owner", "--sort=name", "--mtime=@0", "-C", str(rootfs), "."],
        stdout=subprocess.PIPE,
    )
    assert tar.stdout is not None
    with tmp.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz:
        for chunk in iter(lambda: tar.stdout.read(1 << 20), b""):  # type: ignore[union-attr]
            diff.update(chunk)
            gz.write(chunk)
    if tar.wait() != 0:
        raise BuildError(f"tar of the root filesystem failed (exit {tar.returncode})")
    digest = file_digest(tmp)
    size = tmp.stat().st_size
    tmp.rename(blobs / digest)
    return f"sha256:{diff.hexdigest()}", f"sha256:{digest}", size


def oci_config(recipe: Recipe, diff_id: str) -> dict[str, Any]:
    c = recipe.config
    debian_arch, _ = arches()
    return {
        "architecture": debian_arch,
        "os": "linux",
        "config": {
            "User": c["User"],
            "Env": c["Env"],
            "ExposedPorts": {p: {} for p in c["ExposedPorts"]},
            "Entrypoint": c["Entrypoint"],
            "Cmd": c["Cmd"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": f"scripts/build-image ({recipe.suite} {recipe.variant}, mmdebstrap)"}],
    }


def pack(recipe: Recipe, rootfs: Path, out: Path) -> Path:
    """An OCI image archive of ``rootfs`` at ``out/ARCHIVE``; returns its path."""
    layout = out / "layout"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    diff_id, layer_digest, layer_size = layer(rootfs, blobs)
    cfg_digest, cfg_size = write_blob(blobs, json.dumps(oci_config(recipe, diff_id), indent=2).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": cfg_digest,
            "size": cfg_size,
        },
        "layers": [{"mediaType": GZIP, "digest": layer_digest, "size": layer_size}],
    }
    man_digest, man_size = write_blob(blobs, json.dumps(manifest, indent=2).encode())
    tag = version()
    ref = f"{recipe.name}:{tag}"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": manifest["mediaType"],
                "digest": man_digest,
                "size": man_size,
                # containerd (ctr import) reads the full name, podman and skopeo the tag.
                "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index, indent=2))
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    # `docker load` before Docker 25 reads only this file.
    docker = [
        {
            "Config": f"blobs/sha256/{cfg_digest[7:]}",
            "RepoTags": [ref],
            "Layers": [f"blobs/sha256/{layer_digest[7:]}"],
        }
    ]
    (layout / "manifest.json").write_text(json.dumps(docker))
    archive = out / ARCHIVE
    with tarfile.open(archive, "w") as t:
        for f in sorted(layout.rglob("*")):
            info = t.gettarinfo(str(f), arcname=str(f.relative_to(layout)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if f.is_file():
                with f.open("rb") as data:
                    t.addfile(info, data)
            else:
                t.addfile(info)
    shutil.rmtree(layout)
    return archive


def du(path: Path) -> int:
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def build(cache: Path, *, rebuild: bool) -> Path:
    if os.geteuid() != 0:
        raise BuildError(
            "must run as root (mmdebstrap in root mode, chroot, files owned by root and uid 65532)"
        )
    recipe = Recipe.load()
    start = time.monotonic()
    tools = tool_binaries()
    parts = [
        RECIPE.read_bytes(),
        LOCK.read_bytes(),
        Path(__file__).read_bytes(),
        (ROOT / "scripts" / "build-image").read_bytes(),
        version().encode(),
    ]
    parts += [str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() for f in source_files()]
    parts += [f"{name}\0{file_digest(path)}".encode() for name, path in sorted(tools.items())]
    key = key_of(parts)
    dest = cache / key
    archive = dest / ARCHIVE
    with locked(cache / ".image.lock"):
        if archive.is_file() and not rebuild:
            log(f"cached: {archive} ({archive.stat().st_size >> 20} MiB); tools: {', '.join(sorted(tools))}")
            return archive
        base = ensure_base(recipe, cache)
        with tempfile.TemporaryDirectory(prefix="gitops-agent-image.", dir=cache) as tmp:
            work = Path(tmp)
            t = time.monotonic()
            wheels = wheelhouse(recipe, work)
            log(f"wheels ready in {time.monotonic() - t:.0f}s ({len(list(wheels.iterdir()))} wheels)")
            t = time.monotonic()
            rootfs = work / "rootfs"
            assemble(recipe, base, wheels, tools, rootfs)
            size = du(rootfs)
            log(
                f"root filesystem assembled in {time.monotonic() - t:.0f}s ({size >> 20} MiB); "
                f"tools: {', '.join(sorted(tools))}"
            )
            t = time.monotonic()
            partial = work / "out"
            partial.mkdir()
            pack(recipe, rootfs, partial)
            log(f"packed in {time.monotonic() - t:.0f}s")
            if dest.exists():
                shutil.rmtree(dest)
            partial.rename(dest)
        # Older keys are stale builds; the newest few stay, as another checkout may be using one.
        images = [p for p in cache.iterdir() if p.is_dir() and len(p.name) == 16 and (p / ARCHIVE).is_file()]
        images.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for old in images[KEEP:]:
            if old != dest:
                shutil.rmtree(old, ignore_errors=True)
    log(
        f"built {recipe.name}:{version()} in {time.monotonic() - start:.0f}s: {archive} "
        f"({archive.stat().st_size >> 20} MiB archive, {size >> 20} MiB unpacked)"
    )
    return archive


def lock() -> None:
    """Resolve pyproject's dependencies for the image's Python and pin every wheel in LOCK."""
    recipe = Recipe.load()
    with tempfile.TemporaryDirectory(prefix="gitops-agent-lock.") as tmp:
        src = copy_sources(Path(tmp) / "src")
        report = Path(tmp) / "report.json"
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "--disable-pip-version-check",
                "install",
                "--quiet",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                "--target",
                str(Path(tmp) / "t"),
                *platform_args(recipe),
                str(src),
            ],
            what="resolving the dependencies",
        )
        installs = json.loads(report.read_text())["install"]
    pins = sorted(
        f"{i['metadata']['name'].lower()}=={i['metadata']['version']}"
        for i in installs
        if i["metadata"]["name"].lower() != "gitops-agent"
    )
    LOCK.write_text(
        "# Every wheel in the image, pinned: both recipes install exactly these (scripts/build-image,\n"
        "# the Dockerfile). Made by `scripts/build-image --lock` from pyproject.toml's dependencies for\n"
        "# Python "
        + recipe.wheel_python
        + " on glibc "
        + recipe.wheel_glibc
        + " (tools/image/recipe.toml).\n"
        + "".join(p + "\n" for p in pins)
    )
    log(f"pinned {len(pins)} wheels in {LOCK.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/build-image", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lock", action="store_true", help="re-pin tools/image/requirements.txt, build nothing"
    )
    parser.add_argument("--rebuild", action="store_true", help="build the image even if it is cached")
    args = parser.parse_args(argv)
    cache = Path(os.environ.get("GITOPS_AGENT_CACHE", "~/.cache/gitops-agent")).expanduser() / "image"
    try:
        if args.lock:
            lock()
        else:
            print(build(cache, rebuild=args.rebuild))
    except BuildError as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
