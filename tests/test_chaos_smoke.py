"""The chaos runner (``python -m benchmarks chaos``, docs/reliability.md): its pure parts, a seeded
5-minute smoke of the real run, and the checker catching builds with a prune guard disabled.

The runs are subprocesses, exactly as a person runs them; each starts and deletes its own three
local clusters, Git server and agent (the runner cleans up in a ``finally``).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.chaos import content, invariants, runner
from benchmarks.chaos.invariants import Live, Snapshot
from benchmarks.chaos.world import Sample

ROOT = Path(__file__).resolve().parent.parent
SMOKE_SEED = 7


def chaos(tmp_path: Path, *args: str, timeout: float) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "chaos", "--out", str(out), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    results = sorted(out.glob("chaos-*.json"))
    assert results, f"no results written; stderr:\n{done.stderr[-4000:]}"
    return done.returncode, done.stdout + done.stderr, json.loads(results[-1].read_text())


# ---------------------------------------------------------------- pure parts


def test_the_schedule_is_the_same_for_the_same_seed_and_its_first_round_has_every_kind() -> None:
    first = list(itertools.islice(runner.schedule(11, runner.KINDS), 60))
    again = list(itertools.islice(runner.schedule(11, runner.KINDS), 60))
    other = list(itertools.islice(runner.schedule(12, runner.KINDS), 60))
    assert first == again
    assert first != other
    assert {p.kind for p in first[: len(runner.KINDS)]} == set(runner.KINDS)
    assert all(p.cluster == "chaos-b" for p in first if p.kind == "credentials-revoke")


def test_an_object_seen_in_git_and_then_gone_or_recreated_is_a_deletion() -> None:
    def live(uid: str) -> Live:
        return Live(uid, "1", {}, {}, (), {})

    a, b, c = ("ConfigMap", "chaos", "a"), ("ConfigMap", "chaos", "b"), ("ConfigMap", "chaos", "c")
    snap = Snapshot("x", objects={a: live("u1"), b: live("other")})
    found = invariants.not_deleted(snap, {a, b, c}, {a: "u1", b: "u2", c: "u3"})
    assert found == [
        "ConfigMap chaos/b was deleted and re-created (UID u2 -> other)",
        "ConfigMap chaos/c was deleted (in Git at the last revision that rendered)",
    ]
    assert invariants.not_deleted(snap, {a}, {a: "u1", c: "u3"}) == []  # c left Git: not protected


def test_a_labelled_object_missing_from_its_parents_member_list_is_reported() -> None:
    key = ("ConfigMap", "chaos", "cm-00")
    obj = Live("u", "1", {"applyset.kubernetes.io/part-of": "applyset-x-v1"}, {}, (), {})
    assert invariants.inventory_covers(Snapshot("x", {key: obj}, {"applyset-x-v1": {key}})) == []
    missing = invariants.inventory_covers(Snapshot("x", {key: obj}, {"applyset-x-v1": set()}))
    assert missing and "not in that parent's member list" in missing[0]


def test_rss_growth_is_judged_per_process_after_its_warm_up() -> None:
    flat = [Sample(0, 200, 40), Sample(31, 90, 30), Sample(600, 100, 35)]
    leaking = [Sample(0, 90, 30), Sample(31, 90, 30), Sample(600, 90 + invariants.RSS_SLACK_MB + 1, 30)]
    assert invariants.resources({1: flat}) == []
    assert invariants.resources({2: leaking}) == [
        f"agent pid 2: RSS 90 MB -> {90 + invariants.RSS_SLACK_MB + 1:.0f} MB (> +40 MB)"
    ]


def test_a_mass_removal_leaves_few_objects_and_every_broken_mode_keeps_its_objects_declared() -> None:
    full = content.declared(content.ClusterContent())
    mass = content.declared(content.ClusterContent(mode=content.Mode.MASS))
    assert len(mass["plain"]) / len(full["plain"]) < 0.5 <= 1 - len(mass["plain"]) / len(full["plain"])
    files = content.files("chaos-a", content.ClusterContent(mode=content.Mode.BROKEN_PLAIN))
    assert files["plain/chaos-a/extra.yaml"].startswith("broken: [unclosed")


# ---------------------------------------------------------------- real runs


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_seeded_five_minute_run_observes_every_fault_kind_and_violates_no_invariant(tmp_path: Path) -> None:
    code, output, result = chaos(tmp_path, "--duration", "300", "--seed", str(SMOKE_SEED), timeout=880)
    assert code == 0, output[-6000:]
    assert result["violations"] == []
    unobserved = [k for k in runner.KINDS if result["kinds"].get(k, {}).get("observed", 0) < 1]
    assert unobserved == [], output[-6000:]
    assert "| fault | injected | observed | survived |" in output


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("plant", sorted(runner.PLANTS))
def test_the_checker_fails_a_run_of_an_agent_with_a_prune_guard_disabled(tmp_path: Path, plant: str) -> None:
    kinds = ",".join(runner.PLANTS[plant][3])
    code, output, result = chaos(
        tmp_path, "--duration", "0", "--seed", "1", "--plant", plant, "--faults", kinds, timeout=580
    )
    assert code == 1, output[-6000:]
    assert result["violations"], output[-6000:]
    assert all("invariant 1 nothing in Git deleted violated" in v for v in result["violations"][:1])
    assert "(seed 1)" in result["violations"][0] and "at step 1" in result["violations"][0]


def test_a_status_row_carries_the_typed_failure_and_prune_refusal_reasons_the_runner_reads() -> None:
    from agent.model import ClusterResult, Failure, FailureReason, PruneReason, PruneRefusal
    from agent.run.status import AppStatus

    failed = AppStatus("c", "a", last_result=ClusterResult("c", failure=Failure(FailureReason.RENDER, "x")))
    braked = AppStatus(
        "c", "a", last_result=ClusterResult("c", prune_refusal=PruneRefusal(PruneReason.BRAKE, "y"))
    )
    assert (failed.to_json()["reason"], failed.to_json()["prune_reason"]) == ("render", None)
    assert (braked.to_json()["reason"], braked.to_json()["prune_reason"]) == (None, "brake")
