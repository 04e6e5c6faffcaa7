"""Chart dependencies from repositories, as ``helm dependency build`` resolves them, fetched
beside the Git source, never by a render.

Called by ``reconcile.charts.ChartPolls`` after a source's poll, for the chart an app renders
(a directory in its Git checkout, or a chart fetched from a repository) when an entry of its
``dependencies`` is not vendored under ``charts/``. The render has no network, so this stage
builds a copy of the chart in the cache with every dependency under ``charts/``
(``<cache_dir>/charts/built/<key>/<chart>``; the Git checkout is never written) and the render
reads that copy. How each entry is resolved:

* ``Chart.lock`` (``requirements.lock`` for apiVersion v1 charts) is honoured when its digest is
  Helm's digest of the ``dependencies`` list (``lock_digest``): each entry at its locked version.
  A lock that does not match is stale: the constraints are resolved instead (the newest version
  each allows, as Helm's resolver picks it) and the pin says so (``ChartPin.notes``);
* an ``http(s)://`` repository or ``oci://`` registry path, or ``@name``/``alias:name`` naming a
  ``[[helm_repositories]]`` entry's ``name``: fetched through ``ChartFetcher`` (conditional index
  read or tag list, digest checked, bounded unpack, one copy per digest);
* ``file://PATH``: a chart directory that must stay inside the repository (for a fetched chart:
  inside the chart); no repository at all: it must be vendored.

``condition`` and ``tags`` stay Helm's business at render time: every dependency is fetched.
Anything that cannot be resolved is a ``ChartError`` (reason ``chart``): the app fails closed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from agent.config.chart_versions import parse_constraint, parse_version
from agent.config.types import HelmSettings
from agent.errors import ChartError, ChartProblem
from agent.model import ChartPin
from agent.source.charts import MAX_CHART_FILES, ChartFetcher, Polled

__all__ = ["BuiltChart", "Dependency", "DependencyBuilder", "lock_digest", "pin_of", "vendored"]

log = structlog.get_logger("agent.source.chart_deps")

#: Largest Chart.yaml, requirements.yaml or lock file read.
MAX_META_BYTES = 1 << 20
#: Largest chart in Git copied into the cache (its files in all).
MAX_COPY_BYTES = 64 << 20
#: Written last into a built chart's directory: a directory without it is incomplete.
_COMPLETE = ".complete"

YamlLoader = Callable[[str], Any]


@dataclass(frozen=True)
class Dependency:
    """One ``dependencies`` entry, with the fields of Helm's ``chart.Dependency``."""

    name: str
    version: str = ""
    repository: str = ""
    condition: str = ""
    tags: tuple[str, ...] = ()
    enabled: bool = False
    import_values: tuple[Any, ...] = ()
    alias: str = ""

    @classmethod
    def of(cls, raw: Any) -> Dependency:
        """An entry as written; ``ValueError`` when it is not a mapping with a name."""
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise ValueError("every dependencies entry needs a name")
        tags = raw.get("tags") or ()
        values = raw.get("import-values") or ()
        return cls(
            name=raw["name"],
            version=_text(raw.get("version")),
            repository=_text(raw.get("repository")),
            condition=_text(raw.get("condition")),
            tags=tuple(_text(t) for t in tags) if isinstance(tags, list) else (),
            enabled=raw.get("enabled") is True,
            import_values=tuple(values) if isinstance(values, list) else (),
            alias=_text(raw.get("alias")),
        )

    def go_json(self) -> dict[str, Any]:
        """The entry as Go's ``json.Marshal`` writes Helm's struct: its field order, empty
        fields left out where the struct says ``omitempty`` (``repository`` never is)."""
        out: dict[str, Any] = {"name": self.name}
        if self.version:
            out["version"] = self.version
        out["repository"] = self.repository
        if self.condition:
            out["condition"] = self.condition
        if self.tags:
            out["tags"] = list(self.tags)
        if self.enabled:
            out["enabled"] = True
        if self.import_values:
            out["import-values"] = _sorted_maps(list(self.import_values))
        if self.alias:
            out["alias"] = self.alias
        return out


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _go_marshal(value: Any) -> bytes:
    """``json.Marshal``'s bytes: compact, map keys sorted, ``<``, ``>`` and ``&`` escaped as Go does."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False, default=str)
    for c, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(c, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode("utf-8")


def _sorted_maps(value: Any) -> Any:
    """Maps with their keys sorted, as Go marshals a ``map[string]interface{}``."""
    if isinstance(value, dict):
        return {str(k): _sorted_maps(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_sorted_maps(v) for v in value]
    return value


def lock_digest(req: Sequence[Dependency], lock: Sequence[Dependency]) -> str:
    """Helm's ``HashReq``: the digest a ``Chart.lock`` records for the dependencies it locked."""
    data = [[d.go_json() for d in req], [d.go_json() for d in lock]]
    return "sha256:" + hashlib.sha256(_go_marshal(data)).hexdigest()


def _v1_lock_digest(req: Sequence[Dependency]) -> str:
    """Helm's ``HashV2Req``: what a ``requirements.lock`` written by Helm 2 records."""
    data = {"dependencies": [d.go_json() for d in req]}
    return "sha256:" + hashlib.sha256(_go_marshal(data)).hexdigest()


def vendored(chart: Path, name: str) -> bool:
    """``name`` is under ``charts/`` (a directory, or an archive ``helm dependency build`` wrote)."""
    charts = chart / "charts"
    return (charts / name / "Chart.yaml").is_file() or any(charts.glob(f"{name}-*.tgz"))


@dataclass(frozen=True)
class _Meta:
    """What of a chart's own files the build reads."""

    version: str
    api_version: str
    dependencies: tuple[Dependency, ...]
    lock: tuple[Dependency, ...] | None
    lock_digest: str
    lock_name: str


@dataclass(frozen=True)
class _Placed:
    """A dependency resolved to a chart directory, to go under ``charts/``."""

    name: str
    version: str
    digest: str
    source: Path
    #: A ``file://`` chart's files as walked (symlinks inside the repository followed); none
    #: for a fetched chart, whose unpacked directory is linked as it is.
    files: tuple[tuple[str, Path], ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return f"{self.name}@{self.version} (sha256:{self.digest[:12]})"


@dataclass(frozen=True)
class BuiltChart:
    """A copy of a chart with its dependencies under ``charts/``, in the cache."""

    directory: Path
    #: sha256 of what it was built from (the chart's files and each dependency's digest).
    key: str
    version: str
    dependencies: tuple[str, ...]
    notes: tuple[str, ...] = ()


def _load(path: Path, load_yaml: YamlLoader, label: str) -> Any:
    try:
        if path.stat().st_size > MAX_META_BYTES:
            raise ChartError(
                ChartProblem.DEPENDENCY, f"{label}/{path.name} is over {MAX_META_BYTES} bytes", url=""
            )
        return load_yaml(path.read_text("utf-8"))
    except ChartError:
        raise
    except Exception as e:  # OSError, UnicodeDecodeError, the loader's YAML errors
        why = getattr(e, "problem", None) or getattr(e, "strerror", None) or e
        raise ChartError(ChartProblem.DEPENDENCY, f"{label}/{path.name}: {why}", url="") from None


def _dependencies(raw: Any, label: str, file: str) -> tuple[Dependency, ...]:
    entries = raw.get("dependencies") if isinstance(raw, dict) else None
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise ChartError(ChartProblem.DEPENDENCY, f"{label}/{file}: dependencies is not a list", url="")
    try:
        return tuple(Dependency.of(e) for e in entries)
    except ValueError as e:
        raise ChartError(ChartProblem.DEPENDENCY, f"{label}/{file}: {e}", url="") from None


def _read_meta(chart: Path, load_yaml: YamlLoader, *, label: str) -> _Meta:
    meta = _load(chart / "Chart.yaml", load_yaml, label)
    if not isinstance(meta, dict):
        raise ChartError(ChartProblem.DEPENDENCY, f"{label}/Chart.yaml is not a mapping", url="")
    api = _text(meta.get("apiVersion")) or "v1"
    deps = _dependencies(meta, label, "Chart.yaml")
    lock_name = "Chart.lock"
    if api == "v1":
        lock_name = "requirements.lock"
        if (chart / "requirements.yaml").is_file():
            deps = deps + _dependencies(
                _load(chart / "requirements.yaml", load_yaml, label), label, "requirements.yaml"
            )
    lock: tuple[Dependency, ...] | None = None
    digest = ""
    if deps and (chart / lock_name).is_file():
        raw = _load(chart / lock_name, load_yaml, label)
        if isinstance(raw, dict):
            try:
                lock = _dependencies(raw, label, lock_name)
            except ChartError:
                lock = None  # a lock that does not read is stale: the constraints decide
            digest = _text(raw.get("digest"))
    return _Meta(_text(meta.get("version")), api, deps, lock, digest, lock_name)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _files(directory: Path, root: Path, label: str) -> Iterator[tuple[str, Path]]:
    """``(relative path, real file)`` of every file under ``directory``, in a stable order;
    symlinks followed only inside ``root`` (the repository), as the render allows them; a
    directory linking back to one it is inside is not walked again."""

    def walk(d: Path, prefix: str, above: frozenset[Path]) -> Iterator[tuple[str, Path]]:
        real = d.resolve()
        if real in above:
            return
        for name in sorted(os.listdir(d)):
            entry = d / name
            rel = f"{prefix}{name}"
            target = entry.resolve()
            if entry.is_symlink() and (not _inside(target, root) or not target.exists()):
                why = "points outside the repository" if target.exists() else "is dangling"
                raise ChartError(ChartProblem.DEPENDENCY, f"{label}/{rel}: symlink {why}", url="")
            if target.is_dir():
                yield from walk(entry, rel + "/", above | {real})
            elif target.is_file():
                yield rel, target

    yield from walk(directory, "", frozenset())


def _digest_files(files: Sequence[tuple[str, Path]], label: str) -> str:
    """sha256 over the files' names and contents, within ``MAX_CHART_FILES`` and ``MAX_COPY_BYTES``."""
    if len(files) > MAX_CHART_FILES:
        raise ChartError(ChartProblem.DEPENDENCY, f"{label}: more than {MAX_CHART_FILES} files", url="")
    h = hashlib.sha256()
    total = 0
    for rel, real in files:
        data = real.read_bytes()
        total += len(data)
        if total > MAX_COPY_BYTES:
            raise ChartError(ChartProblem.DEPENDENCY, f"{label}: more than {MAX_COPY_BYTES} bytes", url="")
        h.update(f"{len(rel)}:{rel}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def _link_or_copy(src: str, dst: str) -> None:
    # The cache's unpacked charts are never written to: a hard link shares their bytes.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


class DependencyBuilder:
    """Builds charts whose dependencies are not all vendored, into ``<cache>/charts/built/``."""

    def __init__(self, fetcher: ChartFetcher, *, load_yaml: YamlLoader) -> None:
        self.fetcher = fetcher
        self.load_yaml = load_yaml
        self.root = fetcher.root / "built"

    def missing(self, chart: Path) -> bool:
        """Whether ``chart`` names a dependency not vendored under ``charts/`` (``False`` when its
        Chart.yaml does not read: the render says what is wrong with it, file and line)."""
        try:
            meta = _read_meta(chart, self.load_yaml, label=chart.name)
        except ChartError:
            return False
        return any(not vendored(chart, d.name) for d in meta.dependencies)

    def build(
        self, chart: Path, *, root: Path, label: str, polled: Polled | None = None
    ) -> BuiltChart | None:
        """``chart`` (a directory inside ``root``) with its dependencies under ``charts/``, or
        ``None`` when every one is vendored already. ``ChartError`` naming ``label``. ``polled``:
        the indexes this poll read already (one request per repository, however many charts)."""
        polled = {} if polled is None else polled
        meta = _read_meta(chart, self.load_yaml, label=label)
        missing = [i for i, d in enumerate(meta.dependencies) if not vendored(chart, d.name)]
        if not missing:
            return None
        wanted, notes = self._versions(meta, label)
        placed = [self._resolve(meta.dependencies[i], wanted[i], chart, root, label, polled) for i in missing]
        files = list(_files(chart, root.resolve(), label))
        h = hashlib.sha256(_digest_files(files, label).encode())
        for p in placed:
            h.update(f"\n{p.name}@{p.version}:{p.digest}".encode())
        key = h.hexdigest()
        built = BuiltChart(
            self.root / key / chart.name, key, meta.version, tuple(str(p) for p in placed), notes
        )
        if (self.root / key / _COMPLETE).is_file():
            os.utime(self.root / key / _COMPLETE)  # recently used: kept by the cache's collection
            return built
        self._write(files, placed, key, chart.name)
        log.info("chart dependencies built", chart=label, dependencies=built.dependencies, key=key[:12])
        return built

    def _versions(self, meta: _Meta, label: str) -> tuple[list[str], tuple[str, ...]]:
        """The version (or constraint) each dependency is fetched at: the lock's when it matches."""
        constraints = [d.version for d in meta.dependencies]
        if meta.lock is None:
            return constraints, ()
        req = [d if d.repository.startswith("file://") else self._named(d, label) for d in meta.dependencies]
        matches = len(meta.lock) == len(req) and meta.lock_digest in (
            lock_digest(req, meta.lock),
            _v1_lock_digest(meta.dependencies) if meta.api_version == "v1" else "",
        )
        if matches and all(lk.name == d.name for lk, d in zip(meta.lock, meta.dependencies, strict=True)):
            return [lk.version for lk in meta.lock], ()
        note = (
            f"{label}/{meta.lock_name} is stale (its digest is not that of the dependencies of "
            "Chart.yaml): resolved their version constraints instead (run `helm dependency update`)"
        )
        log.warning("chart lock is stale", chart=label, lock=meta.lock_name)
        return constraints, (note,)

    def _named(self, dep: Dependency, label: str) -> Dependency:
        """``dep`` with ``@name``/``alias:name`` replaced by that repository's URL, as Helm does."""
        repo = dep.repository
        for prefix in ("@", "alias:"):
            if repo.startswith(prefix):
                name = repo.removeprefix(prefix)
                entry = next((e for e in self.fetcher.repositories if e.name == name), None)
                if entry is None:
                    raise ChartError(
                        ChartProblem.DEPENDENCY,
                        f"dependency {dep.name!r} of {label}: no [[helm_repositories]] entry named {name!r}",
                        url="",
                    )
                return replace(dep, repository=entry.url)
        return dep

    def _resolve(
        self, dep: Dependency, version: str, chart: Path, root: Path, label: str, polled: Polled
    ) -> _Placed:
        what = f"dependency {dep.name!r} of {label}"
        if dep.repository.startswith("file://"):
            return self._local(dep, version, chart, root, what)
        if not dep.repository:
            raise ChartError(
                ChartProblem.DEPENDENCY, f"{what} names no repository and is not under charts/", url=""
            )
        url = self._named(dep, label).repository.rstrip("/")
        if not url.startswith(("http://", "https://", "oci://")):
            raise ChartError(
                ChartProblem.DEPENDENCY,
                f"{what}: repository {dep.repository!r} is not http(s)://, oci://, file:// or a name",
                url="",
            )
        try:
            pin = self.fetcher.fetch(HelmSettings(chart=dep.name, repository=url, version=version), polled)
        except ChartError as e:
            raise ChartError(e.problem, f"{what}: {e.detail}", url=e.url, constraint=e.constraint) from None
        return _Placed(dep.name, pin.version, pin.digest, pin.directory)

    def _local(self, dep: Dependency, version: str, chart: Path, root: Path, what: str) -> _Placed:
        path = dep.repository.removeprefix("file://")
        target = (chart / path).resolve() if not path.startswith("/") else Path(path).resolve()
        if not _inside(target, root.resolve()):
            raise ChartError(
                ChartProblem.DEPENDENCY, f"{what}: {dep.repository} leaves the repository", url=""
            )
        if not (target / "Chart.yaml").is_file():
            raise ChartError(ChartProblem.DEPENDENCY, f"{what}: {dep.repository} holds no Chart.yaml", url="")
        raw = _load(target / "Chart.yaml", self.load_yaml, what)
        found = _text(raw.get("version")) if isinstance(raw, dict) else ""
        try:
            allowed = not version or parse_constraint(version).allows(parse_version(found))
        except ValueError:
            allowed = False
        if not allowed:
            raise ChartError(
                ChartProblem.DEPENDENCY,
                f"{what}: {dep.repository} is version {found!r}, not {version!r}",
                url="",
            )
        files = tuple(_files(target, root.resolve(), what))
        return _Placed(dep.name, found, _digest_files(files, what), target, files)

    def _write(
        self, files: Sequence[tuple[str, Path]], placed: Sequence[_Placed], key: str, name: str
    ) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        try:
            for rel, real in files:
                (work / name / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(real, work / name / rel)
            taken: set[str] = set()
            for p in placed:
                sub = p.name if p.name not in taken else f"{p.name}-{p.version}"
                taken.add(sub)
                if not p.files:
                    shutil.copytree(p.source, work / name / "charts" / sub, copy_function=_link_or_copy)
                for rel, real in p.files:
                    (work / name / "charts" / sub / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(real, work / name / "charts" / sub / rel)
            (work / _COMPLETE).write_text(f"{name}\n")
            target = self.root / key
            try:
                work.rename(target)
            except OSError:
                if not (target / _COMPLETE).is_file():  # not another build's complete copy
                    shutil.rmtree(target, ignore_errors=True)
                    work.rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def pin_of(built: BuiltChart, *, repository: str, chart: str, constraint: str, digest: str = "") -> ChartPin:
    """The pin an app renders: ``built``'s directory; the archive's ``digest`` for a fetched chart."""
    return ChartPin(
        repository,
        chart,
        constraint,
        built.version or "0.0.0",
        digest or built.key,
        built.directory,
        dependencies=built.dependencies,
        notes=built.notes,
    )
