"""An imported config renders what the source tool would have applied: each app of a Flux and an
Argo CD fixture repository (kustomize paths, Helm charts in Git, plain directories) is rendered
with the agent's render API and compared object for object with `kustomize build` / `helm template`
of the same inputs, run here with the parameters Flux or Argo CD would give them (Argo CD:
release = the app's name unless set, namespace = destination.namespace, valueFiles, values,
helm.parameters as --set; Flux: targetNamespace, postBuild.substitute). Offline; the pinned
helm and kustomize are the oracles' tools too."""

from __future__ import annotations

import re
import subprocess
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from agent.config.load import parse_config
from agent.config.types import AppConfig
from agent.imports.argocd import import_argocd
from agent.imports.flux import import_flux
from agent.imports.toml_text import toml_text
from agent.reconcile.stages import app_render_spec
from agent.render.binaries import tool
from agent.render.renderer import render

Key = tuple[str, str, str, str]

CHART = {
    "Chart.yaml": "apiVersion: v2\nname: web\nversion: 0.1.0\n",
    "values.yaml": "replicaCount: 1\nimage: {repository: nginx, tag: '1.0'}\nservice: {type: ClusterIP}\n",
    "values-production.yaml": "replicaCount: 2\n",
    "templates/deployment.yaml": """apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
  namespace: {{ .Release.Namespace }}
spec:
  replicas: {{ .Values.replicaCount }}
  selector: {matchLabels: {app: {{ .Release.Name }}}}
  template:
    metadata: {labels: {app: {{ .Release.Name }}}}
    spec:
      containers: [{name: web, image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"}]
""",
    "templates/service.yaml": """apiVersion: v1
kind: Service
metadata: {name: {{ .Release.Name }}}
spec:
  type: {{ .Values.service.type }}
  ports: [{port: 80}]
  selector: {app: {{ .Release.Name }}}
""",
}

KUSTOMIZE = {
    "kustomization.yaml": "resources: [deployment.yaml, cm.yaml]\n"
    "labels: [{pairs: {team: a}}]\nnamePrefix: k-\n",
    "deployment.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: ui}\nspec: {replicas: 1}\n",
    "cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {domain: '${DOMAIN}'}\n",
}

PLAIN = {
    "a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {env: '${ENV}'}\n",
    "sub/b.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\ndata: {env: '${ENV}'}\n",
}


def _application(name: str, path: str, namespace: str, helm: str = "") -> str:
    return f"""---
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {{name: {name}, namespace: argocd}}
spec:
  source:
    repoURL: https://git.example.com/apps.git
    targetRevision: main
    path: {path}{helm}
  destination: {{server: "https://kubernetes.default.svc", namespace: {namespace}}}
  syncPolicy: {{automated: {{prune: true, selfHeal: true}}}}
"""


ARGO_HELM = """
    helm:
      valueFiles: [values-production.yaml]
      values: |
        service: {type: NodePort}
      parameters:
        - {name: image.tag, value: "2.0"}
        - {name: replicaCount, value: "3"}"""

ARGO_APPS = (
    _application("web", "charts/web", "shop", ARGO_HELM)
    + _application("ui", "kustomize-ui", "guestbook")
    + _application("plain", "plain", "plain")
)

FLUX_SYNC = """
apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata: {name: flux-system, namespace: flux-system}
spec: {url: "https://git.example.com/fleet.git", ref: {branch: main}}
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: ui, namespace: flux-system}
spec:
  sourceRef: {kind: GitRepository, name: flux-system}
  path: ./kustomize-ui
  prune: true
  targetNamespace: guestbook
  postBuild: {substitute: {DOMAIN: example.com}}
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: plain, namespace: flux-system}
spec:
  sourceRef: {kind: GitRepository, name: flux-system}
  path: ./plain
  prune: true
  targetNamespace: plain
  postBuild: {substitute: {ENV: prod}}
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: releases, namespace: flux-system}
spec:
  sourceRef: {kind: GitRepository, name: flux-system}
  path: ./releases/prod
  prune: true
"""

FLUX_RELEASE = """
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: web, namespace: shop}
spec:
  targetNamespace: store
  chart:
    spec:
      chart: ./charts/web
      sourceRef: {kind: GitRepository, name: flux-system, namespace: flux-system}
      valuesFiles: [charts/web/values.yaml, charts/web/values-production.yaml]
  values: {image: {tag: "3.0"}, replicaCount: 1}
"""

# flux2-kustomize-helm-example's apps/production: the base release, its values patched.
FLUX_OVERLAY = {
    "releases/prod/kustomization.yaml": "resources: [../base]\n"
    "patches: [{path: web-values.yaml, target: {kind: HelmRelease}}]\n",
    "releases/prod/web-values.yaml": """
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: web, namespace: shop}
spec:
  values: {replicaCount: 5}
""",
    "releases/base/kustomization.yaml": "resources: [web.yaml]\n",
}


def _tree(root: Path, files: Mapping[str, str], under: str = "") -> Path:
    for name, text in files.items():
        path = root / under / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _repo(root: Path, objects: Mapping[str, str]) -> Path:
    _tree(root, CHART, "charts/web")
    _tree(root, KUSTOMIZE, "kustomize-ui")
    _tree(root, PLAIN, "plain")
    return _tree(root, objects)


def _apps(root: Path, text: str) -> dict[str, AppConfig]:
    cfg = parse_config(tomllib.loads(text), base_dir=root)
    return {a.name: a for a in cfg.apps}


def _agent(root: Path, app: AppConfig) -> dict[Key, dict[str, Any]]:
    """What the agent applies for ``app``: its render, namespaces defaulted as the apply stage does."""
    rendered = render(root, app_render_spec(app))
    return _keyed((o.manifest for o in rendered.objects), app.settings.default_namespace, override=False)


def _keyed(objects: Iterable[Any], namespace: str, *, override: bool) -> dict[Key, dict[str, Any]]:
    """Objects by identity; ``namespace`` set where unset (Argo CD, the agent) or on every object
    (Flux's targetNamespace, kustomize's namespace transformer). Fixtures are all namespaced."""
    out: dict[Key, dict[str, Any]] = {}
    for obj in objects:
        if not obj:
            continue
        meta = obj.setdefault("metadata", {})
        if namespace and (override or not meta.get("namespace")):
            meta["namespace"] = namespace
        out[(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
    return out


def _run(*argv: str, cwd: Path) -> list[Any]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return list(yaml.safe_load_all(done.stdout))


def _substituted(objects: list[Any], variables: Mapping[str, str]) -> list[Any]:
    """Flux's postBuild: ``${VAR}`` replaced in the built YAML."""
    text = yaml.safe_dump_all(objects)
    return list(yaml.safe_load_all(re.sub(r"\$\{(\w+)\}", lambda m: variables.get(m[1], m[0]), text)))


def _plain(directory: Path, *, recurse: bool) -> list[Any]:
    files = sorted(directory.rglob("*.yaml") if recurse else directory.glob("*.yaml"))
    return [doc for f in files for doc in yaml.safe_load_all(f.read_text())]


def test_argocd_apps_render_as_argocd_would_render_them(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"argocd/apps.yaml": ARGO_APPS})
    apps = _apps(root, toml_text(import_argocd(root), path="repo"))
    helm, kustomize = str(tool("helm")), str(tool("kustomize"))
    (tmp_path / "values.yaml").write_text("service: {type: NodePort}\n")
    chart = [helm, "template", "web", "charts/web", "--namespace", "shop", "--include-crds"]
    chart += ["--values", "charts/web/values-production.yaml", "--values", str(tmp_path / "values.yaml")]
    chart += ["--set", "image.tag=2.0", "--set", "replicaCount=3"]
    expected = {
        "web": _keyed(_run(*chart, cwd=root), "shop", override=False),
        "ui": _keyed(_run(kustomize, "build", "kustomize-ui", cwd=root), "guestbook", override=False),
        "plain": _keyed(_plain(root / "plain", recurse=False), "plain", override=False),
    }
    assert set(apps) == set(expected)
    for name, objects in expected.items():
        assert _agent(root, apps[name]) == objects, name
    # The release took the Application's name and the parameters' types (an int replica count).
    assert expected["web"][("apps/v1", "Deployment", "shop", "web")]["spec"]["replicas"] == 3


def test_flux_apps_render_as_flux_would_render_them(tmp_path: Path) -> None:
    root = _repo(
        tmp_path,
        {"clusters/prod/sync.yaml": FLUX_SYNC, "releases/base/web.yaml": FLUX_RELEASE, **FLUX_OVERLAY},
    )
    apps = _apps(root, toml_text(import_flux(root), path="repo"))
    helm, kustomize = str(tool("helm")), str(tool("kustomize"))
    (tmp_path / "values.yaml").write_text("image: {tag: '3.0'}\nreplicaCount: 5\n")  # patched
    chart = [helm, "template", "store-web", "charts/web", "--namespace", "store", "--include-crds"]
    chart += ["--values", "charts/web/values.yaml", "--values", "charts/web/values-production.yaml"]
    chart += ["--values", str(tmp_path / "values.yaml")]
    built = _run(kustomize, "build", "kustomize-ui", cwd=root)
    expected = {
        "web": _keyed(_run(*chart, cwd=root), "store", override=False),
        "ui": _keyed(_substituted(built, {"DOMAIN": "example.com"}), "guestbook", override=True),
        "plain": _keyed(
            _substituted(_plain(root / "plain", recurse=True), {"ENV": "prod"}), "plain", override=True
        ),
    }
    assert set(apps) == set(expected)  # `releases` applies only the release: not an app of its own
    for name, objects in expected.items():
        assert _agent(root, apps[name]) == objects, name
    assert expected["ui"][("v1", "ConfigMap", "guestbook", "k-cfg")]["data"] == {"domain": "example.com"}
    assert expected["web"][("apps/v1", "Deployment", "store", "store-web")]["spec"]["replicas"] == 5
