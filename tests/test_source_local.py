"""The source stage against real local repositories (paths and file://): refs, history, cache, checkouts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pygit2
import pytest
from gitserver import Origin, git, make_source, origin_fixture  # noqa: F401  (fixture)

from agent.errors import RenderError, SourceError
from agent.render.renderer import RenderSpec, render
from agent.source.checkout import REFUSED_LINK


def test_follows_a_branch_and_reports_the_commit(origin: Origin, tmp_path: Path) -> None:
    source, _ = make_source(origin.url, tmp_path / "cache")
    first = source.poll()
    assert first.sha == origin.head()
    assert first.ref == "refs/heads/main"
    assert first.author == "Ada Author <ada@example.com>"
    assert first.subject == "first commit"
    assert first.date is not None and first.date.tzinfo is not None
    assert (first.tree / "apps" / "app.yaml").read_text() == "kind: ConfigMap\n"

    second_sha = origin.commit({"apps/app.yaml": "kind: Secret\n", "README.md": None}, "second\n\nbody")
    second = source.poll()
    assert second.sha == second_sha != first.sha
    assert second.subject == "second"
    assert (second.tree / "apps" / "app.yaml").read_text() == "kind: Secret\n"
    assert not (second.tree / "README.md").exists()
    assert source.last_good == second


def test_a_poll_with_no_new_commits_makes_no_fetch(origin: Origin, tmp_path: Path) -> None:
    source, log = make_source(str(origin.bare), tmp_path / "cache")
    first = source.poll()
    assert source.fetch_count == 1
    assert source.poll() == first
    assert source.poll() == first
    assert source.fetch_count == 1
    assert len(log.named("source.fetched")) == 1


def test_a_restarted_agent_reuses_the_cache_without_fetching(origin: Origin, tmp_path: Path) -> None:
    make_source(origin.url, tmp_path / "cache")[0].poll()
    again, _ = make_source(origin.url, tmp_path / "cache")
    assert again.poll().sha == origin.head()
    assert again.fetch_count == 0


@pytest.mark.parametrize("annotated", [True, False], ids=["annotated", "lightweight"])
def test_follows_a_tag_and_a_moved_tag(origin: Origin, tmp_path: Path, annotated: bool) -> None:
    tagged = origin.head()
    origin.tag("v1", annotated=annotated)
    origin.commit({"apps/app.yaml": "kind: Deployment\n"}, "after the tag")
    source, log = make_source(origin.url, tmp_path / "cache", tag="v1")
    rev = source.poll()
    assert (rev.sha, rev.ref) == (tagged, "refs/tags/v1")
    assert source.poll().sha == tagged and source.fetch_count == 1

    origin.tag("v1", annotated=annotated, force=True)
    assert source.poll().sha == origin.head()
    assert log.named("source.tag_moved")


@pytest.mark.parametrize("length", [40, 8])
def test_a_pinned_commit_needs_no_network_once_cached(origin: Origin, tmp_path: Path, length: int) -> None:
    pinned = origin.head()
    origin.commit({"apps/app.yaml": "kind: Job\n"}, "later")
    source, _ = make_source(origin.url, tmp_path / "cache", commit=pinned[:length])
    assert source.poll().sha == pinned
    shutil.rmtree(origin.bare)  # the remote is gone: a pinned, cached commit still resolves
    assert source.poll().sha == pinned
    assert source.fetch_count == 1


def test_a_pinned_commit_that_is_not_on_the_remote_is_refused(origin: Origin, tmp_path: Path) -> None:
    dangling = origin.commit({"x": "1"}, "never pushed", push=False)
    source, _ = make_source(origin.url, tmp_path / "cache", commit=dangling)
    with pytest.raises(SourceError, match="not reachable from any branch or tag") as err:
        source.poll()
    assert not err.value.retryable


def test_follows_a_force_push_and_logs_that_history_was_rewritten(origin: Origin, tmp_path: Path) -> None:
    origin.commit({"apps/app.yaml": "kind: Pod\n"}, "to be rewritten")
    source, log = make_source(origin.url, tmp_path / "cache")
    before = source.poll().sha
    after = origin.rewrite({"apps/app.yaml": "kind: Service\n"}, "rewritten")
    rev = source.poll()
    assert rev.sha == after != before
    assert (rev.tree / "apps" / "app.yaml").read_text() == "kind: Service\n"
    assert log.named("source.history_rewritten") == [
        {"url": origin.url, "ref": "refs/heads/main", "previous": before, "current": after}
    ]


def test_a_fast_forward_is_not_reported_as_rewritten_history(origin: Origin, tmp_path: Path) -> None:
    source, log = make_source(origin.url, tmp_path / "cache")
    source.poll()
    origin.commit({"a": "1"}, "next")
    source.poll()
    assert not log.named("source.history_rewritten")


def test_a_missing_branch_is_a_clear_error_and_the_last_good_revision_stays(
    origin: Origin, tmp_path: Path
) -> None:
    git("push", "-q", "origin", "main:feature", cwd=origin.work)
    source, _ = make_source(origin.url, tmp_path / "cache", branch="feature")
    good = source.poll()
    git("push", "-q", "origin", ":feature", cwd=origin.work)
    with pytest.raises(SourceError, match="branch 'feature' not found on the remote"):
        source.poll()
    assert source.last_good == good and good.tree.is_dir()
    assert source.last_error is not None


def test_an_unreachable_repository_keeps_the_last_good_revision(origin: Origin, tmp_path: Path) -> None:
    source, log = make_source(origin.url, tmp_path / "cache")
    good = source.poll()
    moved = origin.bare.with_name("elsewhere.git")
    origin.bare.rename(moved)
    with pytest.raises(SourceError) as err:
        source.poll()
    assert err.value.retryable
    assert source.last_good == good and (good.tree / "apps" / "app.yaml").is_file()
    assert log.named("source.poll_failed")[0]["last_good"] == good.sha
    moved.rename(origin.bare)
    assert source.poll() == good


def _corrupt(repo_dir: Path, how: str) -> None:
    if how == "config":
        (repo_dir / "config").write_text("[core\n garbage = = =\n")
    elif how == "objects-deleted":
        shutil.rmtree(repo_dir / "objects")
        (repo_dir / "objects").mkdir()
    elif how == "objects-truncated":
        for path in (repo_dir / "objects").rglob("*"):
            if path.is_file():
                path.chmod(0o644)
                path.write_bytes(path.read_bytes()[:7])
    elif how == "ref-garbage":
        (repo_dir / "refs" / "remotes" / "origin" / "main").write_text("not-a-sha\n")
    elif how == "not-a-directory":
        shutil.rmtree(repo_dir)
        repo_dir.write_text("oops")


@pytest.mark.parametrize(
    "how", ["config", "objects-deleted", "objects-truncated", "ref-garbage", "not-a-directory"]
)
def test_a_corrupt_cache_is_recovered_by_cloning_again(origin: Origin, tmp_path: Path, how: str) -> None:
    cache = tmp_path / "cache"
    first, _ = make_source(origin.url, cache)
    first.poll()
    _corrupt(first.repo_dir, how)
    shutil.rmtree(cache / "checkouts")  # so the recovered repository must really produce the tree
    source, log = make_source(origin.url, cache)
    rev = source.poll()
    assert rev.sha == origin.head()
    assert (rev.tree / "apps" / "app.yaml").read_text() == "kind: ConfigMap\n"
    assert log.named("source.cache_corrupt")
    assert pygit2.Repository(str(source.repo_dir)).is_bare


def test_an_interrupted_checkout_never_looks_complete(
    origin: Origin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent.source.checkout

    origin.commit({f"apps/f{i}.yaml": f"n: {i}\n" for i in range(5)}, "five files")
    source, _ = make_source(origin.url, tmp_path / "cache")
    written: list[Path] = []
    real = agent.source.checkout.write_blob

    def failing(path: Path, data: bytes, *, executable: bool) -> None:
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        written.append(path)
        real(path, data, executable=executable)

    monkeypatch.setattr(agent.source.checkout, "write_blob", failing)
    with pytest.raises(OSError):
        source.poll()
    assert not (source.checkouts / origin.head()).exists()
    assert source.last_good is None
    monkeypatch.undo()
    rev = source.poll()
    names = sorted(p.name for p in (rev.tree / "apps").iterdir())
    assert names == ["app.yaml"] + [f"f{i}.yaml" for i in range(5)]
    assert [p.name for p in source.checkouts.iterdir() if p.name.startswith(".tmp-")] == []


def test_a_crash_mid_checkout_leaves_only_a_temporary_directory(origin: Origin, tmp_path: Path) -> None:
    """The process is SIGKILLed after writing two files: nothing may look like a complete checkout."""
    origin.commit({f"apps/f{i}.yaml": f"n: {i}\n" for i in range(5)}, "five files")
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import agent.source.checkout
        from gitserver import make_source
        real, count = agent.source.checkout.write_blob, [0]
        def crash(path, data, *, executable):
            count[0] += 1
            if count[0] > 2:
                os.kill(os.getpid(), signal.SIGKILL)
            real(path, data, executable=executable)
        agent.source.checkout.write_blob = crash
        make_source({origin.url!r}, Path({str(cache)!r}))[0].poll()
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    entries = [p.name for p in (cache / "checkouts").iterdir() if p.name != ".lock"]
    assert len(entries) == 1 and entries[0].startswith(".tmp-")
    assert not (cache / "checkouts" / origin.head()).exists()

    source, _ = make_source(origin.url, cache)
    rev = source.poll()
    assert len(list((rev.tree / "apps").iterdir())) == 6
    assert sorted(p.name for p in (cache / "checkouts").iterdir()) == [".lock", origin.head()]


def test_old_checkouts_are_collected_but_never_the_current_one(origin: Origin, tmp_path: Path) -> None:
    source, _ = make_source(origin.url, tmp_path / "cache", keep_checkouts=1)
    current = source.poll()
    shas = [origin.commit({"n": str(i)}, f"commit {i}", push=False) for i in range(3)]
    origin.push()
    for sha in shas:
        source.resolve(sha)
        os.utime(source.checkouts / sha, (1e9, 1e9 + shas.index(sha)))  # a clear age order
    kept = sorted(p.name for p in source.checkouts.iterdir() if p.name != ".lock")
    # The one just checked out and the followed revision are protected; of the rest, the newest stays.
    assert kept == sorted([current.sha, shas[1], shas[2]])
    assert current.tree.is_dir() and source.last_good == current


@pytest.mark.parametrize(
    "links",
    [
        {"apps/passwd": "/etc/passwd"},
        {"apps/up": "../../outside"},
        {"apps/sneaky": "sub/../../.."},
        {"d/l1": "..", "d/l2": "l1/.."},  # each harmless lexically, together one level above the root
    ],
    ids=["absolute", "dot-dot", "through-subdir", "chained"],
)
def test_a_symlink_leaving_the_checkout_is_made_dangling_and_the_commit_still_checks_out(
    origin: Origin, tmp_path: Path, links: dict[str, str]
) -> None:
    source, _ = make_source(origin.url, tmp_path / "cache")
    source.poll()
    for rel, target in links.items():
        path = origin.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
    sha = origin.commit({}, "add links")
    rev = source.poll()
    assert rev.sha == sha and source.last_good == rev
    _nothing_leaves(rev.tree)
    assert any(os.readlink(rev.tree / rel) == REFUSED_LINK for rel in links)


def _nothing_leaves(tree: Path) -> None:
    base = os.path.realpath(tree)
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            resolved = os.path.realpath(os.path.join(dirpath, name))
            assert resolved == base or resolved.startswith(base + os.sep), (name, resolved)


def test_a_symlink_leaving_the_repository_fails_only_the_apps_that_contain_or_reach_it(
    origin: Origin, tmp_path: Path
) -> None:
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {}\n  namespace: default\n"
    origin.commit({f"apps/{a}/cm.yaml": cm.format(a) for a in ("a", "b", "c")}, "three apps")
    os.symlink("/etc/passwd", origin.work / "apps" / "a" / "stolen.yaml")
    os.symlink("../a", origin.work / "apps" / "c" / "from-a")  # c reaches a's files
    (origin.work / "apps" / "d").mkdir()
    os.symlink("/etc/hostname", origin.work / "apps" / "d" / ".gitops-agent-ignore")
    origin.commit({"apps/d/cm.yaml": cm.format("d")}, "links out of the repository, and one to one")
    rev = make_source(origin.url, tmp_path / "cache")[0].poll()
    assert [o.key.name for o in render(rev.tree, RenderSpec("c", ("apps/b",), {})).objects] == ["b"]
    for app in ("a", "c"):
        with pytest.raises(RenderError) as caught:
            render(rev.tree, RenderSpec("c", (f"apps/{app}",), {}))
        assert [p.file for p in caught.value.problems] == ["apps/a/stolen.yaml"], caught.value.problems
        assert "dangling symlink" in caught.value.problems[0].message
    # Rules that cannot be read would render what they exclude: the app fails instead.
    with pytest.raises(RenderError) as caught:
        render(rev.tree, RenderSpec("c", ("apps/d",), {}))
    assert [p.file for p in caught.value.problems] == ["apps/d/.gitops-agent-ignore"]


def test_a_symlink_inside_the_checkout_is_kept(origin: Origin, tmp_path: Path) -> None:
    origin.symlink("apps/alias.yaml", "app.yaml")
    origin.symlink("base", "apps")
    rev = make_source(origin.url, tmp_path / "cache")[0].poll()
    assert (rev.tree / "apps" / "alias.yaml").is_symlink()
    assert (rev.tree / "base" / "alias.yaml").read_text() == "kind: ConfigMap\n"


def test_an_executable_file_keeps_its_mode(origin: Origin, tmp_path: Path) -> None:
    script = origin.work / "hook.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    origin.commit({}, "script")
    rev = make_source(origin.url, tmp_path / "cache")[0].poll()
    assert os.access(rev.tree / "hook.sh", os.X_OK)
    assert not os.access(rev.tree / "README.md", os.X_OK)


def test_resolve_checks_out_any_ref_without_moving_the_followed_revision(
    origin: Origin, tmp_path: Path
) -> None:
    first = origin.head()
    origin.tag("v1")
    second = origin.commit({"b": "2"}, "second")
    source, _ = make_source(origin.url, tmp_path / "cache")
    current = source.poll()
    assert source.resolve(first).sha == first
    assert source.resolve(first[:9]).sha == first
    assert source.resolve("v1").sha == first
    assert source.resolve("refs/tags/v1").sha == first
    assert source.resolve("main").sha == second
    assert source.resolve("main~1").sha == first
    assert source.resolve("HEAD").sha == second
    assert source.resolve("v1").tree == source.checkouts / first
    assert source.last_good == current
    with pytest.raises(SourceError, match="no branch, tag or commit named 'nope'"):
        source.resolve("nope")
