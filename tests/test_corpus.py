"""The real-world corpus (../shared/corpus, unmodified) as six apps of one local cluster.

kube-prometheus (its CRDs as an app of their own), the cert-manager and ingress-nginx charts,
argo-cd's install.yaml and the opentelemetry-operator kustomization: what platform teams install
first. The settings a user would give live here, never in the corpus: cert-manager's
`crds.enabled: true` (a values file of the test's repository), argo-cd's `default_namespace`,
`create_namespace` for the charts' release namespaces, otel depending on cert-manager.

Each stack must render as its reference renders it (``helm template``, ``kustomize build``, the
plain files, each read as Kubernetes reads YAML), apply in one pass, and then be quiet: the
next pass writes nothing, the one after sends no request for unchanged objects, ``diff`` finds
nothing to do; a realistic change applies only itself and a removal prunes only its object.
Two objects cannot be created on a cluster whose Pods do not run: cert-manager's webhook
admits cert-manager.io objects (otel's Certificate and Issuer), and it has no Pod to answer.
They are named here (``WEBHOOK_BLOCKED``), never a reason to leave a stack out.

A fresh cluster of its own: the stacks install webhooks, an APIService and many CRDs, which
must not reach the tests that share the pool clusters.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.config.types import Config
from agent.dev.process import LocalCluster
from agent.model import ClusterResult, ObjectKey, Outcome
from agent.render.binaries import tool
from tests.agentkit import E2E, Repo, make_repo
from tests.appkit import AppsAgent, counting, write_apps_config
from tests.yamlkit import kubernetes_reads

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
KUBE_VERSION = re.search(r"^KUBERNETES_VERSION=v?(\S+)$", (ROOT / "tools" / "versions.env").read_text(), re.M)
CERT_MANAGER_VALUES = "crds:\n  enabled: true\n"

APPS: list[dict[str, Any]] = [
    {"name": "kp-setup", "path": "kube-prometheus/setup"},
    {
        "name": "kube-prometheus",
        "path": "kube-prometheus",
        "exclude": ["kube-prometheus/setup/**"],
        "depends_on": ["kp-setup"],
    },
    {"name": "cert-manager", "path": "cert-manager-chart", "create_namespace": True},
    {"name": "ingress-nginx", "path": "ingress-nginx-chart", "create_namespace": True},
    {"name": "argo-cd", "path": "argo-cd", "default_namespace": "argocd", "create_namespace": True},
    {"name": "otel", "path": "opentelemetry-operator/default", "depends_on": ["cert-manager"]},
]
HELM = {
    "cert-manager": ("cert-manager-chart", "cert-manager", ["values/cert-manager.yaml"]),
    "ingress-nginx": ("ingress-nginx-chart", "ingress-nginx", []),
}
WEBHOOK_BLOCKED = {
    ObjectKey(
        "cert-manager.io",
        "Certificate",
        "opentelemetry-operator-system",
        "opentelemetry-operator-serving-cert",
    ),
    ObjectKey(
        "cert-manager.io",
        "Issuer",
        "opentelemetry-operator-system",
        "opentelemetry-operator-selfsigned-issuer",
    ),
}


@dataclass
class Stacks:
    cluster: LocalCluster
    repo: Repo
    files: dict[str, str]
    config: Config
    agent: AppsAgent
    first: dict[str, ClusterResult]


def _corpus_files() -> dict[str, str]:
    """Every file of the corpus, by its path in the test's repository (the corpus's own layout)."""
    out = {}
    for p in sorted(CORPUS.rglob("*")):
        if p.is_file() and p.name != "SOURCES.md":
            out[str(p.relative_to(CORPUS))] = p.read_text()
    return out


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, cluster_state_dir: Path) -> Iterator[Stacks]:
    from tests import clusters

    tmp = tmp_path_factory.mktemp("corpus")
    cluster = clusters.start("corpus", cluster_state_dir)
    undo = E2E(None)
    try:
        files = {**_corpus_files(), "values/cert-manager.yaml": CERT_MANAGER_VALUES}
        repo = _repo(tmp, files)
        cfg = _config(tmp, repo, cluster)
        agent = AppsAgent(cfg)
        undo.at_end(agent.close)
        first = agent.reconcile()
        yield Stacks(cluster, repo, files, cfg, agent, first)
    finally:
        undo.teardown()
        clusters.delete("corpus", cluster_state_dir)


def _repo(tmp: Path, files: dict[str, str]) -> Repo:
    """The corpus committed as it is (``Repo.commit`` dedents: the files are written verbatim)."""
    repo = make_repo(tmp, {"README": "corpus\n"})
    _commit(repo, files)
    return repo


def _commit(repo: Repo, files: dict[str, str]) -> str:
    from agent.dev.demo import commit_directory

    if repo.work.exists():
        shutil.rmtree(repo.work)
    for rel, text in files.items():
        f = repo.work / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return commit_directory(repo.path, repo.work, "corpus")


def _config(tmp: Path, repo: Repo, cluster: LocalCluster) -> Config:
    apps = [dict(a) for a in APPS]
    cfg = write_apps_config(tmp, repo, cluster, apps, cluster_name="corpus")
    text = Path(cfg.file).read_text()
    for app, (chart, namespace, values) in HELM.items():
        block = f'name = "{app}"\n'
        helm = f'\n[apps.helm]\nchart = "{chart}"\nnamespace = "{namespace}"\n'
        helm += f"values_files = {json.dumps(values)}\n"
        start = text.index(block)
        end = text.find("\n[[apps]]", start)
        end = len(text) if end < 0 else end
        text = text[:end] + helm + text[end:]
    Path(cfg.file).write_text(text)
    from agent.config.load import load_config

    return load_config(Path(cfg.file))


# -- render parity ---------------------------------------------------------------------------


def _reference(app: str, work: Path) -> str:
    """What the stack's own tool renders (or the plain files), as a YAML stream."""
    if app in HELM:
        chart, namespace, values = HELM[app]
        assert KUBE_VERSION is not None
        argv = [str(tool("helm")), "template", app, str(work / chart), "--namespace", namespace]
        argv += ["--kube-version", KUBE_VERSION.group(1), "--skip-tests"]
        for v in values:
            argv += ["-f", str(work / v)]
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    if app == "otel":
        argv = [str(tool("kustomize")), "build", str(work / "opentelemetry-operator" / "default")]
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    folder = {
        "kp-setup": "kube-prometheus/setup",
        "kube-prometheus": "kube-prometheus",
        "argo-cd": "argo-cd",
    }[app]
    return "\n---\n".join(p.read_text() for p in sorted((work / folder).glob("*.yaml")))


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
    assert created >= 270


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
    results = stacks.agent.reconcile()
    changed = {
        (r.key.kind, r.key.name, r.outcome)
        for res in results.values()
        for r in res.results
        if r.outcome not in (Outcome.UNCHANGED, Outcome.SKIPPED) and r.key not in WEBHOOK_BLOCKED
    }
    # Two replicas: the chart's Deployment changes and the chart adds its PodDisruptionBudget
    # (as `helm template` renders it with that value); nothing else of any stack is written.
    assert changed == {
        ("Deployment", "ingress-nginx-controller", Outcome.CONFIGURED),
        ("PodDisruptionBudget", "ingress-nginx-controller", Outcome.CREATED),
        ("ServiceMonitor", "blackbox-exporter", Outcome.PRUNED),
    }, changed
