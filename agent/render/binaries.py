"""Locate the pinned external binaries (kube-apiserver, etcd, kubectl, kustomize, krender, helm, sops).

``scripts/install-control-plane`` builds them into ``~/.cache/gitops-agent/bin-<key>``, and
``scripts/install-go-tools`` the other pinned Go tools into ``~/.cache/gitops-agent/go-tools/``;
the render stage, the local control plane and the tests find them here. The
``kubectl`` on a machine's PATH is usually not the pinned one, so PATH is only
the last resort, and only for the render tools (a container image ships them there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from agent.errors import LocalClusterError

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install-control-plane"
PATH_FALLBACK = ("kustomize", "krender", "helm", "sops")


def go_tool_names(root: Path = REPO_ROOT) -> set[str]:
    """What ``scripts/install-go-tools`` builds, read where it reads it (``GO_TOOL_<name>`` and
    ``TEST_TOOL_<name>`` pins in tools/versions.env, programs under tools/go/ and benchmarks/), for
    the hint of a missing one."""
    names = {p.parent.name for p in (*root.glob("tools/go/*/go.mod"), *root.glob("benchmarks/*/go.mod"))}
    pins = root / "tools" / "versions.env"
    if pins.is_file():
        for line in pins.read_text().splitlines():
            for prefix in ("GO_TOOL_", "TEST_TOOL_"):
                if line.startswith(prefix) and "=" in line:
                    names.add(line.split("=", 1)[0].removeprefix(prefix))
    return names


def cache_root() -> Path:
    return Path(os.environ.get("GITOPS_AGENT_CACHE", "~/.cache/gitops-agent")).expanduser()


_found: dict[str, Path] = {}


def bin_dir(*, install: bool = False) -> Path | None:
    """The directory of pinned binaries: ``$GITOPS_AGENT_BIN_DIR``, else the newest cached build.

    With ``install=True`` and nothing cached, runs the install script (minutes on a cold machine).
    """
    env = os.environ.get("GITOPS_AGENT_BIN_DIR")
    if env:
        return Path(env)
    if "dir" in _found:  # only a found directory is remembered: a build may finish later
        return _found["dir"]
    if install and INSTALL_SCRIPT.exists():
        out = subprocess.run([str(INSTALL_SCRIPT)], check=False, capture_output=True, text=True)
        if out.returncode != 0:
            raise LocalClusterError(f"scripts/install-control-plane failed:\n{out.stderr[-4000:]}")
        _found["dir"] = Path(out.stdout.strip().splitlines()[-1])
        return _found["dir"]
    builds = sorted(cache_root().glob("bin-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for b in builds:
        if not b.name.endswith(".partial") and (b / "kube-apiserver").exists():
            _found["dir"] = b
            return b
    return None


def cache_clear() -> None:
    """Forget the found directory (tests that change ``GITOPS_AGENT_BIN_DIR``)."""
    _found.clear()


def go_tool(name: str) -> Path | None:
    """The newest build of a tool ``scripts/install-go-tools`` installs (sops, test oracles)."""
    builds = sorted(
        (p / name for p in (cache_root() / "go-tools").glob(f"{name}-*") if not p.name.endswith(".partial")),
        key=lambda p: p.stat().st_mtime if p.exists() else 0.0,
        reverse=True,
    )
    return next((b for b in builds if b.is_file()), None)


def tool(name: str, *, install: bool = False) -> Path:
    """Absolute path of a pinned tool; raises ``LocalClusterError`` naming the fix."""
    d = bin_dir(install=install)
    if d is not None and (d / name).is_file():
        return d / name
    if found_go := go_tool(name):
        return found_go
    if name in PATH_FALLBACK and (found := shutil.which(name)):
        return Path(found)
    script = f"install-go-tools {name}" if name in go_tool_names() else "install-control-plane"
    raise LocalClusterError(f"{name} not found: run scripts/{script} (or set GITOPS_AGENT_BIN_DIR)")
