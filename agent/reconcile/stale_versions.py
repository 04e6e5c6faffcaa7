"""managedFields entries that name a custom resource version on its way out (for ``takeover``).

Every managedFields entry records the apiVersion its manager wrote through. Server-side apply
converts the object into each entry's version; once a CRD stops serving a version, an entry
naming it makes every apply of the object fail with a conversion error, and from then on the
entry cannot be removed either (kubernetes#111937). So such entries are found and removed
while the old version is still served, as Cluster API's CRD migrator does.

An entry is stale when its version is neither the CRD's storage version nor the version Git
applies the object with (the two every later write uses), or when Git's own CRD no longer
serves it. ``stale_entries`` is pure; ``crd_versions`` reads the live CRDs of the kinds a
takeover looks at. Called by ``reconcile.takeover``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.errors import ApiError
from agent.kube.client import KubeClient
from agent.model import CRD_KEY, DesiredObject, Manifest, split_api_version
from agent.plan.apis import crd_versions as desired_crd_versions
from agent.plan.fields import managed_entries


@dataclass(frozen=True)
class CrdVersions:
    """What a live CRD says about its versions."""

    storage: str
    served: frozenset[str]


@dataclass(frozen=True)
class StaleEntry:
    """One managedFields entry naming a version to leave; removed by ``takeover --apply``."""

    manager: str
    operation: str
    subresource: str
    api_version: str
    why: str

    def matches(self, raw: Mapping[str, object]) -> bool:
        return (
            raw.get("manager") == self.manager
            and raw.get("operation") == self.operation
            and str(raw.get("subresource") or "") == self.subresource
            and raw.get("apiVersion") == self.api_version
        )


def crd_versions(client: KubeClient, kinds: Iterable[tuple[str, str]]) -> dict[tuple[str, str], CrdVersions]:
    """(group, kind) → its live CRD's storage and served versions, for kinds CRDs define."""
    wanted = set(kinds)
    if not wanted:
        return {}
    try:
        info = client.resource("apiextensions.k8s.io/v1", CRD_KEY[1])
        listed = client.list(info)
    except ApiError as e:
        if e.is_cluster_level:
            raise
        return {}  # CRDs not readable (namespaced RBAC): nothing to say about their versions
    out: dict[tuple[str, str], CrdVersions] = {}
    for crd in listed.items:
        spec = crd.get("spec") or {}
        gk = (str(spec.get("group", "")), str((spec.get("names") or {}).get("kind", "")))
        if gk not in wanted:
            continue
        versions = [v for v in spec.get("versions") or () if isinstance(v, dict)]
        storage = next((str(v.get("name")) for v in versions if v.get("storage")), "")
        served = frozenset(str(v.get("name")) for v in versions if v.get("served"))
        out[gk] = CrdVersions(storage, served)
    return out


def stale_entries(
    obj: DesiredObject,
    live: Manifest,
    crds: Mapping[tuple[str, str], CrdVersions],
    desired: Iterable[DesiredObject] = (),
) -> tuple[StaleEntry, ...]:
    """The entries of ``live`` naming a version of its CRD to leave (see the module docstring)."""
    group, declared = split_api_version(obj.api_version)
    crd = crds.get((group, obj.key.kind))
    if crd is None:
        return ()
    git_crd = desired_crd_versions(desired).get((group, obj.key.kind))
    out: list[StaleEntry] = []
    for e in managed_entries(live):
        g, version = split_api_version(e.api_version)
        if g != group or version in ("", declared):
            continue
        dropped = git_crd is not None and git_crd.get(version, {}).get("served") is not True
        if version == crd.storage and not dropped:
            continue
        if dropped:
            why = f"the CRD in Git no longer serves {version}"
        else:
            why = f"the CRD stores {crd.storage or '?'} and Git applies {declared}"
        why += (
            f": once {version} is not served, server-side apply of this object fails converting this "
            "entry, and it can no longer be removed (kubernetes#111937)"
        )
        out.append(StaleEntry(e.manager, e.operation, e.subresource, e.api_version, why))
    return tuple(out)
