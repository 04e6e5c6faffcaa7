"""Shared machinery of the benchmarks: clusters, server-side request counts, the agent and kubectl.

Used by every ``benchmarks.bench_*`` module. Nothing here measures by itself.

Request counts come from the API server, never from the agent: ``apiserver_request_total`` is
scraped from ``/metrics`` with the admin client certificate before and after a measured step and
the difference is split by verb. Two sources of noise are removed, and the rest is reported:

* the kube-controller-manager is paused (SIGSTOP) for the duration of a counted step, so its
  discovery refreshes and reactions to our writes are not counted against the tool measured;
* rows for ``leases`` (the API server's own identity heartbeat every 10 s) and the health
  endpoints are dropped: neither the agent nor kubectl touches them in these benchmarks.

An idle window of 10 s with both measures in place counts 0 requests (checked by ``noise``).

CPU seconds (user + system) are read around the step itself, inside the scrapes (rendering
``/metrics`` costs the API server CPU too): the API servers' and etcds' from ``/proc/PID/stat``,
the client's from ``getrusage`` — ``RUSAGE_SELF`` for the in-process agent (the benchmark's other
threads are idle meanwhile), ``RUSAGE_CHILDREN`` for kubectl (its processes are waited for inside
the step), or ``/proc/PID/stat`` of a long-lived client process (Flux's engine, ``FluxEngine``). On a
machine where server and client share the cores, they bound the wall time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from agent.dev import localcluster
from agent.dev.process import LocalCluster
from agent.render import binaries as tools
from benchmarks.markdown import spread

_ROW = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_IGNORED_RESOURCES = {"leases"}
_IGNORED_PATHS = {"/healthz", "/readyz", "/livez", "/metrics"}
REPO_ROOT = Path(__file__).resolve().parent.parent


# -- clusters ---------------------------------------------------------------------------------


class ClusterSet:
    """Local control planes started for one benchmark; ``close`` (always called) deletes them."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.clusters: dict[str, LocalCluster] = {}

    def start(self, *names: str, pods: bool | None = None) -> list[LocalCluster]:
        """Start ``names`` (``pods``: with simulated Pods, ``localcluster.start``)."""
        self.clusters.update(dict.fromkeys(names))  # type: ignore[arg-type]  # recorded before start
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            started = list(pool.map(lambda n: localcluster.start(n, self.state_dir, pods=pods), names))
        for c in started:
            self.clusters[c.name] = c
        return started

    def delete(self, name: str) -> None:
        with contextlib.suppress(Exception):
            localcluster.thaw(name, self.state_dir)
        localcluster.delete(name, self.state_dir)
        self.clusters.pop(name, None)

    def close(self) -> None:
        for name in list(self.clusters):
            with contextlib.suppress(Exception):
                self.delete(name)

    def __enter__(self) -> ClusterSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def controllers_paused(*clusters: LocalCluster) -> Iterator[None]:
    """SIGSTOP the controller managers while requests are counted (their traffic is not ours), and the
    kube-scheduler and kwok of a cluster that runs simulated Pods (their writes are not ours either)."""
    pids = [
        pid
        for c in clusters
        for pid in (c.pids.controller_manager, c.pids.scheduler, c.pids.kwok)
        if pid is not None
    ]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        for c in clusters:
            _settle(c)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _settle(cluster: LocalCluster, *, quiet: float = 0.2, timeout: float = 15.0) -> None:
    """Wait until requests a paused controller sent before SIGSTOP have been served.

    The server counts a request when it ends, so a namespace deletion already under way (its
    DELETE collection calls) would otherwise land in the next count. Settled is two scrapes
    ``quiet`` seconds apart that differ by nothing (no counter moves, so there is no event to wait
    on; a request in flight for longer than that is not one a paused controller sends).
    """
    deadline = time.monotonic() + timeout
    before = scrape(cluster)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        after = scrape(cluster)
        if not difference(before, after).total:
            return
        before = after
    raise RuntimeError(f"{cluster.name}: the API server still served requests {timeout:.0f} s after pausing")


# -- request counts at the server --------------------------------------------------------------


def scrape(cluster: LocalCluster) -> dict[tuple[tuple[str, str], ...], float]:
    code, body = localcluster.api_request(cluster, "GET", "/metrics", timeout=30.0)
    if code != 200 or not isinstance(body, str):
        raise RuntimeError(f"{cluster.name}: GET /metrics answered {code}")
    rows: dict[tuple[tuple[str, str], ...], float] = {}
    for line in body.splitlines():
        m = _ROW.match(line)
        if m:
            rows[tuple(sorted(_LABEL.findall(m.group(1))))] = float(m.group(2))
    return rows


@dataclass
class Requests:
    """Requests the server counted during one step, by verb and by "VERB resource"."""

    by_verb: Counter[str] = field(default_factory=Counter)
    by_resource: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_verb.values())

    def __add__(self, other: Requests) -> Requests:
        return Requests(self.by_verb + other.by_verb, self.by_resource + other.by_resource)

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "by_verb": dict(sorted(self.by_verb.items()))}

    def short(self) -> str:
        return " ".join(f"{v}={n}" for v, n in sorted(self.by_verb.items(), key=lambda x: -x[1]))


def difference(before: dict[Any, float], after: dict[Any, float]) -> Requests:
    out = Requests()
    for key, value in after.items():
        n = round(value - before.get(key, 0.0))
        if n <= 0:
            continue
        labels = dict(key)
        if labels.get("resource") in _IGNORED_RESOURCES or labels.get("subresource") in _IGNORED_PATHS:
            continue
        verb = labels.get("verb", "?")
        if labels.get("dry_run"):
            verb += "(dry-run)"
        out.by_verb[verb] += n
        what = labels.get("resource") or labels.get("subresource") or "?"
        out.by_resource[f"{verb} {what}"] += n
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process, all its threads (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)


def cores() -> int:
    """CPUs this process may run on (what ``nproc`` prints)."""
    return len(os.sched_getaffinity(0))


#: Whose CPU is the client's: this process, its waited-for children, or a long-lived process (its PID).
Client = Literal["self", "children"] | int


def _client_cpu(who: Client) -> float:
    if isinstance(who, int):
        return process_cpu(who)
    u = resource.getrusage(resource.RUSAGE_SELF if who == "self" else resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


@dataclass
class Measured:
    seconds: float
    requests: Requests
    value: Any = None
    #: CPU seconds during the step: ``apiserver``, ``etcd``, ``server`` (their sum) and ``client``.
    cpu: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "requests": self.requests.to_json(),
            "cpu": {k: round(v, 2) for k, v in self.cpu.items()},
        }


def _cpu_snapshot(clusters: list[LocalCluster], client: Client) -> tuple[float, float, float]:
    return (
        sum(process_cpu(c.pids.apiserver) for c in clusters),
        sum(process_cpu(c.pids.etcd) for c in clusters),
        _client_cpu(client),
    )


def measure(clusters: list[LocalCluster], step: Callable[[], Any], *, client: Client = "self") -> Measured:
    """Run ``step`` with the controller managers paused: wall time, requests and CPU at the servers.

    ``client`` names whose CPU is the client's: ``"self"`` (the agent, in this process),
    ``"children"`` (kubectl, subprocesses waited for during the step) or a PID (Flux's engine).
    """
    with controllers_paused(*clusters):
        before = [scrape(c) for c in clusters]
        cpu0 = _cpu_snapshot(clusters, client)
        t0 = time.perf_counter()
        value = step()
        seconds = time.perf_counter() - t0
        cpu1 = _cpu_snapshot(clusters, client)
        after = [scrape(c) for c in clusters]
    total = Requests()
    for b, a in zip(before, after, strict=True):
        total = total + difference(b, a)
    api, etcd, own = (y - x for x, y in zip(cpu0, cpu1, strict=True))
    cpu = {"apiserver": api, "etcd": etcd, "server": api + etcd, "client": own}
    return Measured(seconds, total, value, cpu)


def cpu_bound(m: Measured, ncpu: int) -> float:
    """The least wall time the step's CPU allows on ``ncpu`` cores: (server + client) / cores."""
    return (m.cpu["server"] + m.cpu["client"]) / ncpu


def noise(cluster: LocalCluster, seconds: float = 5.0) -> Measured:
    """Nobody does anything: requests (should be 0) and the servers' background CPU."""
    return measure([cluster], lambda: time.sleep(seconds))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def timed(step: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def alternating(
    agent: Callable[[], object], reference: Callable[[], object], reps: int
) -> tuple[list[float], list[float]]:
    """``reps`` timings of each side, the two taking turns at going first (neither always runs on
    the caches the other warmed)."""
    agent_s: list[float] = []
    reference_s: list[float] = []
    for r in range(reps):
        if r % 2:
            reference_s.append(timed(reference))
            agent_s.append(timed(agent))
        else:
            agent_s.append(timed(agent))
            reference_s.append(timed(reference))
    return agent_s, reference_s


# -- kubectl ----------------------------------------------------------------------------------


def kubectl(cluster: LocalCluster, *args: str, ok: tuple[int, ...] = (0,), timeout: float = 900.0) -> str:
    """The pinned kubectl (agent.render.binaries) with a discovery cache of this cluster's own."""
    argv = [
        str(tools.tool("kubectl")),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--cache-dir={cluster.directory / '.kube-cache'}",
        *args,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode not in ok:
        raise RuntimeError(f"kubectl {' '.join(args[:3])} exited {out.returncode}: {out.stderr[-2000:]}")
    return out.stdout


# -- Flux's engine ------------------------------------------------------------------------------

#: The Flux engine's name in tables and JSON (``benchmarks/fluxssa``: ``fluxcd/pkg/ssa``, as
#: kustomize-controller reconciles).
FLUX_NAME = "Flux engine (fluxcd/pkg/ssa)"


FLUX_GO_MOD = Path(__file__).resolve().parent / "fluxssa" / "go.mod"


def flux_version() -> str:
    """The pinned engine, as its go.mod requires it: ``fluxcd/pkg/ssa v0.78.0``."""
    m = re.search(r"^\s*github\.com/(fluxcd/pkg/ssa) (v\S+)", FLUX_GO_MOD.read_text(), re.MULTILINE)
    if m is None:
        raise RuntimeError(f"{FLUX_GO_MOD}: no github.com/fluxcd/pkg/ssa requirement")
    return f"{m.group(1)} {m.group(2)}"


def flux_binary() -> Path:
    """The built ``benchmarks/fluxssa``; its absence fails the benchmark, naming the fix."""
    found = tools.go_tool("fluxssa")
    if found is None:
        raise RuntimeError(
            "benchmarks/fluxssa is not built: run scripts/install-go-tools fluxssa "
            "(scripts/bootstrap builds it)"
        )
    return found


class FluxEngine:
    """``fluxssa serve`` for one cluster: Flux's apply engine kept running between reconciles, as
    kustomize-controller is (REST mappings and connections warm), its inventory in a file.

    One request line, one JSON answer line; an ``{"error": ...}`` answer or a dead process raises.
    """

    def __init__(self, cluster: LocalCluster, inventory: Path) -> None:
        self.cluster = cluster
        self.log = cluster.directory / "fluxssa.log"
        argv = [
            str(flux_binary()),
            "serve",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--inventory={inventory}",
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def warm(self, files: Path) -> None:
        """Resolve the REST mappings of the kinds the server already serves (sends no request else)."""
        self._ask(f"warm {files}")

    def apply(self, files: Path) -> dict[str, Any]:
        """One reconcile of ``files``: ``{"created", "configured", "unchanged", "deleted", ...}``."""
        return self._ask(f"apply {files}")

    def _ask(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"fluxssa on {self.cluster.name} exited {self.process.wait()}: {tail}")
        out: dict[str, Any] = json.loads(answer)
        if "error" in out:
            raise RuntimeError(f"fluxssa on {self.cluster.name}: {out['error']}")
        return out

    def close(self) -> None:
        end_process(self.process, timeout=10)


# -- the agent ----------------------------------------------------------------------------------


def quiet_logs() -> None:
    """The agent logs every pass at info; benchmarks want warnings only (and no time spent on logs)."""
    from agent import logs

    logs.configure("console", "warning")


def write_config(
    path: Path,
    repo: Path,
    cache_dir: Path,
    clusters: list[LocalCluster],
    *,
    agent: str = "bench",
    workload_path: str = "workload",
    defaults: str = "",
    concurrency: int | None = None,
    apps: Sequence[str] = (),
) -> Path:
    """The agent's config file; ``concurrency`` (None: the agent's default) goes into each cluster.

    With ``apps``, each cluster serves one `[[apps]]` app per name, rendering
    ``<workload_path>/<name>``, and has no paths (no app of its own).
    """
    lines = [
        "[agent]",
        f'name = "{agent}"',
        f'cache_dir = "{cache_dir}"',
        'listen = ""',
        'log_level = "warning"',
        "",
        "[source]",
        f'url = "{repo}"',
        "",
        "[defaults]",
        'pass_deadline = "600s"',
        # The brake is about deleting; these benchmarks never prune, so it stays at its default.
        defaults,
        "",
    ]
    for c in clusters:
        lines += [
            "[[clusters]]",
            f'name = "{c.name}"',
            f'kubeconfig = "{c.kubeconfig}"',
            *([] if apps else [f'paths = ["{workload_path}"]']),
            *([f"concurrency = {concurrency}"] if concurrency is not None else []),
            "",
        ]
        for app in apps:
            lines += [
                "[[apps]]",
                f'name = "{app}"',
                f'cluster = "{c.name}"',
                f'path = "{workload_path}/{app}"',
                "",
            ]
    path.write_text("\n".join(lines))
    return path


def commit_workload(repo: Path, items_dir: Path, message: str) -> str:
    """Commit ``items_dir`` as ``workload/`` (the whole tree) of the benchmark repository."""
    from agent.dev.demo import commit_directory

    with tempfile.TemporaryDirectory(prefix="bench-tree-") as tmp:
        tree = Path(tmp) / "workload"
        shutil.copytree(items_dir, tree)
        return commit_directory(repo, Path(tmp), message)


class InProcessAgent:
    """``gitops-agent run`` without the daemon: GitSource + Fleet, warm between passes (as deployed)."""

    def __init__(self, config_file: Path) -> None:
        from agent.config.load import load_config
        from agent.run.fleet import Fleet
        from agent.source.git import GitSource

        self.config = load_config(config_file)
        self.source = GitSource(self.config.source, Path(self.config.agent.cache_dir) / "git")
        self.fleet = Fleet(self.config)

    def reconcile(self, *, dry_run: bool = False, only: list[str] | None = None) -> list[Any]:
        revision = self.source.poll()
        results = self.fleet.reconcile_all(revision, dry_run=dry_run, only=only)
        for r in results:
            if not r.ok:
                raise RuntimeError(f"agent pass on {r.cluster} failed: {r.error or r.prune_refused}")
        return results

    def close(self) -> None:
        self.fleet.close()


def outcome_counts(results: list[Any]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for r in results:
        for x in r.results:
            counts[x.outcome.value] += 1
    return dict(counts)


def format_row(size: int | str, row: dict[str, Any]) -> str:
    """One line of the console table: agent, kubectl and Flux's engine side by side, ratios first,
    CPU as server+client; a tool without a figure for the step is left out.

    The initial apply's row holds medians over its repetitions, and says so with its range.
    """
    a, p, f = row["agent"], row.get("peer"), row.get("flux")
    status = "" if "met" not in row else ("  target met" if row["met"] else "  TARGET MISSED")
    if "throughput_ratio_range" in row:  # the initial apply: medians over repetitions
        status += f"  throughput {spread(row, 'throughput_ratio', 'x')}"
    line = (
        f"{row['metric']:<24} {size!s:>6}  agent {a['seconds']:8.3f}s "
        f"{a['requests']['total']:6d} req {_cpu(a)}"
    )
    if p is not None:
        line += (
            f"  |  time x{row['time_ratio']!s:<6} {row['peer_name']:<28} {p['seconds']:8.3f}s "
            f"{p['requests']['total']:6d} req {_cpu(p)}{status}"
        )
    if f is not None:
        line += (
            f"  |  time x{row['flux_time_ratio']!s:<6} Flux engine {f['seconds']:8.3f}s "
            f"{f['requests']['total']:6d} req {_cpu(f)}"
        )
        if "flux_throughput_ratio_range" in row:
            line += f"  throughput {spread(row, 'flux_throughput_ratio', 'x')}"
        if "flux_met" in row:
            line += "  Flux target met" if row["flux_met"] else "  FLUX TARGET MISSED"
    return line


def _cpu(side: dict[str, Any]) -> str:
    c = side.get("cpu")
    return f"cpu {c['server']:.2f}+{c['client']:.2f}s" if c else ""


# -- the agent in a process of its own ------------------------------------------------------


def serve_passes(config: Path, commands: IO[str], replies: IO[str]) -> None:
    """The child of ``AgentProcess``: each ``pass`` line, one pass of every cluster at the revision
    polled once at the start, answered with a JSON line (wall time, outcomes, failures, results)."""
    from agent.run import heap

    heap.tune()  # as ``gitops-agent run`` does
    heap.tune_collector()
    quiet_logs()
    agent = InProcessAgent(config)
    revision = agent.source.poll()
    try:
        for line in commands:
            if line.strip() != "pass":
                break
            t0 = time.perf_counter()
            results = agent.fleet.reconcile_all(revision)
            seconds = time.perf_counter() - t0
            failed = sorted(f"{r.cluster}/{r.app}: {r.error}"[:200] for r in results if not r.ok)
            reply = {
                "seconds": seconds,
                "outcomes": outcome_counts(results),
                "failed": failed,
                "results": len(results),
            }
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    finally:
        agent.close()


class AgentProcess:
    """The agent in a child process of its own (``serve_passes``), driven one pass at a time, so
    that its CPU, memory and sockets can be read from ``/proc`` without the benchmark's own."""

    def __init__(self, config: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.harness", "--child", str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )
        self.pid = self.proc.pid

    def one_pass(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("pass\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the agent under measurement exited {self.proc.wait()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def measured_pass(self, clusters: list[LocalCluster]) -> Measured:
        """One pass under ``measure``: its value is the child's reply; ``client`` CPU is the child's,
        and ``rss_mb``/``peak_rss_mb`` of the child are added to the value after the pass."""
        cpu0 = process_cpu(self.pid)
        m = measure(clusters, self.one_pass)
        m.cpu["client"] = process_cpu(self.pid) - cpu0
        m.value["rss_mb"], m.value["peak_rss_mb"] = memory_mb(self.pid)
        return m

    def close(self) -> None:
        """End the child (its stdin closed: it stops after the pass in hand) and its pipes."""
        end_process(self.proc, timeout=60)


def end_process(proc: subprocess.Popen[Any], *, timeout: float, terminate: bool = False) -> None:
    """Ask a child to end (SIGTERM with ``terminate``, else end of its stdin), kill it if it has
    not after ``timeout`` seconds, and close its pipes."""
    if terminate:
        proc.terminate()
    elif proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    found: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(rest.split()[0]) / 1024
    return found["VmRSS"], found["VmHWM"]


def connections(pid: int, ports: set[int]) -> int:
    """Established TCP connections of ``pid`` to any of ``ports`` (the API servers)."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    remote_port = int(cols[2].rsplit(":", 1)[1], 16)
                    if cols[3] == "01" and cols[9] in inodes and remote_port in ports:
                        count += 1
        except FileNotFoundError:
            continue
    return count


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        serve_passes(Path(sys.argv[2]), sys.stdin, sys.stdout)
    else:
        sys.exit("usage: python -m benchmarks.harness --child CONFIG (AgentProcess starts it)")
