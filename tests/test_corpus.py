"""The real-world corpus (../shared/corpus, unmodified) as six apps of one local cluster.

The stacks, the settings a user would give them and the objects a webhook without Pods refuses
are ``benchmarks/corpus.py``'s (shared with the corpus benchmark): kube-prometheus (its CRDs as
an app of their own), the cert-manager and ingress-nginx charts, argo-cd's install.yaml and the
opentelemetry-operator kustomization, with cert-manager's `crds.enabled: true` (a values file of
the test's repository), argo-cd's `default_namespace`, `create_namespace` for the charts' release
namespaces, otel depending on cert-manager.

Each stack must render as its reference renders it (``helm template``, ``kustomize build``, the
plain files, each read as Kubernetes reads YAML), apply in one pass, and then be quiet: the
next pass writes nothing, the one after sends no request for unchanged objects, ``diff`` finds
nothing to do; a realistic change applies only itself and a removal prunes only its object.
Two objects cannot be created: cert-manager's webhook admits cert-manager.io objects (otel's
Certificate and Issuer), and its Pods are simulated, not processes that answer (the API server's
traffic into the cluster fails at once, ``agent.dev.process``). They are named
(``WEBHOOK_BLOCKED``), never a reason to leave a stack out.

The charts' Helm hooks run on simulated Pods: ingress-nginx's admission Jobs (pre-install,
pre-upgrade and post-install, post-upgrade) at the install and again on an upgrade, cert-manager's
post-install ``startupapicheck`` once; a steady pass runs none.

A fresh cluster of its own, with simulated Pods: the stacks install webhooks, an APIService and
many CRDs, which must not reach the tests that share the pool clusters.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.config.load import load_config
from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.model import ClusterResult, Note, Outcome, PassState
from agent.plan.release import pinned_version
from benchmarks import corpus
from benchmarks.corpus import APPS, WEBHOOK_BLOCKED
from tests.agentkit import E2E, Repo, config_head, make_repo, unique
from tests.appkit import AppsAgent, counting
from tests.appkit import members as appkit_members
from tests.yamlkit import kubernetes_reads

pytestmark = pytest.mark.cluster


@dataclass
class Stacks:
    cluster: LocalCluster
    repo: Repo
    files: dict[str, str]
    config: Config
    agent: AppsAgent
    first: dict[str, ClusterResult]


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, cluster_state_dir: Path) -> Iterator[Stacks]:
    from tests import clusters

    tmp = tmp_path_factory.mktemp("corpus")
    clusters.require_control_plane(pods=True)
    cluster = clusters.start("corpus", cluster_state_dir, pods=True)
    undo = E2E(None)
    try:
        files = corpus.repository_files()
        repo = _repo(tmp, files)
        cfg = _config(tmp, repo, cluster)
        agent = AppsAgent(cfg)
        undo.at_end(agent.close)
        first = settle(agent)
        yield Stacks(cluster, repo, files, cfg, agent, first)
    finally:
        undo.teardown()
        clusters.delete("corpus", cluster_state_dir)


#: Bound on the passes of one sync whose hooks run (each hook Job completes in about a second).
SETTLE_SECONDS = 180.0


def settle(agent: AppsAgent) -> dict[str, ClusterResult]:
    """Passes until no app's sync waits on a step (its hooks' Jobs running), as the scheduler
    runs them: each app's last result, with the results of all those passes."""
    deadline = time.monotonic() + SETTLE_SECONDS
    seen: dict[str, list[Any]] = {}
    while True:
        last = agent.reconcile()
        for name, res in last.items():
            seen.setdefault(name, []).extend(res.results)
        if all(r.state is not PassState.SYNCING for r in last.values()) or time.monotonic() > deadline:
            return {name: dataclasses.replace(res, results=seen[name]) for name, res in last.items()}
        time.sleep(0.5)


def hooks_created(results: dict[str, ClusterResult], app: str) -> list[str]:
    """The names of the hook Jobs ``app``'s passes created, in order."""
    res = results[app].results
    return [
        r.key.name
        for r in res
        if r.note is Note.HOOK and r.outcome is Outcome.CREATED and r.key.kind == "Job"
    ]


def _repo(tmp: Path, files: dict[str, str]) -> Repo:
    """The corpus committed as it is (``Repo.commit`` dedents: the files are written verbatim)."""
    repo = make_repo(tmp, {"README": "corpus\n"})
    _commit(repo, files)
    return repo


def _commit(repo: Repo, files: dict[str, str]) -> str:
    from agent.dev.demo import commit_directory

    if repo.work.exists():
        shutil.rmtree(repo.work)
    corpus.write_tree(repo.work, files)
    return commit_directory(repo.path, repo.work, "corpus")


def _config(tmp: Path, repo: Repo, cluster: LocalCluster) -> Config:
    lines = [
        *config_head(tmp, repo, unique("agent")),
        "[[clusters]]",
        'name = "corpus"',
        f'kubeconfig = "{cluster.kubeconfig}"',
        *corpus.apps_toml("corpus"),
    ]
    path = tmp / "corpus.toml"
    path.write_text("\n".join(lines) + "\n")
    return load_config(path)


# -- render parity ---------------------------------------------------------------------------


def _reference(app: str, work: Path) -> str:
    """What the stack's own tool renders (or the plain files), as a YAML stream."""
    if app in corpus.PLAIN:
        return "\n---\n".join(p.read_text() for p in corpus.plain_files(app, work))
    argv = corpus.reference_argv(app, work, pinned_version())
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


def _objects(stream: str, default_namespace: str | None = None) -> dict[tuple[str, str, str], Any]:
    """Objects of a YAML stream as Kubernetes reads them, by (kind, namespace, name)."""
    out = {}
    for doc in kubernetes_reads(stream):
        assert "error" not in doc, doc
        value = doc["doc"]
        if not value:
            continue
        items = (
            value["items"] if str(value.get("kind", "")).endswith("List") and "items" in value else [value]
        )
        for o in items:
            meta = o["metadata"]
            if default_namespace and meta.get("namespace") == default_namespace:
                meta.pop("namespace")
            out[(o["kind"], meta.get("namespace", ""), meta["name"])] = o
    return out


def render_argv(stacks: Stacks, app: str) -> list[str]:
    cli = [sys.executable, "-m", "agent.cli", "render", "--config", stacks.config.file]
    return [*cli, "--cluster", "corpus", "--app", app]


@pytest.mark.parametrize("app", [a["name"] for a in APPS])
def test_every_stack_renders_as_its_own_tool_renders_it(stacks: Stacks, app: str) -> None:
    out = subprocess.run(
        render_argv(stacks, app),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    default_ns = next((a.get("default_namespace") for a in APPS if a["name"] == app), None)
    ours = _objects(out.stdout, default_ns)
    theirs = _objects(_reference(app, stacks.repo.work))
    assert sorted(ours) == sorted(theirs)
    differing = sorted(k for k in ours if ours[k] != theirs[k])
    assert not differing, differing[:5]


# -- one pass, then quiet --------------------------------------------------------------------


def test_one_pass_applies_every_object_but_those_a_webhook_without_pods_refuses(stacks: Stacks) -> None:
    results = stacks.first
    failed = {r.key for res in results.values() for r in res.results if r.outcome is Outcome.FAILED}
    assert failed <= WEBHOOK_BLOCKED, sorted(map(str, failed))
    for name, res in results.items():
        assert res.failure is None, (name, res.error)
    created = sum(1 for res in results.values() for r in res.results if r.outcome is Outcome.CREATED)
    by_app = {n: sum(r.outcome is Outcome.CREATED for r in res.results) for n, res in results.items()}
    assert created >= 270, (by_app, {n: hooks_created(results, n) for n in results})
    # The charts' install hooks ran, in Helm's order, never as members.
    ingress = hooks_created(results, "ingress-nginx")
    assert ingress.index("ingress-nginx-admission-create") < ingress.index("ingress-nginx-admission-patch"), (
        ingress
    )
    assert hooks_created(results, "cert-manager").count("cert-manager-startupapicheck") == 1
    members = {k.name for k in appkit_members(stacks.config, stacks.cluster, "ingress-nginx")}
    assert "ingress-nginx-admission-create" not in members and "ingress-nginx-controller" in members


def test_the_next_passes_write_nothing_and_then_send_nothing_for_unchanged_objects(stacks: Stacks) -> None:
    with counting(stacks.cluster) as second:
        results = stacks.agent.reconcile()
    written = {
        r.key
        for res in results.values()
        for r in res.results
        if r.outcome in (Outcome.CREATED, Outcome.CONFIGURED)
    }
    assert written == set(), sorted(map(str, written))
    # The two objects the webhook refuses are tried again each pass (and refused), with their
    # failure reported as Events: nothing else is written.
    writes = {k: n for k, n in second.writes.items() if "dry-run" not in k and not k.endswith(" events")}
    assert set(writes) <= {"APPLY certificates", "APPLY issuers"}, writes
    with counting(stacks.cluster) as third:
        stacks.agent.reconcile()
    applies = {k: n for k, n in third.writes.items() if not k.endswith(("certificates", "issuers", "events"))}
    assert applies == {}, applies


def test_diff_finds_nothing_to_do_but_the_webhook_refused_objects(stacks: Stacks) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "diff", "--config", stacks.config.file, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(out.stdout)
    entries = {
        (o["group"], o["kind"], o["namespace"], o["name"])
        for c in report["clusters"]
        for a in c["apps"]
        for o in a["objects"]
    }
    assert entries == {(k.group, k.kind, k.namespace, k.name) for k in WEBHOOK_BLOCKED}, entries
    assert report["summary"]["updated"] == 0 and report["summary"]["pruned"] == 0


def test_a_chart_value_change_applies_only_that_change_and_a_removal_prunes_only_its_object(
    stacks: Stacks,
) -> None:
    removed = "kube-prometheus/blackboxExporter-serviceMonitor.yaml"
    assert removed in stacks.files
    files = {k: v for k, v in stacks.files.items() if k != removed}
    files["ingress-nginx-chart/values.yaml"] = stacks.files["ingress-nginx-chart/values.yaml"].replace(
        "  replicaCount: 1\n", "  replicaCount: 2\n", 1
    )
    assert files["ingress-nginx-chart/values.yaml"] != stacks.files["ingress-nginx-chart/values.yaml"]
    _commit(stacks.repo, files)
    results = settle(stacks.agent)
    for name, res in results.items():
        assert res.failure is None, (name, res.error)
    changed = {
        (r.key.kind, r.key.name, r.outcome)
        for res in results.values()
        for r in res.results
        if r.outcome not in (Outcome.UNCHANGED, Outcome.SKIPPED)
        and r.key not in WEBHOOK_BLOCKED
        and r.note is not Note.HOOK
    }
    # Two replicas: the chart's Deployment changes and the chart adds its PodDisruptionBudget
    # (as `helm template` renders it with that value); nothing else of any stack is written.
    assert changed == {
        ("Deployment", "ingress-nginx-controller", Outcome.CONFIGURED),
        ("PodDisruptionBudget", "ingress-nginx-controller", Outcome.CREATED),
        ("ServiceMonitor", "blackbox-exporter", Outcome.PRUNED),
    }, changed
    # An upgrade: ingress-nginx's admission Jobs run again (their previous objects replaced, never
    # an immutable field); cert-manager's post-install check is not run again.
    ingress = hooks_created(results, "ingress-nginx")
    assert ingress.index("ingress-nginx-admission-create") < ingress.index("ingress-nginx-admission-patch"), (
        ingress
    )
    assert hooks_created(results, "cert-manager") == []
    # The next pass runs no hook: reads only for the stacks' objects.
    with counting(stacks.cluster) as steady:
        again = stacks.agent.reconcile()
    assert not any(hooks_created(again, name) for name in again), again
    writes = {k: n for k, n in steady.writes.items() if not k.endswith(("certificates", "issuers", "events"))}
    assert writes == {}, writes
