"""Why each app of a pass ran, in the words the history shows: pure.

``scheduler.Daemon`` knows it when a pass starts: a forced pass (``coalesce.JobState``) was
asked for by a ``sync`` (``manual sync``), a config reload or a Lease acquired; otherwise each
app's ``due.Due`` says why it is due (a new revision, its interval, its backoff after
failures, its first pass, a dependency). A new revision that a verified push made the agent
poll for (``receiver``) is a ``webhook push``. The status page keeps the trigger with each
pass (``ui.records.PassEntry``), and ``gitops-agent history`` prints it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum

from agent.run.due import Decision, DueReason

__all__ = ["Trigger", "triggers"]


class Trigger(StrEnum):
    FIRST_PASS = "first pass"
    NEW_REVISION = "new revision"
    WEBHOOK = "webhook push"
    INTERVAL = "interval"
    MANUAL_SYNC = "manual sync"
    BACKOFF = "retry/backoff"
    DEPENDENCY = "dependency"
    CONFIG_RELOAD = "config reloaded"
    LEASE = "lease acquired"


_BY_REASON = {
    DueReason.FIRST_PASS: Trigger.FIRST_PASS,
    DueReason.NEW_REVISION: Trigger.NEW_REVISION,
    DueReason.INTERVAL: Trigger.INTERVAL,
    DueReason.BACKOFF: Trigger.BACKOFF,
    DueReason.WAITING: Trigger.DEPENDENCY,
    DueReason.UNBLOCKED: Trigger.DEPENDENCY,
}

#: A forced pass's ``why`` (``Daemon.sync``, ``Daemon._force``) → its trigger.
FORCED = {
    "manual sync": Trigger.MANUAL_SYNC,
    "config reloaded": Trigger.CONFIG_RELOAD,
    "lease acquired": Trigger.LEASE,
}


def triggers(
    decision: Decision,
    apps: Collection[str],
    *,
    forced_by: str = "",
    pushed: Collection[str] = (),
    source_of: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """App → why it runs in this pass, for each of ``apps``. ``forced_by``: the forced pass's
    why ("" when not forced); ``pushed``: the sources whose new revision a push announced."""
    own = {d.app: d for d in decision.apps}
    out: dict[str, str] = {}
    for app in apps:
        due = own.get(app)
        if forced_by and (due is None or due.reason is not DueReason.NEW_REVISION):
            out[app] = FORCED.get(forced_by, Trigger.MANUAL_SYNC).value
        elif due is None:
            out[app] = Trigger.DEPENDENCY.value  # run first for an app that depends on it
        elif due.reason is DueReason.NEW_REVISION and (source_of or {}).get(app) in pushed:
            out[app] = Trigger.WEBHOOK.value
        else:
            out[app] = _BY_REASON[due.reason].value
    return out
