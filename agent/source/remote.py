"""Network half of the source stage: ls-remote and fetch with pygit2, in a child process.

``agent.source`` calls ``ls_remote`` and ``fetch``; each runs
``python -m agent.source.remote`` with a JSON request on stdin and reads a JSON
answer from stdout. Why a child process rather than a thread:

* **Bounded time.** libgit2 blocks inside C; a thread stuck on a server that
  accepted the connection and never answers cannot be cancelled. A process
  can: on timeout its whole process group is killed, so ``poll`` never hangs.
  (libgit2's own connect/read timeouts are set too, as a first line.)
* **A private libgit2 home.** libssh2's host-key check reads
  ``<homedir>/.ssh/known_hosts``; the child sets that home to a private copy of
  the configured known_hosts (``gitauth.ssh_home``) without touching the
  agent's process-wide libgit2 settings or ``$HOME``, and without reading the
  user's ``~/.gitconfig`` (no surprise ``insteadOf`` rewrites).

pygit2 stays the Git library on both sides: the child only connects, lists and
fetches into the cache repository; all object reading happens in the parent.
Credentials travel over the stdin pipe (never argv or the environment), and
every message that comes back is scrubbed of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pygit2

from agent import GIT_CHILD
from agent.errors import SourceError
from agent.source.auth import (
    AgentCallbacks,
    AuthRejected,
    Credentials,
    HostKeyRejected,
    is_ssh_url,
    mask_url,
    scrub,
    ssh_home,
)

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

# Lower-cased fragments of libgit2/libssh2 messages, checked in this order.
_AUTH = (
    "authentication",
    "status code: 401",
    "status code: 403",
    "unauthorized",
    "permission denied",
    "no callback set",
    "publickey",
    "credentials",
)
_UNREACHABLE = (
    "failed to resolve",
    "could not resolve",
    "connection refused",
    "failed to connect",
    "timed out",
    "timeout",
    "unreachable",
    "no route",
    "connection reset",
    "broken pipe",
    "early eof",
    "unexpected eof",
    "failed to start ssh session",
    "network",
)
_MISSING = (
    "could not find repository",
    "status code: 404",
    "does not appear to be a git repository",
    "repository not found",
)


class CacheCorrupt(Exception):
    """The local cache repository cannot be read; the caller re-clones it."""


# ---------------------------------------------------------------------------
# Parent side


def ls_remote(git_dir: Path, url: str, creds: Credentials, *, timeout: float) -> dict[str, str]:
    """Advertised refs of the remote, ``{"refs/heads/main": "<sha>", "refs/tags/v1^{}": ...}``."""
    answer = _run({"op": "ls-remote", "git_dir": str(git_dir), "url": url}, url, creds, timeout)
    return {str(k): str(v) for k, v in answer["heads"].items()}


def fetch(
    git_dir: Path, url: str, creds: Credentials, refspecs: list[str], *, depth: int, timeout: float
) -> int:
    """Fetch ``refspecs`` into the cache repository; returns the number of objects received."""
    request = {"op": "fetch", "git_dir": str(git_dir), "url": url, "refspecs": refspecs, "depth": depth}
    return int(_run(request, url, creds, timeout)["received"])


def _run(request: dict[str, Any], url: str, creds: Credentials, timeout: float) -> dict[str, Any]:
    masked = mask_url(url)
    payload = json.dumps({**request, "timeout": timeout, "credentials": creds.to_json()})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])),
        GIT_CHILD: "1",  # no logging set up in the child (agent/__init__.py)
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.source.remote"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group, so a timeout kills ssh helpers too
        text=True,
    )
    try:
        out, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise SourceError(f"git {request['op']} timed out after {timeout:g}s", url=masked) from None
    except BaseException:
        _kill(proc)
        raise
    try:
        answer: dict[str, Any] = json.loads(out)
    except ValueError:
        tail = scrub(err.strip()[-500:], url=url, secrets=creds.secrets())
        raise SourceError(
            f"git {request['op']} helper failed (exit {proc.returncode}): {tail}", url=masked
        ) from None
    if answer.get("ok"):
        return answer
    return _raise(
        str(answer.get("kind")),
        scrub(str(answer.get("message")), url=url, secrets=creds.secrets()),
        request["op"],
        masked,
        creds,
    )


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def _raise(kind: str, message: str, op: str, url: str, creds: Credentials) -> dict[str, Any]:
    if kind == "corrupt":
        raise CacheCorrupt(message)
    if kind == "auth":
        raise SourceError(f"authentication failed: {message} (check source.auth)", url=url, retryable=False)
    if kind == "hostkey":
        where = (
            creds.ssh_known_hosts_file or "(no known_hosts file configured: source.auth.ssh_known_hosts_file)"
        )
        raise SourceError(
            f"SSH host key of {message} is unknown or does not match {where}; refusing to connect",
            url=url,
            retryable=False,
        )
    if kind == "unreachable":
        raise SourceError(f"cannot reach the repository: {message}", url=url)
    if kind == "missing":
        raise SourceError(f"repository not found: {message}", url=url, retryable=False)
    raise SourceError(f"git {op} failed: {message}", url=url)


# ---------------------------------------------------------------------------
# Child side


def classify(error: BaseException, message: str) -> str:
    """Map a pygit2 failure to ``auth``/``hostkey``/``unreachable``/``missing``/``error``.

    libgit2's errors carry no codes, so beyond our own callbacks' exception types the message
    is the only evidence: the one classification by text in the agent (and the one exception
    ``tests/test_typed_results.py`` allows).
    """
    if isinstance(error, AuthRejected):
        return "auth"
    if isinstance(error, HostKeyRejected):
        return "hostkey"
    low = message.lower()
    if "hostkey" in low or "host key" in low:
        return "hostkey"
    for kind, fragments in (("auth", _AUTH), ("unreachable", _UNREACHABLE), ("missing", _MISSING)):
        if any(f in low for f in fragments):
            return kind
    return "error"


def _cache_readable(git_dir: str) -> bool:
    """Whether every local ref of the cache still peels to a readable commit and tree."""
    try:
        repo = pygit2.Repository(git_dir)
        for name in repo.references:
            commit = repo.references[name].peel(pygit2.Commit)
            len(commit.tree)
    except (pygit2.GitError, KeyError, ValueError):
        return False
    return True


def _serve(request: dict[str, Any], home: Path) -> dict[str, Any]:
    url = str(request["url"])
    creds = Credentials.from_json(request["credentials"])
    ssh = is_ssh_url(url)
    # Timeouts in milliseconds; the parent's kill is the backstop for what these miss.
    millis = max(1, int(float(request["timeout"]) * 1000))
    pygit2.settings.server_connect_timeout = millis
    pygit2.settings.server_timeout = millis
    pygit2.settings.homedir = str(ssh_home(creds, home))
    try:
        repo = pygit2.Repository(str(request["git_dir"]))
    except pygit2.GitError as e:
        raise CacheCorrupt(str(e)) from e
    remote = repo.remotes.create_anonymous(url)
    callbacks = AgentCallbacks(creds, ssh=ssh, url_credentials=mask_url(url) != url)
    if request["op"] == "ls-remote":
        heads = remote.list_heads(callbacks=callbacks)
        return {"heads": {h.name: str(h.oid) for h in heads}}
    stats = remote.fetch(list(request["refspecs"]), callbacks=callbacks, depth=int(request.get("depth", 0)))
    return {"received": stats.received_objects}


def main() -> int:
    request = json.loads(sys.stdin.read())
    url = str(request.get("url", ""))
    secrets = Credentials.from_json(request.get("credentials", {})).secrets()
    with tempfile.TemporaryDirectory(prefix="gitops-agent-home-") as home:
        try:
            answer: dict[str, Any] = {"ok": True, **_serve(request, Path(home))}
        except CacheCorrupt as e:
            answer = {"ok": False, "kind": "corrupt", "message": str(e)}
        except Exception as e:  # every failure becomes a classified answer for the parent
            message = str(e) if not isinstance(e, HostKeyRejected) else str(e.args[0])
            kind = classify(e, message)
            if kind == "error" and not _cache_readable(str(request.get("git_dir"))):
                kind = "corrupt"
            answer = {"ok": False, "kind": kind, "message": message}
    answer["message"] = scrub(str(answer.get("message", "")), url=url, secrets=secrets)
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
