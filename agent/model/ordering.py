"""The order of an app's sync: waves, hooks and the steps they make (``plan.ordering`` reads them).

An object carries a wave (Argo CD's ``argocd.argoproj.io/sync-wave``, 0 by default) and may be a
hook: Argo CD's ``argocd.argoproj.io/hook`` or Helm's ``helm.sh/hook``, each with its delete
policy. ``SyncOrder`` is what a sync does with them: its ``steps`` in order (hooks before, the
waves of ordinary objects with their ``Sync`` hooks, hooks after), each step applied whole and
healthy before the next starts; the hooks that run only when the sync fails; and what this sync
never applies (``Skip``, delete and rollback hooks, a Helm ``test``, an install hook on an
upgrade), each with why. Pure values; the pass, ``diff`` and ``/status`` read them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.model.health import Health
from agent.model.keys import ObjectKey

#: Argo CD's annotations: an object's wave; what hook it is and when it is deleted.
SYNC_WAVE = "argocd.argoproj.io/sync-wave"
ARGOCD_HOOK = "argocd.argoproj.io/hook"
ARGOCD_HOOK_DELETE_POLICY = "argocd.argoproj.io/hook-delete-policy"
#: Helm's hook annotations beside ``helm.sh/hook`` (``names.HELM_HOOK``).
HELM_HOOK_WEIGHT = "helm.sh/hook-weight"
HELM_HOOK_DELETE_POLICY = "helm.sh/hook-delete-policy"


class HookTool(enum.StrEnum):
    """Whose annotation made an object a hook: their semantics differ (docs/ordering.md)."""

    ARGOCD = "argocd"
    HELM = "helm"


class Stage(enum.StrEnum):
    """Where in a sync a hook (or an ordinary object: ``SYNC``) runs."""

    #: Before any ordinary object: Argo ``PreSync``, Helm ``pre-install``/``pre-upgrade``.
    PRE = "pre"
    #: With the ordinary objects of its wave: Argo ``Sync``, and every ordinary object.
    SYNC = "sync"
    #: After the last wave is healthy: Argo ``PostSync``, Helm ``post-install``/``post-upgrade``.
    POST = "post"
    #: Only when the sync failed: Argo ``SyncFail``.
    FAIL = "fail"


class SyncKind(enum.StrEnum):
    """Which Helm hooks a sync runs: an app's first install (no inventory yet) or a later revision."""

    INSTALL = "install"
    UPGRADE = "upgrade"


class DeletePolicy(enum.StrEnum):
    """When a hook object is deleted (Argo's and Helm's spellings read into one)."""

    #: The previous object of the hook is deleted before it is created again (both tools' default).
    BEFORE_HOOK_CREATION = "before-hook-creation"
    #: Deleted once it succeeded.
    HOOK_SUCCEEDED = "hook-succeeded"
    #: Deleted once it failed.
    HOOK_FAILED = "hook-failed"


class NotRun(enum.StrEnum):
    """Why an object this sync never applies is left out: read by reports, never parsed from text."""

    #: Argo CD ``Skip``: the object is never applied.
    SKIP = "skip"
    #: A delete or rollback hook (Argo ``PreDelete``/``PostDelete``, Helm ``pre-delete``...): it
    #: belongs to a delete-on-purpose flow the agent does not run yet.
    DELETE_OR_ROLLBACK = "delete-or-rollback"
    #: A Helm ``test`` hook: run only by ``gitops-agent test``.
    TEST = "test"
    #: A Helm install hook on an upgrade, or an upgrade hook on the first install.
    OTHER_SYNC = "other-sync"
    #: A Helm hook naming no event Helm knows: Helm never runs it either.
    NO_EVENT = "no-event"


@dataclass(frozen=True)
class Hook:
    """What a hook annotation says about one object."""

    tool: HookTool
    #: The events as the annotation names them (Argo's types, Helm's events), known ones only.
    events: tuple[str, ...]
    #: When its object is deleted; the tool's default when the annotation names none.
    delete_policies: frozenset[DeletePolicy]
    #: Helm's ``hook-weight`` (Argo hooks: their wave): the order among hooks of one stage.
    weight: int = 0

    def deletes_on(self, policy: DeletePolicy) -> bool:
        return policy in self.delete_policies


@dataclass(frozen=True)
class Ordered:
    """One desired object with its place in a sync."""

    key: ObjectKey
    #: Its sync wave (ordinary objects and Argo hooks); Helm hooks: their weight.
    wave: int = 0
    #: None: an ordinary object, an inventory member applied in its wave.
    hook: Hook | None = None

    @property
    def is_hook(self) -> bool:
        return self.hook is not None


@dataclass(frozen=True)
class Step:
    """Objects applied together, all applied and healthy before the next step starts."""

    stage: Stage
    #: The wave (``SYNC``, Argo hooks) or Helm weight of its objects.
    wave: int
    #: In apply order: kind phases (Namespaces, CRDs, cluster-scoped, namespaced), then by key.
    objects: tuple[Ordered, ...]

    @property
    def label(self) -> str:
        """How reports name it: ``wave 2``, ``pre-sync hooks (weight -5)``..."""
        if self.stage is Stage.SYNC:
            return f"wave {self.wave}"
        return f"{self.stage}-sync hooks ({'wave' if self._argo else 'weight'} {self.wave})"

    @property
    def _argo(self) -> bool:
        return any(o.hook is not None and o.hook.tool is HookTool.ARGOCD for o in self.objects)


@dataclass(frozen=True)
class Left:
    """An object this sync never applies, and why."""

    ordered: Ordered
    why: NotRun


@dataclass(frozen=True)
class SyncOrder:
    """An app's sync in order: what runs, what runs on failure, what never runs in it."""

    steps: tuple[Step, ...] = ()
    #: Steps of ``SyncFail`` hooks, run when a step failed.
    on_fail: tuple[Step, ...] = ()
    left_out: tuple[Left, ...] = ()

    @property
    def plain(self) -> bool:
        """One wave and no hook: the sync is today's single apply (the same requests)."""
        return (
            len(self.steps) <= 1
            and not self.on_fail
            and all(o.hook is None for s in self.steps for o in s.objects)
        )

    @property
    def hooks(self) -> tuple[Ordered, ...]:
        """Every hook run in a successful sync, in order (each once per step it runs in)."""
        return tuple(o for s in self.steps for o in s.objects if o.hook is not None)

    def describe(self) -> tuple[str, ...]:
        """The sync in order, a line per step (``wave 1: ConfigMap/shop/a, Job.batch/shop/b (Sync hook)``),
        then what runs on failure and what never runs: what reports list."""

        def named(o: Ordered) -> str:
            return f"{o.key} ({o.hook.tool} hook)" if o.hook is not None else str(o.key)

        lines = [f"{s.label}: {', '.join(named(o) for o in s.objects)}" for s in self.steps]
        lines += [f"on failure: {', '.join(named(o) for o in s.objects)}" for s in self.on_fail]
        lines += [f"never applied: {x.ordered.key} ({x.why})" for x in self.left_out]
        return tuple(lines)

    def members(self) -> frozenset[ObjectKey]:
        """The ordinary objects: the app's inventory members (hooks never are)."""
        return frozenset(o.key for s in self.steps for o in s.objects if o.hook is None)


@dataclass(frozen=True)
class WaveWait:
    """Where an app's sync stands when a pass ends before its last wave: the wave applied and
    not healthy yet, the object it waits for, and when the next pass looks again."""

    #: The step as reports name it (``wave 1``) and its wave number.
    step: str
    wave: int
    #: How many steps the sync has, and which this is (from 1): "wave 1 (2 of 3)".
    index: int
    steps: int
    #: The first object of the wave that is not healthy, and its health (debounced).
    blocker: ObjectKey | None
    health: Health | None
    #: Seconds the wave has waited (from its first pass at this revision), and its bound.
    waited: float
    timeout: float
    #: Seconds after this pass's end that the next pass of the app is due.
    recheck: float

    def to_json(self) -> dict[str, object]:
        """What ``/status`` shows of it: the wave, the object it waits for and why."""
        return {
            "step": self.step,
            "wave": self.wave,
            "index": self.index,
            "steps": self.steps,
            "blocker": str(self.blocker) if self.blocker else None,
            "health": self.health.describe() if self.health else None,
            "waited": round(self.waited, 1),
            "timeout": self.timeout,
            "message": self.message,
        }

    @property
    def message(self) -> str:
        what = f"{self.blocker}: {self.health.describe()}" if self.blocker and self.health else "its objects"
        return (
            f"{self.step} ({self.index} of {self.steps}) applied, waiting for {what} "
            f"({self.waited:.0f}s of {self.timeout:.0f}s); later waves and the prune wait"
        )
