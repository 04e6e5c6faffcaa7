"""`gitops-agent completion SHELL`: a script the shell really completes with.

Each test sources the printed script in the real shell and asks it to complete, so the
program is called back as the shell calls it (``_GITOPS_AGENT_COMPLETE``), from a
``gitops-agent`` on PATH that runs this checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has a `gitops-agent` running this checkout's code."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    prog = bindir / "gitops-agent"
    # -P: this checkout, whatever directory the shell completes in.
    prog.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -P -m agent.cli "$@"\n')
    prog.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}


def _script(shell: str, env: dict[str, str]) -> str:
    out = subprocess.run(["gitops-agent", "completion", shell], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _bash_complete(env: dict[str, str], *words: str) -> list[str]:
    """COMPREPLY of bash's own completion function for the words typed so far."""
    script = _script("bash", env)
    typed = " ".join(f"'{w}'" for w in words)
    probe = f"{script}\nCOMP_WORDS=(gitops-agent {typed}); COMP_CWORD={len(words)}\n"
    probe += '_gitops_agent_completion gitops-agent\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_bash_completes_commands_options_and_choices(on_path: dict[str, str]) -> None:
    assert _bash_complete(on_path, "st") == ["status"]
    assert set(_bash_complete(on_path, "")) >= {"run", "diff", "status", "sync", "completion", "render"}
    assert "--output" in _bash_complete(on_path, "status", "--o")
    assert _bash_complete(on_path, "completion", "") == ["bash", "zsh", "fish"]


def test_bash_completes_the_day_two_verbs_and_their_choices(on_path: dict[str, str]) -> None:
    assert set(_bash_complete(on_path, "")) >= {"events", "tree", "wait"}
    assert _bash_complete(on_path, "wait", "--for", "") == ["healthy", "synced"]
    assert {"--revision", "--timeout", "--token-file", "--url"} <= set(_bash_complete(on_path, "wait", "--"))
    for verb in ("events", "tree", "wait", "run", "status"):
        assert _bash_complete(on_path, verb, "-o", "") == ["table", "json"], verb


def test_fish_completes_with_its_script(on_path: dict[str, str]) -> None:
    def complete(line: str) -> list[str]:
        probe = f'gitops-agent completion fish | source; complete -C "{line}"'
        out = subprocess.run(["fish", "-c", probe], capture_output=True, text=True, env=on_path, timeout=60)
        assert out.returncode == 0, out.stderr
        return [row.split("\t")[0] for row in out.stdout.splitlines()]

    assert complete("gitops-agent st") == ["status"]
    assert complete("gitops-agent completion ") == ["bash", "fish", "zsh"]


def test_zsh_loads_its_script_and_is_answered_in_its_protocol(on_path: dict[str, str]) -> None:
    """zsh completes only inside its line editor: the script must load under compinit and register
    its function, and the program must answer the zsh protocol the function speaks."""
    probe = "autoload -U compinit; compinit -u; source <(gitops-agent completion zsh)"
    probe += "; whence -w _gitops_agent_completion"
    out = subprocess.run(["zsh", "-c", probe], capture_output=True, text=True, env=on_path, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "_gitops_agent_completion: function"), out.stderr
    env = {
        **on_path,
        "_GITOPS_AGENT_COMPLETE": "zsh_complete",
        "COMP_WORDS": "gitops-agent st",
        "COMP_CWORD": "1",
    }
    out = subprocess.run(["gitops-agent"], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.splitlines()[:2] == ["plain", "status"], out.stderr


def test_an_unknown_shell_is_a_usage_error_naming_the_choices(on_path: dict[str, str]) -> None:
    out = subprocess.run(["gitops-agent", "completion", "tcsh"], capture_output=True, text=True, env=on_path)
    assert out.returncode == 2 and out.stdout == ""
    assert "'bash', 'zsh', 'fish'" in out.stderr
