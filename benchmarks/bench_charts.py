"""Benchmark 13: charts from a repository -- what a poll of an unchanged repository costs, and a
repository chart's render against ``helm template`` of the same chart.

Called by ``benchmarks.__main__`` (``python -m benchmarks charts``). The charts are the corpus's
(``benchmarks.corpus.HELM``: cert-manager and ingress-nginx, unmodified), packaged with the pinned
``helm package`` into a chart repository served on loopback (``agent.dev.chartrepo``, as the demo
serves one), with the values the corpus test gives them from the apps' Git tree.

Poll: the agent's fetch stage (``source.charts.ChartFetcher``, as the daemon's poll runs it)
fetches both charts once, then polls the unchanged repository ``reps`` times; requests are counted
by the repository's server, not by the agent. Target: at most one request per repository per poll
(``index.yaml``, answered 304 to its ETag), and no archive downloaded again. The same charts
pushed to an OCI registry (CNCF distribution, ``agent.dev.ociregistry``, counted from its access
log): at most one request per chart per poll (its tag list; each chart is a repository there).

Render: the fetched chart rendered as the agent renders a repository chart (``render`` of the app's
spec with ``chart_dir``, its YAML dump excluded, for the pinned Kubernetes release) next to
``helm template`` of the same unpacked chart with the same flags; each warmed up once, then ``reps``
runs alternating which goes first, ratio of the medians, target at most ``TARGET_RATIO``.
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path
from typing import Any

from benchmarks import corpus
from benchmarks import harness as h

#: Render time of the agent / ``helm template``, at most (as the corpus rows).
TARGET_RATIO = 1.2
#: Requests one poll of an unchanged repository may send it, at most.
POLL_TARGET = 1


def poll_row(
    kind: str, charts: int, requests: list[int], downloads: int, *, per_chart: bool
) -> dict[str, Any]:
    """The poll row: requests the repository answered per unchanged poll, archives fetched again.
    An HTTP repository has one index for all its charts; in an OCI registry each chart is a
    repository of its own, with its own tag list (``per_chart``)."""
    limit = POLL_TARGET * (charts if per_chart else 1)
    what = "request per chart (its tag list)" if per_chart else "request (index.yaml)"
    return {
        "metric": f"poll of an unchanged {kind} repository ({charts} charts)",
        "requests_per_poll": requests,
        "downloads": downloads,
        "target": f"<= {POLL_TARGET} {what} per poll, no download",
        "met": max(requests) <= limit and downloads == 0,
    }


def render_row(chart: str, objects: int, agent: list[float], helm: list[float]) -> dict[str, Any]:
    a_med, r_med = statistics.median(agent), statistics.median(helm)
    ratio = h.ratio(a_med, r_med)
    return {
        "chart": chart,
        "objects": objects,
        "agent_seconds": {"min": round(min(agent), 4), "median": round(a_med, 4)},
        "helm_seconds": {"min": round(min(helm), 4), "median": round(r_med, 4)},
        "time_ratio": ratio,
        "min_ratio": h.ratio(min(agent), min(helm)),
        "target": f"time <= {TARGET_RATIO}x helm template",
        "met": ratio is not None and ratio <= TARGET_RATIO,
    }


def format_lines(result: dict[str, Any]) -> list[str]:
    out = []
    for row in result["poll"]:
        status = "target met" if row["met"] else "TARGET MISSED"
        out.append(
            f"{row['metric']}: requests per poll {row['requests_per_poll']}, "
            f"archives downloaded again {row['downloads']}  {status}"
        )
    for row in result["render"]:
        a, r = row["agent_seconds"], row["helm_seconds"]
        status = "target met" if row["met"] else "TARGET MISSED"
        out.append(
            f"render {row['chart']:<14} {row['objects']:4d} objects  agent {a['median']:.3f}s "
            f"(min {a['min']:.3f})  |  time x{row['time_ratio']} (min x{row['min_ratio']}) helm template "
            f"{r['median']:.3f}s (min {r['min']:.3f})  {status}"
        )
    return out


def _oci_poll(root: Path, archives: Path, reps: int) -> dict[str, Any]:
    """The same charts pushed to a distribution registry (`helm push`), fetched once, then polled:
    requests counted from the registry's access log."""
    from agent.config.helm_types import HelmRepository, HelmSettings
    from agent.dev.ociregistry import Registry
    from agent.render.tools import load_chart_yaml
    from agent.source.charts import ChartFetcher

    registry = Registry(root / "oci-registry")
    with registry.serve():
        for archive in sorted(archives.glob("*.tgz")):
            registry.push_archive(archive)
        entry = HelmRepository(url=registry.url, plain_http=True)
        wanted = [HelmSettings(repository=registry.url, chart=app) for app in corpus.HELM]
        fetcher = ChartFetcher((entry,), root / "oci-cache", load_index=load_chart_yaml, timeout=30)
        if errors := [p.error for p in fetcher.pins(wanted) if p.error]:
            raise RuntimeError(f"charts not fetched from the registry: {errors}")
        requests, downloads = [], 0
        for _ in range(reps):
            before = len(registry.requests())
            fetcher.pins(wanted)
            polled = registry.requests()[before:]
            requests.append(len(polled))
            downloads += sum(1 for r in polled if "/blobs/" in r)
    return poll_row("OCI", len(wanted), requests, downloads, per_chart=True)


def run(root: Path, reps: int = 7) -> dict[str, Any]:
    """Publish the corpus charts, fetch them, poll ``reps`` times, then time each chart's render."""
    from agent.config.helm_types import HelmSettings
    from agent.dev.chartrepo import ChartRepository
    from agent.plan.release import pinned_version
    from agent.render.binaries import tool
    from agent.render.renderer import RenderSpec, render
    from agent.render.tools import load_chart_yaml
    from agent.source.charts import ChartFetcher

    h.quiet_logs()
    work = root / "charts-tree"  # the apps' Git tree: their values files
    corpus.write_tree(work, corpus.repository_files())
    repo = ChartRepository(root / "chart-repository")
    for directory, _, _ in corpus.HELM.values():
        version = load_chart_yaml((work / directory / "Chart.yaml").read_text())["version"]
        repo.package(work / directory, str(version))
    out: dict[str, Any] = {"charts": sorted(corpus.HELM), "reps": reps}
    kube_version = pinned_version()
    with repo.serve():
        wanted = {
            app: HelmSettings(
                repository=repo.url, chart=app, release_name=app, namespace=ns, values_files=tuple(values)
            )
            for app, (_, ns, values) in corpus.HELM.items()
        }
        fetcher = ChartFetcher((), root / "cache", load_index=load_chart_yaml, timeout=30)
        pins = {p.chart: p for p in fetcher.pins(wanted.values())}
        if any(p.error for p in pins.values()):
            raise RuntimeError(f"charts not fetched: {[p.error for p in pins.values() if p.error]}")
        requests, downloads = [], 0
        for _ in range(reps):
            before = len(repo.log)
            fetcher.pins(wanted.values())
            polled = repo.log[before:]
            requests.append(len(polled))
            downloads += sum(1 for r in polled if r[1].endswith(".tgz"))
    out["poll"] = [poll_row("HTTP", len(wanted), requests, downloads, per_chart=False)]
    out["poll"].append(_oci_poll(root, repo.root, reps))
    out["render"] = []
    for app, helm in wanted.items():
        pin = pins[app]
        spec = RenderSpec(
            cluster="bench", paths=(), helm=helm, kube_version=kube_version, chart_dir=pin.directory
        )
        desired = render(work, spec)  # warm-up, and the objects counted
        argv = [str(tool("helm")), "template", app, str(pin.directory), "--include-crds", "--skip-tests"]
        argv += ["--namespace", helm.namespace, "--kube-version", kube_version]
        argv += [a for v in helm.values_files for a in ("--values", str(work / v))]
        reference = lambda argv=argv: subprocess.run(argv, capture_output=True, check=True, timeout=300)  # noqa: E731
        reference()
        agent_s, helm_s = h.alternating(lambda spec=spec: render(work, spec), reference, reps)
        out["render"].append(render_row(f"{app} {pin.version}", len(desired.objects), agent_s, helm_s))
    for line in format_lines(out):
        print(line, flush=True)
    return out
