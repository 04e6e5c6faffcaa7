"""Apply a plan to one cluster with server-side apply, object by object.

Called by ``reconcile`` after the inventory was widened. Only the plan's body
is sent (yielded paths already removed), with our field manager, ``force``
only when the plan forces, and the ``resourceVersion`` the plan was made from,
so a write in between fails with 409 and the object is re-planned from a
fresh read (bounded) in the same pass. An update the server answers with the version it
had wrote nothing and counts as ``UNCHANGED``. The re-plan also gets the 409's
``FieldManagerConflict`` causes: the server may name owners the object does
not show (``before-first-apply`` after managedFields were cleared), and the
conflict rules decide those too (``causes``). Never PUT, never a
read-modify-written copy (docs/safety.md rule 4).

Order: Namespaces, then CRDs (waiting until Established and refreshing
discovery), then other cluster-scoped objects, then namespaced ones; objects
of one phase go in parallel on the cluster's own bounded pool. One rejected
object is a ``FAILED`` result and the rest go on (docs/safety.md rule 6); only a
cluster-level failure (no answer, credentials refused) ends the pass.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from agent.config.types import CLUSTER_DEFAULTS, CONFLICT_RETRIES, CRD_WAIT
from agent.errors import ApiError, StatusCause
from agent.kube.client import KubeClient
from agent.model import (
    RECREATE,
    RECREATE_ON_IMMUTABLE,
    Action,
    ApplyResult,
    Change,
    Manifest,
    Note,
    ObjectKey,
    Outcome,
    phase_of,
)
from agent.plan import apis

#: Re-plan one object from a fresh read and the 409's causes (the owners the server named).
Replanner = Callable[[ObjectKey, Manifest | None, tuple[StatusCause, ...]], Change]
#: The request body of a change: the plan masks Secret values, only this puts them back.
BodyFor = Callable[[Change], Manifest | None]
#: Requests submitted ahead per worker of the apply pool: enough that no worker waits for work.
WINDOW_PER_WORKER = 4
#: Reads of a new CRD until it is Established: the first after this long, doubling up to the last.
ESTABLISHED_FIRST_DELAY, ESTABLISHED_MAX_DELAY = 0.01, 0.2


@dataclass(frozen=True)
class ApplyOptions:
    #: Our field manager: the only owner we write as.
    field_manager: str
    #: Send every request with ``dryRun=All``: the pass changes nothing.
    dry_run: bool = False
    #: Objects applied at once within a phase (per cluster); the pass passes the cluster's setting.
    concurrency: int = CLUSTER_DEFAULTS.concurrency
    #: Seconds to wait for a CRD applied in this pass to become Established.
    crd_wait: float = CRD_WAIT
    #: Re-plans after a 409 before the object is reported failed.
    conflict_retries: int = CONFLICT_RETRIES


def apply_changes(
    client: KubeClient, changes: Sequence[Change], options: ApplyOptions, replan: Replanner, body_for: BodyFor
) -> list[ApplyResult]:
    """Apply every change phase by phase; returns one result per change."""
    results: list[ApplyResult] = []
    by_phase: dict[int, list[Change]] = {}
    for c in changes:
        by_phase.setdefault(phase_of(c.key), []).append(c)
    with ThreadPoolExecutor(
        max_workers=max(1, options.concurrency), thread_name_prefix=f"apply-{client.name}"
    ) as pool:
        for phase in sorted(by_phase):
            batch = sorted(by_phase[phase], key=lambda c: c.key)
            # Changes that send nothing are answered here: a pool round trip per unchanged
            # object was most of a steady-state pass's apply time.
            sends = [i for i, c in enumerate(batch) if _sends(c)]
            sent = dict(
                zip(
                    sends,
                    _windowed(
                        pool,
                        lambda c: _apply_one(client, c, options, replan, body_for),
                        [batch[i] for i in sends],
                        window=max(1, options.concurrency) * WINDOW_PER_WORKER,
                    ),
                    strict=True,
                )
            )
            phase_results = [
                sent[i] if i in sent else _apply_one(client, c, options, replan, body_for)
                for i, c in enumerate(batch)
            ]
            results.extend(phase_results)
            if phase == 1 and not options.dry_run:
                _wait_established(
                    client,
                    [r for r in phase_results if r.outcome in (Outcome.CREATED, Outcome.CONFIGURED)],
                    options,
                )
    return results


def _windowed(
    pool: ThreadPoolExecutor, fn: Callable[[Change], ApplyResult], items: Sequence[Change], *, window: int
) -> Iterator[ApplyResult]:
    """``pool.map(fn, items)`` with at most ``window`` submitted and not yet taken.

    ``pool.map`` submits every item at once: a future (with its condition and lock) per object,
    ~1 KB each, 9,000 objects x 3 clusters were ~25 MB of a first pass's peak.
    """
    pending: deque[Future[ApplyResult]] = deque()
    for item in items:
        if len(pending) >= window:
            yield pending.popleft().result()
        pending.append(pool.submit(fn, item))
    while pending:
        yield pending.popleft().result()


def _sends(change: Change) -> bool:
    """Whether ``_apply_one`` would send a request for ``change`` (else it answers at once)."""
    return change.action not in (Action.NOOP, Action.SKIP, Action.CONFLICT) and change.body is not None


def _apply_one(
    client: KubeClient, change: Change, options: ApplyOptions, replan: Replanner, body_for: BodyFor
) -> ApplyResult:
    for attempt in range(options.conflict_retries + 1):
        if change.action is Action.NOOP:
            return ApplyResult(change.key, Outcome.UNCHANGED, uid=change.uid, ignored=change.ignored)
        if change.action is Action.CONFLICT:
            # Every differing field is yielded to its owner: nothing to send.
            return ApplyResult(
                change.key,
                Outcome.UNCHANGED,
                message=change.reason,
                uid=change.uid,
                note=Note.YIELDED,
                yielded=change.yielded,
                ignored=change.ignored,
            )
        if change.action is Action.SKIP or change.body is None:
            return ApplyResult(
                change.key, Outcome.SKIPPED, message=change.reason, uid=change.uid, skip=change.skip
            )
        try:
            return _send(client, change, body_for(change), options)
        except ApiError as e:
            if e.is_cluster_level:
                raise
            if e.is_conflict and attempt < options.conflict_retries:
                change = _fresh(client, change, replan, e.causes)
                continue
            if e.is_immutable:
                return _immutable(client, change, body_for(change), options, e)
            if e.status == 404 and not (e.details and e.details.kind):
                return _not_served(client, change, e)
            return ApplyResult(change.key, Outcome.FAILED, status=e.status, message=e.api_message or str(e))
    return ApplyResult(
        change.key,
        Outcome.FAILED,
        status=409,
        message="conflicting writes: gave up after re-planning",
        note=Note.CONFLICTS_UNRESOLVED,
    )


def _send(client: KubeClient, change: Change, body: Manifest | None, options: ApplyOptions) -> ApplyResult:
    assert body is not None
    if change.resource_version and change.action is not Action.CREATE:
        body = copy.copy(body)
        body["metadata"] = {**body.get("metadata", {}), "resourceVersion": change.resource_version}
    warnings: list[str] = []
    out = client.apply(
        body,
        field_manager=options.field_manager,
        force=change.force,
        dry_run=options.dry_run,
        warnings=warnings,
    )
    outcome = Outcome.CREATED if change.action is Action.CREATE else Outcome.CONFIGURED
    meta = (out.get("metadata") or {}) if out else {}
    uid = meta.get("uid")
    if _stored_nothing(change, meta, options):
        outcome = Outcome.UNCHANGED
    return ApplyResult(
        change.key,
        outcome,
        message=change.reason,
        uid=uid,
        warnings=tuple(warnings),
        yielded=change.yielded,
        ignored=change.ignored,
    )


def _stored_nothing(change: Change, meta: Manifest, options: ApplyOptions) -> bool:
    """An update the server answered with the version it had: nothing was written. (A dry-run
    answers with the live version whether or not it would change anything: not a sign there.)"""
    if options.dry_run or change.action is not Action.UPDATE or not change.resource_version:
        return False
    return str(meta.get("resourceVersion") or "") == change.resource_version


def _not_served(client: KubeClient, change: Change, error: ApiError) -> ApplyResult:
    """A 404 naming no object: the resource path itself is not served (a CRD dropped the version
    after discovery was read). Discovery is read again; if it confirms, the result says so in
    the words of the check before the pass (``plan.apis``), else it is the server's answer."""
    disc = client.discovery(refresh=True)
    if disc.find(change.api_version, change.key.kind) is not None:
        return ApplyResult(change.key, Outcome.FAILED, status=404, message=error.api_message or str(error))
    file = str(change.provenance) if change.provenance else ""
    found = apis.not_served(change.key, change.api_version, file, disc.served())
    return ApplyResult(
        change.key, Outcome.FAILED, status=404, message=found.message, note=Note.API_NOT_SERVED
    )


def _fresh(client: KubeClient, change: Change, replan: Replanner, causes: tuple[StatusCause, ...]) -> Change:
    info = client.resource(change.api_version, change.key.kind)
    live = client.get(info, change.key.namespace or None, change.key.name)
    return replan(change.key, live, causes)


def immutable_fields_text(error: ApiError) -> str:
    """``spec.selector (field is immutable)``, per field the server refused to change: its causes,
    not its message, which quotes the whole rejected value (kilobytes of Go struct per pass)."""
    return ", ".join(f"{c.field or 'the object'} ({c.detail})" for c in error.causes if c.immutable)


def immutable_message(error: ApiError) -> str:
    """One line: which fields, and how to let the agent make the change."""
    return (
        f"immutable field changed: {immutable_fields_text(error)}; annotate the object in Git with "
        f"{RECREATE}: {RECREATE_ON_IMMUTABLE} to delete and re-create it"
    )


def _immutable(
    client: KubeClient, change: Change, body: Manifest | None, options: ApplyOptions, error: ApiError
) -> ApplyResult:
    """Recreate only when the object asks for it; otherwise report the field."""
    assert body is not None
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if annotations.get(RECREATE) != RECREATE_ON_IMMUTABLE or change.action is Action.CREATE:
        return ApplyResult(
            change.key, Outcome.FAILED, status=422, message=immutable_message(error), note=Note.IMMUTABLE
        )
    if options.dry_run:
        return ApplyResult(
            change.key, Outcome.CONFIGURED, message="would delete and re-create (immutable field)"
        )
    info = client.resource(change.api_version, change.key.kind)
    ns = change.key.namespace or None
    client.delete(info, ns, change.key.name, uid=change.uid, propagation="Foreground")
    deadline = time.monotonic() + 60
    while client.get(info, ns, change.key.name) is not None:
        if time.monotonic() > deadline:
            return ApplyResult(
                change.key,
                Outcome.FAILED,
                status=422,
                message="deleted for re-create but still present after 60s",
            )
        time.sleep(0.2)
    body = copy.deepcopy(body)
    body.get("metadata", {}).pop("resourceVersion", None)
    out = client.apply(body, field_manager=options.field_manager, force=change.force)
    return ApplyResult(
        change.key,
        Outcome.CREATED,
        message="re-created: an immutable field changed",
        uid=(out.get("metadata") or {}).get("uid"),
    )


def _wait_established(client: KubeClient, crds: list[ApplyResult], options: ApplyOptions) -> None:
    """Custom resources of a CRD applied in this pass need the CRD served first."""
    if not crds:
        return
    info = client.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    deadline = time.monotonic() + options.crd_wait
    pending = {r.key.name for r in crds}
    # The server establishes a new CRD within milliseconds: a fixed 0.2 s beat cost every pass
    # with a CRD that much (a fifth of an initial apply of 500 objects), so the beat starts short.
    delay = ESTABLISHED_FIRST_DELAY
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            obj = client.get(info, None, name) or {}
            conds = (obj.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                pending.discard(name)
        if pending:
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, ESTABLISHED_MAX_DELAY)
    # A CRD still not Established is not fatal for the pass: its custom resources
    # fail one by one (kind not served) and every other object still applies.
    client.discovery(refresh=True)
