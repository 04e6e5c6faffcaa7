"""``gitops-agent test``: an app's Helm ``test`` hooks, run as ``helm test`` runs them.

A sync never runs a ``test`` hook (its charts are rendered ``--skip-tests``, and
``plan.ordering`` leaves one found in plain YAML out). Here the app's revision is rendered with
its tests, as a later revision of an installed release, and each test hook is created alone, by
weight then key as Helm orders them, waited for until it succeeded or failed (a Pod by its
phase, as Helm reads it; a Job by its conditions, ``plan.health``), deleted by its delete policy
(``before-hook-creation`` by default: the last run stays to be read), and reported.

A test hook is created as the app's hook (``hook_runs``: labelled ``hook-of``, never
``part-of``): never a member of its inventory, never pruned. Only an installed app (its ApplySet
parent exists) is tested, as ``helm test`` needs a release; only what lies inside the app's
scope is created.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from agent.config.types import AppConfig
from agent.errors import ScopeError
from agent.kube.client import KubeClient
from agent.model import (
    DeletePolicy,
    DesiredObject,
    Health,
    HealthState,
    NotRun,
    ObjectKey,
    Ordered,
    Revision,
    SyncKind,
)
from agent.plan.health import assess
from agent.plan.ordering import sync_order
from agent.reconcile import hook_runs, namespaces
from agent.reconcile.stages import ClusterStages

#: Seconds between two reads of a running test.
POLL = 0.5


class TestOutcome(enum.StrEnum):
    """How one test hook ended."""

    PASSED = "passed"
    FAILED = "failed"


@dataclass(frozen=True)
class TestResult:
    """One test hook: its key in the cluster (a ``generateName`` one named by the server)."""

    key: ObjectKey
    outcome: TestOutcome
    message: str


@dataclass(frozen=True)
class TestRun:
    """An app's tests at a revision; ``error``: why none could run (nothing was created)."""

    app: str
    revision: str
    results: tuple[TestResult, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(r.outcome is TestOutcome.PASSED for r in self.results)


def run_tests(stages: ClusterStages, app: AppConfig, revision: Revision, *, timeout: float) -> TestRun:
    """Run ``app``'s test hooks at ``revision`` one after the other (each bounded by ``timeout``)."""
    store = stages.store_for(stages.parent_of(app.name))
    if not store.load().exists:
        return TestRun(app.name, revision.sha, error="the app is not installed yet (no ApplySet parent)")
    rendered = stages.render_app(app, revision, upgrade=True, tests=True)
    objects = stages.prepare(rendered, store.id, default_namespace=namespaces.target_namespace(app))
    order = sync_order(objects, SyncKind.UPGRADE)
    tests = sorted((x.ordered for x in order.left_out if x.why is NotRun.TEST), key=lambda o: (o.wave, o.key))
    by_key = {o.key: o for o in objects}
    violations = stages.scope_violations(app, [by_key[o.key] for o in tests])
    if violations:
        raise ScopeError(violations, cluster=stages.cluster.name, app=app.name)
    client = stages.client_for(app)
    results = tuple(
        _run_one(client, o, by_key[o.key], store.id, stages.field_manager, timeout) for o in tests
    )
    return TestRun(app.name, revision.sha, results)


def _run_one(
    client: KubeClient, ordered: Ordered, obj: DesiredObject, app_id: str, field_manager: str, timeout: float
) -> TestResult:
    created, results = hook_runs.create(client, [(ordered, obj)], app_id, field_manager)
    if obj.key not in created:
        return TestResult(obj.key, TestOutcome.FAILED, results[0].message)
    key = created[obj.key]
    health = _finished(client, key, obj.api_version, timeout)
    passed = health.state is HealthState.CURRENT
    assert ordered.hook is not None
    if ordered.hook.deletes_on(DeletePolicy.HOOK_SUCCEEDED if passed else DeletePolicy.HOOK_FAILED):
        hook_runs.delete(client, [(key, obj.api_version)])
    return TestResult(key, TestOutcome.PASSED if passed else TestOutcome.FAILED, health.describe())


def _finished(client: KubeClient, key: ObjectKey, api_version: str, timeout: float) -> Health:
    """The test's health once it ended: ``CURRENT`` passed; anything else failed."""
    info = client.resource(api_version, key.kind)
    deadline = time.monotonic() + timeout
    while True:
        live = client.get(info, key.namespace or None, key.name)
        if live is None:
            return Health(HealthState.FAILED, "deleted before it finished", reason="Deleted")
        health = _pod(live) if key.kind == "Pod" and not key.group else assess(live)
        if health.state in (HealthState.CURRENT, HealthState.FAILED):
            return health
        if time.monotonic() > deadline:
            return Health(
                HealthState.FAILED, f"not finished within {timeout:g}s: {health.describe()}", reason="Timeout"
            )
        time.sleep(POLL)


def _pod(live: dict[str, object]) -> Health:
    """A test Pod as Helm reads it: passed once ``Succeeded``, failed once ``Failed``."""
    status = live.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    if phase == "Succeeded":
        return Health(HealthState.CURRENT, "Succeeded", reason="Succeeded")
    if phase == "Failed":
        return Health(HealthState.FAILED, "Failed", reason="Failed")
    return Health(HealthState.IN_PROGRESS, f"phase {phase or 'unknown'}", reason="Running")


__all__ = ["TestOutcome", "TestResult", "TestRun", "run_tests"]
