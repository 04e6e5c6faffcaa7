"""``create_namespace``: an app's target namespace, created before its objects are applied.

Called by ``ClusterReconciler`` after the app's preflight and before its apply (never in a
dry run), and by ``ClusterStages.scope_violations``, which refuses the app before any request
when the namespace lies outside its ``allowed_namespaces``. The namespace is created with the
app's identity (impersonated where ``service_account`` is set), so the server applies the
tenant's RBAC, and labelled ``gitops-agent.io/created-by=<agent>.<app>`` so people can tell
where it came from. It is not declared, so it is never an inventory member and never pruned
(Argo CD's CreateNamespace does the same); a Namespace the render declares is an ordinary member
and is not created here.
"""

from __future__ import annotations

from collections.abc import Container

import structlog

from agent.config.types import AppConfig
from agent.errors import ApiError
from agent.kube.client import KubeClient
from agent.model import ObjectKey

CREATED_BY = "gitops-agent.io/created-by"

log = structlog.get_logger("gitops_agent.reconcile")


def target_namespace(app: AppConfig) -> str:
    """The namespace ``app``'s namespaced objects go to by default: its Helm release's
    (``[apps.helm]``, or ``[clusters.helm]`` for an entry's own app), else ``default_namespace``."""
    if app.helm is not None and app.helm.namespace:
        return app.helm.namespace
    return app.settings.default_namespace


def to_create(app: AppConfig, declared: Container[ObjectKey]) -> str:
    """The namespace ``create_namespace`` makes sure of for ``app`` ("": none)."""
    if not app.settings.create_namespace:
        return ""
    name = target_namespace(app)
    return "" if ObjectKey("", "Namespace", "", name) in declared else name


def ensure_namespace(client: KubeClient, name: str, *, agent: str, app: str, field_manager: str) -> bool:
    """Create namespace ``name`` through ``client`` (the app's identity) unless it exists; True if
    created. A namespace created in between (409 AlreadyExists) is as good as one found."""
    info = client.resource("v1", "Namespace")
    try:
        if client.get(info, None, name) is not None:
            return False
    except ApiError as e:
        if not e.is_denied:  # a tenant may create its namespace without reading namespaces
            raise
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {CREATED_BY: f"{agent}.{app}"}},
    }
    try:
        client.create(info, body, field_manager=field_manager)
    except ApiError as e:
        if e.status == 409 and e.reason == "AlreadyExists":
            return False
        raise
    log.info("namespace created (create_namespace)", namespace=name, app=app)
    return True
