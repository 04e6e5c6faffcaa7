"""Pure: whether the running agent's ``/status`` shows an app synced or healthy at a revision,
for ``gitops-agent wait`` (which polls ``/status`` and asks this at each answer).

Synced: the app's last pass succeeded at the revision (the one asked for, else its source's
latest as the agent polled it), nothing waited for, not suspended. Healthy: synced, and its wait
read the rollout Current at that revision (so only apps with ``wait`` set can be healthy).
Failed, for good at that revision: its pass failed there (any failure, a refusal, a deadline),
the mass-deletion brake holds its prune (only ``prune approve`` lifts it), or its rollout
Failed there. Anything else is not yet: the caller polls again, until its own timeout.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: A commit as ``--revision`` names it: 7 to 40 hexadecimal digits (what ``/status`` shows).
SHA = re.compile(r"^[0-9a-f]{7,40}$")


class Goal(enum.StrEnum):
    HEALTHY = "healthy"
    SYNCED = "synced"


class Verdict(enum.StrEnum):
    REACHED = "reached"
    FAILED = "failed"
    PENDING = "pending"
    #: The question cannot be answered: no such cluster or app, or no health to wait for.
    UNANSWERABLE = "unanswerable"


@dataclass(frozen=True)
class Answer:
    verdict: Verdict
    message: str
    #: The revision waited for ("" while the app's source has none yet).
    revision: str = ""

    def to_json(self) -> dict[str, str]:
        return {"verdict": self.verdict.value, "message": self.message, "revision": self.revision}


def _at(actual: str | None, wanted: str) -> bool:
    return bool(actual) and bool(wanted) and str(actual).startswith(wanted)


def _first(text: object) -> str:
    return (str(text or "").splitlines() or [""])[0]


def _row(doc: Mapping[str, Any], cluster: str, app: str) -> dict[str, Any] | Answer:
    rows = [r for r in doc.get("clusters") or [] if isinstance(r, dict)]
    found = next((r for r in rows if r.get("cluster") == cluster and r.get("app", cluster) == app), None)
    if found is not None:
        return found
    apps = [str(r.get("app", cluster)) for r in rows if r.get("cluster") == cluster]
    if apps:
        return Answer(
            Verdict.UNANSWERABLE, f"cluster {cluster!r} has no app {app!r} (its apps: {', '.join(apps)})"
        )
    served = ", ".join(sorted({str(r.get("cluster")) for r in rows})) or "none"
    return Answer(Verdict.UNANSWERABLE, f"the agent serves no cluster {cluster!r} (its clusters: {served})")


def _target(doc: Mapping[str, Any], row: Mapping[str, Any], revision: str) -> str:
    """The revision asked for, else the latest of the app's source (the default's for an agent
    whose rows do not name it)."""
    if revision:
        return revision
    source = row.get("source")
    for s in doc.get("sources") or []:
        if isinstance(s, dict) and s.get("name") == source:
            return str(s.get("revision") or "")
    return str(doc.get("revision") or "") if source is None else ""


def _sync(row: Mapping[str, Any], target: str) -> Answer | None:
    """None when synced at ``target``; else why not, or why never."""
    at = str(row.get("revision") or "")
    if not _at(at, target):
        state = row.get("state") or "pending"
        return Answer(Verdict.PENDING, f"{state}, last pass at {at[:12] or 'no revision'}", target)
    if row.get("result") == "failed":
        why = _first(row.get("error")) or f"{row.get('failed_objects', 0)} objects failed"
        ended = "refused" if row.get("refused") else "failed"
        return Answer(Verdict.FAILED, f"pass {ended} at {at[:12]}: {why}", target)
    if row.get("prune_reason") == "brake":
        return Answer(Verdict.FAILED, f"prune held at {at[:12]}: {_first(row.get('prune_refused'))}", target)
    if row.get("result") != "ok":
        return Answer(Verdict.PENDING, f"{row.get('state') or 'pending'} at {at[:12]}", target)
    if row.get("waiting_on"):
        return Answer(Verdict.PENDING, f"waiting on {', '.join(row['waiting_on'])}", target)
    if row.get("prune_reason") == "suspended":
        return Answer(Verdict.PENDING, "suspended (gitops-agent resume lifts it)", target)
    return None


def answer(doc: Mapping[str, Any], cluster: str, app: str, goal: Goal, revision: str = "") -> Answer:
    """What ``/status`` (``doc``) says of ``goal`` for (``cluster``, ``app``) at ``revision``."""
    row = _row(doc, cluster, app)
    if isinstance(row, Answer):
        return row
    target = _target(doc, row, revision)
    if not target:
        return Answer(Verdict.PENDING, f"source {row.get('source') or 'default'} has no revision yet")
    if (not_synced := _sync(row, target)) is not None:
        return not_synced
    if goal is Goal.SYNCED:
        return Answer(Verdict.REACHED, f"synced at {target[:12]}", target)
    health = row.get("health") or {}
    if not _at(health.get("revision"), target):
        if row.get("follows_health") is False:
            return Answer(
                Verdict.UNANSWERABLE,
                f"app {app!r} does not follow its rollout (`wait` is not set): its health is never read;"
                " wait --for synced instead, or set wait",
                target,
            )
        return Answer(Verdict.PENDING, f"synced at {target[:12]}, rollout not read yet", target)
    state = str(health.get("state") or "")
    blocker = f"; {health['blocker']}" if health.get("blocker") else ""
    if state == "Current":
        return Answer(Verdict.REACHED, f"healthy at {target[:12]}", target)
    if state == "Failed":
        return Answer(
            Verdict.FAILED, f"health Failed at {target[:12]}: {health.get('message', '')}{blocker}", target
        )
    return Answer(
        Verdict.PENDING, f"synced at {target[:12]}, health {state}: {health.get('message', '')}", target
    )
