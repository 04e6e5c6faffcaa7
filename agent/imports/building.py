"""A path of PATH rendered as the agent renders it (``agent.render``: kustomize and Helm offline,
plain files read), its objects as ``Found``: what an import reads when files alone do not say,
an app of apps' Applications or a HelmRelease a kustomization patches.

Called by ``app_of_apps`` and ``flux``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from agent.errors import RenderError
from agent.imports.reading import Found
from agent.render.renderer import RenderSpec, render
from agent.render.sops import SopsMode

#: The cluster name an import's renders go by (a chart with no release name of its own takes it).
CLUSTER = "import"


def built(root: Path, spec: RenderSpec) -> tuple[list[Found], str]:
    """The objects ``spec`` renders in ``root``, or none and why not (files and problems named).
    Encrypted files stay encrypted: an import holds no key and reads no secret."""
    try:
        rendered = render(root, replace(spec, sops=SopsMode.SEAL))
    except RenderError as e:
        return [], "; ".join(str(p) for p in e.problems[:3])
    return [Found(o.provenance.file, o.provenance.line, o.manifest) for o in rendered.objects], ""


def built_path(root: Path, path: str) -> tuple[list[Found], str]:
    """``built`` of one path with no settings of its own (a kustomization, a directory)."""
    return built(root, RenderSpec(cluster=CLUSTER, paths=(path,)))
