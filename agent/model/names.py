"""Names on objects and pages: every label and annotation key the agent reads or writes, and
the status page's path of an app.

One home, so the planner, apply, prune, the inventory and the Leases never spell one twice.
"""

from __future__ import annotations

from urllib.parse import quote

#: KEP-3659 ApplySet: membership label on every member; the parent's id label and annotations.
PART_OF = "applyset.kubernetes.io/part-of"
ID_LABEL = "applyset.kubernetes.io/id"
TOOLING = "applyset.kubernetes.io/tooling"
GROUP_KINDS = "applyset.kubernetes.io/contains-group-kinds"
ADDITIONAL_NAMESPACES = "applyset.kubernetes.io/additional-namespaces"
#: On every ApplySet parent and Lease: the agent it belongs to, so one labelled LIST finds all.
AGENT_LABEL = "gitops-agent.io/agent"
#: On a parent: the app is suspended; a mass-deletion approval; the prune set the brake holds
#: (so an approval of any other set is refused at once); the entry that claims it.
SUSPENDED = "gitops-agent.io/suspended"
PRUNE_APPROVAL = "gitops-agent.io/prune-approved-digest"
PRUNE_HELD = "gitops-agent.io/prune-held-digest"
CLAIMED_BY = "gitops-agent.io/claimed-by"
#: On a parent of an app with ``drift = "report"``: the revision its last successful pass applied
#: (a restarted agent still knows drift from a new revision).
APPLIED_REVISION = "gitops-agent.io/applied-revision"
#: On a parent: ``gitops-agent rollback`` pinned the app to a commit (its SHA), rolled back from
#: another (the bad one: a source revision other than both ends the pin), when and by whom.
ROLLBACK_TO = "gitops-agent.io/rollback-to"
ROLLBACK_FROM = "gitops-agent.io/rollback-from"
ROLLBACK_AT = "gitops-agent.io/rollback-at"
#: On a status page record (a ConfigMap in the management cluster): what it records ("status").
RECORD_LABEL = "gitops-agent.io/record"
#: On a Lease: its role ("cluster" | "replica") and the cluster it is for.
ROLE_LABEL = "gitops-agent.io/lease"
CLUSTER_LABEL = "gitops-agent.io/cluster"
#: Users' annotations on an object: leave it alone; keep it when it leaves Git; "disabled".
RECONCILE = "gitops-agent.io/reconcile"
PRUNE = "gitops-agent.io/prune"
DISABLED = "disabled"
#: Other tools' annotations that keep an object when it leaves Git, honoured like ``PRUNE``:
#: Helm's ``keep`` policy, Argo CD's sync-options (a comma list) with ``Prune=false`` or
#: ``Delete=false``, Flux's ``prune: disabled``.
HELM_RESOURCE_POLICY = "helm.sh/resource-policy"
HELM_KEEP = "keep"
ARGOCD_SYNC_OPTIONS = "argocd.argoproj.io/sync-options"
ARGOCD_NO_PRUNE = ("Prune=false", "Delete=false")
FLUX_PRUNE = "kustomize.toolkit.fluxcd.io/prune"
#: Users' annotations: fields to take over whatever the rules say; fields never to compare.
FORCE_FIELDS = "gitops-agent.io/force-fields"
IGNORE_FIELDS = "gitops-agent.io/ignore-fields"
#: Users' annotation: leave the object out of health ("ignore").
HEALTH = "gitops-agent.io/health"
HEALTH_IGNORE = "ignore"
#: On an object whose values were encrypted in Git (SOPS): a JSON list of the JSON pointers
#: decrypted by the agent, masked in every report, log and page (docs/secrets.md).
DECRYPTED_FIELDS = "gitops-agent.io/decrypted-fields"
#: Users' annotation: delete and re-create the object when an immutable field changes.
RECREATE = "gitops-agent.io/recreate"
#: Helm's hook annotation (comma-separated phases), read to leave delete/rollback hooks out.
HELM_HOOK = "helm.sh/hook"
RECREATE_ON_IMMUTABLE = "on-immutable-change"
#: On a hook object the agent created: the ApplySet id of its app (never ``PART_OF``: a hook is
#: no member, so nothing, ``kubectl`` included, prunes it as one).
HOOK_OF = "gitops-agent.io/hook-of"
#: On an app's ApplySet parent: ``<revision>:<digest of its hooks>`` of the last sync whose hooks
#: all ran; hooks run again only when it changes (docs/ordering.md).
HOOKS_RAN = "gitops-agent.io/hooks-ran"


def app_page(cluster: str, app: str) -> str:
    """The status page's path of one app: the deep link of logs, notifications and statuses."""
    return f"/ui/clusters/{quote(cluster, safe='')}/apps/{quote(app, safe='')}"
