"""The pure and local parts of history and rollback: a pinned commit from the cache alone
(kept checkout, cached repository, a shallow source refused by name), whether a pin holds, why
a pass ran, and what the status page's record keeps of both (Git on disk; no cluster)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest
from gitserver import Origin, make_source, origin_fixture  # noqa: F401  (fixture)

from agent.errors import SourceError
from agent.model import ClusterResult, Pin
from agent.reconcile.pins import PinAction, decide
from agent.render.chart_meta import chart_version
from agent.run.due import Decision, Due, DueReason
from agent.run.triggers import triggers
from agent.source.pinned import kept_checkouts, revision_at
from agent.ui import records


def three_commits(origin: Origin, tmp_path: Path, **kw: object) -> tuple[list[str], Path]:
    """Three commits polled in turn with one kept checkout: the first one's tree is collected."""
    cache = tmp_path / "cache"
    source, _ = make_source(origin.url, cache, keep_checkouts=1, **kw)
    shas = [source.poll().sha]
    for n in (2, 3, 4):
        origin.commit({"apps/app.yaml": f"kind: ConfigMap\n# {n}\n"}, f"commit {n}")
        shas.append(source.poll().sha)
    source.close()
    return shas, cache


def test_a_kept_checkout_is_handed_out_without_the_network(origin: Origin, tmp_path: Path) -> None:
    shas, cache = three_commits(origin, tmp_path)
    source, _ = make_source("http://127.0.0.1:9/nowhere.git", cache)  # never contacted
    source.repo_dir = make_source(origin.url, cache)[0].repo_dir
    kept = kept_checkouts(source)
    assert shas[-1] in kept
    rev = revision_at(source, kept[-1][:10])
    assert rev.sha == kept[-1] and rev.tree == source.checkouts / kept[-1]
    assert rev.subject


def test_an_older_commit_is_written_from_the_cached_repository(origin: Origin, tmp_path: Path) -> None:
    shas, cache = three_commits(origin, tmp_path)
    source, _ = make_source(origin.url, cache)
    assert shas[0] not in kept_checkouts(source)
    rev = revision_at(source, shas[0])
    assert rev.sha == shas[0]
    assert (rev.tree / "apps/app.yaml").read_text() == "kind: ConfigMap\n"
    assert source.fetch_count == 0


def test_a_shallow_source_rolls_back_only_to_kept_checkouts_and_says_so(
    origin: Origin, tmp_path: Path
) -> None:
    shas, cache = three_commits(origin, tmp_path)
    source, _ = make_source(origin.url, cache, shallow=True)
    with pytest.raises(SourceError, match=r"shallow = true.*only kept checkouts") as e:
        revision_at(source, shas[0])
    assert shas[0] in str(e.value)
    assert revision_at(source, shas[-1]).sha == shas[-1]


@pytest.mark.parametrize("bad_input", ["main~1", "zzzzzzz", "abc", ""])
def test_only_a_commit_sha_is_accepted(origin: Origin, tmp_path: Path, bad_input: str) -> None:
    source, _ = make_source(origin.url, tmp_path / "cache")
    with pytest.raises(SourceError, match="not a commit SHA"):
        revision_at(source, bad_input)


def test_an_unknown_commit_is_named(origin: Origin, tmp_path: Path) -> None:
    source, _ = make_source(origin.url, tmp_path / "cache")
    source.poll()
    with pytest.raises(SourceError, match="deadbeef00 is not in the cache"):
        revision_at(source, "deadbeef00")


PIN = Pin("a" * 40, "b" * 40)


@pytest.mark.parametrize(
    ("pin", "followed", "action"),
    [
        (None, "c" * 40, PinAction.NONE),
        (PIN, "b" * 40, PinAction.HOLD),  # still the bad revision
        (PIN, "a" * 40, PinAction.HOLD),  # the source went back to the pinned one
        (PIN, None, PinAction.HOLD),  # nothing delivered: keep it
        (PIN, "c" * 40, PinAction.CLEAR),  # a newer commit landed
        (Pin("a" * 40, ""), "c" * 40, PinAction.HOLD),  # no bad revision: only --clear ends it
    ],
)
def test_a_pin_holds_until_the_source_moves_past_both_of_its_revisions(
    pin: Pin | None, followed: str | None, action: PinAction
) -> None:
    assert decide(pin, followed) is action


def test_each_app_of_a_pass_says_why_it_ran() -> None:
    apps = (
        Due("new", DueReason.NEW_REVISION, 0, 0),
        Due("pushed", DueReason.NEW_REVISION, 0, 0),
        Due("tick", DueReason.INTERVAL, 0, 0),
        Due("retry", DueReason.BACKOFF, 0, 0, failures=2),
    )
    decision = Decision(tuple(d.app for d in apps), apps[0], apps)
    sources = {"new": "a", "pushed": "b", "tick": "a", "retry": "a"}
    got = triggers(decision, [*sources, "dep"], pushed={"b"}, source_of=sources)
    assert got == {
        "new": "new revision",
        "pushed": "webhook push",
        "tick": "interval",
        "retry": "retry/backoff",
        "dep": "dependency",
    }
    forced = triggers(decision, ["tick", "new"], forced_by="manual sync", source_of=sources)
    assert forced == {"tick": "manual sync", "new": "new revision"}


def test_the_record_keeps_the_trigger_chart_and_pin_and_reads_old_records() -> None:
    now = datetime.now(UTC)
    r = ClusterResult("c", "a" * 40, app="web", started=now, finished=now, pin=PIN, chart="1.2.3")
    r.followed = "b" * 40
    rec = records.after_pass(None, r, subject="", now=now, trigger="manual sync")
    h = rec.history[-1]
    assert (h.trigger, h.chart, h.pinned_from) == ("manual sync", "1.2.3", "b" * 40)
    assert (rec.pin_revision, rec.pin_bad) == (PIN.revision, PIN.bad)
    doc = records.AppRecord.from_json(rec.to_json())
    assert doc == rec
    old = rec.to_json()
    del old["pin_revision"], old["pin_bad"]
    for entry in old["history"]:
        del entry["trigger"], entry["chart"], entry["pinned_from"], entry["note"]
    assert records.AppRecord.from_json(old) is not None
    cleared = dataclasses.replace(r, pin=None, pin_cleared="rollback pin to aaa cleared")
    after = records.after_pass(rec, cleared, subject="", now=now)
    assert (after.pin_revision, after.history[-1].note) == ("", "rollback pin to aaa cleared")


def test_a_chart_version_is_read_cheaply_or_left_empty(tmp_path: Path) -> None:
    (tmp_path / "charts/web").mkdir(parents=True)
    (tmp_path / "charts/web/Chart.yaml").write_text("apiVersion: v2\nname: web\nversion: 1.4.0\n")
    assert chart_version(tmp_path, "charts/web") == "1.4.0"
    assert chart_version(tmp_path, "charts/none") == ""
    (tmp_path / "charts/web/Chart.yaml").write_text("- not a mapping\n")
    assert chart_version(tmp_path, "charts/web/") == ""


def test_gitops_agent_status_shows_the_pin() -> None:
    from agent.cli.ops import format_status

    row = {"cluster": "c", "app": "web", "state": "ok", "revision": "a" * 40, "pin": PIN.to_json()}
    out = format_status({"agent": "x", "revision": "b" * 40, "clusters": [row]})
    assert f"c/web: rolled back: pinned to {'a' * 12} (from {'b' * 12})" in out
