"""Network half of the source stage: ls-remote and fetch with pygit2, in a long-lived child process.

``agent.source`` holds one ``GitRemote`` per source and calls its ``ls_remote`` and ``fetch``;
each sends a JSON request line to a worker running ``python -m agent.source.remote``
(``agent.source.worker``), started on the first request and reused by every later poll. Why a
child process rather than a thread:

* **Bounded time.** libgit2 blocks inside C; a thread stuck on a server that
  accepted the connection and never answers cannot be cancelled. A process
  can: past the deadline its whole process group is killed, so ``poll`` never hangs,
  and the next request starts a fresh worker. (libgit2's own connect/read timeouts are
  set too, as a first line.)
* **A private libgit2 home.** libssh2's host-key check reads
  ``<homedir>/.ssh/known_hosts``; the child sets that home to a private copy of
  the configured known_hosts (``gitauth.ssh_home``, copied again for every request)
  without touching the agent's process-wide libgit2 settings or ``$HOME``, and without
  reading the user's ``~/.gitconfig`` (no surprise ``insteadOf`` rewrites).

pygit2 stays the Git library on both sides: the child only connects, lists and
fetches into the cache repository; all object reading happens in the parent.
Credentials travel in each request over the stdin pipe (never argv or the environment),
and every message that comes back is scrubbed of them. A worker that dies or is killed
mid-request fails that request with a ``SourceError``; it is never the agent's crash.
"""

from __future__ import annotations

import gc
import json
import os
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
from agent.source.worker import Worker, WorkerDied, WorkerTimeout

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


def _child_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])),
        GIT_CHILD: "1",  # no logging set up in the child (agent/__init__.py)
    }


class GitRemote:
    """The network operations of one source, answered by its own long-lived worker process."""

    def __init__(self) -> None:
        self.worker = Worker("agent.source.remote", _child_env())

    def ls_remote(self, git_dir: Path, url: str, creds: Credentials, *, timeout: float) -> dict[str, str]:
        """Advertised refs of the remote, ``{"refs/heads/main": "<sha>", "refs/tags/v1^{}": ...}``."""
        answer = self._run({"op": "ls-remote", "git_dir": str(git_dir), "url": url}, url, creds, timeout)
        return {str(k): str(v) for k, v in answer["heads"].items()}

    def fetch(
        self, git_dir: Path, url: str, creds: Credentials, refspecs: list[str], *, depth: int, timeout: float
    ) -> int:
        """Fetch ``refspecs`` into the cache repository; returns the number of objects received."""
        request = {"op": "fetch", "git_dir": str(git_dir), "url": url, "refspecs": refspecs, "depth": depth}
        return int(self._run(request, url, creds, timeout)["received"])

    def restart(self) -> None:
        """Start the next request in a fresh worker (after the cache repository was re-cloned:
        libgit2 keeps pack files open by path, process-wide)."""
        self.worker.close()

    def close(self) -> None:
        """Stop the worker; a later request would start another."""
        self.worker.close()

    def _run(self, request: dict[str, Any], url: str, creds: Credentials, timeout: float) -> dict[str, Any]:
        masked = mask_url(url)
        op = request["op"]
        try:
            answer = self.worker.request(
                {**request, "timeout": timeout, "credentials": creds.to_json()}, timeout=timeout
            )
        except WorkerTimeout:
            raise SourceError(f"git {op} timed out after {timeout:g}s", url=masked) from None
        except WorkerDied as e:
            detail = scrub(e.detail, url=url, secrets=creds.secrets())
            raise SourceError(f"git {op} helper process failed ({detail})", url=masked) from None
        if answer.get("ok"):
            return answer
        return _raise(
            str(answer.get("kind")),
            scrub(str(answer.get("message")), url=url, secrets=creds.secrets()),
            op,
            masked,
            creds,
        )


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


def answer(request: dict[str, Any], home: Path) -> dict[str, Any]:
    """One request's answer: ``{"ok": true, ...}`` or a classified, scrubbed failure."""
    url = str(request.get("url", ""))
    secrets = Credentials.from_json(request.get("credentials", {})).secrets()
    try:
        result: dict[str, Any] = {"ok": True, **_serve(request, home)}
    except CacheCorrupt as e:
        result = {"ok": False, "kind": "corrupt", "message": str(e)}
    except Exception as e:  # every failure becomes a classified answer for the parent
        message = str(e) if not isinstance(e, HostKeyRejected) else str(e.args[0])
        kind = classify(e, message)
        if kind == "error" and not _cache_readable(str(request.get("git_dir"))):
            kind = "corrupt"
        result = {"ok": False, "kind": kind, "message": message}
    result["message"] = scrub(str(result.get("message", "")), url=url, secrets=secrets)
    return result


def main() -> int:
    """Answer request lines from stdin until it closes (the parent stopped or died)."""
    with tempfile.TemporaryDirectory(prefix="gitops-agent-home-") as home:
        sys.stdout.buffer.write(b'{"ready": true}\n')  # imports done: requests' deadlines start now
        sys.stdout.buffer.flush()
        for line in sys.stdin.buffer:
            reply = answer(json.loads(line), Path(home))
            sys.stdout.buffer.write(json.dumps(reply).encode() + b"\n")
            sys.stdout.buffer.flush()
            # The request's repository handles (some held by traceback cycles) go before the next
            # one; while the parent reads the answer, not before it.
            gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
