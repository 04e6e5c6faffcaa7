"""An app's preflight: may its ServiceAccount do what this pass is about to do?

Called by the pass (and ``diff``) for an app with a ``service_account``, after planning and
the prune decision, before anything is written for it. ``needs`` is pure: each distinct
(verb, group/resource, namespace) the plan's writes, the prune set and the failed reads
need. ``check`` then asks the server: the ServiceAccount exists (a GET as the agent, which
tells a missing account from a bare 403), and one SelfSubjectAccessReview per need made *as*
the account, so the server's RBAC answers, not a copy of it. Whatever is missing fails the
app in one line naming every missing rule, instead of a 403 per object after a half-applied
pass. A steady pass (nothing to write, nothing unknown) needs nothing and costs no request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from agent.errors import AccessDenied, ApiError
from agent.kube.client import KubeClient, ResourceInfo
from agent.model import AccessProblem, Action, Change, ObjectKey

_SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@dataclass(frozen=True, order=True)
class Need:
    """One permission a pass needs: ``verb`` on ``group``/``resource`` in ``namespace`` ("": cluster-wide)."""

    verb: str
    group: str
    resource: str
    namespace: str

    def __str__(self) -> str:
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        where = f"in namespace {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.verb} {what} {where}"


#: The verbs a planned change sends: a server-side apply is a PATCH, one that creates needs both.
_VERBS = {Action.CREATE: ("patch", "create"), Action.UPDATE: ("patch",)}


def needs(
    changes: Iterable[Change],
    *,
    delete: Iterable[ObjectKey] = (),
    orphan: Iterable[ObjectKey] = (),
    unread: Iterable[ObjectKey] = (),
    resolve: Callable[[ObjectKey], ResourceInfo | None],
) -> dict[Need, ObjectKey]:
    """Each permission the pass needs → the first object needing it (pure but for ``resolve``).

    ``unread``: objects whose listing failed in this pass (``list`` is what they need).
    Kinds the server does not serve yet (a CRD of this pass) are left out: nothing to ask.
    """
    out: dict[Need, ObjectKey] = {}

    def add(key: ObjectKey, verbs: Iterable[str]) -> None:
        info = resolve(key)
        if info is None:
            return
        namespace = key.namespace if info.namespaced else ""
        for verb in verbs:
            out.setdefault(Need(verb, info.group, info.plural, namespace), key)

    for c in changes:
        if c.body is not None and c.action in _VERBS:
            add(c.key, _VERBS[c.action])
    for key in delete:
        add(key, ("delete",))
    for key in orphan:
        add(key, ("get", "patch"))
    for key in unread:
        add(key, ("list",))
    return out


def _account_exists(agent: KubeClient, service_account: str, nothing: str) -> None:
    """Raise ``AccessDenied`` if the account is not there (unknown when the agent may not read it:
    the reviews still tell what is missing)."""
    namespace, _, name = service_account.partition("/")
    try:
        agent.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}")
    except ApiError as e:
        if e.status == 404:
            raise AccessDenied(
                AccessProblem.MISSING_ACCOUNT,
                f"preflight: ServiceAccount {service_account} does not exist; {nothing}",
            ) from e
        if not e.is_denied:
            raise


def check(
    agent: KubeClient,
    service_account: str,
    wanted: dict[Need, ObjectKey],
    *,
    app: str,
    concurrency: int,
) -> None:
    """Raise ``AccessDenied`` (one line) unless ``service_account`` exists and may do all of ``wanted``.

    ``agent``: the agent's own client (it reads the account and makes the reviews as it).
    """
    if not wanted:
        return
    namespace, _, name = service_account.partition("/")
    nothing = f"nothing applied or pruned for app {app!r}"
    _account_exists(agent, service_account, nothing)
    tenant = agent.impersonating(service_account)

    def allowed(need: Need) -> bool:
        attributes = {"verb": need.verb, "group": need.group, "resource": need.resource}
        if need.namespace:
            attributes["namespace"] = need.namespace
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        answer = tenant.request("POST", _SSAR, body=review)
        return bool(((answer or {}).get("status") or {}).get("allowed"))

    ordered = sorted(wanted)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(ordered)))) as pool:
            answers = list(pool.map(allowed, ordered))
    except ApiError as e:
        if e.is_denied and e.details is not None and e.details.kind == "serviceaccounts":
            # The review itself was refused at impersonation: the agent may not act as the account.
            raise AccessDenied(
                AccessProblem.IMPERSONATION_DENIED,
                f"preflight: the agent may not impersonate ServiceAccount {service_account} (grant it"
                f" `impersonate` on serviceaccounts/{name} in namespace {namespace}); {nothing}",
            ) from e
        raise
    missing = [n for n, ok in zip(ordered, answers, strict=True) if not ok]
    if missing:
        said = "; ".join(f"{n} (for {wanted[n]})" for n in missing)
        raise AccessDenied(
            AccessProblem.RULE_MISSING,
            f"preflight: ServiceAccount {service_account} may not {said}; {nothing}",
        )
