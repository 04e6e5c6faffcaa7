"""Which config entries reach the same cluster, known by the UID of its ``kube-system`` namespace.

Every entry's ApplySet parent is keyed by the agent name, so two ``[[clusters]]``
entries reaching one cluster (the same kubeconfig, or two URLs of one API server)
share one inventory and each pass of one prunes what the other applied. The UID
of ``kube-system`` tells them apart where the URL cannot: created once with the
cluster, never renamed, the same through every address. ``Fleet`` keeps one
``IdentityBook``; every pass records its own entry's UID and reads, once, those
of the entries no pass has read yet, so the first pass of either entry already
sees the other and both are refused whichever runs first. Where RBAC hides
``kube-system`` (the namespaced install), the claim on the parent
(``model.CLAIMED_BY``) refuses the second entry instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import structlog

log = structlog.get_logger("gitops_agent.identity")

#: How long a pass waits for another pass's read of the same entry (reads have their own timeouts).
WAIT_FOR_PEER = 60.0


class IdentityBook:
    """Entry name → kube-system UID (``None``: unreadable or unreachable when read). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uids: dict[str, str | None] = {}
        self._reading: dict[str, threading.Event] = {}

    def record(self, entry: str, uid: str | None) -> None:
        with self._lock:
            self._uids[entry] = uid

    def forget(self, entry: str) -> None:
        """The entry was removed or now points elsewhere: read it again when next needed."""
        with self._lock:
            self._uids.pop(entry, None)

    def resolve(self, entries: Iterable[str], read: Callable[[str], str | None]) -> None:
        """Read the UID of each entry never read (side by side, each once for all callers); wait for them.

        ``read`` must not raise and must be bounded in time (the peer's own timeouts). A failed read
        is recorded as ``None`` and not retried here: that entry's own passes record it when they can.
        """
        mine: list[tuple[str, threading.Event]] = []
        theirs: list[threading.Event] = []
        with self._lock:
            for entry in entries:
                if entry in self._uids:
                    continue
                if entry in self._reading:
                    theirs.append(self._reading[entry])
                else:
                    event = self._reading[entry] = threading.Event()
                    mine.append((entry, event))
        threads = [
            threading.Thread(target=self._read, args=(e, ev, read), name=f"identity-{e}", daemon=True)
            for e, ev in mine
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for event in theirs:
            event.wait(WAIT_FOR_PEER)

    def _read(self, entry: str, event: threading.Event, read: Callable[[str], str | None]) -> None:
        uid: str | None = None
        try:
            uid = read(entry)
        finally:
            with self._lock:
                self._uids.setdefault(entry, uid)  # a pass of that entry may have recorded it meanwhile
                self._reading.pop(entry, None)
            event.set()

    def sharing(self, entry: str, uid: str) -> list[str]:
        """The other entries known to reach the cluster whose kube-system UID is ``uid``."""
        with self._lock:
            return sorted(e for e, u in self._uids.items() if u == uid and e != entry)


def shared_message(entry: str, others: list[str], uid: str, *, agent: str, namespace: str) -> str:
    """The refusal of an entry whose cluster other entries reach too: who, why, and the fix."""
    names = sorted({entry, *others})  # the same words in every entry's refusal
    listed = ", ".join(repr(n) for n in names[:-1]) + f" and {names[-1]!r}"
    return (
        f"entries {listed} reach the same cluster (kube-system namespace UID {uid}): they would share "
        f"one inventory (ApplySet parent ConfigMap {namespace}/{agent}) and each would prune what "
        "the others apply, so every one of them is refused and nothing was applied, pruned or "
        "written there. Serve the cluster from one entry (list every team's paths in it), or run "
        "the other team with its own [agent] name."
    )
