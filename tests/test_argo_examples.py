"""Argo CD's own examples of waves and hooks, each an app of the agent, on simulated Pods.

``tests/fixtures/argocd-example-apps`` holds argocd-example-apps' ``sync-waves`` and
``pre-post-sync`` unmodified (SOURCES.md). The ``pods`` cluster runs them: kube-scheduler, kwok's
kubelets and the workload controllers complete the Jobs and make the ReplicaSets and the
Deployment ready; nothing here writes a status. ``gitops-agent run --once`` syncs each app to
its end, as a daemon's scheduler would (it wakes the app again while a wave waits). The order is
read from the server: watches started before the first write (``tests.watchlog``) give each
creation, completion and deletion its resourceVersion.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.config.types import Config
from agent.model import Outcome, PassState
from tests.agentkit import E2E, make_repo, tracked, write_config
from tests.clusters import TestNamespace
from tests.watchlog import WatchLog, condition, ready, watching

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).parent / "fixtures" / "argocd-example-apps"
COLLECTIONS = (
    "/apis/batch/v1/namespaces/{ns}/jobs",
    "/apis/apps/v1/namespaces/{ns}/replicasets",
    "/apis/apps/v1/namespaces/{ns}/deployments",
    "/api/v1/namespaces/{ns}/services",
)


def example_files(*names: str) -> dict[str, str]:
    """The examples' directories under ``apps/``, byte for byte."""
    out: dict[str, str] = {}
    for name in names:
        for f in sorted((EXAMPLES / name).iterdir()):
            out[f"apps/{name}/{f.name}"] = f.read_text()
    return out


def app_config(tmp_path: Path, ns: TestNamespace, example: str, *deps: str) -> Config:
    repo = make_repo(tmp_path, example_files(example, *deps))
    # The examples name no namespace: the app's default namespace is the test's.
    defaults = f'default_namespace = "{ns.name}"\nhealth_debounce = "0s"'
    return write_config(
        tmp_path, repo, {"pods": ns.cluster}, paths={"pods": [f"apps/{example}"]}, defaults=defaults
    )


def sync_once(config: Config) -> None:
    """``run --once``: every pass of the sync, until its last step is through."""
    once = CliRunner().invoke(main, ["run", "--once", "--config", config.file], catch_exceptions=False)
    assert once.exit_code == 0, once.output


def members(config: Config) -> set[str]:
    """``Kind/name`` of the app's inventory members (hooks never are)."""
    return {f"{k.kind}/{k.name}" for k in tracked(config, "pods")}


def second_pass_runs_nothing(e2e: E2E, config: Config, log: WatchLog) -> None:
    """The same revision again: no hook runs, nothing is written (no event in the namespace)."""
    before = log.events()
    r = e2e.agent(config).reconcile()["pods"]
    assert r.state is PassState.OK, (r.error, r.results)
    assert not any(x.outcome is Outcome.CREATED for x in r.results) and not r.applied, r.results
    hooks_or_objects = [e for e in log.events()[len(before) :] if e.type in ("ADDED", "DELETED")]
    assert not hooks_or_objects, [(e.type, e.kind, e.name) for e in hooks_or_objects]


def test_argo_sync_waves_example_runs_its_waves_and_hooks_in_the_documented_order(
    tmp_path: Path, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    config = app_config(tmp_path, pods_namespace, "sync-waves")
    with watching(pods_namespace.cluster, pods_namespace.name, COLLECTIONS) as log:
        sync_once(config)
        (schema,) = log.names("Job", "upgrade-sql-schema")  # generateName: named by the server (POST)
        assert log.names("Job") == [schema, "maint-page-up", "maint-page-down"]
        complete = condition("Complete")
        created, healthy = log.created, log.first

        # PreSync: the schema upgrade completes before any object of the app is written.
        presync_done = healthy("Job", schema, complete)
        # Wave 0: the backend, applied together, healthy before wave 1 starts.
        wave0 = [created("ReplicaSet", "backend"), created("Service", "backend")]
        assert presync_done < min(wave0)
        wave0_healthy = healthy("ReplicaSet", "backend", ready)
        # Wave 1: the Sync hook that puts the maintenance page up.
        assert max(wave0) < wave0_healthy < created("Job", "maint-page-up")
        page_up = healthy("Job", "maint-page-up", complete)
        # Wave 2: the frontend, once the page is up.
        wave2 = [created("ReplicaSet", "frontend"), created("Service", "frontend")]
        assert page_up < min(wave2)
        # Wave 3: the page comes down once the frontend is ready.
        assert max(wave2) < healthy("ReplicaSet", "frontend", ready) < created("Job", "maint-page-down")
        healthy("Job", "maint-page-down", complete)
        # No hook here is HookSucceeded: BeforeHookCreation (the default) keeps them until they run again.
        assert not [e for e in log.events() if e.type == "DELETED"]
        assert members(config) == {
            "ReplicaSet/backend",
            "Service/backend",
            "ReplicaSet/frontend",
            "Service/frontend",
        }

        second_pass_runs_nothing(e2e, config, log)


def test_argo_pre_post_sync_example_runs_presync_before_and_postsync_after_the_guestbook_is_available(
    tmp_path: Path, pods_namespace: TestNamespace, e2e: E2E
) -> None:
    config = app_config(tmp_path, pods_namespace, "pre-post-sync", "kustomize-guestbook")
    with watching(pods_namespace.cluster, pods_namespace.name, COLLECTIONS) as log:
        sync_once(config)
        before, after = "pre-post-sync-before", "pre-post-sync-after"
        deployment = service = "pre-post-sync-kustomize-guestbook-ui"  # kustomize's namePrefixes
        assert log.names("Job") == [before, after]
        complete = condition("Complete")

        assert log.first("Job", before, complete) < log.created("Deployment", deployment)
        assert log.first("Job", before, complete) < log.created("Service", service)
        available = log.first("Deployment", deployment, condition("Available"))
        assert available < log.created("Job", after)
        # HookSucceeded: each hook deleted once it succeeded.

        def deleted(name: str) -> int:
            return log.first("Job", name, lambda e: e.type == "DELETED")

        assert log.first("Job", before, complete) < deleted(before) < log.created("Deployment", deployment)
        assert log.first("Job", after, complete) < deleted(after)
        assert members(config) == {f"Deployment/{deployment}", f"Service/{service}"}

        second_pass_runs_nothing(e2e, config, log)
