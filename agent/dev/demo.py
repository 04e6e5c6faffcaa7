"""``gitops-agent demo``: the whole job on an embedded default.

Starts two real local clusters, writes the shipped sample repository
(``agent/dev/sample/v1``) as a commit of a local bare Git repository, reconciles
both clusters, commits ``v2`` (image bump, changed ConfigMap, one object added
and one removed from Git), reconciles again and prints what changed where.
``demo-a`` holds two apps (``infra``, then ``web`` with ``depends_on``), each
with its own inventory; ``demo-b`` is one ``[[clusters]]`` entry with paths, as
configs without apps are. Last, a label added with the pinned ``kubectl label``
on an object the agent manages is shown surviving the next reconcile: the
project's headline promise (docs/safety.md rule 4), checked, not just printed.
When kube-scheduler and kwok are installed (``scripts/bootstrap``) the clusters run simulated
Pods, and the demo shows each rollout completing (``kubectl rollout status``).
Also the fixture the end-to-end tests reuse (``commit_directory``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pygit2

from agent.config.load import load_config
from agent.model import ClusterResult, Outcome
from agent.run.fleet import Fleet

if TYPE_CHECKING:
    from agent.dev.chartrepo import ChartRepository

SAMPLE = Path(__file__).resolve().parent / "sample"
CLUSTERS = ("demo-a", "demo-b")
REGIONS = {"demo-a": "eu-west", "demo-b": "us-east"}
#: The cluster that shows apps: ``infra`` (the namespace, the cluster's settings), then ``web``.
APPS_CLUSTER = "demo-a"
#: The label a person adds by hand, and the object it goes on (``web``'s Deployment on ``demo-a``).
HAND_LABEL = ("owner", "alice")
#: The third app on ``demo-a``: a chart from the repository the demo serves, and its constraint.
CHART = ("greeter", "0.x")
#: The releases the demo publishes: the first before the first reconcile, the second before the next.
CHART_RELEASES = ("0.1.0", "0.2.0")
LABELLED = ("deployment", "demo", "web")


def _tree(repo: pygit2.Repository, directory: Path) -> pygit2.Oid:
    builder = repo.TreeBuilder()
    for entry in sorted(directory.iterdir()):
        if entry.is_dir():
            builder.insert(entry.name, _tree(repo, entry), pygit2.enums.FileMode.TREE)
        else:
            builder.insert(entry.name, repo.create_blob(entry.read_bytes()), pygit2.enums.FileMode.BLOB)
    return builder.write()


def commit_directory(repo_dir: Path, source: Path, message: str, *, branch: str = "main") -> str:
    """Commit ``source``'s files as the whole tree of ``branch`` in a bare repo (created if missing)."""
    if (repo_dir / "HEAD").exists():
        repo = pygit2.Repository(str(repo_dir))
    else:
        repo = pygit2.init_repository(str(repo_dir), bare=True, initial_head=branch)
    sig = pygit2.Signature("gitops-agent demo", "demo@gitops-agent.local", int(time.time()), 0)
    ref = f"refs/heads/{branch}"
    parents = [repo.references[ref].target] if ref in repo.references else []
    oid = repo.create_commit(ref, sig, sig, message, _tree(repo, source), parents)
    return str(oid)


def write_config(state: Path, repo: Path, kubeconfigs: dict[str, Path], charts: str = "") -> Path:
    """The demo's config; ``charts``: the URL of the chart repository its third app installs from."""
    lines = [
        "[agent]",
        'name = "gitops-agent"',
        f'cache_dir = "{state / "cache"}"',
        "",
        "[source]",
        f'url = "{repo}"',
        'branch = "main"',
        'poll_interval = "10s"',
        "",
    ]
    for name, kc in kubeconfigs.items():
        lines += [
            "[[clusters]]",
            f'name = "{name}"',
            f'kubeconfig = "{kc}"',
            # demo-b is one entry with paths (its own implicit app, as every config before apps).
            *([] if name == APPS_CLUSTER else [f'paths = ["apps/infra", "apps/web", "clusters/{name}"]']),
            'pass_deadline = "60s"',
            "[clusters.vars]",
            f'CLUSTER = "{name}"',
            f'REGION = "{REGIONS[name]}"',
            "",
        ]
    lines += [
        "[[apps]]",
        'name = "infra"',
        f'cluster = "{APPS_CLUSTER}"',
        f'paths = ["apps/infra", "clusters/{APPS_CLUSTER}"]',
        "",
        "[[apps]]",
        'name = "web"',
        f'cluster = "{APPS_CLUSTER}"',
        'paths = ["apps/web"]',
        'depends_on = ["infra"]',
        "",
    ]
    if charts:
        lines += [
            "[[apps]]",
            f'name = "{CHART[0]}"',
            f'cluster = "{APPS_CLUSTER}"',
            'depends_on = ["infra"]',
            "[apps.helm]",
            f'repository = "{charts}"',
            f'chart = "{CHART[0]}"',
            f'version = "{CHART[1]}"  # a constraint: a newly published 0.x release is a new revision',
            'namespace = "demo"',
            "",
        ]
    path = state / "config.toml"
    path.write_text("\n".join(lines))
    return path


def describe(results: list[ClusterResult]) -> list[str]:
    """One line per object that did something (unchanged ones are counted, not listed)."""
    lines: list[str] = []
    for r in results:
        where = r.cluster if not r.app or r.app == r.cluster else f"{r.cluster} app {r.app}"
        lines.append(
            f"{where}: revision {r.revision[:12]}"
            + (f", chart {r.chart}" if r.chart else "")
            + f", {r.count(Outcome.UNCHANGED)} unchanged"
            + (f", error: {r.error}" if r.error else "")
        )
        for res in r.results:
            if res.outcome is not Outcome.UNCHANGED:
                extra = f" ({res.message})" if res.message else ""
                lines.append(f"  {res.outcome.value:<10} {res.key}{extra}")
    return lines


def _kubectl(kubeconfig: Path, *args: str) -> str:
    """The pinned kubectl (the one ``scripts/bootstrap`` built), as a person at a terminal runs it."""
    from agent.render.binaries import tool

    out = subprocess.run(
        [str(tool("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def _hand_label_value(kubeconfig: Path) -> str | None:
    """The value of ``HAND_LABEL``'s key on the labelled object, read live (``None``: gone)."""
    kind, ns, name = LABELLED
    live = json.loads(_kubectl(kubeconfig, "get", kind, name, "-n", ns, "-o", "json"))
    value = (live["metadata"].get("labels") or {}).get(HAND_LABEL[0])
    return value if isinstance(value, str) else None


def _pods_simulated(echo: Callable[[str], None]) -> bool:
    """Whether the clusters can run simulated Pods (kube-scheduler and kwok installed); says which."""
    from agent.dev.layout import SIMULATION
    from agent.errors import LocalClusterError
    from agent.render.binaries import tool

    try:
        for component in SIMULATION:
            tool(component)
    except LocalClusterError as e:
        echo(f"• Pods are not simulated ({e}): Deployments apply but never become Available")
        return False
    echo("• Pods are simulated: kube-scheduler and kwok play the kubelets of two fake Nodes per cluster")
    return True


def _show_rollouts(kubeconfigs: dict[str, Path], echo: Callable[[str], None]) -> bool:
    """``kubectl rollout status`` of ``web`` on each cluster: the rollout the second commit started."""
    kind, ns, name = LABELLED
    ok = True
    for cluster, kubeconfig in kubeconfigs.items():
        try:
            said = _kubectl(kubeconfig, "rollout", "status", f"{kind}/{name}", "-n", ns, "--timeout=90s")
        except RuntimeError as e:
            echo(f"  {cluster}: {e}")
            ok = False
            continue
        echo(f"  {cluster}: {said.strip().splitlines()[-1]}")
    return ok


def run_demo(state: Path, *, keep: bool = False, echo: Callable[[str], None] = print) -> bool:
    from agent.dev import localcluster
    from agent.dev.chartrepo import ChartRepository
    from agent.render.binaries import bin_dir

    state.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    echo("• installing the pinned control plane (cached after the first run)…")
    bin_dir(install=True)
    pods = _pods_simulated(echo)
    echo("• starting two local clusters: " + ", ".join(CLUSTERS))
    kubeconfigs = {
        name: localcluster.start(name, state / "clusters", pods=pods).kubeconfig for name in CLUSTERS
    }
    try:
        if (state / "charts").exists():
            shutil.rmtree(state / "charts")
        with ChartRepository(state / "charts").serve() as charts:
            ok = _reconciles(state, kubeconfigs, charts, echo, pods=pods)
        echo(f"\ndone in {time.monotonic() - t0:.1f}s; config: {state / 'config.toml'}")
        return ok
    finally:
        if keep:
            echo("clusters left running; kubeconfigs: " + ", ".join(str(p) for p in kubeconfigs.values()))
        else:
            for name in CLUSTERS:
                localcluster.stop(name, state / "clusters")


def _reconciles(
    state: Path,
    kubeconfigs: dict[str, Path],
    charts: ChartRepository,
    echo: Callable[[str], None],
    *,
    pods: bool,
) -> bool:
    """The demo's three reconciles: the first commit, the second with a new chart release, and
    one after a label added by hand. True when all succeeded and the label survived."""
    from agent.reconcile.charts import ChartPolls
    from agent.report.summary import format_summary
    from agent.source.git import GitSource

    repo = state / "fleet.git"
    if repo.exists():
        shutil.rmtree(repo)
    sha1 = commit_directory(repo, SAMPLE / "v1", "Deploy web and cluster-info to every cluster")
    echo(f"• sample repository {repo} at {sha1[:12]}")
    chart, constraint = CHART
    charts.package(SAMPLE / "chart" / chart, CHART_RELEASES[0])
    echo(f"• chart repository {charts.url} serves {chart} {CHART_RELEASES[0]}")
    echo(
        f"• {APPS_CLUSTER} serves three apps, each with its own inventory: infra, then web and {chart} "
        f"(depends_on infra; {chart} is chart {chart!r} at version {constraint!r} from that repository); "
        f"{CLUSTERS[1]} is one entry with paths, as a config without apps"
    )
    cfg = load_config(write_config(state, repo, kubeconfigs, charts.url))
    source, pins = GitSource.from_config(cfg), ChartPolls(cfg)
    fleet = Fleet(cfg)

    def reconcile(title: str) -> list[ClusterResult]:
        results = fleet.reconcile_all(pins.attach(source.name, source.poll()))
        echo(f"\n== {title} ==")
        echo(format_summary(results))
        return results

    try:
        first = reconcile("first reconcile")
        echo("\n".join(describe(first)))
        sha2 = commit_directory(
            repo, SAMPLE / "v2", "Bump nginx, new greeting, add feature-flags, drop legacy-settings"
        )
        charts.package(SAMPLE / "chart" / chart, CHART_RELEASES[1])
        echo(f"\n• new commit {sha2[:12]}: image bump, changed ConfigMap, one object added, one removed")
        echo(
            f"• {chart} {CHART_RELEASES[1]} published: it matches {constraint!r}, "
            f"so it is {chart}'s next revision"
        )
        second = reconcile("second reconcile")
        echo("\n".join(describe(second)))
        rolled_out = True
        if pods:
            echo("\n• the new image rolls out on the simulated Nodes:")
            rolled_out = _show_rollouts(kubeconfigs, echo)
        kind, ns, name = LABELLED
        label = "=".join(HAND_LABEL)
        echo(f"\n• by hand, on {APPS_CLUSTER}: kubectl label {kind} {name} -n {ns} {label}")
        _kubectl(kubeconfigs[APPS_CLUSTER], "label", kind, name, "-n", ns, label)
        third = reconcile("third reconcile (nothing changed in Git; a label was added by hand)")
    finally:
        fleet.close()
    kept = _hand_label_value(kubeconfigs[APPS_CLUSTER]) == HAND_LABEL[1]
    if kept:
        echo(
            f"\n✔ {label} is still on {kind}/{name} in {APPS_CLUSTER} after the reconcile: the agent "
            "applies only the fields Git declares, so what others add survives every reconcile."
        )
    else:
        echo(f"\n✘ {label} is gone from {kind}/{name} in {APPS_CLUSTER}: the reconcile reverted it.")
    return kept and rolled_out and all(r.ok for r in first + second + third)
