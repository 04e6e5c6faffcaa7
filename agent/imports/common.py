"""What the Flux and Argo CD imports share: the notes of unknown fields, Git refs, clusters.

Called by ``flux`` and ``argocd``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from agent.imports.model import KUBECONFIG_PLACEHOLDER, Cluster, Note

_COMMIT = re.compile(r"[0-9a-f]{7,40}\Z")
_TAG = re.compile(r"v?\d+(\.\d+)*([-+][0-9A-Za-z.-]+)?\Z")
_RANGE = re.compile(r"[*^~<>=|x]|\s-\s")


def other_fields(spec: Mapping[str, Any], known: Iterable[str], what: str, why: str) -> list[Note]:
    """A note for each key of ``spec`` outside ``known``: the fields nothing maps."""
    taken = set(known)
    return [Note(f"{what} spec.{k}", why) for k in spec if k not in taken]


def git_ref(revision: str, what: str) -> tuple[dict[str, str], list[Note]]:
    """Argo CD's ``targetRevision`` as ``branch``/``tag``/``commit`` keys (a guess, noted)."""
    rev = revision.strip()
    if not rev or rev == "HEAD":
        why = "HEAD is the remote's default branch, which the agent cannot ask for: main is assumed"
        return {"branch": "main"}, [Note(f"{what} targetRevision {rev or 'HEAD'}", why)]
    if _COMMIT.match(rev):
        return {"commit": rev}, []
    if _TAG.match(rev):
        return {"tag": rev}, []
    if _RANGE.search(rev):
        why = "the agent follows one branch, tag or commit, not a version range: pin a tag"
        return {"branch": "main"}, [Note(f"{what} targetRevision {rev}", why)]
    return {"branch": rev}, []


def clusters_of(
    names: Iterable[str], kubeconfig: str, notes: Mapping[str, list[Note]]
) -> tuple[Cluster, ...]:
    """A ``[[clusters]]`` entry per distinct name, reached by ``kubeconfig`` or a placeholder."""
    return tuple(
        Cluster(name, kubeconfig or KUBECONFIG_PLACEHOLDER.format(name=name), tuple(notes.get(name, ())))
        for name in dict.fromkeys(names)
    )


def depends(
    raw: Any, kind: str, cluster: str, names: dict[tuple[str, str, str], str], what: str, notes: list[Note]
) -> tuple[str, ...]:
    """``dependsOn`` as app names on the same cluster; others noted."""
    found: list[str] = []
    for dep in raw or ():
        name = str(dep.get("name", "")) if isinstance(dep, dict) else ""
        if (app := names.get((kind, name, cluster))) is not None:
            found.append(app)
        else:
            notes.append(
                Note(f"{what} spec.dependsOn {name}", f"no {kind} {name} is imported on cluster {cluster}")
            )
    return tuple(dict.fromkeys(found))


def table(value: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``value[key]`` when it is a mapping, else empty: objects from Git are not trusted to be well formed."""
    found = value.get(key)
    return found if isinstance(found, dict) else {}
