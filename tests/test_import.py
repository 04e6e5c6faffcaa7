"""`gitops-agent import`: Flux and Argo CD repositories (fixtures in the shape of
fluxcd/flux2-kustomize-helm-example and argoproj/argocd-example-apps) as agent configs."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from agent.cli.main import main
from agent.config.load import parse_config
from agent.imports.argocd import import_argocd
from agent.imports.flux import import_flux
from agent.imports.toml_text import toml_text

FLUX = {
    "clusters/production/infrastructure.yaml": """
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: infra-controllers, namespace: flux-system}
spec:
  interval: 1h
  sourceRef: {kind: GitRepository, name: flux-system}
  path: ./infrastructure/controllers
  prune: true
  wait: true
  timeout: 5m
""",
    "clusters/production/apps.yaml": """
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: apps, namespace: flux-system}
spec:
  dependsOn: [{name: infra-controllers}]
  interval: 10m
  retryInterval: 2m
  sourceRef: {kind: GitRepository, name: flux-system}
  path: ./apps/production
  prune: true
  targetNamespace: shop
  postBuild:
    substitute: {DOMAIN: example.com, REPLICAS: "3"}
    substituteFrom: [{kind: ConfigMap, name: cluster-vars}]
""",
    "clusters/production/sources.yaml": """
apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata: {name: flux-system, namespace: flux-system}
spec:
  interval: 1m
  url: https://git.example.com/fleet.git
  ref: {branch: main}
  secretRef: {name: flux-system}
---
apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata: {name: pinned, namespace: flux-system}
spec:
  url: https://git.example.com/other.git
  ref: {semver: ">=1.0.0"}
---
apiVersion: source.toolkit.fluxcd.io/v1beta2
kind: OCIRepository
metadata: {name: manifests, namespace: flux-system}
spec: {url: "oci://ghcr.io/example/manifests"}
""",
    "infrastructure/controllers/kustomization.yaml": """
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [ingress-nginx.yaml]
""",
    "infrastructure/controllers/ingress-nginx.yaml": """
apiVersion: v1
kind: Namespace
metadata: {name: ingress-nginx}
---
apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata: {name: ingress-nginx, namespace: ingress-nginx}
spec:
  interval: 24h
  url: https://kubernetes.github.io/ingress-nginx
  secretRef: {name: repo-creds}
---
apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata: {name: registry, namespace: ingress-nginx}
spec: {type: oci, url: "oci://ghcr.io/example/charts"}
---
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: ingress-nginx, namespace: ingress-nginx}
spec:
  interval: 30m
  chart:
    spec:
      chart: ingress-nginx
      version: "4.x"
      sourceRef: {kind: HelmRepository, name: ingress-nginx}
  targetNamespace: ingress
  install: {createNamespace: true}
  values:
    controller: {replicaCount: 2, service: {type: LoadBalancer}}
  valuesFrom: [{kind: Secret, name: nginx-values, valuesKey: values.yaml}]
  driftDetection: {mode: warn}
---
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: metrics, namespace: ingress-nginx}
spec:
  releaseName: metrics-release
  dependsOn: [{name: ingress-nginx}]
  chart:
    spec: {chart: metrics, sourceRef: {kind: HelmRepository, name: registry}}
---
apiVersion: source.toolkit.fluxcd.io/v1
kind: OCIRepository
metadata: {name: cert-manager, namespace: ingress-nginx}
spec:
  url: oci://quay.io/jetstack/charts/cert-manager
  ref: {semver: "1.x"}
  layerSelector: {mediaType: application/vnd.cncf.helm.chart.content.v1.tar+gzip}
  verify: {provider: cosign, secretRef: {name: cosign-pub}}
---
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: cert-manager, namespace: ingress-nginx}
spec:
  chartRef: {kind: OCIRepository, name: cert-manager}
  values: {crds: {enabled: true}}
""",
    "apps/production/kustomization.yaml": """
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [web.yaml]
patches:
  - path: nginx-values.yaml
    target: {kind: HelmRelease}
""",
    # A patch in the shape of a HelmRelease, with a chart version (flux2-kustomize-helm-example's
    # apps/production/podinfo-values.yaml): a patch, never a release of its own.
    "apps/production/nginx-values.yaml": """
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: ingress-nginx, namespace: ingress}
spec:
  chart:
    spec: {version: ">=4.11.0"}
""",
    "apps/production/web.yaml": """
apiVersion: v1
kind: ConfigMap
metadata: {name: web}
data: {domain: "${DOMAIN}"}
""",
}

ARGO = {
    "apps/guestbook.yaml": """
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: guestbook, namespace: argocd}
spec:
  project: default
  source: {repoURL: "https://git.example.com/apps.git", targetRevision: HEAD, path: guestbook}
  destination: {server: "https://kubernetes.default.svc", namespace: guestbook}
  syncPolicy:
    automated: {prune: true, selfHeal: true}
    syncOptions: [CreateNamespace=true]
  ignoreDifferences:
    - {group: apps, kind: Deployment, jsonPointers: [/spec/replicas]}
    - {kind: ConfigMap, managedFieldsManagers: [kube-controller-manager], jqPathExpressions: [.data.x]}
""",
    "apps/helm-guestbook.yaml": """
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: helm-guestbook, namespace: argocd}
spec:
  source:
    repoURL: "https://git.example.com/apps.git"
    targetRevision: master
    path: helm-guestbook
    helm:
      releaseName: guestbook
      valueFiles: [values-production.yaml]
      valuesObject: {replicaCount: 2}
  destination: {name: prod-east, namespace: web}
  syncPolicy: {automated: {}}
""",
    "apps/ingress.yaml": """
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: ingress.nginx, namespace: argocd}
spec:
  sources:
    - {repoURL: "https://kubernetes.github.io/ingress-nginx", chart: ingress-nginx, targetRevision: 4.10.0,
       helm: {valueFiles: [$values/values/ingress.yaml], values: "controller:\\n  replicaCount: 3\\n"}}
    - {repoURL: "https://git.example.com/apps.git", targetRevision: master, ref: values}
  destination: {server: "https://kubernetes.default.svc", namespace: ingress}
  syncPolicy: {automated: {prune: true, selfHeal: true}}
""",
    "root.yaml": """
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: root, namespace: argocd}
spec:
  source: {repoURL: "https://git.example.com/apps.git", path: apps}
  destination: {server: "https://kubernetes.default.svc"}
""",
    "appsets.yaml": """
apiVersion: argoproj.io/v1alpha1
kind: ApplicationSet
metadata: {name: envs, namespace: argocd}
spec:
  generators:
    - list:
        elements: [{env: dev, ns: guestbook-dev}, {env: prod, ns: guestbook-prod}]
  template:
    metadata: {name: "guestbook-{{env}}"}
    spec:
      source: {repoURL: "https://git.example.com/apps.git", targetRevision: master, path: guestbook}
      destination: {server: "https://kubernetes.default.svc", namespace: "{{ns}}"}
      syncPolicy: {automated: {prune: true, selfHeal: true}}
---
apiVersion: argoproj.io/v1alpha1
kind: ApplicationSet
metadata: {name: dirs, namespace: argocd}
spec:
  goTemplate: true
  generators:
    - git:
        repoURL: "https://git.example.com/apps.git"
        revision: master
        directories: [{path: "workloads/*"}, {path: workloads/skip, exclude: true}]
  template:
    metadata: {name: "{{.path.basename}}"}
    spec:
      source: {repoURL: "https://git.example.com/apps.git", targetRevision: master, path: "{{.path.path}}"}
      destination: {server: "https://kubernetes.default.svc", namespace: "{{.path.basename}}"}
      syncPolicy: {automated: {prune: true, selfHeal: true}}
""",
    "guestbook/deployment.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gb}\n",
    "helm-guestbook/Chart.yaml": "apiVersion: v2\nname: helm-guestbook\nversion: 0.1.0\n",
    "helm-guestbook/values-production.yaml": "replicaCount: 1\n",
    "workloads/api/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: api}\n",
    "workloads/worker/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: worker}\n",
    "workloads/skip/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: skip}\n",
}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _apps(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(a["cluster"], a["name"]): a for a in data["apps"]}


def test_flux_kustomizations_become_apps_with_their_settings_sources_and_notes(tmp_path: Path) -> None:
    text = toml_text(import_flux(_tree(tmp_path, FLUX)), path="repo")
    data = tomllib.loads(text)
    apps = _apps(data)
    web = apps[("production", "apps")]
    assert web["path"] == "apps/production" and web["source"] == "flux-system"
    assert web["depends_on"] == ["infra-controllers"] and web["reconcile_interval"] == "10m"
    assert web["default_namespace"] == "shop" and web["vars"] == {"DOMAIN": "example.com", "REPLICAS": "3"}
    assert "prune" not in web  # Flux's prune: true is the agent's default
    infra = apps[("production", "infra-controllers")]
    assert infra["wait"] is True and infra["health_timeout"] == "5m"
    (source,) = data["sources"]
    assert source == {
        "name": "flux-system",
        "url": "https://git.example.com/fleet.git",
        "branch": "main",
        "poll_interval": "1m",
    }
    assert "targetNamespace overrides every object's namespace" in text
    assert "spec.postBuild.substituteFrom ConfigMap cluster-vars" in text
    assert "spec.retryInterval because the agent has no equivalent" in text
    assert "spec.secretRef flux-system/flux-system because credentials are never copied" in text
    oci = "OCIRepository flux-system/manifests (oci://ghcr.io/example/manifests) because OCI sources are not"
    assert oci in text
    cfg = parse_config(data, base_dir=tmp_path)  # the whole config, as written, loads
    assert {a.name for a in cfg.apps} >= {"apps", "infra-controllers", "ingress-nginx"}


def test_flux_helm_releases_become_chart_apps_from_their_helm_repositories(tmp_path: Path) -> None:
    text = toml_text(import_flux(_tree(tmp_path, FLUX)), path="repo")
    data = tomllib.loads(text)
    nginx = _apps(data)[("production", "ingress-nginx")]
    assert nginx["helm"] == {
        "repository": "https://kubernetes.github.io/ingress-nginx",
        "chart": "ingress-nginx",
        "version": "4.x",
        "release_name": "ingress-ingress-nginx",
        "namespace": "ingress",
        "values": {"controller": {"replicaCount": 2, "service": {"type": "LoadBalancer"}}},
    }
    assert nginx["create_namespace"] is True and nginx["drift"] == "report"
    assert nginx["depends_on"] == ["infra-controllers"] and nginx["reconcile_interval"] == "30m"
    # Charts in OCI registries: a HelmRepository of type oci, and an OCIRepository a chartRef
    # names (its URL is the chart's artifact: the repository is the path above it).
    metrics = _apps(data)[("production", "metrics")]
    assert metrics["helm"]["repository"] == "oci://ghcr.io/example/charts"
    assert (metrics["helm"]["chart"], metrics["helm"]["release_name"]) == ("metrics", "metrics-release")
    assert [r["url"] for r in data["helm_repositories"]] == [
        "https://kubernetes.github.io/ingress-nginx",
        "oci://ghcr.io/example/charts",
    ]
    cert_manager = _apps(data)[("production", "cert-manager")]["helm"]
    assert (cert_manager["repository"], cert_manager["chart"], cert_manager["version"]) == (
        "oci://quay.io/jetstack/charts",
        "cert-manager",
        "1.x",
    )
    assert "OCIRepository ingress-nginx/cert-manager spec.verify because set verify = true" in text
    assert "OCIRepository ingress-nginx/cert-manager (oci://" not in text  # a chart source, not a Git one
    assert "spec.layerSelector" not in text  # the Helm chart layer: what the agent takes anyway
    # The kustomize patch of the release is not a second release.
    assert [a for a in data["apps"] if a["name"].startswith("ingress-nginx")] == [nginx], data["apps"]
    assert parse_config(data, base_dir=tmp_path).apps
    assert "spec.valuesFrom Secret nginx-values key values.yaml because values come from Git" in text
    assert "HelmRepository ingress-nginx/ingress-nginx spec.secretRef repo-creds" in text


def test_argocd_applications_sets_and_app_of_apps_become_apps(tmp_path: Path) -> None:
    imported = import_argocd(_tree(tmp_path, ARGO), cluster="mgmt", kubeconfig="/k/config")
    text = toml_text(imported, path="repo")
    data = tomllib.loads(text)
    apps = _apps(data)
    guestbook = apps[("mgmt", "guestbook")]
    assert guestbook["path"] == "guestbook" and guestbook["default_namespace"] == "guestbook"
    assert guestbook["create_namespace"] is True and "prune" not in guestbook and "drift" not in guestbook
    assert guestbook["ignore"] == [
        {"group": "apps", "kind": "Deployment", "json_pointers": ["/spec/replicas"]},
        {"kind": "ConfigMap", "managers": ["kube-controller-manager"]},
    ]
    assert "jqPathExpressions because jq is not read" in text
    assert "targetRevision HEAD because HEAD is the remote's default branch" in text
    helm_gb = apps[("prod-east", "helm-guestbook")]
    assert helm_gb["helm"] == {
        "chart": "helm-guestbook",
        "release_name": "guestbook",
        "namespace": "web",
        "values_files": ["helm-guestbook/values-production.yaml"],
        "values": {"replicaCount": 2},
    }
    assert helm_gb["prune"] is False and helm_gb["drift"] == "report"
    ingress = apps[("mgmt", "ingress-nginx")]
    assert ingress["helm"]["repository"] == "https://kubernetes.github.io/ingress-nginx"
    assert ingress["helm"]["values_files"] == ["values/ingress.yaml"]
    assert ingress["helm"]["version"] == "4.10.0"
    assert ingress["helm"]["values"] == {"controller": {"replicaCount": 3}}
    generated = {("mgmt", "guestbook-dev"), ("mgmt", "guestbook-prod"), ("mgmt", "api"), ("mgmt", "worker")}
    assert generated <= set(apps)
    assert ("mgmt", "skip") not in apps and ("mgmt", "root") not in apps
    assert apps[("mgmt", "guestbook-prod")]["default_namespace"] == "guestbook-prod"
    assert "Application argocd/root (path apps) because it is an app of apps" in text
    assert [c["name"] for c in data["clusters"]] == ["mgmt", "prod-east"]
    assert all(c["kubeconfig"] == "/k/config" for c in data["clusters"])


def test_argocd_config_loads_as_written(tmp_path: Path) -> None:
    data = tomllib.loads(toml_text(import_argocd(_tree(tmp_path, ARGO)), path="repo"))
    cfg = parse_config(data, base_dir=tmp_path)
    assert {a.name for a in cfg.apps} >= {"guestbook", "helm-guestbook", "guestbook-dev", "api"}


def test_the_command_prints_the_config_and_logs_to_stderr(tmp_path: Path) -> None:
    files = {k: v for k, v in ARGO.items() if k not in ("apps/ingress.yaml", "apps/helm-guestbook.yaml")}
    _tree(tmp_path, {**files, "broken.yaml": "a: [\n"})
    result = CliRunner().invoke(main, ["import", "--from", "argocd", str(tmp_path)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("# Imported by `gitops-agent import --from argocd`")
    assert "broken.yaml: not read" in result.stderr and "[[apps]]" not in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert CliRunner().invoke(main, ["import", "--from", "flux", str(empty)]).exit_code == 2
