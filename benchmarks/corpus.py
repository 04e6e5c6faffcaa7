"""The real-world corpus (../shared/corpus, unmodified) as six apps of one local cluster.

Shared by tests/test_corpus.py (render parity, one pass, then quiet) and the corpus benchmark
(``benchmarks/bench_corpus.py``: render time against each stack's own tool, the steady pass).

kube-prometheus (its CRDs as an app of their own), the cert-manager and ingress-nginx charts,
argo-cd's install.yaml and the opentelemetry-operator kustomization: what platform teams install
first. The settings a user would give live here, never in the corpus: cert-manager's
`crds.enabled: true` (a values file of the repository the apps are served from), argo-cd's
`default_namespace`, `create_namespace` for the charts' release namespaces, otel depending on
cert-manager.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.model import ObjectKey
from agent.render.binaries import tool

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPUS = REPO_ROOT.parent / "shared" / "corpus"
CERT_MANAGER_VALUES = "crds:\n  enabled: true\n"
#: The values file the repository gets beside the corpus (``repository_files``).
CERT_MANAGER_VALUES_FILE = "values/cert-manager.yaml"

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
#: Charts: app -> (chart directory, release namespace, values files).
HELM: dict[str, tuple[str, str, list[str]]] = {
    "cert-manager": ("cert-manager-chart", "cert-manager", [CERT_MANAGER_VALUES_FILE]),
    "ingress-nginx": ("ingress-nginx-chart", "ingress-nginx", []),
}
#: Kustomizations: app -> its directory.
KUSTOMIZE = {"otel": "opentelemetry-operator/default"}
#: Plain YAML: app -> the folder whose files (not its sub-folders) it is.
PLAIN = {"kp-setup": "kube-prometheus/setup", "kube-prometheus": "kube-prometheus", "argo-cd": "argo-cd"}

#: Objects that cannot be created on a cluster whose Pods do not run: cert-manager's webhook
#: admits cert-manager.io objects (otel's Certificate and Issuer), and it has no Pod to answer.
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


def corpus_files() -> dict[str, str]:
    """Every file of the corpus, by its path in the repository (the corpus's own layout)."""
    out = {}
    for p in sorted(CORPUS.rglob("*")):
        if p.is_file() and p.name != "SOURCES.md":
            out[str(p.relative_to(CORPUS))] = p.read_text()
    return out


def repository_files() -> dict[str, str]:
    """What the apps' repository holds: the corpus as it is, and the values the test gives."""
    return {**corpus_files(), CERT_MANAGER_VALUES_FILE: CERT_MANAGER_VALUES}


def write_tree(work: Path, files: dict[str, str]) -> None:
    """``files`` written verbatim under ``work``."""
    for rel, text in files.items():
        f = work / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value)
    return json.dumps(str(value))


def apps_toml(cluster: str) -> list[str]:
    """The `[[apps]]` tables of the six apps on ``cluster``, each chart's `[apps.helm]` with it."""
    lines: list[str] = []
    for app in APPS:
        lines += ["", "[[apps]]", *(f"{k} = {_toml(v)}" for k, v in {"cluster": cluster, **app}.items())]
        if app["name"] in HELM:
            chart, namespace, values = HELM[app["name"]]
            lines += [
                "",
                "[apps.helm]",
                f"chart = {_toml(chart)}",
                f"namespace = {_toml(namespace)}",
                f"values_files = {_toml(values)}",
            ]
    return lines


def plain_files(app: str, work: Path) -> list[Path]:
    """A plain app's files in ``work`` (its folder's YAML files, not its sub-folders'), in order."""
    return sorted((work / PLAIN[app]).glob("*.yaml"))


def reference_argv(app: str, work: Path, kube_version: str) -> list[str]:
    """The stack's own tool on the checkout ``work``: ``helm template`` with the flags the agent
    gives it (``agent.render.tools.helm_template``) or the pinned ``kustomize build``."""
    if app in HELM:
        chart, namespace, values = HELM[app]
        argv = [str(tool("helm")), "template", app, str(work / chart), "--include-crds", "--skip-tests"]
        argv += ["--namespace", namespace, "--kube-version", kube_version]
        for v in values:
            argv += ["--values", str(work / v)]
        return argv
    return [str(tool("kustomize")), "build", str(work / KUSTOMIZE[app])]
