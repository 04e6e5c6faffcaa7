"""Render: a cluster's desired objects from a checked-out revision, failing closed.

Called by ``reconcile`` (through ``RenderCache``) and by ``gitops-agent render``. Input: the
root of a checkout and a ``RenderSpec``; output: a ``DesiredSet`` in a stable order, or a
``RenderError`` carrying *every* problem found -- never a partial set (docs/safety.md rule 2).

What each configured path (repository-relative) may be:

* a directory with ``kustomization.yaml`` / ``kustomization.yml`` / ``Kustomization``: built
  by ``agent.render.kustomize`` (the pinned kustomize API in a sandbox); it may read files
  anywhere inside the repository, never outside it or remote;
* a directory with ``Chart.yaml``: rendered with the pinned ``helm template`` (the chart named
  by ``RenderSpec.helm`` uses its release name, namespace and values files; any other chart
  uses release name = cluster name; ``--is-upgrade`` for a release's later revision);
* any other directory: plain manifests. ``*.yaml``, ``*.yml`` and ``*.json`` files are read
  recursively in code-point order of their names; sub-directories that hold a kustomization
  or a chart are rendered as such (as Flux does) instead of being descended into. Names
  starting with ``.`` (``.git``, ``.github``) are skipped, other extensions are ignored;
* a single manifest file.

Exclusions, gitignore-like (``agent.render.ignore``): ``.gitops-agent-ignore`` files
and ``RenderSpec.exclude``.

Every child (kustomize, helm, sops) runs with a memory limit (``agent.render.limits``).

Variables: ``${VAR}`` in plain manifests and kustomize output where the app substitutes
(``RenderSpec.vars``, ``agent.render.substitute``); Helm output is not substituted (charts
take values and often carry shell ``${...}`` of their own).

Encrypted files: any document with SOPS metadata (a top-level ``sops`` key), in plain
files, in kustomize/helm output and in the files kustomize generators read, is decrypted
in memory with ``RenderSpec.keys`` (``agent.render.sops``); a file that does not decrypt
is a problem like any other, so the render fails closed.

Identity: two objects with the same (group, kind, namespace, name) are an error naming both
places. Namespaces are compared as written: render never invents one (the apply stage
defaults them), so an object without a namespace and one with the default namespace are not
reported here.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.config.types import CLUSTER_DEFAULTS, DEFAULT_RENDER_MEMORY, HelmSettings
from agent.errors import LocalClusterError, RenderError, RenderProblem
from agent.model import Capabilities as Capabilities  # re-exported: the render's vocabulary
from agent.model import DesiredObject, DesiredSet, EncryptedSource, Manifest, ObjectKey, Provenance
from agent.render.binaries import tool
from agent.render.ignore import IGNORE_FILE, Rule, ignored, parse_ignore
from agent.render.jsonmanifest import parse_json
from agent.render.kustomize import Graph, check_kustomization, kustomization_file, kustomize_build
from agent.render.limits import MemoryFailures, bounded_runner, input_problems
from agent.render.manifests import Document, Origin, decode_bytes, objects_of, parse_yaml
from agent.render.process import Runner
from agent.render.sops import AgeKeys, Sops, SopsMode
from agent.render.tooljson import SUBSTITUTED, read_helm_output, read_output
from agent.render.tools import check_chart, converter, helm_template

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class RenderSpec:
    """What to render for one cluster; built from ``ClusterConfig`` by the caller."""

    cluster: str
    #: Repository-relative directories (or files) whose objects the cluster should hold.
    paths: tuple[str, ...]
    #: ``${VAR}`` values, or ``None`` where the app does not substitute (``config.types.substitutes``).
    vars: Mapping[str, str] | None = None
    #: Gitignore-like globs anchored at the repository root, skipped by the plain walk.
    exclude: tuple[str, ...] = ()
    #: The cluster's Helm chart settings, if any.
    helm: HelmSettings | None = None
    #: Seconds allowed for each kustomize/helm run; bytes of memory for each (``RLIMIT_DATA``).
    timeout: float = CLUSTER_DEFAULTS.render_timeout
    memory: int = DEFAULT_RENDER_MEMORY
    #: Largest stdout of one tool run, and largest total of plain files read.
    max_output_bytes: int = 64 * 1024 * 1024
    #: Largest single manifest file.
    max_file_bytes: int = 16 * 1024 * 1024
    #: Age identities for SOPS-encrypted files (``None``: none configured).
    keys: AgeKeys | None = None
    #: Decrypt encrypted files, or keep their ciphertext (reports without keys).
    sops: SopsMode = SopsMode.DECRYPT
    #: The cluster's capabilities for Helm, asked when a chart is rendered (a pass: the cluster's
    #: version and discovery); ``kube_version`` alone without a cluster (``agent.plan.release``).
    capabilities: Callable[[], Capabilities] | None = field(default=None, compare=False)
    kube_version: str = ""
    #: Outside the checkout: a repository's chart; the Git chart with its dependencies (source.chart_deps).
    chart_dir: Path | None = None
    chart_built: Path | None = None
    #: Charts as a release's later revision (``--is-upgrade``), not its first install; with tests.
    is_upgrade: bool = False
    tests: bool = False


class _Render:
    """State of one render: the problems and objects found so far."""

    def __init__(self, tree: Path, spec: RenderSpec, runner: Runner) -> None:
        self.tree = tree.resolve()
        self.spec = spec
        self.runner = runner
        self.problems: list[RenderProblem] = []
        self.found: list[tuple[Manifest, Provenance]] = []
        self.units: set[Path] = set()
        self.visited: set[Path] = set()
        self.bytes_read = 0
        #: The output depends on ``spec.cluster`` (a Helm release named after it): not shareable.
        self.used_cluster_name = False
        self.sops = Sops(
            self.tree,
            spec.keys,
            spec.sops,
            runner=runner,
            timeout=spec.timeout,
            max_output=spec.max_output_bytes,
            max_file=spec.max_file_bytes,
            problems=self.problems,
        )
        #: What Helm was told about the cluster: the output is that cluster's (not shareable).
        self.used_capabilities: Capabilities | None = None

    def rel(self, path: Path) -> str:
        return path.relative_to(self.tree).as_posix() if path != self.tree else "."

    def path(self, given: str, what: str) -> Path | None:
        p = Path(given)
        if p.is_absolute() or ".." in p.parts:
            self.problems.append(RenderProblem(given, f"{what} must be a path inside the repository"))
            return None
        full = self.tree / p
        target = full.resolve()
        if target != self.tree and self.tree not in target.parents:
            self.problems.append(RenderProblem(given, f"{what} is a symlink pointing outside the repository"))
            return None
        if not full.exists():
            self.problems.append(RenderProblem(given, f"{what} does not exist in this revision"))
            return None
        return full.resolve()

    def run(self) -> None:
        if not self.spec.paths and self.spec.chart_dir is None:
            self.problems.append(RenderProblem("", "no paths to render"))
        rules = parse_ignore("\n".join(self.spec.exclude), "")
        for given in self.spec.paths:
            full = self.path(given, "path")
            if full is None:
                continue
            if full.is_file():
                self.file(full)
            elif not self.unit(full):
                self.walk(full, list(rules))
        helm = self.spec.helm
        if self.spec.chart_dir is not None:
            self.helm(self.spec.chart_dir, fetched=True)
        elif helm is not None and helm.chart:
            chart = self.path(helm.chart, "helm chart")
            if chart is not None and chart not in self.units:
                self.unit(chart, explicit=True)

    def unit(self, directory: Path, *, explicit: bool = False) -> bool:
        """Render ``directory`` if it is a kustomization or a chart; False if it is neither."""
        if kustomization_file(directory) is not None:
            self.units.add(directory)
            self.kustomize(directory)
            return True
        if (directory / "Chart.yaml").is_file():
            self.units.add(directory)
            self.helm(directory)
            return True
        if explicit:
            self.problems.append(RenderProblem(self.rel(directory), "helm chart directory has no Chart.yaml"))
        return False

    def walk(self, directory: Path, rules: list[Rule]) -> None:
        if directory in self.visited:
            return  # reached twice through symlinks: its objects would only be duplicates
        self.visited.add(directory)
        rel_dir = self.rel(directory)
        base = "" if rel_dir == "." else rel_dir
        ignore = directory / IGNORE_FILE
        if ignore.is_file():
            rules = rules + parse_ignore(ignore.read_text("utf-8", "replace"), base)
        elif ignore.is_symlink():  # unreadable rules would render what they exclude: fail closed
            where = f"{base}/{IGNORE_FILE}".lstrip("/")
            self.problems.append(RenderProblem(where, f"dangling symlink ({os.readlink(ignore)})"))
            return
        try:
            entries = sorted(os.listdir(directory))
        except OSError as e:
            self.problems.append(RenderProblem(rel_dir, f"cannot list directory: {e.strerror}"))
            return
        for name in entries:
            if name.startswith("."):
                continue
            entry = directory / name
            rel = f"{base}/{name}" if base else name
            is_dir = entry.is_dir()
            if ignored(rules, rel, is_dir):
                continue
            if entry.is_symlink():
                target = entry.resolve()
                if target != self.tree and self.tree not in target.parents:
                    self.problems.append(
                        RenderProblem(rel, f"symlink points outside the repository ({os.readlink(entry)})")
                    )
                    continue
                if not target.exists():
                    self.problems.append(RenderProblem(rel, f"dangling symlink ({os.readlink(entry)})"))
                    continue
            if is_dir:
                if not self.unit(entry.resolve()):
                    self.walk(entry.resolve(), rules)
            elif name.endswith(MANIFEST_SUFFIXES) and entry.is_file():
                self.file(entry, rel)

    def file(self, path: Path, rel: str | None = None) -> None:
        rel = rel or self.rel(path.resolve())
        origin = Origin(rel)
        size = path.stat().st_size
        if size > self.spec.max_file_bytes:
            self.problems.append(
                origin.problem(f"file is {size} bytes, over the limit of {self.spec.max_file_bytes}")
            )
            return
        self.bytes_read += size
        if self.bytes_read > self.spec.max_output_bytes:
            self.problems.append(
                origin.problem(f"manifests exceed the render limit of {self.spec.max_output_bytes} bytes")
            )
            return
        text, bad = decode_bytes(path.read_bytes(), origin)
        if text is None:
            assert bad is not None
            self.problems.append(bad)
            return
        is_json = path.name.endswith(".json")
        docs, problems = (parse_json if is_json else parse_yaml)(text, origin, self.spec.vars)
        if not problems:
            docs = self.sops.file_docs(text.encode("utf-8"), docs, origin, "json" if is_json else "yaml")
        self.add(docs, problems, origin)

    def add(self, docs: list[Document], problems: list[RenderProblem], origin: Origin) -> None:
        objects, invalid = objects_of(docs, origin)
        self.problems.extend(problems)
        self.problems.extend(invalid)
        self.found.extend(objects)

    def binary(self, name: str, file: str) -> Path | None:
        try:
            return tool(name)
        except LocalClusterError as e:
            self.problems.append(RenderProblem(file, str(e)))
            return None

    def kustomize(self, directory: Path) -> None:
        rel = self.rel(directory)
        graph = Graph()
        problems = check_kustomization(directory, self.tree, graph)
        if problems:
            self.problems.extend(problems)
            return
        kfile = kustomization_file(directory)
        assert kfile is not None
        binary = self.binary("krender", rel)
        if binary is None:
            return
        out = kustomize_build(
            binary,
            directory,
            self.tree,
            graph,
            timeout=self.spec.timeout,
            max_output=self.spec.max_output_bytes,
            max_file=self.spec.max_file_bytes,
            runner=self.runner,
            json_unless=SUBSTITUTED if self.spec.vars is not None else "",
        )
        if out.problems:
            self.problems.extend(out.problems)
            return
        origin = Origin(self.rel(kfile), label=f"{rel} (kustomize build output)", provenance_lines=False)
        docs, problems = read_output(out.text, origin, self.spec.vars)
        if not problems:
            docs = self.sops.output_docs(docs, origin, graph.roots())
        self.add(docs, problems, origin)

    def helm(self, chart: Path, *, fetched: bool = False) -> None:
        """``helm template`` of ``chart`` in the checkout, or (``fetched``) of a repository's."""
        settings, in_git = self.spec.helm, chart
        rel = f"{settings.repository}/{settings.chart}" if fetched and settings else self.rel(chart)
        configured = settings is not None and (fetched or settings.chart.strip("/") in (rel, f"{rel}/"))
        built = self.spec.chart_built if configured and not fetched else None  # dependencies fetched in
        chart, root = (built, built.parent) if built else (chart, chart.parent if fetched else self.tree)
        release = (settings.release_name if settings and configured else "") or self.spec.cluster
        self.used_cluster_name |= release == self.spec.cluster
        namespace = settings.namespace if settings and configured else ""
        values: list[Path] = []
        for v in settings.values_files if settings and configured else ():
            full = self.path(v, "helm values file")
            if full is not None and not full.is_file():
                self.problems.append(RenderProblem(v, "helm values file is not a file"))
            elif full is not None:
                values.append(full)
        limits = {"max_total": self.spec.max_output_bytes, "max_file": self.spec.max_file_bytes}
        shown = (lambda p: f"{rel}/{p.relative_to(chart).as_posix()}") if root != self.tree else self.rel
        problems = check_chart(chart, root) + input_problems([chart, *values], shown, **limits)
        if problems or len(values) != len(settings.values_files if settings and configured else ()):
            self.problems.extend(problems)
            return
        if (binary := self.binary("helm", f"{rel}/Chart.yaml")) is None:
            return
        caps = self.spec.capabilities() if self.spec.capabilities is not None else None
        if caps is None and self.spec.kube_version:
            caps = Capabilities(self.spec.kube_version)
        self.used_capabilities = caps or self.used_capabilities
        out = helm_template(
            binary,
            chart,
            root,
            release=release,
            namespace=namespace,
            values=values,
            values_json=settings.values if settings and configured else "",
            kube_version=caps.kube_version if caps else "",
            api_versions=caps.api_versions if caps else (),
            is_upgrade=self.spec.is_upgrade,
            tests=self.spec.tests,
            timeout=self.spec.timeout,
            max_output=self.spec.max_output_bytes,
            runner=self.runner,
            converter=converter(),
            item_lines=fetched,
        )
        if out.problems:
            self.problems.extend(out.problems)
            return
        sections, converted = read_helm_output(out.text, rel)
        label = f"{rel} (helm template output)"
        origin = Origin(f"{rel}/Chart.yaml", label=label, sections=sections, provenance_lines=False)
        docs, problems = (converted, []) if converted is not None else parse_yaml(out.text, origin, None)
        if not problems and not fetched:  # a fetched chart holds no file of the app's keys
            docs = self.sops.output_docs(docs, origin, [in_git])
        self.add(docs, problems, origin)

    def duplicates(self) -> None:
        first: dict[ObjectKey, Provenance] = {}
        for manifest, prov in self.found:
            key = ObjectKey.of(manifest)
            if key in first:
                where = first[key]
                self.problems.append(
                    RenderProblem(prov.file, f"duplicate object {key}: also defined at {where}", prov.line)
                )
            else:
                first[key] = prov


def _job(tree: Path, spec: RenderSpec, runner: Runner) -> _Render:
    job = _Render(tree, spec, runner)
    job.run()
    job.duplicates()
    if job.problems:
        raise RenderError(job.problems, cluster=spec.cluster)
    return job


def render(tree: Path, spec: RenderSpec, *, revision: str = "", runner: Runner | None = None) -> DesiredSet:
    """Every object ``spec`` declares in ``tree``.

    Raises ``RenderError`` with all problems found; never returns a partial set. Charts are told
    the cluster's capabilities from the first try (a ``kubeVersion`` constraint fails against
    Helm's default): a cluster that cannot answer raises, so nothing is applied or pruned there.
    """
    job = _job(tree, spec, runner or bounded_runner(spec.memory))
    return DesiredSet(
        spec.cluster,
        revision,
        tuple(DesiredObject(m, p) for m, p in job.found),
        encrypted=tuple(job.sops.sources.values()),
        sealed=spec.sops is SopsMode.SEAL,
        capabilities=job.used_capabilities,
        cluster_neutral=job.used_capabilities is None and not job.used_cluster_name,
    )


def rendered_for(ds: DesiredSet) -> Capabilities | None:
    """What Helm was told when ``ds`` was rendered (``None``: no chart, or Helm's default)."""
    return ds.capabilities


def dump_stream(ds: DesiredSet) -> str:
    """The set as one YAML stream: documents in render order, keys sorted, a source comment each."""
    parts = []
    for obj in ds.objects:
        body = yaml.safe_dump(
            obj.manifest, sort_keys=True, default_flow_style=False, allow_unicode=True, width=1 << 30
        )
        parts.append(f"---\n# Source: {obj.provenance}\n{body}")
    return "".join(parts)


@dataclass
class _Entry:
    """One successful render, shared by every cluster whose spec renders the same."""

    objects: tuple[DesiredObject, ...]
    #: Per-cluster ``DesiredSet`` views of ``objects`` (only the ``cluster`` field differs).
    views: dict[str, DesiredSet] = field(default_factory=dict)
    encrypted: tuple[EncryptedSource, ...] = ()
    sealed: bool = False
    #: What Helm was told about the cluster: the entry holds only while the cluster still says so.
    capabilities: Capabilities | None = None
    #: The objects as clusters prepared them (``RenderCache.prepared``), by what preparing used.
    prepared: OrderedDict[Hashable, list[DesiredObject]] = field(default_factory=OrderedDict)


class RenderCache:
    """Successful renders of a known revision, shared by clusters that render the same thing.

    ``Fleet`` gives one cache to all its reconcilers. The key is the revision and everything of
    the spec that changes the output (paths, vars, exclude, helm, limits) -- not the cluster's
    name, unless the render used it (a Helm release named after the cluster): then the entry is
    the cluster's own. Sharing means 3 clusters serving the same paths render, and hold, one
    tree; each gets its own cheap ``DesiredSet`` over the same objects, which nothing downstream
    writes to (``ClusterReconciler.prepare`` copies metadata, the planner copies bodies;
    ``test_render_shared_between_clusters_is_never_mutated``).

    Bounded for a daemon that sees many commits: at most ``revisions_per_spec`` renders (least
    recently used first out) per spec, and ``max_entries`` in all. Errors are not kept (a
    missing binary may be fixed without a new commit), except a child stopped at
    ``render_memory``: rendering that revision again would only be stopped again. Thread-safe;
    a missing entry is computed once.
    """

    DEFAULT_ENTRIES = 64
    #: Distinct preparations kept per render (clusters that differ in default namespace or scopes).
    PREPARED_PER_RENDER = 8

    def __init__(self, max_entries: int = DEFAULT_ENTRIES, *, revisions_per_spec: int = 2) -> None:
        self.max_entries = max_entries
        self.revisions_per_spec = revisions_per_spec
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._flights: dict[tuple[Any, ...], threading.Lock] = {}
        self.memory_failures = MemoryFailures()

    @staticmethod
    def spec_key(spec: RenderSpec) -> tuple[Any, ...]:
        """What of ``spec`` changes a render's output, the cluster's name aside."""
        return (
            spec.paths,
            None if spec.vars is None else tuple(sorted(spec.vars.items())),
            spec.exclude,
            spec.helm,
            spec.chart_dir,
            spec.chart_built,
            (spec.is_upgrade, spec.tests),
            spec.max_file_bytes,
            spec.max_output_bytes,
            spec.memory,
            # The keys decide whether a render succeeds: a cluster without them never gets
            # another's decrypted render. A fingerprint, so the cache key holds no key.
            spec.keys.fingerprint if spec.keys is not None else None,
            spec.sops,
        )

    @classmethod
    def key(cls, revision: str, spec: RenderSpec, *, own: bool = False) -> tuple[Any, ...]:
        """The entry's key; ``own``: the key of a render that depends on the cluster's name."""
        return (revision, cls.spec_key(spec), spec.cluster if own else None)

    def get(self, revision: str, spec: RenderSpec) -> DesiredSet | None:
        if not revision:
            return None
        with self._lock:
            for key in (self.key(revision, spec), self.key(revision, spec, own=True)):
                entry = self._entries.get(key)
                if (
                    entry is not None
                    and entry.capabilities is not None
                    and not _same_capabilities(entry.capabilities, spec)
                ):
                    continue  # the cluster was upgraded, or a CRD came or went: render again
                if entry is not None:
                    self._entries.move_to_end(key)
                    view = entry.views.get(spec.cluster)
                    if view is None:
                        view = entry.views[spec.cluster] = DesiredSet(
                            spec.cluster,
                            revision,
                            entry.objects,
                            entry.encrypted,
                            entry.sealed,
                            entry.capabilities,
                            cluster_neutral=key[2] is None,  # a shared entry: another cluster's render
                        )
                    return view
            return None

    def put(self, revision: str, spec: RenderSpec, ds: DesiredSet) -> None:
        """Keep ``ds`` (a successful render of ``revision``); shared only if ``render`` proved it may be."""
        if not revision:
            return
        key = self.key(revision, spec, own=not ds.cluster_neutral)
        caps = ds.capabilities
        with self._lock:
            old = self._entries.get(key)
            if old is None or old.capabilities != caps:  # a shared render stays the one all hold
                self._entries[key] = _Entry(ds.objects, {ds.cluster: ds}, ds.encrypted, ds.sealed, caps)
            self._entries.move_to_end(key)
            self._evict(key)

    def _evict(self, newest: tuple[Any, ...]) -> None:
        same_spec = [k for k in self._entries if k[1:] == newest[1:]]
        for k in same_spec[: max(0, len(same_spec) - self.revisions_per_spec)]:
            del self._entries[k]
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def render(
        self, tree: Path, spec: RenderSpec, *, revision: str, runner: Runner | None = None
    ) -> DesiredSet:
        """The cached set for (revision, spec), rendering it on a miss -- once for concurrent askers."""
        found = self.get(revision, spec)
        if found is not None:
            return found
        if not revision:
            return render(tree, spec, revision=revision, runner=runner)
        flight_key = self.key(revision, spec)
        with self._lock:
            flight = self._flights.setdefault(flight_key, threading.Lock())
        with flight:  # others asking for the same render wait for it instead of rendering too
            found = self.get(revision, spec)
            if found is None and (failed := self.memory_failures.get(flight_key)) is not None:
                raise failed
            if found is None:
                try:
                    found = render(tree, spec, revision=revision, runner=runner)
                except RenderError as e:
                    self.memory_failures.remember(flight_key, e)
                    raise
                self.put(revision, spec, found)
        with self._lock:
            if not flight.locked():
                self._flights.pop(flight_key, None)
        return found

    def prepared(
        self, view: DesiredSet, token: Hashable, build: Callable[[], list[DesiredObject]]
    ) -> list[DesiredObject]:
        """``build()``'s objects, shared by every cluster preparing a cached render with an equal ``token``.

        ``token`` must name everything the objects depend on besides the render (the membership
        label, the default namespace, each kind's scope in the cluster): clusters serving the
        same paths then hold one prepared copy instead of one each, and a later pass at the same
        revision gets the very objects its no-op memo holds. A render this cache does not hold
        (no revision, evicted) is prepared afresh; an error raised by ``build`` is not kept.
        """
        with self._lock:
            entry = next((e for e in self._entries.values() if e.objects is view.objects), None)
            found = entry.prepared.get(token) if entry is not None else None
        if found is None:
            made = build()
            if entry is None:
                return made
            with self._lock:
                found = entry.prepared.setdefault(token, made)
                while len(entry.prepared) > self.PREPARED_PER_RENDER:
                    entry.prepared.popitem(last=False)
        return list(found)  # callers may filter their list; the objects are never written to

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        # An empty cache is still a cache: ``render_cache or RenderCache()`` must keep a shared one.
        return True


def _same_capabilities(used: Capabilities, spec: RenderSpec) -> bool:
    """Whether the cluster ``spec`` renders for still says what ``used`` told Helm."""
    if spec.capabilities is not None:
        return spec.capabilities() == used
    return used == Capabilities(spec.kube_version)
