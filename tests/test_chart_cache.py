"""The chart cache is collected: what any app's current or last good pin uses stays, a few
unused copies stay (newest first), the rest goes; nothing just written goes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent.config.types import Config
from agent.model import Revision
from agent.reconcile.charts import ChartPolls
from agent.source.chart_cache import collect
from tests.chartrepo import ChartRepo
from tests.test_config_helm_repo import load


def entry(root: Path, name: str, age: float) -> Path:
    d = root / name
    (d / "chart").mkdir(parents=True)
    (d / ".complete").write_text("x\n")
    then = time.time() - age
    os.utime(d / ".complete", (then, then))
    os.utime(d, (then, then))
    return d


def test_in_use_stays_the_newest_unused_stay_within_the_bound_and_young_ones_are_left_alone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "charts"
    used = entry(root, "a" * 64, 9000)
    built = entry(root / "built", "b" * 64, 9000)
    old, older, oldest = (entry(root, c * 64, age) for c, age in (("c", 1000), ("d", 2000), ("e", 3000)))
    young = entry(root, "f" * 64, 10)
    unfinished, working = entry(root, ".tmp-x", 5000), entry(root, ".tmp-y", 10)
    other = entry(root, "not-a-digest", 9000)
    removed = collect(root, [used / "chart", built / "chart"], spare=1, min_age=600)
    assert sorted(removed) == sorted([older, oldest, unfinished])
    assert all(p.is_dir() for p in (used, built, old, young, working, other))
    assert not any(p.exists() for p in removed)


def config(tmp_path: Path, url: str) -> Config:
    body = f"""
[agent]
cache_dir = "{tmp_path / "cache"}"

[[apps]]
name = "web"
cluster = "a"
[apps.helm]
repository = "{url}"
chart = "web"
"""
    return load(tmp_path, body)  # type: ignore[return-value]


def test_the_running_agents_polls_keep_only_what_the_apps_use(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("web", "1.0.0")
    revision = Revision("0" * 40, "main", tmp_path)
    with repo.serve():
        polls = ChartPolls(config(tmp_path, repo.url), timeout=5, collect=True)
        polls.spare, polls.min_age = 0, 0.0
        (first,) = polls.attach("default", revision).charts
        repo.publish("web", "1.1.0")
        (second,) = polls.attach("default", revision).charts
    assert second.version == "1.1.0" and second.directory.is_dir()
    assert not first.directory.exists()  # no app uses 1.0.0 any more
    (kept,) = polls.attach("default", revision).charts  # the repository is down: the last good stays
    assert kept.error and kept.directory == second.directory and second.directory.is_dir()
    # A command's polls (no collection) never remove what the running agent may use.
    ChartPolls(config(tmp_path, "http://127.0.0.1:1"), timeout=5).attach("default", revision)
    assert second.directory.is_dir()
