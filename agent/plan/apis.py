"""Which API versions a cluster serves, and which ones a Kubernetes release removes (pure).

The version table (``data/removed_apis.json``) ships with the agent: k8s.io/api's
prerelease-lifecycle data at the pinned version, checked by ``tests/test_removed_apis.py``
against an independent Go program (``tools/go/apilifecycle``). Callers:

* a pass and ``gitops-agent diff`` (live) ask ``unserved`` which declared objects use a
  group/version/kind the cluster's discovery does not serve, before anything is written:
  such an object fails alone, naming its file and the served replacement;
* ``gitops-agent diff --offline --kubernetes-version`` (or a cluster's ``kubernetes_version``)
  asks ``removed_by`` which objects use versions that release no longer serves;
* both read ``deprecations`` for versions the table (or a CRD of the render) marks deprecated.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from agent.model import (
    CRD_KEY,
    ApiFinding,
    ApiProblem,
    DesiredObject,
    ObjectKey,
    Release,
    parse_release,
    release_text,
    split_api_version,
)

__all__ = ["Release", "parse_release", "release_text"]


@dataclass(frozen=True)
class Lifecycle:
    """One group/version/kind of the table: when it is deprecated, removed, and what replaces it."""

    api_version: str
    kind: str
    removed: Release
    deprecated: Release | None = None
    #: ``(apiVersion, kind)`` to use instead, when the release notes name one.
    replacement: tuple[str, str] | None = None
    #: ``k8s.io/api`` (its prerelease-lifecycle data) or ``migration-guide`` (types it dropped).
    source: str = "k8s.io/api"

    @property
    def group(self) -> str:
        return split_api_version(self.api_version)[0]


class VersionTable:
    """The table, indexed by (apiVersion, kind) and by (group, kind)."""

    def __init__(self, entries: Iterable[Lifecycle]) -> None:
        self.entries = tuple(entries)
        self._by_gvk = {(e.api_version, e.kind): e for e in self.entries}
        self._by_gk: dict[tuple[str, str], list[Lifecycle]] = {}
        for e in self.entries:
            self._by_gk.setdefault((e.group, e.kind), []).append(e)

    def get(self, api_version: str, kind: str) -> Lifecycle | None:
        return self._by_gvk.get((api_version, kind))

    def removed_by(self, api_version: str, kind: str, target: Release) -> Lifecycle | None:
        """The entry if ``target`` (or an earlier release) no longer serves ``api_version``/``kind``."""
        e = self.get(api_version, kind)
        return e if e is not None and e.removed <= target else None

    def follow(self, replacement: tuple[str, str], target: Release) -> tuple[str, str] | None:
        """A replacement that ``target`` still serves (flowcontrol v1beta1 → v1beta3 → v1); None
        when the chain ends in one it removes too (PodSecurityPolicy)."""
        seen = {replacement}
        while (e := self.removed_by(*replacement, target)) is not None:
            if e.replacement is None or e.replacement in seen:
                return None
            replacement = e.replacement
            seen.add(replacement)
        return replacement

    def moves(self, api_version: str, kind: str) -> list[tuple[str, str]]:
        """Replacements the release notes name: this version's first, then other versions' of the
        same group and kind (``extensions`` Ingress → ``networking.k8s.io/v1`` Ingress)."""
        group, _ = split_api_version(api_version)
        out: list[tuple[str, str]] = []
        own = self.get(api_version, kind)
        for e in [own] if own else []:
            if e.replacement:
                out.append(e.replacement)
        for e in self._by_gk.get((group, kind), []):
            if e.replacement and e.replacement not in out:
                out.append(e.replacement)
        return out


def _entry(raw: Mapping[str, object], where: str) -> Lifecycle:
    try:
        repl = raw.get("replacement")
        replacement = None
        if isinstance(repl, dict):
            replacement = (str(repl["apiVersion"]), str(repl["kind"]))
        deprecated = raw.get("deprecated")
        return Lifecycle(
            api_version=str(raw["apiVersion"]),
            kind=str(raw["kind"]),
            removed=parse_release(str(raw["removed"])),
            deprecated=parse_release(str(deprecated)) if deprecated else None,
            replacement=replacement,
            source=str(raw.get("source", "k8s.io/api")),
        )
    except (KeyError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from e


@functools.cache
def table() -> VersionTable:
    """The shipped table (``agent/plan/data/removed_apis.json``), read once."""
    text = resources.files("agent.plan").joinpath("data/removed_apis.json").read_text("utf-8")
    doc = json.loads(text)
    return VersionTable(_entry(raw, f"removed_apis.json apis[{i}]") for i, raw in enumerate(doc["apis"]))


# -- served versions (live) ---------------------------------------------------------------

#: (group, kind) → the versions the cluster serves, its preferred version first.
Served = Mapping[tuple[str, str], Sequence[str]]


def _gv(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def crd_versions(objs: Iterable[DesiredObject]) -> dict[tuple[str, str], dict[str, dict[str, object]]]:
    """(group, kind) → {version: its entry of ``spec.versions``} for CRDs in the desired set."""
    out: dict[tuple[str, str], dict[str, dict[str, object]]] = {}
    for o in objs:
        if (o.key.group, o.key.kind) != CRD_KEY:
            continue
        spec = o.manifest.get("spec") or {}
        kind = str((spec.get("names") or {}).get("kind") or "")
        versions = {str(v.get("name")): v for v in spec.get("versions") or () if isinstance(v, dict)}
        if kind:
            out[(str(spec.get("group", "")), kind)] = versions
    return out


def replacement_for(
    api_version: str, kind: str, served: Served, versions: VersionTable | None = None
) -> tuple[str, str] | None:
    """What to use instead of an unserved ``api_version``/``kind``: the same group and kind in a
    version the cluster serves (its preferred one), else a known move the cluster serves, else
    a known move at all (the cluster may not serve that either: still the right advice)."""
    group, _ = split_api_version(api_version)
    mine = served.get((group, kind))
    if mine:
        return _gv(group, mine[0]), kind
    moves = (versions or table()).moves(api_version, kind)
    for av, k in moves:
        g, v = split_api_version(av)
        if v in (served.get((g, k)) or ()):
            return av, k
    return moves[0] if moves else None


def not_served_message(
    api_version: str, kind: str, file: str, replacement: tuple[str, str] | None, removed: Release | None
) -> str:
    """The words a pass and ``diff`` both use for an object the cluster does not serve."""
    when = f" (removed in Kubernetes {release_text(removed)})" if removed else ""
    use = (
        f"use apiVersion {replacement[0]}"
        + (f" kind {replacement[1]}" if replacement[1] != kind else "")
        + " instead"
        if replacement
        else "no served version of this kind is known"
    )
    return f"apiVersion {api_version} of kind {kind} is not served by this cluster{when}: {use} ({file})"


def not_served(
    key: ObjectKey,
    api_version: str,
    file: str,
    served: Served,
    versions: VersionTable | None = None,
    defined: Mapping[str, Mapping[str, object]] | None = None,
) -> ApiFinding:
    """The finding for one object the cluster does not serve; ``defined``: the versions a CRD of
    the render declares for its kind (a served one is the replacement when nothing else is)."""
    vt = versions or table()
    group, _ = split_api_version(api_version)
    entry = vt.get(api_version, key.kind)
    repl = replacement_for(api_version, key.kind, served, vt)
    if repl is None and defined:
        repl = next(((_gv(group, v), key.kind) for v, d in defined.items() if d.get("served") is True), None)
    message = not_served_message(api_version, key.kind, file, repl, entry.removed if entry else None)
    return ApiFinding(
        key, api_version, ApiProblem.NOT_SERVED, message, replacement=repl[0] if repl else "", file=file
    )


def unserved(
    objs: Iterable[DesiredObject],
    served: Served,
    versions: VersionTable | None = None,
    *,
    also: Iterable[DesiredObject] = (),
) -> dict[ObjectKey, ApiFinding]:
    """Objects whose group/version/kind the cluster does not serve: key → finding.

    Kinds a CRD of the same render (or of ``also``: the pass's other apps) adds in a version it
    serves are not findings (CRDs are applied first, in the same pass); a version it does not
    serve is.
    """
    objs = list(objs)
    crds = crd_versions([*objs, *also])
    out: dict[ObjectKey, ApiFinding] = {}
    for o in objs:
        group, version = split_api_version(o.api_version)
        if version in (served.get((group, o.key.kind)) or ()):
            continue
        defined = crds.get((group, o.key.kind))
        if defined is not None and defined.get(version, {}).get("served") is True:
            continue
        out[o.key] = not_served(o.key, o.api_version, str(o.provenance), served, versions, defined)
    return out


# -- a release's removals (offline) and deprecations ---------------------------------------


def removed_by(
    objs: Iterable[DesiredObject], target: Release, versions: VersionTable | None = None
) -> dict[ObjectKey, ApiFinding]:
    """Objects using versions ``target`` (or an earlier release) no longer serves: key → finding."""
    vt = versions or table()
    out: dict[ObjectKey, ApiFinding] = {}
    for o in objs:
        e = vt.removed_by(o.api_version, o.key.kind, target)
        if e is None:
            continue
        file = str(o.provenance)
        repl = e.replacement or next(iter(vt.moves(o.api_version, o.key.kind)), None)
        repl = vt.follow(repl, target) if repl else None
        use = (
            f"use apiVersion {repl[0]}" + (f" kind {repl[1]}" if repl[1] != o.key.kind else "")
            if repl
            else ""
        )
        message = (
            f"apiVersion {o.api_version} of kind {o.key.kind} is removed in Kubernetes "
            f"{release_text(e.removed)} (target {release_text(target)})"
            + (f": {use} instead" if use else ": no replacement is known")
            + f" ({file})"
        )
        out[o.key] = ApiFinding(
            o.key, o.api_version, ApiProblem.REMOVED, message, replacement=repl[0] if repl else "", file=file
        )
    return out


def deprecations(
    objs: Iterable[DesiredObject],
    release: Release | None,
    live_crds: Mapping[tuple[str, str], Mapping[str, Mapping[str, object]]] | None = None,
    versions: VersionTable | None = None,
) -> dict[ObjectKey, ApiFinding]:
    """Objects using a version that ``release`` has deprecated (table) or that a CRD — of the
    render, else ``live_crds`` — marks ``deprecated``, and that is still served there."""
    objs = list(objs)
    vt = versions or table()
    crds = {**(live_crds or {}), **crd_versions(objs)}
    out: dict[ObjectKey, ApiFinding] = {}
    for o in objs:
        group, version = split_api_version(o.api_version)
        file = str(o.provenance)
        e = vt.get(o.api_version, o.key.kind)
        if e is not None and release is not None and e.deprecated and e.deprecated <= release < e.removed:
            repl = e.replacement
            message = (
                f"apiVersion {o.api_version} of kind {o.key.kind} is deprecated since Kubernetes "
                f"{release_text(e.deprecated)} and removed in {release_text(e.removed)}"
                + (f": use apiVersion {repl[0]} instead" if repl else "")
                + f" ({file})"
            )
            out[o.key] = ApiFinding(
                o.key,
                o.api_version,
                ApiProblem.DEPRECATED,
                message,
                replacement=repl[0] if repl else "",
                file=file,
            )
            continue
        entry = (crds.get((group, o.key.kind)) or {}).get(version)
        if entry is not None and entry.get("deprecated") is True:
            said = str(entry.get("deprecationWarning") or "")
            message = (
                f"apiVersion {o.api_version} of kind {o.key.kind} is deprecated by its "
                f"CustomResourceDefinition" + (f": {said}" if said else "") + f" ({file})"
            )
            out[o.key] = ApiFinding(o.key, o.api_version, ApiProblem.DEPRECATED, message, file=file)
    return out
