"""A pinned commit's checkout from what the cache already holds: never the network.

``gitops-agent rollback`` pins an app to an earlier commit so that it works with the Git server
down; the pass (``reconcile.pipeline``) and the command then need that commit's tree without
asking the remote. ``revision_at`` hands it out: a kept checkout (``checkouts/<sha>``, which
``GitSource`` keeps ``keep_checkouts`` of) as it is, else the commit written from the cache
repository (``checkout.materialize``). A shallow source's cache holds only the tips it
fetched, so there only kept checkouts count, and the error says so. Signed sources verify the
commit as a poll does. The read takes no repository lock: a poll may hold it for a whole fetch
(up to its timeout) and a cache repository only grows, so the worst a concurrent re-clone
does is fail this read, which the next pass retries. Using the checkout touches it, so
collection (newest first) keeps it while the pin is in force.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pygit2

from agent.errors import SourceError
from agent.model import Revision
from agent.source.checkout import ObjectUnreadable, checkout_lock, materialize
from agent.source.git import GitSource
from agent.source.signature import SignatureVerifier

__all__ = ["kept_checkouts", "revision_at"]

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_FULL = re.compile(r"^[0-9a-f]{40}$")
#: What a pinned revision's ``ref`` says (reports and logs show it beside the SHA).
PINNED_REF = "rollback pin"


def kept_checkouts(source: GitSource) -> list[str]:
    """The SHAs of the source's complete checkouts, newest first."""
    if not source.checkouts.is_dir():
        return []
    dirs = [d for d in source.checkouts.iterdir() if _FULL.match(d.name) and d.is_dir()]
    dirs.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    return [d.name for d in dirs]


def revision_at(source: GitSource, sha: str) -> Revision:
    """The checked-out commit ``sha`` (full or abbreviated) of ``source`` from its cache alone.

    Raises ``SourceError`` (not retryable) naming the commit and the source when the cache
    cannot produce it, and why (a shallow source, a commit never fetched)."""
    want = sha.strip().lower()
    where = f"source {source.name!r}"
    if not _HEX.match(want):
        raise SourceError(f"{sha!r} is not a commit SHA (7 to 40 hex digits) of {where}", retryable=False)
    kept = kept_checkouts(source)
    hits = [k for k in kept if k.startswith(want)]
    if len(hits) > 1:
        shown = ", ".join(h[:12] for h in hits)
        raise SourceError(f"{want} is ambiguous in {where}: {shown}", retryable=False)
    repo = _open(source)
    commit = _commit(repo, hits[0] if hits else want)
    if not hits and source.config.shallow:
        shown = ", ".join(k[:12] for k in kept) or "none"
        raise SourceError(
            f"commit {want} has no kept checkout of {where}, and the source is shallow (shallow = true): "
            f"its cache holds no history, so only kept checkouts can be rolled back to (kept: {shown})",
            retryable=False,
        )
    if commit is None and not hits:
        raise SourceError(
            f"commit {want} is not in the cache of {where} (never fetched, or not a commit of its "
            f"repository); kept checkouts: {', '.join(k[:12] for k in kept) or 'none'}",
            retryable=False,
        )
    verifier = SignatureVerifier(source.config.verify, timeout=source.config.timeout)
    if verifier.enabled:
        if commit is None:
            unverifiable = f"commit {want} of {where} cannot be verified: not in its cache"
            raise SourceError(unverifiable, retryable=False)
        verifier.verify(commit)
    with checkout_lock(source.checkouts):
        if hits:
            tree = source.checkouts / hits[0]
            os.utime(tree)  # the newest: collection keeps it while the pin holds
        else:
            assert commit is not None and repo is not None
            try:
                tree = materialize(repo, commit, source.checkouts)
            except ObjectUnreadable as e:
                raise SourceError(f"commit {want} of {where} cannot be read from its cache: {e}") from e
    return _revision(commit, hits[0] if hits else str(commit.id) if commit else want, tree)


def _open(source: GitSource) -> pygit2.Repository | None:
    if not source.repo_dir.is_dir():
        return None
    try:
        return pygit2.Repository(str(source.repo_dir))
    except pygit2.GitError:
        return None


def _commit(repo: pygit2.Repository | None, sha: str) -> pygit2.Commit | None:
    if repo is None:
        return None
    try:
        commit = repo.revparse_single(sha).peel(pygit2.Commit)
        len(commit.tree)
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return commit


def _revision(commit: pygit2.Commit | None, sha: str, tree: Path) -> Revision:
    if commit is None:
        return Revision(sha=sha, ref=PINNED_REF, tree=tree)
    author = commit.author
    message = (commit.message or "").strip()
    return Revision(
        sha=str(commit.id),
        ref=PINNED_REF,
        tree=tree,
        author=f"{author.name} <{author.email}>",
        date=datetime.fromtimestamp(author.time, timezone(timedelta(minutes=author.offset))),
        subject=message.splitlines()[0] if message else "",
    )
