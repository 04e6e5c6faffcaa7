"""The source stage: follow a branch, tag or commit and hand out checked-out revisions.

Called by the scheduler (``GitSource.poll`` every ``poll_interval``) and by the
CLI (``GitSource.resolve`` for ``render --revision`` / ``diff --revision``), each
building it with ``GitSource.from_config``.

A poll costs one ``ls-remote`` when nothing changed: the advertised ref is
compared with the cache repository's tracking ref, and only a moved ref is
fetched. The commit is then verified (when ``[source.verify]`` is set) and
checked out atomically into ``<cache_dir>/checkouts/<sha>`` (``agent.source.checkout``),
recycling the oldest checkout that collection would delete so that only changed files are
written.
Any failure raises ``SourceError`` with a credential-free message while
``last_good`` keeps the last revision that passed every check; a cache
repository that cannot be read is deleted and cloned again once per call.

Layout under ``cache_dir``::

    repos/<name>-<hash>.git   bare cache repository, one per URL (credentials stripped)
    repos/<name>-<hash>.git.lock
                              held for a whole poll or resolve: sources (and processes)
                              sharing a URL take turns in the cache repository
    checkouts/<sha>/          the default source's complete trees; .tmp-*/.trash-* are
                              work in progress
    checkouts-<source>/<sha>/ each other named source's, so one source's garbage
                              collection never removes the tree another one hands out

Network operations run in a long-lived, killable worker process of the source's own
(``agent.source.remote``; ``close`` stops it),
credentials and SSH host keys are handled by ``agent.source.auth``, signatures by
``agent.source.signature``.
"""

from __future__ import annotations

import gc
import hashlib
import re
import shutil
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

import pygit2
import structlog

from agent.config.types import DEFAULT_SOURCE, Config, SourceConfig
from agent.errors import SourceError
from agent.model import Revision
from agent.source import remote as gitremote
from agent.source.auth import is_local_url, load_credentials, mask_url, strip_credentials
from agent.source.checkout import (
    ObjectUnreadable,
    checkout_lock,
    collect,
    file_lock,
    materialize,
    surplus,
)
from agent.source.remote import CacheCorrupt
from agent.source.signature import SignatureVerifier

__all__ = ["GitSource", "Logger", "cache_dir_for", "checkouts_dir"]

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_UNSHALLOW = 2**31 - 1  # libgit2's GIT_FETCH_DEPTH_UNSHALLOW
_ALL_REFS = ["+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"]


class Logger(Protocol):
    """The structlog-style logger the stage writes to (event name plus key/values)."""

    def debug(self, event: str, **kw: Any) -> Any: ...
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...


@dataclass(frozen=True)
class _Target:
    """A remote ref to follow: ``refs/heads/main`` → tracked locally as ``refs/remotes/origin/main``."""

    remote_ref: str
    local_ref: str

    @classmethod
    def of(cls, ref: str) -> _Target:
        if ref.startswith("refs/heads/"):
            return cls(ref, "refs/remotes/origin/" + ref.removeprefix("refs/heads/"))
        return cls(ref, ref)  # tags and other refs keep their own name

    @property
    def refspec(self) -> str:
        return f"+{self.remote_ref}:{self.local_ref}"


def cache_dir_for(config: Config) -> Path:
    """Where the Git cache of ``config`` lives: ``git/`` under ``[agent] cache_dir``."""
    return Path(config.agent.cache_dir).expanduser() / "git"


def checkouts_dir(cache_dir: Path, name: str = DEFAULT_SOURCE) -> Path:
    """Where source ``name`` writes its checkouts: its own directory, so that garbage
    collection (``keep_checkouts``, newest first) never counts or removes another
    source's trees. The default source keeps the pre-sources ``checkouts/``."""
    return cache_dir / ("checkouts" if name == DEFAULT_SOURCE else f"checkouts-{name}")


class GitSource:
    """Delivers checked-out revisions of one repository; see the module docstring."""

    def __init__(
        self,
        config: SourceConfig,
        cache_dir: Path,
        *,
        name: str = DEFAULT_SOURCE,
        log: Logger | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self.url = config.url
        self.masked_url = mask_url(config.url)
        self.cache_dir = Path(cache_dir).expanduser()
        self.repo_dir = self.cache_dir / "repos" / _repo_name(config.url)
        # Beside the repository, not in it: re-cloning a corrupt cache deletes the repository.
        self.repo_lock = self.repo_dir.with_name(self.repo_dir.name + ".lock")
        self.checkouts = checkouts_dir(self.cache_dir, name)
        self.log: Logger = log or structlog.get_logger("agent.source")
        self.fetch_count = 0
        self.last_error: SourceError | None = None
        self._last_good: Revision | None = None
        self._verifier = SignatureVerifier(config.verify, timeout=config.timeout)
        self._verified: set[str] = set()
        self._lock = threading.Lock()
        self._remote = gitremote.GitRemote()

    @classmethod
    def from_config(
        cls, config: Config, name: str = DEFAULT_SOURCE, *, log: Logger | None = None
    ) -> GitSource:
        """The source ``name`` (``[source]`` by default), cached under ``[agent] cache_dir``: one way to
        build it, for every caller."""
        return cls(config.source_named(name), cache_dir_for(config), name=name, log=log)

    @property
    def last_good(self) -> Revision | None:
        """The last revision ``poll`` delivered; kept when a later poll fails."""
        return self._last_good

    @property
    def worker_pid(self) -> int | None:
        """The process id of this source's Git worker while one runs (tests, benchmarks)."""
        return self._remote.worker.pid

    @property
    def worker_starts(self) -> int:
        """How many Git worker processes this source has started (one, unless one hung or died)."""
        return self._remote.worker.started

    def close(self) -> None:
        """Stop this source's Git worker process (a later poll would start another)."""
        self._remote.close()

    # -- public verbs ---------------------------------------------------------

    def poll(self) -> Revision:
        """Follow the configured ref; fetch only if it moved. Raises ``SourceError``."""
        with self._lock, file_lock(self.repo_lock):
            try:
                revision = self._recovering(self._poll_once)
            except SourceError as e:
                self.last_error = e
                self.log.warning(
                    "source.poll_failed",
                    url=self.masked_url,
                    error=str(e),
                    retryable=e.retryable,
                    last_good=self._last_good.sha if self._last_good else None,
                )
                raise
            self.last_error = None
            if self._last_good is None or self._last_good.sha != revision.sha:
                self.log.info(
                    "source.revision",
                    url=self.masked_url,
                    ref=revision.ref,
                    sha=revision.sha,
                    subject=revision.subject,
                )
            self._last_good = revision
            return revision

    def resolve(self, ref: str) -> Revision:
        """Check out an arbitrary branch, tag, full ref or (short) SHA, with ``~n``/``^`` suffixes."""
        with self._lock, file_lock(self.repo_lock):
            return self._recovering(lambda: self._resolve_once(ref.strip()))

    # -- poll -------------------------------------------------------------------

    def _poll_once(self) -> Revision:
        repo = self._open_repo()
        if self.config.commit:
            commit = self._commit_by_sha(repo, self.config.commit)
            return self._deliver(repo, commit, self.config.commit)
        kind, name = ("tag", self.config.tag) if self.config.tag else ("branch", self.config.branch or "main")
        target = _Target.of(f"refs/{'tags' if kind == 'tag' else 'heads'}/{name}")
        advertised = self._ls_remote(repo)
        if target.remote_ref not in advertised:
            raise SourceError(
                f"{kind} {name!r} not found on the remote", url=self.masked_url, retryable=False
            )
        commit = self._follow(repo, target, advertised[target.remote_ref])
        return self._deliver(repo, commit, target.remote_ref)

    def _follow(self, repo: pygit2.Repository, target: _Target, remote_oid: str) -> pygit2.Commit:
        """Bring ``target.local_ref`` to ``remote_oid`` (fetching only if it differs) and peel it."""
        before = _ref_oid(repo, target.local_ref)
        if before != remote_oid or not _has_object(repo, remote_oid):
            self._fetch(repo, [target.refspec])
            self._note_rewrite(repo, target, before, remote_oid)
        return _peel_commit(repo, target.local_ref)

    def _note_rewrite(self, repo: pygit2.Repository, target: _Target, before: str | None, after: str) -> None:
        if before is None or before == after:
            return
        try:
            old, new = _peel_commit(repo, before), _peel_commit(repo, after)
            rewritten = old.id != new.id and not repo.descendant_of(new.id, old.id)
        except (CacheCorrupt, pygit2.GitError, KeyError, ValueError):
            rewritten = True  # the old commit is gone or unreachable: history was not simply extended
        if self.config.shallow and target.remote_ref.startswith("refs/heads/"):
            # A shallow cache lacks the history that would tell a rewrite from a fast-forward.
            self.log.debug("source.ancestry_unknown", ref=target.remote_ref, previous=before, current=after)
        elif rewritten:
            self.log.warning(
                "source.history_rewritten",
                url=self.masked_url,
                ref=target.remote_ref,
                previous=before,
                current=after,
            )
        elif target.remote_ref.startswith("refs/tags/"):
            self.log.warning(
                "source.tag_moved", url=self.masked_url, ref=target.remote_ref, previous=before, current=after
            )

    # -- resolve -----------------------------------------------------------------

    def _resolve_once(self, spec: str) -> Revision:
        if not spec:
            raise SourceError("empty revision", url=self.masked_url, retryable=False)
        # "main~2", "v1^": resolve the name (possibly remotely), then apply the suffix locally.
        split = re.match(r"^([^~^]+)(.*)$", spec)
        base, suffix = (split.group(1), split.group(2)) if split else (spec, "")
        repo = self._open_repo()
        commit = _local_commit(repo, base) if _HEX.match(base) else None
        if commit is None:
            commit = self._resolve_remote(repo, base)
        if suffix:
            try:
                commit = repo.revparse_single(f"{commit.id}{suffix}").peel(pygit2.Commit)
            except (KeyError, pygit2.GitError, ValueError) as e:
                raise SourceError(
                    f"cannot resolve {spec!r}: {e}", url=self.masked_url, retryable=False
                ) from None
        return self._deliver(repo, commit, spec, current=False)

    def _resolve_remote(self, repo: pygit2.Repository, name: str) -> pygit2.Commit:
        advertised = self._ls_remote(repo)
        candidates = (
            [name]
            if name.startswith("refs/") or name == "HEAD"
            else [f"refs/heads/{name}", f"refs/tags/{name}"]
        )
        for ref in candidates:
            if ref in advertised:
                target = _Target(ref, "refs/remotes/origin/HEAD") if ref == "HEAD" else _Target.of(ref)
                return self._follow(repo, target, advertised[ref])
        if _HEX.match(name):
            return self._commit_by_sha(repo, name, advertised)
        raise SourceError(
            f"no branch, tag or commit named {name!r} on the remote", url=self.masked_url, retryable=False
        )

    def _commit_by_sha(
        self, repo: pygit2.Repository, sha: str, advertised: dict[str, str] | None = None
    ) -> pygit2.Commit:
        """A pinned commit: no network at all once it is in the cache."""
        sha = sha.lower()
        if (commit := _local_commit(repo, sha)) is not None:
            return commit
        advertised = self._ls_remote(repo) if advertised is None else advertised
        named = [ref for ref, oid in advertised.items() if oid.startswith(sha) and not ref.endswith("^{}")]
        self._fetch(repo, [_Target.of(named[0]).refspec] if named else _ALL_REFS)
        if (commit := _local_commit(repo, sha)) is None and (named or self.config.shallow):
            # Not a tip, or older than a shallow fetch reaches: the whole history may hold it.
            self._fetch(repo, _ALL_REFS, full=True)
            commit = _local_commit(repo, sha)
        if commit is None:
            raise SourceError(
                f"commit {sha} is not reachable from any branch or tag of the remote",
                url=self.masked_url,
                retryable=False,
            )
        return commit

    # -- shared steps ------------------------------------------------------------

    def _deliver(
        self, repo: pygit2.Repository, commit: pygit2.Commit, ref: str, *, current: bool = True
    ) -> Revision:
        """Verify, check out and collect; the result is what callers may render."""
        sha = str(commit.id)
        if (
            current
            and self._last_good is not None
            and self._last_good.sha == sha
            and self._last_good.tree.is_dir()
        ):
            return self._last_good  # nothing moved: no verification, no disk work
        self._verify(commit)
        with checkout_lock(self.checkouts):
            protect = {sha} | ({self._last_good.sha} if self._last_good else set())
            # The oldest tree collection would delete becomes the new one: only changed files written.
            spare = surplus(self.checkouts, keep=self.config.keep_checkouts, protect=protect)
            try:
                tree = materialize(repo, commit, self.checkouts, spare=spare[0] if spare else None)
            except ObjectUnreadable as e:
                raise CacheCorrupt(str(e)) from e
            removed = collect(self.checkouts, keep=self.config.keep_checkouts, protect=protect)
        if removed:
            self.log.debug("source.checkouts_collected", removed=removed)
        return _revision(commit, ref, tree)

    def _verify(self, commit: pygit2.Commit) -> None:
        sha = str(commit.id)
        if not self._verifier.enabled or sha in self._verified:
            return
        try:
            signed = self._verifier.verify(commit)
        except SourceError as e:
            raise SourceError(str(e), url=self.masked_url, retryable=e.retryable) from None
        self._verified.add(sha)
        self.log.info("source.signature_verified", sha=sha, method=signed.method, signer=signed.signer)

    def _ls_remote(self, repo: pygit2.Repository) -> dict[str, str]:
        creds = load_credentials(self.config.auth, self.url)
        return self._remote.ls_remote(self.repo_dir, self.url, creds, timeout=self.config.timeout)

    def _fetch(self, repo: pygit2.Repository, refspecs: list[str], *, full: bool = False) -> None:
        creds = load_credentials(self.config.auth, self.url)
        # libgit2's local transport cannot fetch shallow; a local clone costs no network anyway.
        depth = 1 if self.config.shallow and not full and not is_local_url(self.url) else 0
        if full and repo.is_shallow:
            depth = _UNSHALLOW  # depth 0 would keep the existing shallow boundary
        self.fetch_count += 1
        received = self._remote.fetch(
            self.repo_dir, self.url, creds, refspecs, depth=depth, timeout=self.config.timeout
        )
        self.log.info("source.fetched", url=self.masked_url, refspecs=refspecs, objects=received, depth=depth)

    def _open_repo(self) -> pygit2.Repository:
        if not self.repo_dir.exists():
            self.repo_dir.parent.mkdir(parents=True, exist_ok=True)
            return pygit2.init_repository(str(self.repo_dir), bare=True)
        try:
            return pygit2.Repository(str(self.repo_dir))
        except pygit2.GitError as e:
            raise CacheCorrupt(f"cannot open the cache repository: {e}") from e

    def _recovering(self, attempt: Any) -> Revision:
        """Run ``attempt``; if the cache repository is unreadable, delete it and try once more."""
        try:
            result: Revision = attempt()
            return result
        except CacheCorrupt as e:
            reason = str(e)
        self.log.warning("source.cache_corrupt", url=self.masked_url, path=str(self.repo_dir), error=reason)
        # libgit2 caches open pack files by path, process-wide: every handle on the broken
        # repository (some held by traceback cycles) must be gone before the same path is re-cloned.
        gc.collect()
        self._remote.restart()  # the worker's libgit2 holds the same process-wide pack cache
        self._reset_repo()
        try:
            result = attempt()
            return result
        except CacheCorrupt as e:
            raise SourceError(
                f"cache repository {self.repo_dir} still unreadable after re-cloning: {e}",
                url=self.masked_url,
            ) from None

    def _reset_repo(self) -> None:
        if self.repo_dir.is_dir() and not self.repo_dir.is_symlink():
            shutil.rmtree(self.repo_dir)
        elif self.repo_dir.exists() or self.repo_dir.is_symlink():
            self.repo_dir.unlink()


# -- helpers -----------------------------------------------------------------------


def _repo_name(url: str) -> str:
    """``repos/<last path part>-<hash of the credential-free URL>.git``: readable and collision-free."""
    clean = strip_credentials(url).rstrip("/")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", clean.rsplit("/", 1)[-1].rsplit(":", 1)[-1]).removesuffix(".git")
    return f"{stem[:40] or 'repo'}-{hashlib.sha256(clean.encode()).hexdigest()[:16]}.git"


def _ref_oid(repo: pygit2.Repository, name: str) -> str | None:
    try:
        ref = repo.references.get(name)
    except (pygit2.GitError, ValueError) as e:
        raise CacheCorrupt(f"reference {name} is unreadable: {e}") from e
    return str(ref.target) if ref is not None else None


def _has_object(repo: pygit2.Repository, oid: str) -> bool:
    try:
        return repo.get(oid) is not None
    except (pygit2.GitError, ValueError) as e:
        raise CacheCorrupt(f"object {oid} is unreadable: {e}") from e


def _peel_commit(repo: pygit2.Repository, name_or_oid: str) -> pygit2.Commit:
    try:
        commit = repo.revparse_single(name_or_oid).peel(pygit2.Commit)
        len(commit.tree)  # the tree must be readable too, or the checkout would fail later
    except (KeyError, pygit2.GitError, ValueError) as e:
        raise CacheCorrupt(f"{name_or_oid} cannot be read from the cache: {e}") from e
    return commit


def _local_commit(repo: pygit2.Repository, sha: str) -> pygit2.Commit | None:
    """The commit with this (abbreviated) SHA if the cache has it, else ``None``."""
    try:
        obj = repo.revparse_single(sha)
    except (KeyError, ValueError, pygit2.GitError):
        return None  # absent or ambiguous: ask the remote
    try:
        commit = obj.peel(pygit2.Commit)
        len(commit.tree)
    except (KeyError, pygit2.GitError, ValueError) as e:
        raise CacheCorrupt(f"commit {sha} cannot be read from the cache: {e}") from e
    return commit


def _revision(commit: pygit2.Commit, ref: str, tree: Path) -> Revision:
    author = commit.author
    tz = timezone(timedelta(minutes=author.offset))
    return Revision(
        sha=str(commit.id),
        ref=ref,
        tree=tree,
        author=f"{author.name} <{author.email}>",
        date=datetime.fromtimestamp(author.time, tz),
        subject=(commit.message or "").strip().splitlines()[0] if (commit.message or "").strip() else "",
    )
