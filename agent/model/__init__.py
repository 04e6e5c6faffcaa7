"""Typed values passed between pipeline stages.

source → ``Revision``; render → ``DesiredSet`` of ``DesiredObject``; plan →
``Plan`` of ``Change``; apply/prune → ``ApplyResult``; reconcile →
``ClusterResult``. Stages exchange these, never loose dicts. Manifests inside
them are plain JSON-compatible dicts, the one shape Kubernetes speaks.

Results are typed all the way to their readers: why a pass failed is a
``Failure`` (a ``FailureReason``, the state it leaves, a message for people),
why it pruned nothing a ``PruneRefusal``, what an object's message is about a
``Note``, how far it rolled out a ``Health`` (``HealthState``, and the ``Blocker`` that holds
it up). Metrics, ``/status``, Events and the CLI read these fields; nothing
classifies a message by its text.

The vocabulary lives in one module each (``keys``, ``desired``, ``changes``, ``results``,
``failures``, ``health``, ``names``); every name is re-exported here, so ``from agent.model
import X`` is the one spelling callers use.
"""

from __future__ import annotations

from agent.model.changes import (
    Action,
    Change,
    FieldConflict,
    IgnoredFields,
    Plan,
    Resolution,
    SkipReason,
)
from agent.model.desired import (
    DecryptFault,
    DesiredObject,
    DesiredSet,
    EncryptedSource,
    Provenance,
    Revision,
)
from agent.model.failures import (
    AccessProblem,
    Failure,
    FailureReason,
    PassState,
    PruneReason,
    PruneRefusal,
    Refusal,
    ScopeRule,
    ScopeViolation,
)
from agent.model.health import (
    AppHealth,
    Blocker,
    Health,
    HealthCause,
    HealthState,
)
from agent.model.keys import (
    CRD_KEY,
    FieldPath,
    Manifest,
    ObjectKey,
    Release,
    parse_release,
    phase_of,
    release_text,
    split_api_version,
)
from agent.model.names import (
    ADDITIONAL_NAMESPACES,
    AGENT_LABEL,
    ARGOCD_NO_PRUNE,
    ARGOCD_SYNC_OPTIONS,
    CLAIMED_BY,
    CLUSTER_LABEL,
    DECRYPTED_FIELDS,
    DISABLED,
    FLUX_PRUNE,
    FORCE_FIELDS,
    GROUP_KINDS,
    HEALTH,
    HEALTH_IGNORE,
    HELM_HOOK,
    HELM_KEEP,
    HELM_RESOURCE_POLICY,
    ID_LABEL,
    IGNORE_FIELDS,
    PART_OF,
    PRUNE,
    PRUNE_APPROVAL,
    PRUNE_HELD,
    RECONCILE,
    RECORD_LABEL,
    RECREATE,
    RECREATE_ON_IMMUTABLE,
    ROLE_LABEL,
    SUSPENDED,
    TOOLING,
    app_page,
)
from agent.model.results import (
    ApiFinding,
    ApiProblem,
    AppConflict,
    ApplyResult,
    ClusterResult,
    Note,
    Outcome,
)

__all__ = [
    "ADDITIONAL_NAMESPACES",
    "AGENT_LABEL",
    "ARGOCD_NO_PRUNE",
    "ARGOCD_SYNC_OPTIONS",
    "CLAIMED_BY",
    "CLUSTER_LABEL",
    "CRD_KEY",
    "DECRYPTED_FIELDS",
    "DISABLED",
    "FLUX_PRUNE",
    "FORCE_FIELDS",
    "GROUP_KINDS",
    "HEALTH",
    "HEALTH_IGNORE",
    "HELM_HOOK",
    "HELM_KEEP",
    "HELM_RESOURCE_POLICY",
    "ID_LABEL",
    "IGNORE_FIELDS",
    "PART_OF",
    "PRUNE",
    "PRUNE_APPROVAL",
    "PRUNE_HELD",
    "RECONCILE",
    "RECORD_LABEL",
    "RECREATE",
    "RECREATE_ON_IMMUTABLE",
    "ROLE_LABEL",
    "SUSPENDED",
    "TOOLING",
    "AccessProblem",
    "Action",
    "ApiFinding",
    "ApiProblem",
    "AppConflict",
    "AppHealth",
    "ApplyResult",
    "Blocker",
    "Change",
    "ClusterResult",
    "DecryptFault",
    "DesiredObject",
    "DesiredSet",
    "EncryptedSource",
    "Failure",
    "FailureReason",
    "FieldConflict",
    "FieldPath",
    "Health",
    "HealthCause",
    "HealthState",
    "IgnoredFields",
    "Manifest",
    "Note",
    "ObjectKey",
    "Outcome",
    "PassState",
    "Plan",
    "Provenance",
    "PruneReason",
    "PruneRefusal",
    "Refusal",
    "Release",
    "Resolution",
    "Revision",
    "ScopeRule",
    "ScopeViolation",
    "SkipReason",
    "app_page",
    "parse_release",
    "phase_of",
    "release_text",
    "split_api_version",
]
