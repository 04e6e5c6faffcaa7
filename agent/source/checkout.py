"""Atomic per-commit checkouts and their garbage collection.

Called by ``agent.source`` after a commit was fetched (and verified). A commit
is written to ``checkouts/.tmp-<sha>-<random>/``, its symlinks that leave the tree
replaced by dangling ones (``check_symlinks``), made durable, and only then renamed to
``checkouts/<sha>``.
So ``checkouts/<sha>`` existing means the tree is complete: a crash part-way
leaves only a ``.tmp-*`` directory, which no reader ever looks at and the
next collection removes. Removal is the same in reverse (rename to
``.trash-*`` first), so a half-deleted tree never looks complete either.

Incremental: when collection would remove an old checkout anyway (``surplus``), that tree
is recycled instead of deleted and a new one written: renamed to ``.tmp-*`` first (so it
stops looking complete at once), only the entries that differ between its commit and the
new one are removed and written (subtrees with the same id are not even read), then its
whole shape (every path and kind) is compared with the new commit's tree and its symlinks
checked, and it is renamed into place as above. A commit changing one file of 5,000 costs
one file write instead of 5,000 writes plus 5,000 unlinks. A recycled tree whose shape does
not match (someone added or removed a file in it) is discarded and the commit written whole.

The tree is written from the object database by this module rather than by
libgit2's checkout: the renderer must see the committed bytes (no
``.gitattributes`` filters), and every entry name and symlink is checked on
the way. All of it runs under ``checkout_lock`` so that two processes sharing
a cache never collect each other's work in progress.

A checkout being read (rendered) is held with a shared ``flock`` on its directory
(``reading``); collection and recycling take each candidate with an exclusive lock that never
waits, and pass over one a reader holds, so a render never sees its tree change or vanish
underneath it, whatever the polls deliver meanwhile.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pygit2
from pygit2.enums import FileMode

from agent.errors import SourceError

_O = TypeVar("_O", bound=pygit2.Object)
_SHA_DIR = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_TEMP_PREFIXES = (".tmp-", ".trash-")


class ObjectUnreadable(Exception):
    """An object of the commit could not be read from the cache (it is corrupt)."""


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``path``: between processes, and between threads of one process.

    Each call opens the file anew, and ``flock`` locks belong to the open file
    description, so two threads of one process exclude each other as two processes do.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def checkout_lock(checkouts: Path) -> Iterator[None]:
    """Exclusive lock over ``checkouts/`` across threads' owners and processes (``flock``)."""
    with file_lock(checkouts / ".lock"):
        yield


def materialize(
    repo: pygit2.Repository, commit: pygit2.Commit, checkouts: Path, *, spare: Path | None = None
) -> Path:
    """Return ``checkouts/<sha>``, writing it atomically if it does not exist yet.

    ``spare``, a complete checkout collection would remove (``surplus``), is recycled into the
    new tree when it can be; otherwise it is left for collection. Raises ``SourceError`` for an
    unsafe entry name (a symlink leaving the tree is made dangling instead: ``check_symlinks``),
    and ``ObjectUnreadable`` when the cache cannot produce the commit's objects. Call under
    ``checkout_lock``.
    """
    sha = str(commit.id)
    final = checkouts / sha
    if final.is_dir():
        os.utime(final)  # recently used: collection keeps the newest
        return final
    if spare is not None and _recycle(repo, commit, spare, final):
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{sha[:12]}-", dir=checkouts))
    try:
        write_tree(repo, commit.tree, tmp)
        check_symlinks(tmp)
        _fsync_tree(tmp)
        tmp.chmod(0o755)
        os.rename(tmp, final)
        _fsync_dir(checkouts)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _recycle(repo: pygit2.Repository, commit: pygit2.Commit, spare: Path, final: Path) -> bool:
    """Turn the complete checkout ``spare`` into ``final`` (see the module docstring).

    False, with ``spare`` gone or untouched, when it cannot serve: its commit is not in the cache
    or its files are not its commit's. A ``SourceError`` about the new tree is raised as is.
    """
    try:
        spare_commit = repo.get(spare.name)
        old = spare_commit.tree if isinstance(spare_commit, pygit2.Commit) else None
    except (KeyError, pygit2.GitError, ValueError):
        old = None
    if old is None:
        return False  # e.g. history rewritten and the old commit gone: collection removes it
    tmp = spare.with_name(f".tmp-{final.name[:12]}-r{os.getpid()}-{id(spare):x}")
    with _unread(spare) as free:
        if not free:
            return False  # being rendered: written whole instead, the spare left for later
        try:
            os.rename(spare, tmp)  # from here on it is work in progress, never a complete tree
        except FileNotFoundError:
            return False
    try:
        written: list[Path] = []
        update_tree(repo, old, commit.tree, tmp, written)
        links: list[Path] = []
        if _shape(tmp) != _expected_shape(repo, commit.tree, links):
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        check_symlinks(tmp, links=links)
        _fsync_written(tmp, written)
        tmp.chmod(0o755)
        os.utime(tmp)  # the newest checkout for collection, whatever the spare's age
        os.rename(tmp, final)
        _fsync_dir(final.parent)
    except SourceError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except (ObjectUnreadable, OSError):
        # The new commit's objects are unreadable or the spare was not what it claimed: the
        # whole write that follows gives the real answer.
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def update_tree(
    repo: pygit2.Repository, old: pygit2.Tree, new: pygit2.Tree, directory: Path, written: list[Path]
) -> None:
    """Make ``directory``, a checkout of ``old``, one of ``new``: only differing entries change.

    ``written`` collects every path created (files, links, directories) for the durability step.
    """
    if old.id == new.id:
        return
    wanted = {entry.name or "": entry for entry in new}
    previous = {entry.name or "": entry for entry in old}
    for name in previous.keys() - wanted.keys():
        _remove_entry(directory / name)
    for name, entry in wanted.items():
        _check_name(name, directory)
        path = directory / name
        before = previous.get(name)
        if before is not None and before.id == entry.id and before.filemode == entry.filemode:
            continue
        if before is not None and before.filemode == FileMode.TREE and entry.filemode == FileMode.TREE:
            update_tree(
                repo, _read(repo, before.id, pygit2.Tree), _read(repo, entry.id, pygit2.Tree), path, written
            )
            continue
        if before is not None:
            _remove_entry(path)
        _write_entry(repo, entry, path)
        written.append(path)


def _remove_entry(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _shape(root: Path, prefix: str = "") -> dict[str, str]:
    """Every path under ``root`` with its kind (``d``, ``f``, ``l``), from the directory entries
    (their types come with the listing: no stat per file)."""
    shape: dict[str, str] = {}
    with os.scandir(root) as entries:
        for entry in entries:
            rel = prefix + entry.name
            if entry.is_symlink():
                shape[rel] = "l"
            elif entry.is_dir(follow_symlinks=False):
                shape[rel] = "d"
                shape.update(_shape(Path(entry.path), rel + os.sep))
            else:
                shape[rel] = "f" if entry.is_file(follow_symlinks=False) else "?"
    return shape


def _expected_shape(
    repo: pygit2.Repository, tree: pygit2.Tree, links: list[Path], prefix: str = ""
) -> dict[str, str]:
    """The shape ``write_tree`` gives ``tree``; ``links`` receives its symlinks' relative paths."""
    shape: dict[str, str] = {}
    for entry in tree:
        rel = prefix + (entry.name or "")
        mode = entry.filemode
        if mode == FileMode.TREE:
            shape[rel] = "d"
            shape.update(_expected_shape(repo, _read(repo, entry.id, pygit2.Tree), links, rel + os.sep))
        elif mode == FileMode.COMMIT:
            shape[rel] = "d"
        elif mode == FileMode.LINK:
            shape[rel] = "l"
            links.append(Path(rel))
        else:
            shape[rel] = "f"
    return shape


def write_tree(repo: pygit2.Repository, tree: pygit2.Tree, directory: Path) -> None:
    """Write ``tree`` into the existing, empty ``directory``."""
    for entry in tree:
        name = entry.name or ""
        _check_name(name, directory)
        _write_entry(repo, entry, directory / name)


def _write_entry(repo: pygit2.Repository, entry: pygit2.Object, path: Path) -> None:
    mode = entry.filemode
    if mode == FileMode.TREE:
        path.mkdir(mode=0o755)
        write_tree(repo, _read(repo, entry.id, pygit2.Tree), path)
    elif mode in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE):
        write_blob(path, _read(repo, entry.id, pygit2.Blob).data, executable=mode == FileMode.BLOB_EXECUTABLE)
    elif mode == FileMode.LINK:
        os.symlink(os.fsdecode(_read(repo, entry.id, pygit2.Blob).data), path)
    elif mode == FileMode.COMMIT:
        path.mkdir(mode=0o755)  # a submodule: git leaves an empty directory too
    else:
        raise SourceError(f"unsupported entry {entry.name!r} (mode {int(mode):o})", retryable=False)


def write_blob(path: Path, data: bytes, *, executable: bool) -> None:
    """Create one file; O_EXCL|O_NOFOLLOW so a duplicate or symlinked name can never redirect a write."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o755 if executable else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _read(repo: pygit2.Repository, oid: pygit2.Oid, kind: type[_O]) -> _O:
    try:
        obj = repo[oid]
    except (KeyError, pygit2.GitError, ValueError) as e:
        raise ObjectUnreadable(f"object {oid} cannot be read: {e}") from e
    if not isinstance(obj, kind):
        raise ObjectUnreadable(f"object {oid} is a {type(obj).__name__}, expected {kind.__name__}")
    return obj


def _check_name(name: str, directory: Path) -> None:
    # Valid Git trees never hold these; a crafted one could, to write outside the checkout.
    if name in ("", ".", "..") or "/" in name or "\0" in name or name.lower() == ".git":
        raise SourceError(f"refusing unsafe entry name {name!r} in the commit's tree", retryable=False)


#: What a symlink leaving the checkout is replaced with: a target that does not exist, in the
#: link's own directory, so whatever reads through the link finds nothing (never a file outside)
#: and the renderer names the link ("dangling symlink") for the apps that contain or reach it.
REFUSED_LINK = ".gitops-agent-refused-symlink-pointing-outside-the-repository"


def check_symlinks(root: Path, *, links: list[Path] | None = None) -> list[str]:
    """Replace every symlink under ``root`` that resolves outside it by one to ``REFUSED_LINK``;
    return their relative paths.

    Resolved on the real filesystem (``realpath``), not lexically: ``a -> ..`` inside
    ``d/`` is harmless, but ``d/b -> a/..`` then leaves the tree, which only a real
    resolution sees. ``links`` (relative paths), when given, are all the symlinks there are:
    the tree's shape was checked against its commit, so no walk is needed to find them.
    Not an error: one such link fails only the apps whose paths contain or reach it (the
    renderer refuses a dangling link there), not every app of the repository.
    """
    base = os.path.realpath(root)
    if links is None:
        found = [
            os.path.join(dirpath, name)
            for dirpath, dirnames, filenames in os.walk(root)
            for name in dirnames + filenames
            if os.path.islink(os.path.join(dirpath, name))
        ]
    else:
        found = [os.path.join(root, link) for link in links]
    refused: list[str] = []
    while True:  # a replaced link can change where another resolves: again until none leaves
        leaving = [p for p in found if _leaves(p, base) and os.readlink(p) != REFUSED_LINK]
        if not leaving:
            return refused
        for path in leaving:
            os.unlink(path)
            os.symlink(REFUSED_LINK, path)
            refused.append(os.path.relpath(path, root))


def _leaves(path: str, base: str) -> bool:
    resolved = os.path.realpath(path)
    return resolved != base and not resolved.startswith(base + os.sep)


def _fsync_tree(root: Path) -> None:
    # Durable before the rename publishes it: after a power loss a complete-looking
    # tree must not hold empty files. One syncfs(2) of the cache's filesystem costs
    # one flush instead of one per file (5,000 fsyncs took 0.8 s on a 5,000-file tree).
    if _syncfs(root):
        return
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_written(root: Path, written: list[Path]) -> None:
    """Durable before the rename, like ``_fsync_tree``, but for what an update wrote: a few
    fsyncs where one syncfs(2) would flush every other writer's data on the filesystem too."""
    if len(written) > 64:
        _fsync_tree(root)
        return
    dirs = {root}
    for path in written:
        dirs.add(path.parent)
        if path.is_dir() and not path.is_symlink():
            _fsync_tree_files(path, dirs)
        elif not path.is_symlink():
            _fsync_file(path)
    for directory in dirs:
        _fsync_dir(directory)


def _fsync_tree_files(root: Path, dirs: set[Path]) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        dirs.add(Path(dirpath))
        for name in filenames:
            path = Path(dirpath, name)
            if not path.is_symlink():
                _fsync_file(path)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(path: Path) -> bool:
    """syncfs(2) on the filesystem holding ``path`` (Linux); False where it is unavailable."""
    libc_name = ctypes.util.find_library("c")
    if sys.platform != "linux" or libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bool(libc.syncfs(fd) == 0)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def reading(tree: Path) -> Iterator[Path]:
    """Hold the checkout ``tree`` while it is read: collection and recycling pass over it.

    A tree collected before the hold was taken is a retryable error (the next poll delivers the
    revision again), never a half-read tree."""
    gone = SourceError(f"checkout {tree.name[:12]} was collected before it was read", retryable=True)
    try:
        fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        raise gone from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.stat(tree).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # renamed away between the open and the lock
            raise gone
        yield tree
    finally:
        os.close(fd)


@contextmanager
def _unread(checkout: Path) -> Iterator[bool]:
    """An exclusive hold on ``checkout`` if no reader holds it (never waits): True while held."""
    try:
        fd = os.open(checkout, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def surplus(checkouts: Path, *, keep: int, protect: set[str]) -> list[Path]:
    """The complete checkouts ``collect`` would remove now, oldest first. Call under ``checkout_lock``."""
    if not checkouts.is_dir():
        return []
    dirs = [d for d in checkouts.iterdir() if _SHA_DIR.match(d.name) and d.name not in protect and d.is_dir()]
    dirs.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    return dirs[keep:][::-1]


def collect(checkouts: Path, *, keep: int, protect: set[str]) -> list[str]:
    """Remove leftovers of crashed writes and all but the ``keep`` newest other checkouts.

    ``protect`` (the current revision, the one just written) is never removed and does
    not count against ``keep``. Returns the removed SHAs. Call under ``checkout_lock``.
    """
    if not checkouts.is_dir():
        return []
    for leftover in checkouts.iterdir():
        if leftover.name.startswith(_TEMP_PREFIXES):
            shutil.rmtree(leftover, ignore_errors=True)
    removed = []
    for old in surplus(checkouts, keep=keep, protect=protect):
        with _unread(old) as free:
            if not free:
                continue  # being rendered: the next collection takes it
            remove(old)
            removed.append(old.name)
    return removed


def remove(checkout: Path) -> None:
    """Delete a checkout so that it stops looking complete at once (rename, then delete)."""
    trash = checkout.with_name(f".trash-{checkout.name[:12]}-{os.getpid()}-{id(checkout):x}")
    try:
        os.rename(checkout, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)
