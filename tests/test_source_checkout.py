"""Incremental checkouts: the oldest checkout collection would delete is recycled into the new one.

With ``keep_checkouts = 0`` the checkout two commits back is surplus from the third poll on,
so each new commit rewrites only what changed in it. Every recycled tree must equal a fresh
checkout of the same commit, refuse what a fresh one refuses, and never carry over a file
that is not the commit's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from gitserver import Origin, make_source, origin_fixture  # noqa: F401  (fixture)

import agent.source.checkout
from agent.errors import SourceError
from agent.source.git import GitSource


def _snapshot(root: Path) -> dict[str, tuple[str, ...]]:
    """Every path under ``root``: kind, and content, link target or executable bit."""
    out: dict[str, tuple[str, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", path.read_text(), str(os.access(path, os.X_OK)))
    return out


def _fresh(origin: Origin, cache: Path) -> dict[str, tuple[str, ...]]:
    rev = make_source(origin.url, cache)[0].poll()
    return _snapshot(rev.tree)


def _warm(origin: Origin, tmp_path: Path) -> GitSource:
    """A source two commits in, keeping no old checkout: the next commit recycles one."""
    origin.commit(
        {f"apps/d{d}/f{i}.yaml": f"n: {d}{i}\n" for d in range(3) for i in range(5)}
        | {"gone/x.yaml": "x\n", "becomes-dir": "file\n", "becomes-file/y.yaml": "y\n"},
        "tree",
    )
    source, _ = make_source(origin.url, tmp_path / "cache", keep_checkouts=0)
    source.poll()
    origin.commit({"apps/d0/f0.yaml": "n: changed\n"}, "one change")
    source.poll()
    return source


def _older(source: GitSource) -> Path:
    """The one checkout of a warm source besides its current one."""
    current = source.last_good.sha  # type: ignore[union-attr]
    (old,) = [p for p in source.checkouts.iterdir() if len(p.name) == 40 and p.name != current]
    return old


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    written: list[Path] = []
    real = agent.source.checkout.write_blob

    def counting(path: Path, data: bytes, *, executable: bool) -> None:
        written.append(path)
        real(path, data, executable=executable)

    monkeypatch.setattr(agent.source.checkout, "write_blob", counting)
    return written


def test_a_new_commit_writes_only_its_changed_files_and_equals_a_fresh_checkout(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _warm(origin, tmp_path)
    previous = source.last_good.sha  # type: ignore[union-attr]
    written = _count_writes(monkeypatch)
    (origin.work / "gone").joinpath("x.yaml").unlink()
    (origin.work / "becomes-dir").unlink()
    (origin.work / "becomes-file" / "y.yaml").unlink()
    (origin.work / "becomes-file").rmdir()
    script = origin.work / "apps" / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    (origin.work / "apps" / "d2" / "f4.yaml").chmod(0o755)
    os.symlink("d1", origin.work / "apps" / "alias")
    origin.commit(
        {"apps/d1/f1.yaml": "n: new\n", "becomes-dir/z.yaml": "z\n", "becomes-file": "now a file\n"},
        "many kinds of change",
    )
    rev = source.poll()
    # Against the checkout two commits back (the recycled one): this commit's changes and the last's.
    assert sorted("/".join(p.relative_to(source.checkouts).parts[1:]) for p in written) == [
        "apps/d0/f0.yaml",
        "apps/d1/f1.yaml",
        "apps/d2/f4.yaml",
        "apps/run.sh",
        "becomes-dir/z.yaml",
        "becomes-file",
    ]
    kept = sorted(p.name for p in source.checkouts.iterdir() if len(p.name) == 40)
    assert kept == sorted([previous, rev.sha])  # the oldest became the new one
    assert _snapshot(rev.tree) == _fresh(origin, tmp_path / "fresh")
    assert [p.name for p in source.checkouts.iterdir() if p.name.startswith(".")] == [".lock"]


@pytest.mark.parametrize(
    "links",
    [{"apps/up": "../../outside"}, {"d/l1": "..", "d/l2": "l1/.."}],
    ids=["dot-dot", "chained"],
)
def test_a_recycled_checkout_makes_a_symlink_leaving_it_dangling(
    origin: Origin, tmp_path: Path, links: dict[str, str]
) -> None:
    source = _warm(origin, tmp_path)
    for rel, target in links.items():
        path = origin.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
    sha = origin.commit({}, "add links")
    rev = source.poll()
    assert rev.sha == sha
    base = os.path.realpath(rev.tree)
    for rel in links:
        resolved = os.path.realpath(rev.tree / rel)
        assert resolved == base or resolved.startswith(base + os.sep), rel
    assert any(os.readlink(rev.tree / rel) == agent.source.checkout.REFUSED_LINK for rel in links)
    assert [p.name for p in source.checkouts.iterdir() if p.name.startswith(".tmp-")] == []


def test_a_file_added_to_an_old_checkout_never_reaches_the_new_one(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _warm(origin, tmp_path)
    old = _older(source)
    (old / "apps" / "stray.yaml").write_text("kind: Secret\n")
    written = _count_writes(monkeypatch)
    origin.commit({"apps/d1/f1.yaml": "n: new\n"}, "change")
    rev = source.poll()
    assert not (rev.tree / "apps" / "stray.yaml").exists()
    fresh = _fresh(origin, tmp_path / "fresh")
    assert _snapshot(rev.tree) == fresh
    assert len(written) >= sum(1 for kind, *_ in fresh.values() if kind == "file")  # written whole


def test_a_corrupt_cache_under_a_recyclable_checkout_is_cloned_again(origin: Origin, tmp_path: Path) -> None:
    source = _warm(origin, tmp_path)
    shutil.rmtree(source.repo_dir / "objects")
    (source.repo_dir / "objects").mkdir()
    origin.commit({"apps/d1/f1.yaml": "n: new\n"}, "change")
    rev = source.poll()
    assert rev.sha == origin.head()
    assert _snapshot(rev.tree) == _fresh(origin, tmp_path / "fresh")


def test_a_checkout_being_read_is_neither_recycled_nor_collected_until_the_reader_lets_go(
    origin: Origin, tmp_path: Path
) -> None:
    source = _warm(origin, tmp_path)
    old = _older(source)
    before = _snapshot(old)
    with agent.source.checkout.reading(old):  # a render of that revision still under way
        for n in range(3):
            origin.commit({"apps/d1/f1.yaml": f"n: {n}\n"}, f"change {n}")
            source.poll()
            assert _snapshot(old) == before, "a tree being read changed under its reader"
    origin.commit({"apps/d1/f1.yaml": "n: after\n"}, "after the reader")
    rev = source.poll()
    assert not old.exists(), "the next collection after the reader let go takes it"
    assert _snapshot(rev.tree) == _fresh(origin, tmp_path / "fresh")


def test_reading_a_checkout_collected_before_its_hold_is_a_retryable_source_error(
    origin: Origin, tmp_path: Path
) -> None:
    source = _warm(origin, tmp_path)
    old = _older(source)
    agent.source.checkout.remove(old)
    with (
        pytest.raises(SourceError, match="was collected before it was read") as e,
        agent.source.checkout.reading(old),
    ):
        pass
    assert e.value.retryable
