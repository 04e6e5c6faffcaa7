"""A Helm chart repository on loopback (``agent.dev.chartrepo``: the pinned `helm package` and
`helm repo index`, served with ETags, optionally with basic auth or TLS from a local CA, every
request logged), holding charts whose one ConfigMap says their version."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.dev.chartrepo import ChartRepository


def make_chart(src: Path, name: str, version: str, *, data: str = "hello") -> Path:
    """A chart directory whose one ConfigMap says its version and ``data``."""
    d = src / f"{name}-{version}" / name
    (d / "templates").mkdir(parents=True, exist_ok=True)
    (d / "Chart.yaml").write_text(f"apiVersion: v2\nname: {name}\nversion: {version}\n")
    (d / "values.yaml").write_text(f"greeting: {data}\nreplicas: 1\n")
    (d / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Chart.Name }}\n"
        "data:\n  version: {{ .Chart.Version | quote }}\n  greeting: {{ .Values.greeting | quote }}\n"
        "  replicas: {{ .Values.replicas | quote }}\n"
    )
    return d


class ChartRepo(ChartRepository):
    """The served repository of ``agent.dev.chartrepo``, with charts made by ``make_chart``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.src = root.parent / f"{root.name}-src"
        self.username = ""
        self.password = ""

    def publish(self, name: str, version: str, *, data: str = "hello", sign: tuple[str, ...] = ()) -> Path:
        """Package a chart version into the repository and index it again; ``sign``: the
        arguments of `helm package --sign` (``tests.chartsign.SigningKey.args``)."""
        chart = make_chart(self.src, name, version, data=data)
        if not sign:
            return self.package(chart, version)
        self.helm("package", str(chart), "--destination", str(self.root), "--version", version, *sign)
        self.index()
        return self.root / f"{name}-{version}.tgz"

    def digest(self, archive: Path) -> str:
        return hashlib.sha256(archive.read_bytes()).hexdigest()

    def requests(self, path_end: str) -> list[tuple[str, str, int, bool]]:
        return [r for r in self.log if r[1].endswith(path_end)]

    @contextmanager
    def serve(
        self, *, username: str = "", password: str = "", cert: tuple[Path, Path] | None = None
    ) -> Iterator[ChartRepo]:
        self.username, self.password = username, password
        with super().serve(username=username, password=password, cert=cert):
            yield self
