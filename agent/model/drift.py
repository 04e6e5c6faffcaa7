"""Drift: a Git-declared field changed (or an object deleted) in the cluster, not by Git.

An app with ``drift = "report"`` leaves drift where it is while its revision is the one it last
applied successfully, and says so with one ``Drift`` per field (``plan.drift`` decides them):
which object and field, Git's value and live's (Secrets' values masked), and who wrote it and
when, read from the live object's ``managedFields`` (the manager, operation and time of the
entry that owns the field). Read by metrics, Events, alerts, ``/status`` and the status page.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from agent.model.keys import ObjectKey


class DriftKind(enum.StrEnum):
    """What drifted."""

    #: A field Git declares holds another value live (or was removed).
    CHANGED = "changed"
    #: The object was deleted in the cluster: not re-created while the revision stays.
    DELETED = "deleted"


class Evidence(enum.StrEnum):
    """How the writer was found in ``managedFields``."""

    #: The entry that owns the field: its manager wrote the live value.
    OWNER = "owner"
    #: No entry owns the field (it was removed): the latest writer other than the agent.
    LATEST = "latest"
    #: Nothing to read: the object is gone, or no other manager wrote it.
    NONE = "none"


class DriftFate(enum.StrEnum):
    """What the pass did about it."""

    #: Left as it is (``drift = "report"``, revision unchanged): nothing written for the object.
    REPORTED = "reported"
    #: Overwritten by the apply of a new revision (the app is applied whole).
    CORRECTED = "corrected"


@dataclass(frozen=True)
class Drift:
    """One drifted field (or one deleted object) of one app's object."""

    key: ObjectKey
    kind: DriftKind
    #: The field in users' words (``spec.template.spec.containers[name=web].image``); "" when deleted.
    path: str = ""
    #: Git's value and live's (``None``: absent); masked where the object holds secrets.
    git: Any = None
    live: Any = None
    #: Who wrote it: the ``managedFields`` entry's manager, operation, subresource and time.
    manager: str = ""
    operation: str = ""
    subresource: str = ""
    time: str = ""
    evidence: Evidence = Evidence.NONE
    fate: DriftFate = DriftFate.REPORTED

    @property
    def who(self) -> str:
        """``kubectl-edit (Update) at 2026-12-06T06:31:02Z``, or what is known of it."""
        if not self.manager:
            return "unknown (not recorded by the API server)"
        op = f"{self.operation} of {self.subresource}" if self.subresource else self.operation
        text = f"{self.manager} ({op})" if op else self.manager
        if self.time:
            text += f" at {self.time}"
        if self.evidence is Evidence.LATEST:
            text += ", the latest writer (no entry owns the field)"
        return text

    def describe(self) -> str:
        """One line for people (logs, Events, alerts)."""
        if self.kind is DriftKind.DELETED:
            return f"{self.key}: deleted in the cluster (Git declares it)"
        return f"{self.key}: {self.path}: Git {_shown(self.git)}, live {_shown(self.live)}, by {self.who}"

    def to_json(self) -> dict[str, Any]:
        return {
            "object": str(self.key),
            "kind": self.kind.value,
            "path": self.path,
            "git": self.git,
            "live": self.live,
            "manager": self.manager,
            "operation": self.operation,
            "subresource": self.subresource,
            "time": self.time,
            "evidence": self.evidence.value,
            "fate": self.fate.value,
        }


def _shown(value: Any, limit: int = 80) -> str:
    if value is None:
        return "(absent)"
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def drifted_objects(drift: list[Drift] | tuple[Drift, ...]) -> int:
    """How many objects have drift (the ``gitops_agent_drift_objects`` gauge)."""
    return len({d.key for d in drift})
