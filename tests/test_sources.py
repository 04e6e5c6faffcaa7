"""Named sources polled together (``SourceSet``), against real Git servers on loopback.

Two repositories, one of them followed on two branches, serve three apps: each
source is asked once per poll however many apps use it; a source whose server is
down is named with its typed error while the others' revisions are delivered and
its last good revision stays; a source no app uses is never contacted; two sources
on one URL share the cache repository and keep their own checkouts; a source that
hangs past its deadline is reported and joined, never polled twice at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gitserver import GitHttpServer, Origin, RecordingLog, git, origin_fixture  # noqa: F401  (fixture)

from agent.config.load import load_config
from agent.config.types import Config, SourceConfig
from agent.errors import ConfigError, SourceError
from agent.source.checkout import file_lock
from agent.source.git import GitSource
from agent.source.sources import POLL_STEPS, SourceSet


def push_branch(origin: Origin, branch: str, files: dict[str, str | None], message: str) -> str:
    """Commit ``files`` on ``branch`` (created from main when new), push it, go back to main."""
    exists = branch in git("branch", "--format=%(refname:short)", cwd=origin.work).split()
    git("checkout", "-q", *(() if exists else ("-b",)), branch, cwd=origin.work)
    sha = origin.commit(files, message, push=False)
    origin.push(branch)
    git("checkout", "-q", "main", cwd=origin.work)
    return sha


def named_source(name: str, url: str, cache: Path, **kw: Any) -> GitSource:
    """A ``GitSource`` as ``SourceSet.from_config`` builds one for the source ``name``."""
    config = SourceConfig(url=url, **{"branch": "main", "timeout": 20.0, **kw})
    return GitSource(config, cache, name=name, log=RecordingLog())


@dataclass
class Fleet:
    """``one.git`` (branches main and dev) and ``two.git``, each behind its own HTTP server."""

    one: Origin
    two: Origin
    one_server: GitHttpServer
    two_server: GitHttpServer
    unused_server: GitHttpServer
    config: Config

    def heads(self) -> dict[str, str]:
        return {
            "default": self.one.head(),
            "one-dev": git("rev-parse", "dev", cwd=self.one.work),
            "two": self.two.head(),
        }

    def requests(self) -> dict[str, tuple[int, int]]:
        """Per repository: (ref advertisements, fetches), as counted by its server."""
        return {
            name: (len([r for r in server.requests if r.path.endswith("/info/refs")]), len(server.fetches()))
            for name, server in (("one", self.one_server), ("two", self.two_server))
        }


def write_config(tmp_path: Path, one: str, two: str, unused: str) -> Config:
    """Four sources, three apps: the implicit app of `a` (default), `web` on a and b (two),
    `preview` on b (one-dev); the source `unused` serves no app."""
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    path = tmp_path / "agent.toml"
    path.write_text(
        f"""
[agent]
cache_dir = "{tmp_path / "cache"}"

[source]
url = "{one}"
timeout = "10s"

[[sources]]
name = "one-dev"
url = "{one}"
branch = "dev"
timeout = "10s"

[[sources]]
name = "two"
url = "{two}"
timeout = "10s"

[[sources]]
name = "unused"
url = "{unused}"

[[clusters]]
name = "a"
kubeconfig = "kc"
path = "clusters/a"

[[clusters]]
name = "b"
kubeconfig = "kc"

[[apps]]
name = "web"
clusters = ["a", "b"]
source = "two"
path = "web"

[[apps]]
name = "preview"
cluster = "b"
source = "one-dev"
path = "preview"
"""
    )
    return load_config(path)


@pytest.fixture(name="fleet")
def fleet_fixture(tmp_path: Path) -> Iterator[Fleet]:
    srv = tmp_path / "srv"
    one, two = Origin(srv, "one.git"), Origin(srv, "two.git")
    one.commit({"clusters/a/app.yaml": "kind: ConfigMap\n"}, "one: first")
    push_branch(one, "dev", {"preview/app.yaml": "kind: ConfigMap\n"}, "one: dev")
    two.commit({"web/app.yaml": "kind: ConfigMap\n"}, "two: first")
    servers = [GitHttpServer(srv, {}).start() for _ in range(3)]
    try:
        config = write_config(
            tmp_path, servers[0].url("one.git"), servers[1].url("two.git"), servers[2].url("three.git")
        )
        yield Fleet(one, two, *servers, config=config)
    finally:
        for s in servers:
            s.stop()


def test_each_source_is_fetched_once_per_poll_however_many_apps_use_it(fleet: Fleet) -> None:
    sources = SourceSet.from_config(fleet.config, log=RecordingLog())
    assert sources.names == ("default", "one-dev", "two")

    first = sources.poll()
    assert first.ok and first.names == ("default", "one-dev", "two")
    assert {n: r.sha for n, r in first.revisions.items()} == fleet.heads()
    assert (first.revisions["one-dev"].tree / "preview" / "app.yaml").is_file()
    assert {n: sources.source(n).fetch_count for n in sources.names} == {"default": 1, "one-dev": 1, "two": 1}
    # Server-counted, though `two` serves two apps on two clusters: a source that moved costs
    # one ls-remote and one fetch (which starts with its own ref advertisement).
    requests = fleet.requests()
    assert requests["two"] == (2, 1)
    # `one` serves two sources. Their fetches share the cache repository: the second one sends
    # no request for objects when the first one's (dev branched off main) brought them all.
    assert requests["one"][0] == 4 and requests["one"][1] in (1, 2)
    apps = {(a.name, a.cluster): a for a in fleet.config.apps}
    assert sources.revision_for(apps[("web", "a")]) is sources.revision_for(apps[("web", "b")])
    assert sources.revision_for(apps[("preview", "b")]) == first.revisions["one-dev"]
    assert sources.revision_for(apps[("a", "a")]) == first.revisions["default"]

    fleet.one.commit({"clusters/a/app.yaml": "kind: Secret\n"}, "one: main moves")
    push_branch(fleet.one, "dev", {"preview/app.yaml": "kind: Secret\n"}, "one: dev moves")
    fleet.two.commit({"web/app.yaml": "kind: Secret\n"}, "two moves")
    second = sources.poll()
    assert {n: r.sha for n, r in second.revisions.items()} == fleet.heads()
    assert {n: sources.source(n).fetch_count for n in sources.names} == {"default": 2, "one-dev": 2, "two": 2}
    assert fleet.requests() == {"one": (8, requests["one"][1] + 2), "two": (4, 2)}

    assert sources.poll().revisions == second.revisions  # nothing moved: one ls-remote each
    assert {n: sources.source(n).fetch_count for n in sources.names} == {"default": 2, "one-dev": 2, "two": 2}
    assert fleet.requests() == {"one": (10, requests["one"][1] + 2), "two": (5, 2)}


def test_one_source_whose_server_is_down_is_named_while_the_others_deliver_and_its_last_good_stays(
    fleet: Fleet,
) -> None:
    sources = SourceSet.from_config(fleet.config, log=RecordingLog())
    before = sources.poll().revisions
    moved = fleet.one.commit({"clusters/a/app.yaml": "kind: Secret\n"}, "one moves")
    fleet.two.commit({"web/app.yaml": "kind: Secret\n"}, "two moves")
    fleet.two_server.stop()

    polled = sources.poll()
    assert not polled.ok
    assert polled.revisions["default"].sha == moved
    assert polled.revisions["one-dev"] == before["one-dev"]
    assert set(polled.errors) == {"two"}
    error = polled["two"].error
    assert isinstance(error, SourceError) and error.retryable
    assert "cannot reach the repository" in str(error) and error.url == fleet.two_server.url("two.git")
    assert str(polled["two"]).startswith("source 'two': ")
    assert polled["two"].revision is None
    assert sources.last_good("two") == before["two"]
    web = next(a for a in fleet.config.apps if a.name == "web")
    assert sources.revision_for(web) == before["two"] and sources.revision_for(web).tree.is_dir()  # type: ignore[union-attr]


def test_a_source_no_app_uses_is_never_contacted_and_cannot_be_polled_or_resolved(fleet: Fleet) -> None:
    log = RecordingLog()
    sources = SourceSet.from_config(fleet.config, log=log)
    sources.poll()
    sources.poll()
    assert "unused" not in sources.names
    assert [kw["source"] for kw in log.named("source.unused")] == ["unused"]
    with pytest.raises(ConfigError, match=r"no source named 'unused' is used by any app \(polled: default, "):
        sources.poll(["unused"])
    with pytest.raises(ConfigError, match="'unused'"):
        sources.resolve("unused", "main")
    assert fleet.unused_server.requests == []


def test_resolve_checks_out_any_ref_of_the_named_source(fleet: Fleet) -> None:
    sources = SourceSet.from_config(fleet.config, log=RecordingLog())
    dev = git("rev-parse", "dev", cwd=fleet.one.work)
    assert sources.resolve("default", "dev").sha == dev
    assert sources.resolve("two", fleet.two.head()[:10]).sha == fleet.two.head()
    with pytest.raises(SourceError, match="no branch, tag or commit named 'nope'"):
        sources.resolve("two", "nope")


def test_two_sources_on_one_url_share_the_cache_repository_even_when_both_start_cold_at_once(
    origin: Origin, tmp_path: Path
) -> None:
    dev = push_branch(origin, "dev", {"dev.txt": "dev\n"}, "dev")
    for round_ in range(10):
        cache = tmp_path / f"cache-{round_}"
        main_source = named_source("main", origin.url, cache)
        dev_source = named_source("dev", origin.url, cache, branch="dev")
        polled = SourceSet({"main": main_source, "dev": dev_source}, log=RecordingLog()).poll()
        assert polled.ok, f"round {round_}: {polled.errors}"
        assert polled.revisions["main"].sha == origin.head() and polled.revisions["dev"].sha == dev
        assert [p.name for p in (cache / "repos").iterdir() if p.name.endswith(".git")] == [
            main_source.repo_dir.name
        ]


def test_a_source_collecting_its_old_checkouts_never_removes_the_tree_another_source_hands_out(
    origin: Origin, tmp_path: Path
) -> None:
    push_branch(origin, "dev", {"dev.txt": "dev\n"}, "dev")
    cache = tmp_path / "cache"
    main_source = named_source("default", origin.url, cache, keep_checkouts=1)
    sources = SourceSet(
        {"default": main_source, "dev": named_source("dev", origin.url, cache, branch="dev")},
        log=RecordingLog(),
    )
    held = sources.poll().revisions["dev"]
    for i in range(4):
        origin.commit({"main.txt": f"{i}\n"}, f"main {i}")
        assert main_source.poll().sha == origin.head()
    assert held.tree.is_dir() and (held.tree / "dev.txt").is_file()
    assert sources.last_good("dev") == held


def test_a_hung_source_is_reported_at_its_deadline_while_the_other_delivers_and_the_next_poll_joins_it(
    origin: Origin, tmp_path: Path
) -> None:
    other = Origin(tmp_path / "other")
    other.commit({"x.txt": "x\n"}, "other")
    slow = named_source("slow", origin.url, tmp_path / "cache", timeout=1.0)
    fast = named_source("fast", other.url, tmp_path / "cache")
    sources = SourceSet({"slow": slow, "fast": fast}, log=RecordingLog())
    deadline = POLL_STEPS * 1.0
    # Another holder of the shared cache repository's lock (another source or process) keeps
    # `slow` waiting longer than its deadline.
    with file_lock(slow.repo_lock):
        t0 = time.monotonic()
        polled = sources.poll()
        elapsed = time.monotonic() - t0
        assert deadline - 0.05 <= elapsed < deadline + 1.5
        assert polled.revisions["fast"].sha == other.head()
        assert f"did not finish within {deadline:g}s" in str(polled["slow"].error)
        again = sources.poll(["slow"])
        assert "did not finish" in str(again["slow"].error)
        assert len(_poll_threads("slow")) == 1  # joined, not started twice
    for thread in _poll_threads("slow"):
        thread.join(10)
    assert sources.last_good("slow") is not None and sources.last_good("slow").sha == origin.head()  # type: ignore[union-attr]
    assert sources.poll().ok


def _poll_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"source-poll-{name}" and t.is_alive()]
