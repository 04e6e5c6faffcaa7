"""The order of an app's sync, from its objects' annotations (``plan.ordering``; docs/ordering.md).

Table tests of the pure model: waves, kind phases inside a wave, Argo CD hooks in their phases,
Helm hooks with Helm's semantics (install hooks on the first install only, upgrade hooks on
later revisions, weights, delete policies), what a sync never applies and why, and the render
error a sync wave that is not an integer makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from agent.config.health_checks import Wait
from agent.errors import RenderError
from agent.model import (
    ApplyResult,
    DeletePolicy,
    DesiredObject,
    HookTool,
    Note,
    NotRun,
    ObjectKey,
    Outcome,
    Provenance,
    Stage,
    SyncKind,
)
from agent.plan.ordering import live_wave, sync_order
from agent.reconcile.follow import followed


def obj(spec: str, line: int = 1) -> DesiredObject:
    """``Kind/name`` (namespace ``ns`` unless the kind is cluster-scoped) with annotations
    ``k=v;k=v`` after a space: ``"Job/migrate argocd.argoproj.io/hook=PreSync"``."""
    ident, _, notes = spec.partition(" ")
    kind, _, name = ident.partition("/")
    annotations = dict(a.split("=", 1) for a in notes.split(";") if a)
    meta: dict[str, object] = {"name": name, "annotations": annotations}
    if kind not in ("Namespace", "CustomResourceDefinition", "ClusterRole"):
        meta["namespace"] = "ns"
    api = {"CustomResourceDefinition": "apiextensions.k8s.io/v1", "Job": "batch/v1"}.get(kind, "v1")
    return DesiredObject(
        {"apiVersion": api, "kind": kind, "metadata": meta}, Provenance("app.yaml", line=line)
    )


def shape(objects: list[str], kind: SyncKind = SyncKind.UPGRADE) -> list[str]:
    """The steps as ``label: Kind/name Kind/name``, then ``fail ...`` and ``left Kind/name (why)``."""
    order = sync_order([obj(s) for s in objects], kind)
    lines = [f"{s.label}: " + " ".join(f"{o.key.kind}/{o.key.name}" for o in s.objects) for s in order.steps]
    lines += ["fail " + " ".join(f"{o.key.kind}/{o.key.name}" for o in s.objects) for s in order.on_fail]
    lines += [f"left {x.ordered.key.kind}/{x.ordered.key.name} ({x.why})" for x in order.left_out]
    return lines


@dataclass
class Case:
    name: str
    objects: list[str]
    expected: list[str]
    kind: SyncKind = SyncKind.UPGRADE
    extra: dict[str, str] = field(default_factory=dict)


CASES = [
    Case(
        "an app without annotations is one wave 0",
        ["ConfigMap/b", "ConfigMap/a"],
        ["wave 0: ConfigMap/a ConfigMap/b"],
    ),
    Case("an empty app has no step", [], []),
    Case(
        "waves run in ascending order, negative ones first",
        [
            "ConfigMap/late argocd.argoproj.io/sync-wave=2",
            "ConfigMap/early argocd.argoproj.io/sync-wave=-1",
            "ConfigMap/plain",
            "ConfigMap/also-late argocd.argoproj.io/sync-wave=+2",
        ],
        ["wave -1: ConfigMap/early", "wave 0: ConfigMap/plain", "wave 2: ConfigMap/also-late ConfigMap/late"],
    ),
    Case(
        "kind phases stay the order inside a wave: Namespaces and CRDs first",
        ["ConfigMap/a", "CustomResourceDefinition/crd", "ClusterRole/r", "Namespace/ns"],
        ["wave 0: Namespace/ns CustomResourceDefinition/crd ClusterRole/r ConfigMap/a"],
    ),
    Case(
        "a Namespace in a later wave waits for its wave",
        ["Namespace/late argocd.argoproj.io/sync-wave=1", "ConfigMap/a"],
        ["wave 0: ConfigMap/a", "wave 1: Namespace/late"],
    ),
    Case(
        "Argo CD hooks run in their phase: PreSync before every wave, PostSync after, Sync in its wave",
        [
            "Job/post argocd.argoproj.io/hook=PostSync",
            "Job/migrate argocd.argoproj.io/hook=PreSync;argocd.argoproj.io/sync-wave=5",
            "Pod/during argocd.argoproj.io/hook=Sync;argocd.argoproj.io/sync-wave=1",
            "ConfigMap/a argocd.argoproj.io/sync-wave=-3",
            "ConfigMap/b argocd.argoproj.io/sync-wave=1",
        ],
        [
            "pre-sync hooks (wave 5): Job/migrate",
            "wave -3: ConfigMap/a",
            "wave 1: ConfigMap/b Pod/during",
            "post-sync hooks (wave 0): Job/post",
        ],
    ),
    Case(
        "a hook of two phases runs in both; SyncFail only on failure; Skip and delete hooks never",
        [
            "Job/both argocd.argoproj.io/hook=PreSync,PostSync",
            "Job/cleanup argocd.argoproj.io/hook=SyncFail",
            "ConfigMap/skipped argocd.argoproj.io/hook=Skip",
            "Job/bye argocd.argoproj.io/hook=PreDelete",
            "Job/gone argocd.argoproj.io/hook=PostDelete",
        ],
        [
            "pre-sync hooks (wave 0): Job/both",
            "post-sync hooks (wave 0): Job/both",
            "fail Job/cleanup",
            "left ConfigMap/skipped (skip)",
            "left Job/bye (delete-or-rollback)",
            "left Job/gone (delete-or-rollback)",
        ],
    ),
    Case(
        "Helm install hooks run on the first install, ordered by weight",
        [
            "Job/second helm.sh/hook=pre-install;helm.sh/hook-weight=5",
            "Job/first helm.sh/hook=pre-install,pre-upgrade;helm.sh/hook-weight=-5",
            "Job/after helm.sh/hook=post-install",
            "Job/upgrade-only helm.sh/hook=pre-upgrade",
            "Deployment/web",
        ],
        [
            "pre-sync hooks (weight -5): Job/first",
            "pre-sync hooks (weight 5): Job/second",
            "wave 0: Deployment/web",
            "post-sync hooks (weight 0): Job/after",
            "left Job/upgrade-only (other-sync)",
        ],
        SyncKind.INSTALL,
    ),
    Case(
        "Helm upgrade hooks run on a later revision, install hooks not",
        [
            "Job/second helm.sh/hook=pre-install;helm.sh/hook-weight=5",
            "Job/first helm.sh/hook=pre-install,pre-upgrade;helm.sh/hook-weight=-5",
            "Job/after helm.sh/hook=post-install,post-upgrade",
            "Deployment/web",
        ],
        [
            "pre-sync hooks (weight -5): Job/first",
            "wave 0: Deployment/web",
            "post-sync hooks (weight 0): Job/after",
            "left Job/second (other-sync)",
        ],
    ),
    Case(
        "Helm test, delete and rollback hooks never run in a sync; an unknown event is Helm's no-op",
        [
            "Pod/smoke helm.sh/hook=test",
            "Pod/old-smoke helm.sh/hook=test-success",
            "Job/scale-down helm.sh/hook=pre-delete",
            "ConfigMap/rb helm.sh/hook=post-rollback",
            "ConfigMap/odd helm.sh/hook=sometime",
        ],
        [
            "left ConfigMap/odd (no-event)",
            "left ConfigMap/rb (delete-or-rollback)",
            "left Pod/old-smoke (test)",
            "left Pod/smoke (test)",
            "left Job/scale-down (delete-or-rollback)",
        ],
    ),
    Case(
        "Helm's annotation is read as Helm reads it: case and spaces, a weight that is not a number is 0",
        [
            "Job/a helm.sh/hook= Pre-Upgrade ;helm.sh/hook-weight=heavy",
            "Job/b helm.sh/hook=pre-upgrade;helm.sh/hook-weight=1",
        ],
        ["pre-sync hooks (weight 0): Job/a", "pre-sync hooks (weight 1): Job/b"],
    ),
    Case(
        "Argo CD's hook annotation wins over Helm's on one object",
        ["Job/j argocd.argoproj.io/hook=PostSync;helm.sh/hook=pre-install"],
        ["post-sync hooks (wave 0): Job/j"],
        SyncKind.INSTALL,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_steps_of_a_sync(case: Case) -> None:
    assert shape(case.objects, case.kind) == case.expected


@pytest.mark.parametrize(
    ("spec", "tool", "policies"),
    [
        ("Job/a argocd.argoproj.io/hook=PreSync", HookTool.ARGOCD, {DeletePolicy.BEFORE_HOOK_CREATION}),
        (
            "Job/a argocd.argoproj.io/hook=PreSync;"
            "argocd.argoproj.io/hook-delete-policy=HookSucceeded, HookFailed",
            HookTool.ARGOCD,
            {DeletePolicy.HOOK_SUCCEEDED, DeletePolicy.HOOK_FAILED},
        ),
        ("Job/a helm.sh/hook=pre-upgrade", HookTool.HELM, {DeletePolicy.BEFORE_HOOK_CREATION}),
        (
            "Job/a helm.sh/hook=pre-upgrade;helm.sh/hook-delete-policy=before-hook-creation,hook-succeeded",
            HookTool.HELM,
            {DeletePolicy.BEFORE_HOOK_CREATION, DeletePolicy.HOOK_SUCCEEDED},
        ),
        # Helm ignores a policy it does not know, and then applies its default.
        (
            "Job/a helm.sh/hook=pre-upgrade;helm.sh/hook-delete-policy=never",
            HookTool.HELM,
            {DeletePolicy.BEFORE_HOOK_CREATION},
        ),
    ],
)
def test_a_hooks_delete_policies_default_to_before_hook_creation(
    spec: str, tool: HookTool, policies: set[DeletePolicy]
) -> None:
    (hook,) = sync_order([obj(spec)], SyncKind.UPGRADE).hooks
    assert hook.hook is not None and hook.hook.tool is tool
    assert hook.hook.delete_policies == policies


def test_hooks_are_never_members_and_only_one_plain_wave_is_todays_single_apply() -> None:
    plain = sync_order([obj("ConfigMap/a"), obj("Namespace/ns")], SyncKind.UPGRADE)
    assert plain.plain and plain.members() == {o.key for s in plain.steps for o in s.objects}
    hooked = sync_order([obj("ConfigMap/a"), obj("Job/j helm.sh/hook=post-upgrade")], SyncKind.UPGRADE)
    assert not hooked.plain
    assert {k.name for k in hooked.members()} == {"a"}
    assert [s.stage for s in hooked.steps] == [Stage.SYNC, Stage.POST]
    waves = sync_order(
        [obj("ConfigMap/a"), obj("ConfigMap/b argocd.argoproj.io/sync-wave=1")], SyncKind.UPGRADE
    )
    assert not waves.plain
    # A skipped hook alone leaves the sync as it is today: nothing of it is sent.
    assert sync_order([obj("ConfigMap/a"), obj("Job/j helm.sh/hook=pre-delete")], SyncKind.UPGRADE).plain


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            "ConfigMap/a argocd.argoproj.io/sync-wave=first",
            "annotation argocd.argoproj.io/sync-wave: 'first' is not an integer",
        ),
        ("ConfigMap/a argocd.argoproj.io/sync-wave=1.5", "'1.5' is not an integer"),
        ("ConfigMap/a argocd.argoproj.io/sync-wave=", "'' is not an integer"),
        (
            "Job/a argocd.argoproj.io/hook=PreSynk",
            "annotation argocd.argoproj.io/hook: 'PreSynk' names no hook type",
        ),
        (
            "Job/a argocd.argoproj.io/hook=PreSync;argocd.argoproj.io/hook-delete-policy=Always",
            "annotation argocd.argoproj.io/hook-delete-policy: 'Always' is not a delete policy",
        ),
    ],
)
def test_an_annotation_that_cannot_be_read_is_a_render_error_naming_object_and_annotation(
    spec: str, words: str
) -> None:
    with pytest.raises(RenderError) as caught:
        sync_order([obj("ConfigMap/fine"), obj(spec, line=7)], SyncKind.UPGRADE)
    (problem,) = caught.value.problems
    assert problem.file == "app.yaml" and problem.line == 7
    assert words in problem.message and "/ns/a" in problem.message


def test_every_unreadable_annotation_is_named_at_once() -> None:
    bad = [
        obj("ConfigMap/a argocd.argoproj.io/sync-wave=x"),
        obj("ConfigMap/b argocd.argoproj.io/sync-wave=y"),
    ]
    with pytest.raises(RenderError) as caught:
        sync_order(bad, SyncKind.INSTALL)
    assert len(caught.value.problems) == 2


def test_a_skipped_or_deferred_object_is_named_with_why_it_never_runs() -> None:
    order = sync_order([obj("Job/j helm.sh/hook=pre-delete")], SyncKind.UPGRADE)
    assert not order.steps and [x.why for x in order.left_out] == [NotRun.DELETE_OR_ROLLBACK]


def test_a_live_objects_wave_is_read_leniently_for_the_prune() -> None:
    assert live_wave({"metadata": {"annotations": {"argocd.argoproj.io/sync-wave": "-2"}}}) == -2
    assert live_wave({"metadata": {"annotations": {"argocd.argoproj.io/sync-wave": "x"}}}) == 0
    assert live_wave({"metadata": {}}) == 0


def test_a_sync_is_described_step_by_step_for_reports() -> None:
    order = sync_order(
        [
            obj("Job/migrate argocd.argoproj.io/hook=PreSync"),
            obj("ConfigMap/a"),
            obj("Job/cleanup argocd.argoproj.io/hook=SyncFail"),
            obj("ConfigMap/s argocd.argoproj.io/hook=Skip"),
        ],
        SyncKind.UPGRADE,
    )
    assert order.describe() == (
        "pre-sync hooks (wave 0): Job.batch/ns/migrate (argocd hook)",
        "wave 0: ConfigMap/ns/a",
        "on failure: Job.batch/ns/cleanup (argocd hook)",
        "never applied: ConfigMap/ns/s (skip)",
    )


def test_a_rollout_wait_never_follows_a_hook_of_the_sync() -> None:
    job, cm = ObjectKey("batch", "Job", "ns", "migrate-x7k2p"), ObjectKey("", "ConfigMap", "ns", "a")
    results = [
        ApplyResult(job, Outcome.CREATED, note=Note.HOOK),
        ApplyResult(cm, Outcome.CREATED),
    ]
    assert followed(Wait(every=True), results) == ([cm], [])
