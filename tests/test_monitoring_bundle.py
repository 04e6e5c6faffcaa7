"""manifests/monitoring: its alerts and dashboard against a real agent's /metrics, its rules under
promtool, and the bundle applied to a real cluster with the prometheus-operator CRDs of
kube-prometheus (../shared/corpus, unmodified).

The running agent is made to show what the alerts are about: one app that does not render, one
whose prune the mass-deletion brake holds and whose drift is reported (``drift = "report"``), a
notification sink that fails, a Lease held. Its
scrape is the ground truth: every metric name the rules and the dashboard use must be on it, and
promtool's input series are its samples, with the scrape's values (promtool's time 0 is the
moment of the scrape).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.render.binaries import go_tool, tool
from agent.run.lease_settings import LeaseSettings
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import configmaps, http, start_daemon, status, stop_daemon, tune, url
from tests.sinkkit import Sink, add_lines
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "manifests" / "monitoring"
CORPUS_CRDS = ROOT.parent / "shared" / "corpus" / "kube-prometheus" / "setup"
BROKEN = "apiVersion: v1\nkind: ConfigMap\nmetadata: [unclosed\n"
METRIC = re.compile(r"\bgitops_agent_[a-z_]+\b")


@dataclass(frozen=True)
class Scrape:
    text: str
    at: float  # unix time of the scrape


def _rule_groups() -> list[dict[str, Any]]:
    doc = yaml.safe_load((BUNDLE / "prometheusrule.yaml").read_text())
    assert doc["kind"] == "PrometheusRule"
    return list(doc["spec"]["groups"])


def _dashboard_exprs() -> list[str]:
    dash = json.loads((BUNDLE / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    return exprs


def _promtool() -> Path:
    found = go_tool("promtool")
    if found is None:
        pytest.fail("promtool is not built: run scripts/install-go-tools promtool", pytrace=False)
    return found


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory, cluster_pool: ClusterPool) -> Scrape:
    """/metrics of a running agent with a failing app, a held prune, a failing sink and a Lease
    (the agent is stopped and its namespaces deleted once scraped: the scrape is what is tested)."""
    undo = E2E(cluster_pool)
    try:
        return _scrape_agent(tmp_path_factory.mktemp("monitoring"), cluster_pool, undo)
    finally:
        undo.teardown()


def _scrape_agent(tmp: Path, cluster_pool: ClusterPool, e2e: E2E) -> Scrape:
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    ns, lease_ns = e2e.namespace("monitoring"), e2e.namespace("monitoring-leases")
    kubectl(b.kubeconfig, "create", "namespace", lease_ns)
    four = configmaps(ns, "hi", "one", "two", "three", "four")
    repo = make_repo(tmp, {"clusters/pool-a/app.yaml": BROKEN, "clusters/pool-b/app.yaml": four})
    down = Sink("fail")
    e2e.at_end(down.stop)
    cfg = write_config(tmp, repo, {"pool-a": a, "pool-b": b})
    cfg = add_lines(
        cfg,
        f"""
[alerts]
after_failures = 1

[[notifications]]
name = "down"
kind = "webhook"
url = "{down.url}/fail"
retries = 0
""",
    )
    cfg = tune(cfg, defaults={"reconcile_interval": "1s", "brake_min_inventory": 2, "drift": "report"})
    leases = LeaseSettings(
        enabled=True,
        namespace=lease_ns,
        identity="monitoring",
        duration=15,
        renew_deadline=10.0,
        retry_period=1.0,
        kubeconfig=str(b.kubeconfig),
    )
    daemon = start_daemon(cfg, leases=leases, backoff_base=0.2, backoff_cap=0.4)
    e2e.at_end(lambda: stop_daemon(daemon))
    wait_for("pool-b applied", lambda: _cluster(cfg, "pool-b").get("state") == "ok", 60)
    # Three of four objects leave: over the default max_prune_fraction (0.5), so the brake holds.
    repo.commit({"clusters/pool-a/app.yaml": BROKEN, "clusters/pool-b/app.yaml": configmaps(ns, "hi", "one")})
    wait_for(
        "the brake holding pool-b",
        lambda: "brake" in (_cluster(cfg, "pool-b").get("prune_refused") or ""),
        60,
    )
    # drift = "report": a hand edit of a field Git declares stays, and is counted.
    patch = json.dumps({"data": {"greeting": "by-hand"}})
    kubectl(b.kubeconfig, "patch", "configmap", "one", "-n", ns, "--field-manager=kubectl-edit", "-p", patch)
    wait_for("the drift reported", lambda: _cluster(cfg, "pool-b").get("drift_objects") == 1, 60)
    wait_for(
        "a failed notification",
        lambda: daemon.notifier is not None and daemon.notifier.deliveries[0].counts["failed"] >= 1,
        60,
    )
    code, text = http(url(cfg, "/metrics"))
    assert code == 200
    return Scrape(text, time.time())


def _cluster(cfg: Any, name: str) -> dict[str, Any]:
    return next((c for c in status(cfg)["clusters"] if c["cluster"] == name), {})


def _samples(scrape: Scrape) -> list[tuple[str, str, dict[str, str], float]]:
    """(family type, sample name, labels, value) of every sample."""
    return [
        (f.type, s.name, dict(s.labels), s.value)
        for f in text_string_to_metric_families(scrape.text)
        for s in f.samples
    ]


def _names_on(scrape: Scrape) -> set[str]:
    names = {name for _, name, _, _ in _samples(scrape)}
    names |= set(re.findall(r"^# TYPE (\S+) ", scrape.text, flags=re.M))
    return names


def test_every_metric_the_alerts_and_the_dashboard_use_is_on_a_real_scrape(scrape: Scrape) -> None:
    used = {m for g in _rule_groups() for r in g["rules"] for m in METRIC.findall(r["expr"])}
    used |= {m for e in _dashboard_exprs() for m in METRIC.findall(e)}
    assert "gitops_agent_prune_held" in used and "gitops_agent_notifications_total" in used
    missing = sorted(used - _names_on(scrape))
    assert not missing, f"not on the agent's /metrics: {missing}"


def test_the_scrape_shows_the_held_prune_and_the_lost_notifications(scrape: Scrape) -> None:
    samples = {(name, tuple(sorted(labels.items()))): v for _, name, labels, v in _samples(scrape)}
    assert samples[("gitops_agent_prune_held", (("app", "pool-b"), ("cluster", "pool-b")))] == 1
    assert samples[("gitops_agent_notifications_total", (("result", "failed"), ("sink", "down")))] >= 1
    assert samples[("gitops_agent_lease_held", (("cluster", "pool-b"),))] == 1


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups()}))
    out = subprocess.run([str(_promtool()), "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _series(scrape: Scrape, *, frozen: bool, lease_lost: bool = False) -> list[dict[str, str]]:
    """promtool input series from the scrape's samples, one value a minute for an hour.

    Gauges keep their scraped value; counters rise by their scraped value every minute (what
    made them count goes on); a ``*_timestamp_seconds`` gauge is the scrape's value relative to
    the scrape (time 0), rising 60 s a minute while the agent keeps working, or ``frozen`` (the
    agent made no more progress after the scrape). ``lease_lost``: the Lease series read 0.
    """
    out = []
    for kind, name, labels, value in _samples(scrape):
        if not name.startswith("gitops_agent_") or kind == "histogram":
            continue
        if name.endswith("_timestamp_seconds"):
            start = value - scrape.at if value else -scrape.at
            values = f"{start:.0f}+0x60" if frozen else f"{start:.0f}+60x60"
        elif kind == "counter":
            values = f"0+{value:g}x60"
        elif name == "gitops_agent_lease_held" and lease_lost:
            values = "0+0x60"
        else:
            values = f"{value:g}+0x60"
        body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        out.append({"series": f"{name}{{{body}}}", "values": values})
    return out


def _alert(name: str, labels: dict[str, str], group: dict[str, Any]) -> dict[str, Any]:
    rule = next(r for r in group["rules"] if r["alert"] == name)
    return {
        "exp_labels": {**labels, **rule["labels"]},
        "exp_annotations": {
            k: v.replace("{{ $labels.app }}", labels.get("app", ""))
            .replace("{{ $labels.cluster }}", labels.get("cluster", ""))
            .replace("{{ $labels.source }}", labels.get("source", ""))
            .replace("{{ $labels.sink }}", labels.get("sink", ""))
            .replace("{{ $labels.result }}", labels.get("result", ""))
            .replace("{{ $labels.pod }}", labels.get("pod", ""))
            for k, v in rule["annotations"].items()
        },
    }


def test_each_alert_fires_on_series_from_the_real_scrape_and_only_then(
    scrape: Scrape, tmp_path: Path
) -> None:
    (group,) = _rule_groups()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [group]}))
    names = {r["alert"] for r in group["rules"]}
    at_30m = {
        "GitopsAgentAppFailing": [
            _alert("GitopsAgentAppFailing", {"cluster": "pool-a", "app": "pool-a"}, group)
        ],
        "GitopsAgentRenderFailing": [
            _alert("GitopsAgentRenderFailing", {"cluster": "pool-a", "app": "pool-a"}, group)
        ],
        "GitopsAgentPruneHeld": [
            _alert("GitopsAgentPruneHeld", {"cluster": "pool-b", "app": "pool-b"}, group)
        ],
        "GitopsAgentDriftReported": [
            _alert("GitopsAgentDriftReported", {"cluster": "pool-b", "app": "pool-b"}, group)
        ],
        "GitopsAgentNotificationsLost": [
            _alert("GitopsAgentNotificationsLost", {"sink": "down", "result": "failed"}, group)
        ],
    }
    working = [{"eval_time": "30m", "alertname": n, "exp_alerts": at_30m.get(n, [])} for n in sorted(names)]
    stopped = {
        "GitopsAgentSourceStale": [_alert("GitopsAgentSourceStale", {"source": "default"}, group)],
        "GitopsAgentSchedulerStalled": [_alert("GitopsAgentSchedulerStalled", {}, group)],
        "GitopsAgentLeaseLost": [
            _alert("GitopsAgentLeaseLost", {"cluster": c}, group)
            for c in sorted(
                labels["cluster"] for _, n, labels, _ in _samples(scrape) if n == "gitops_agent_lease_held"
            )
        ],
    }
    after_stop = [{"eval_time": "30m", "alertname": n, "exp_alerts": stopped[n]} for n in sorted(stopped)]
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": _series(scrape, frozen=False), "alert_rule_test": working},
            {
                "interval": "1m",
                "input_series": _series(scrape, frozen=True, lease_lost=True),
                "alert_rule_test": after_stop,
            },
        ],
    }
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump(tests))
    out = subprocess.run([str(_promtool()), "test", "rules", str(spec)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_bundle_applies_to_a_cluster_with_the_operators_crds(
    cluster_pool: ClusterPool, e2e: E2E, tmp_path: Path
) -> None:
    """kustomize build | kubectl apply --server-side, on the CRDs kube-prometheus ships."""
    c = cluster_pool["pool-a"]
    crds = [f for f in sorted(CORPUS_CRDS.glob("*.yaml")) if "CustomResourceDefinition" in f.name]
    for name in ("podmonitors", "prometheusrules"):
        (crd,) = [f for f in crds if f.name.lower().startswith(f"0{name[:-1]}")]
        kubectl(c.kubeconfig, "apply", "--server-side", "-f", str(crd))
        kubectl(c.kubeconfig, "wait", "--for=condition=Established", f"crd/{name}.monitoring.coreos.com")
    built = subprocess.run(
        [str(tool("kustomize")), "build", str(BUNDLE)], capture_output=True, text=True, check=True
    ).stdout
    objs = [d for d in yaml.safe_load_all(built) if d]
    assert {o["kind"] for o in objs} == {"PodMonitor", "PrometheusRule", "ConfigMap"}
    ns = e2e.namespace("gitops-agent-monitoring")
    kubectl(c.kubeconfig, "create", "namespace", ns)
    for o in objs:
        o["metadata"]["namespace"] = ns
    manifest = tmp_path / "bundle.yaml"
    manifest.write_text(yaml.safe_dump_all(objs))
    kubectl(c.kubeconfig, "apply", "--server-side", "-f", str(manifest))
    cm = json.loads(kubectl(c.kubeconfig, "get", "cm", "gitops-agent-dashboard", "-n", ns, "-o", "json"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["grafana-dashboard.json"])["uid"] == "gitops-agent"
