"""A Flux ``HelmRelease`` as an ``[[apps]]`` entry with ``[apps.helm]``: the chart from its
``HelmRepository`` (``repository``), its ``GitRepository`` (a chart directory) or an
``OCIRepository`` (``chartRef``), its values, namespace, release name and dependencies.

Called by ``flux``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agent.imports.common import depends, other_fields, table
from agent.imports.flux_sources import oci_chart
from agent.imports.model import App, Helm, HelmRepository, Note, duration, repo_path
from agent.imports.reading import Found

_KNOWN = (
    "chart", "chartRef", "values", "valuesFrom", "targetNamespace", "releaseName", "install", "dependsOn",
    "interval", "suspend", "serviceAccountName", "driftDetection",
)  # fmt: skip
_NO_PEER = "the agent has no equivalent"


class _Unit(Protocol):
    """What a release needs of the Kustomization that applies it."""

    obj: Found
    source: str
    path: str
    reach: Any


def release_app(
    r: Found,
    cluster: str,
    names: dict[tuple[str, str, str], str],
    repos: dict[str, HelmRepository],
    *,
    parents: Sequence[_Unit],
    source: Callable[[str], str],
    built_by: str = "",
    ocis: Mapping[tuple[str, str], Found] | None = None,
) -> App:
    """The app of HelmRelease ``r`` on ``cluster``; ``parents``: the Kustomization apps applying it;
    ``built_by``: the path whose kustomize build ``r`` was read from (its patches applied);
    ``ocis``: the tree's OCIRepository objects by namespace and name (``chartRef`` sources)."""
    spec, what = r.spec, r.label()
    notes = other_fields(spec, _KNOWN, what, _NO_PEER)
    helm, app_source, paths = _chart(r, repos, source, notes, ocis or {})
    namespace = str(spec.get("targetNamespace") or r.namespace or "default")
    release = str(
        spec.get("releaseName")
        or (f"{spec['targetNamespace']}-{r.name}" if spec.get("targetNamespace") else r.name)
    )
    values = table(spec, "values")
    for ref in spec.get("valuesFrom") or ():
        if isinstance(ref, dict):
            notes.append(
                Note(
                    f"{what} spec.valuesFrom {ref.get('kind')} {ref.get('name')}"
                    + (f" key {ref['valuesKey']}" if ref.get("valuesKey") else ""),
                    "values come from Git, not from the cluster: copy them into a values file in the "
                    "repository (values_files) or [apps.helm.values] (a Secret's: a SOPS-encrypted file)",
                )
            )
    # Helm puts a chart's objects that name no namespace in the release's; the agent in
    # default_namespace, so both are the release namespace.
    settings: dict[str, Any] = {"default_namespace": namespace} if namespace != "default" else {}
    if (interval := duration(spec.get("interval"))) is not None:
        settings["reconcile_interval"] = interval
    install = table(spec, "install")
    if install.get("createNamespace"):
        settings["create_namespace"] = True
    notes += [Note(f"{what} spec.install.{k}", _NO_PEER) for k in install if k != "createNamespace"]
    drift = table(spec, "driftDetection")
    if drift.get("mode") == "warn":
        settings["drift"] = "report"
    if drift.get("mode") in (None, "disabled"):
        notes.append(
            Note(
                f"{what} drift detection (off in Flux by default)",
                'the agent corrects drift every pass: drift = "report" only reports it',
            )
        )
    if drift.get("ignore"):
        notes.append(Note(f"{what} spec.driftDetection.ignore", "write those paths as [[apps.ignore]] rules"))
    if sa := spec.get("serviceAccountName"):
        settings["service_account"] = f"{r.namespace or 'flux-system'}/{sa}"
    patched = sorted({p for u in parents for p in u.reach.patched_by})
    if built_by:
        notes.append(
            Note(
                f"{what}: the kustomize patches on the way from {built_by} as such",
                f"they are applied: the release was read from the offline build of {built_by}, so its "
                "values and version here are the patched ones (edit them here)",
            )
        )
    elif patched:
        notes.append(
            Note(
                f"{what}: patches of {', '.join(patched)}",
                "the import reads files and builds no kustomization: values patched there are not in "
                "[apps.helm.values], copy them in",
            )
        )
    deps = [
        names[("Kustomization", u.obj.name, cluster)]
        for u in parents
        if ("Kustomization", u.obj.name, cluster) in names
    ]
    return App(
        name=names[("HelmRelease", r.name, cluster)],
        cluster=cluster,
        source=app_source or (parents[0].source if parents else source("flux-system")),
        origin=f"{what} ({r.file})",
        paths=paths,
        settings=settings,
        depends_on=tuple(
            dict.fromkeys(
                [*deps, *depends(spec.get("dependsOn"), "HelmRelease", cluster, names, what, notes)]
            )
        ),
        suspend=bool(spec.get("suspend")),
        helm=Helm(
            chart=helm.chart,
            repository=helm.repository,
            version=helm.version,
            release_name=release,
            namespace=namespace,
            values_files=helm.values_files,
            values=values,
        ),
        notes=tuple(notes),
        unsupported=f"its chart's source is a {helm_kind(r)}, which the agent cannot fetch yet"
        if helm.repository == UNSUPPORTED
        else "",
    )


def helm_kind(r: Found) -> str:
    """The kind of a release's chart source (``chartRef`` or ``chart.spec.sourceRef``)."""
    ref = r.spec.get("chartRef") or table(table(r.spec, "chart"), "spec").get("sourceRef") or {}
    return str(ref.get("kind", "")) if isinstance(ref, dict) else ""


#: The repository of a release whose chart source cannot be expressed (its app is commented out).
UNSUPPORTED = "unsupported:"


def _chart(
    r: Found,
    repos: dict[str, HelmRepository],
    source: Callable[[str], str],
    notes: list[Note],
    ocis: Mapping[tuple[str, str], Found],
) -> tuple[Helm, str, tuple[str, ...]]:
    """(chart, the app's Git source if the chart is in Git, the app's paths)."""
    what = r.label()
    chart = table(r.spec, "chart")
    spec = table(chart, "spec")
    ref = table(spec, "sourceRef")
    notes += other_fields(spec, ("chart", "version", "sourceRef", "valuesFiles"), f"{what} chart", _NO_PEER)
    kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
    if isinstance(chart_ref := r.spec.get("chartRef"), dict):
        kind, name = str(chart_ref.get("kind", "")), str(chart_ref.get("name", ""))
    files = tuple(str(f) for f in spec.get("valuesFiles") or ())
    if kind == "HelmRepository":
        repo = repos.get(name)
        if repo is None:
            notes.append(
                Note(f"{what} chart sourceRef HelmRepository {name}", "it is not in PATH: set repository")
            )
        if files:
            notes.append(
                Note(
                    f"{what} chart valuesFiles", "they are files inside the chart; values_files come from Git"
                )
            )
        url = repo.url if repo else "https://charts.invalid"
        return (
            Helm(chart=str(spec.get("chart", "")), repository=url, version=str(spec.get("version", ""))),
            "",
            (),
        )
    if kind == "GitRepository":
        path = repo_path(spec.get("chart"))
        return Helm(chart=path, values_files=tuple(repo_path(f) for f in files)), source(name), (path,)
    namespace = str(chart_ref.get("namespace") or r.namespace) if isinstance(chart_ref, dict) else r.namespace
    if kind == "OCIRepository" and (oci := ocis.get((namespace, name))) is not None:
        repository, chart_name, version = oci_chart(oci, notes)
        return Helm(chart=chart_name, repository=repository, version=version), "", ()
    why = f"{kind or 'its'} chart source is not supported: set [apps.helm] repository and chart"
    notes.append(Note(f"{what} chart sourceRef {kind} {name}", why))
    return Helm(chart=str(spec.get("chart", "")), repository=UNSUPPORTED), "", ()
