"""The chaos run: a seeded schedule of faults, the loop that injects them, and the table of what survived.

Called by ``benchmarks.__main__`` (``python -m benchmarks chaos``). The schedule is a pure
function of the seed: rounds, each a seeded permutation of the fault kinds, each step with its
target cluster and its own ``random.Random`` for the fault's choices, so a run is reproduced by
its seed. The first round always completes (every kind at least once), then rounds go on
until ``--duration`` has passed; a quiet phase ends the run.

Each step: inject, observe (a fault counts only when its effect was seen), check the
invariants on every cluster the fault did not stop, heal, wait until every app of every
cluster is ok at Git's head with Git's values (invariant 4: drift corrected within
``CONVERGE_SECONDS``, K = that over the reconcile interval), check every invariant again.
Progress goes to stderr; the table to stdout; JSON and Markdown into ``--out``. Exit 1 on any
violation, each named with its invariant, cluster, step and seed.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.chaos import content, invariants
from benchmarks.chaos import faults as f
from benchmarks.chaos.invariants import Invariant, Violation
from benchmarks.chaos.world import AGENT_NAME, CLUSTERS, RECONCILE_INTERVAL, REPO_ROOT, World

CONVERGE_SECONDS = 60.0
#: Violations printed per step and in the table (the JSON has them all).
SHOWN = 10
KINDS = tuple(f.FAULTS)
#: Kinds in the first round and then only in every Nth: a killed agent restarts with a fresh
#: heap, so it is killed seldom enough that a process lives long enough to show a leak.
EVERY_NTH_ROUND = {"agent-kill": 4}

#: ``--plant NAME``: the agent runs from a copy of ``agent/`` with one prune guard disabled, and
#: the run must fail with the matching violation. (file, exact text, replacement, kinds to run).
PLANTS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "brake": (
        "apply/prune.py",
        "if (over_fraction or over_count) and inventory.approved_digest != d.digest:",
        "if False:  # planted: the mass-deletion brake is off",
        ("mass-removal",),
    ),
    "fail-closed": (
        "render/renderer.py",
        "    if job.problems:\n        raise RenderError(job.problems, cluster=spec.cluster)",
        "    if False:  # planted: a render with problems returns what it found\n        pass",
        ("render-error",),
    ),
}


@dataclass(frozen=True)
class Planned:
    index: int
    kind: str
    cluster: str


def schedule(seed: int, kinds: tuple[str, ...]) -> Iterator[Planned]:
    """Endless: rounds, each a permutation of ``kinds`` (see ``EVERY_NTH_ROUND``), each step's target."""
    rng = random.Random(seed)
    index = 0
    for round_no in itertools.count():
        order = [k for k in kinds if round_no % EVERY_NTH_ROUND.get(k, 1) == 0]
        rng.shuffle(order)
        for kind in order:
            index += 1
            cluster = rng.choice(CLUSTERS)  # drawn for every kind, so a fixed target shifts nothing
            yield Planned(index, kind, f.FAULTS[kind].only or cluster)


@dataclass
class Tally:
    injected: int = 0
    observed: int = 0
    survived: int = 0
    max_convergence: float = 0.0


@dataclass
class Run:
    world: World
    seed: int
    kinds: tuple[str, ...]
    duration: float
    ledger: f.Ledger = field(default_factory=f.Ledger)
    known: dict[str, dict[content.Key, str]] = field(default_factory=dict)
    tally: dict[str, Tally] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    # -- what Git protects ------------------------------------------------------------------

    def protected(self, cluster: str) -> set[content.Key]:
        return {k for objs in content.declared(self.ledger.basis[cluster]).values() for k in objs}

    def declared(self, cluster: str) -> dict[content.Key, dict[str, Any]]:
        out: dict[content.Key, dict[str, Any]] = {}
        for objs in content.declared(self.ledger.basis[cluster]).values():
            out.update(objs)
        return out

    # -- checks -----------------------------------------------------------------------------

    def snapshot(self, cluster: str) -> invariants.Snapshot:
        return invariants.snapshot(cluster, lambda path: self.world.api(cluster, "GET", path))

    def check(self, step: int, *, skip: str | None = None, quiet: bool = False) -> list[Violation]:
        """Invariants 1, 2, 3, 5 and 6 (and 4 when ``quiet``) on every cluster but ``skip``."""
        found: list[Violation] = []

        def add(inv: Invariant, where: str, whats: list[str]) -> None:
            found.extend(Violation(inv, where, w, step) for w in whats)

        for c in CLUSTERS:
            if c == skip:
                continue
            snap = self.snapshot(c)
            protected = self.protected(c)
            known = self.known.setdefault(c, {})
            add(Invariant.NOT_DELETED, c, invariants.not_deleted(snap, protected, known))
            add(
                Invariant.FOREIGN_OBJECTS,
                c,
                invariants.foreign_objects(snap, self.ledger.foreign_objects.get(c, {}), AGENT_NAME),
            )
            add(
                Invariant.FOREIGN_FIELDS,
                c,
                invariants.foreign_fields(snap, self.ledger.foreign_fields.get(c, {})),
            )
            add(Invariant.INVENTORY, c, invariants.inventory_covers(snap))
            if quiet:
                add(Invariant.DRIFT, c, invariants.drifted(snap, self.declared(c)))
            # Learn UIDs after checking (a re-created object must not become the reference),
            # and forget those of objects that left Git: their deletion is legitimate.
            for key in list(known):
                if key not in protected:
                    del known[key]
            for key in protected:
                if key in snap.objects and key not in known:
                    known[key] = snap.objects[key].uid
        add(Invariant.LIVENESS, "the agent", invariants.liveness(self.world.watch.take_failures()))
        return found

    def converge(self, since: datetime) -> tuple[float | None, str]:
        """Wait until every app is ok at Git's head with Git's values; (seconds, "") or (None, why)."""
        t0 = time.monotonic()
        why = ""

        def done() -> bool:
            nonlocal why
            head = self.world.git.head()
            rows = f.rows(self.world)
            if len(rows) != 2 * len(CLUSTERS):
                why = f"/status lists {len(rows)} apps"
                return False
            for r in rows:
                if (
                    r["state"] != "ok"
                    or r["last_success_revision"] != head
                    or not f._finished_after(r, since)
                ):
                    why = (
                        f"{r['cluster']}/{r['app']}: state {r['state']}, reason {r['reason']}, "
                        "last success at "
                        f"{r['last_success_revision'][:10]}, head {head[:10]}"
                    )
                    return False
            for c in CLUSTERS:
                if wrong := invariants.drifted(self.snapshot(c), self.declared(c)):
                    why = f"{c}: {wrong[0]}"
                    return False
            return True

        if f.wait_until(done, CONVERGE_SECONDS, 0.25):
            return time.monotonic() - t0, ""
        return None, why

    # -- the loop ---------------------------------------------------------------------------

    def setup(self) -> None:
        self.world.start()
        self.ledger.basis = dict(self.world.git.contents)
        seconds, why = self.converge(datetime.now(UTC))
        if seconds is None:
            raise RuntimeError(f"the agent never converged after start: {why}")
        for c in CLUSTERS:  # users' own objects beside the agent's, in both namespaces
            objs = self.ledger.foreign_objects.setdefault(c, {})
            for ns in (content.NS, content.NS_K):
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "users-own"},
                    "data": {"x": "1"},
                }
                code, made = self.world.api(c, "POST", f"/api/v1/namespaces/{ns}/configmaps", body)
                if code != 201:
                    raise RuntimeError(f"{c}: creating ConfigMap {ns}/users-own answered {code}: {made}")
                objs[("ConfigMap", ns, "users-own")] = (
                    made["metadata"]["uid"],
                    made["metadata"]["resourceVersion"],
                )
        self.violations += self.check(0, quiet=True)

    def step(self, planned: Planned) -> None:
        fault = f.FAULTS[planned.kind]
        s = f.Step(
            planned.index,
            planned.kind,
            planned.cluster,
            random.Random(f"{self.seed}/{planned.index}"),
            self.world,
            self.ledger,
        )
        tally = self.tally.setdefault(planned.kind, Tally())
        tally.injected += 1
        t0 = time.monotonic()
        record: dict[str, Any] = {"step": s.index, "kind": s.kind, "cluster": s.cluster}
        found: list[Violation] = []
        try:
            fault.inject(s)
            observed = fault.observe(s)
            found += self.check(s.index, skip=s.cluster if fault.stops_cluster else None)
        finally:
            fault.heal(s)
            healed_at = datetime.now(UTC)
        seconds, why = self.converge(healed_at)
        if seconds is None:
            found.append(
                Violation(
                    Invariant.DRIFT,
                    "the fleet",
                    f"not converged {CONVERGE_SECONDS:g}s after the heal: {why}",
                    s.index,
                )
            )
        found += self.check(s.index, quiet=seconds is not None)
        tally.observed += observed
        tally.survived += observed and not found
        if seconds is not None:
            tally.max_convergence = max(tally.max_convergence, seconds)
        record.update(
            observed=observed,
            facts={k: v for k, v in s.facts.items() if isinstance(v, (bool, int, str))},
            seconds=round(time.monotonic() - t0, 2),
            convergence=None if seconds is None else round(seconds, 2),
            violations=[v.describe(self.seed) for v in found],
        )
        self.steps.append(record)
        self.violations += found
        conv = "never" if seconds is None else f"{seconds:.1f}s"
        mark = "observed" if observed else "NOT observed"
        print(
            f"step {s.index:4d} {s.kind:<20} {s.cluster:<8} {mark:<13} converged {conv:<7} "
            f"{len(found)} violation(s)",
            file=sys.stderr,
            flush=True,
        )
        for v in found[:SHOWN]:
            print(f"  {v.describe(self.seed)}", file=sys.stderr, flush=True)

    def run(self) -> None:
        started = time.monotonic()
        for planned in schedule(self.seed, self.kinds):
            first_round = planned.index <= len(self.kinds)
            if not first_round and time.monotonic() - started >= self.duration:
                break
            self.step(planned)
            if self.violations:
                break
        if not self.violations:  # the quiet phase: K passes with no fault, then everything again
            time.sleep(3 * RECONCILE_INTERVAL)
            seconds, why = self.converge(datetime.now(UTC))
            if seconds is None:
                self.violations.append(
                    Violation(Invariant.DRIFT, "the fleet", f"not converged in the quiet phase: {why}", -1)
                )
            self.violations += self.check(-1, quiet=True)
        self.violations += [
            Violation(Invariant.RESOURCES, "the agent", w, -1)
            for w in invariants.resources(self.world.agent.samples)
        ]


# ---------------------------------------------------------------- results


def resources_summary(samples: dict[int, list[Any]]) -> dict[str, Any]:
    """Start (after warm-up) and end of the longest-lived agent process; the peak of all."""
    lives = [rows for rows in samples.values() if rows]
    if not lives:
        return {}
    longest = max(lives, key=lambda r: r[-1].at - r[0].at)
    warm = invariants.warm_sample(longest) or longest[0]
    return {
        "rss_start_mb": round(warm.rss_mb, 1),
        "rss_end_mb": round(longest[-1].rss_mb, 1),
        "fds_start": warm.fds,
        "fds_end": longest[-1].fds,
        "agent_processes": len(lives),
        "longest_process_minutes": round((longest[-1].at - longest[0].at) / 60, 1),
        "rss_peak_mb": round(max(s.rss_mb for rows in lives for s in rows), 1),
    }


def result_of(run: Run, *, plant: str | None, seconds: float) -> dict[str, Any]:
    kinds = {
        k: {
            "injected": t.injected,
            "observed": t.observed,
            "survived": t.survived,
            "max_convergence_s": round(t.max_convergence, 1),
        }
        for k, t in sorted(run.tally.items())
    }
    return {
        "command": "chaos",
        "seed": run.seed,
        "duration_s": run.duration,
        "seconds": round(seconds, 1),
        "plant": plant,
        "kinds": kinds,
        "observed_total": sum(t.observed for t in run.tally.values()),
        "violations": [v.describe(run.seed) for v in run.violations],
        "max_convergence_s": round(max((t.max_convergence for t in run.tally.values()), default=0.0), 1),
        "resources": resources_summary(run.world.agent.samples),
        "healthz_probes": run.world.watch.probes,
        "steps": run.steps,
    }


def table(result: dict[str, Any]) -> str:
    """The Markdown table (also what stdout shows)."""
    lines = [
        f"Seed {result['seed']}, {result['seconds'] / 60:.1f} minutes, {len(result['steps'])} steps, "
        f"{result['observed_total']} observed faults"
        + (f", planted: {result['plant']}" if result["plant"] else "")
        + ".",
        "",
        "| fault | injected | observed | survived | max convergence after heal |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, t in result["kinds"].items():
        lines.append(
            f"| {kind} | {t['injected']} | {t['observed']} | {t['survived']} "
            f"| {t['max_convergence_s']:.1f} s |"
        )
    r = result["resources"]
    lines += [
        "",
        f"Invariant violations: **{len(result['violations'])}**. Max convergence after a fault: "
        f"{result['max_convergence_s']:.1f} s.",
    ]
    if r:
        lines.append(
            f"Agent RSS (its longest-lived process) {r['rss_start_mb']} MB after warm-up → "
            f"{r['rss_end_mb']} MB at its end (peak of all "
            f"{r['rss_peak_mb']} MB); open fds {r['fds_start']} → {r['fds_end']}; "
            f"{r['agent_processes']} agent process(es) (each kill starts one), the longest lived "
            f"{r['longest_process_minutes']} min; "
            f"{result['healthz_probes']} /healthz probes."
        )
    lines += [f"- {v}" for v in result["violations"][:SHOWN]]
    if len(result["violations"]) > SHOWN:
        lines.append(f"- ... and {len(result['violations']) - SHOWN} more (in the JSON)")
    return "\n".join(lines) + "\n"


DOCS_START, DOCS_END = "<!-- chaos-table -->", "<!-- /chaos-table -->"


def write_docs(path: Path, text: str) -> None:
    """Replace the generated table between the markers of docs/reliability.md."""
    doc = path.read_text()
    head, _, rest = doc.partition(DOCS_START)
    _, _, tail = rest.partition(DOCS_END)
    path.write_text(f"{head}{DOCS_START}\n{text}{DOCS_END}{tail}")


def plant_copy(name: str, into: Path) -> Path:
    """A copy of the repository's ``agent/`` with plant ``name`` applied; returns the root to run from."""
    rel, old, new, _ = PLANTS[name]
    shutil.copytree(REPO_ROOT / "agent", into / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    target = into / "agent" / rel
    text = target.read_text()
    if text.count(old) != 1:
        raise RuntimeError(
            f"plant {name!r}: agent/{rel} no longer holds the guard it disables; update PLANTS"
        )
    target.write_text(text.replace(old, new))
    return into


def main(
    *, duration: float, seed: int, kinds: tuple[str, ...], plant: str | None, out: Path, docs: bool
) -> int:
    started = datetime.now(UTC)
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="gitops-chaos-"))
    source_root = plant_copy(plant, root / "plant") if plant else REPO_ROOT
    world = World(root, source_root=source_root)
    run = Run(world, seed, kinds, duration)
    try:
        run.setup()
        run.run()
    finally:
        world.close()
        log = world.agent.log
        keep = out / f"chaos-{started.strftime('%Y%m%dT%H%M%SZ')}.agent.log"
        out.mkdir(parents=True, exist_ok=True)
        if log.exists() and run.violations:
            shutil.copy(log, keep)
        shutil.rmtree(root, ignore_errors=True)
    result = result_of(run, plant=plant, seconds=time.monotonic() - t0)
    text = table(result)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    (out / f"chaos-{stamp}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"chaos-{stamp}.md").write_text(text)
    if docs:
        write_docs(REPO_ROOT / "docs" / "reliability.md", text)
    print(text, end="")
    print(f"wrote {out / f'chaos-{stamp}.json'}", file=sys.stderr)
    return 1 if run.violations else 0
