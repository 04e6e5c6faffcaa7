"""The daemon on real local clusters: each cluster alone, liveness is the agent's (docs/safety.md rules 6, 7).

A frozen (SIGSTOP) API server costs the other clusters nothing and is reported
as timed out; revoked credentials and a wrong CA are clear errors in /status
and /metrics while /healthz stays OK; a rotated token is picked up without a
restart; a cluster that flaps for 30 compressed minutes backs off visibly.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.dev.process import LocalCluster
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterControl, ClusterPool, kubectl
from tests.daemonkit import (
    Daemons,
    HealthWatch,
    cluster_status,
    configmaps,
    http,
    tune,
    url,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _uids(kubeconfig: Path, ns: str) -> dict[str, str]:
    items = json.loads(kubectl(kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))["items"]
    return {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}


def _samples(cfg_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, body = http(cfg_url)
    assert code == 200
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _series(samples: dict, name: str, **labels: str) -> float | None:  # type: ignore[type-arg]
    for (n, lbls), v in samples.items():
        if n == name and all((k, val) in lbls for k, val in labels.items()):
            return float(v)
    return None


def test_each_cluster_alone_a_pass_hung_for_its_whole_deadline_does_not_delay_another_cluster(
    tmp_path: Path,
    cluster_pool: ClusterPool,
    cluster_ctl: ClusterControl,
    fresh_cluster,
    e2e: E2E,
    daemons: Daemons,
) -> None:  # type: ignore[no-untyped-def]
    """The frozen cluster's pass may hang for 120 s, far longer than this test waits: the other
    cluster converging meanwhile shows they share no thread, executor or connection pool."""
    frozen: LocalCluster = fresh_cluster()
    # The frozen cluster first: a shared worker would take its pass before pool-a's.
    targets = {"frozen": frozen, "pool-a": cluster_pool["pool-a"]}
    ns = e2e.namespace("hung")
    repo = make_repo(tmp_path, {f"clusters/{n}/app.yaml": configmaps(ns, "one") for n in targets})
    cfg = tune(
        write_config(tmp_path, repo, targets),
        defaults={"reconcile_interval": "60s", "pass_deadline": "120s", "request_timeout": "90s"},
    )
    daemons(cfg, backoff_base=1.0, backoff_cap=4.0)
    for n in targets:
        wait_for(f"{n} ok", lambda n=n: cluster_status(cfg, n)["state"] == "ok", 60)
    cluster_ctl.freeze(frozen)
    sha = repo.commit({f"clusters/{n}/app.yaml": configmaps(ns, "two") for n in targets})
    wait_for("frozen's pass started", lambda: cluster_status(cfg, "frozen")["state"] == "running", 15)
    wait_for(
        "pool-a at the new revision",
        lambda: cluster_status(cfg, "pool-a")["last_success_revision"] == sha,
        15,
    )
    assert cluster_status(cfg, "frozen")["state"] == "running", "the frozen cluster's pass ended early"
    cluster_ctl.thaw(frozen)
    wait_for(
        "frozen at the new revision after the thaw",
        lambda: cluster_status(cfg, "frozen")["last_success_revision"] == sha,
        60,
    )


def test_each_cluster_alone_no_new_pass_starts_while_an_abandoned_one_still_waits_for_the_cluster(
    tmp_path: Path, cluster_ctl: ClusterControl, fresh_cluster, e2e: E2E
) -> None:  # type: ignore[no-untyped-def]
    """A pass abandoned at its deadline may still hold a request to a hung cluster: passes do not
    pile up behind it (one thread per cluster at most), and once the cluster answers again the
    abandoned pass's writes are refused and the next pass converges."""
    frozen: LocalCluster = fresh_cluster()
    ns = e2e.namespace("stuck")
    repo = make_repo(tmp_path, {"clusters/frozen/app.yaml": configmaps(ns, "one")})
    cfg = tune(
        write_config(tmp_path, repo, {"frozen": frozen}),
        listen=False,
        defaults={"pass_deadline": "2s", "request_timeout": "30s"},
    )
    agent = e2e.agent(cfg)
    assert agent.fleet.run_pass("frozen", agent.revision()).ok
    repo.commit({"clusters/frozen/app.yaml": configmaps(ns, "two")})
    revision = agent.revision()
    cluster_ctl.freeze(frozen)
    t0 = time.monotonic()
    first = agent.fleet.run_pass("frozen", revision)
    assert time.monotonic() - t0 < 5
    assert (first.error or "").startswith("timed out: pass did not finish within 2s")
    t0 = time.monotonic()
    second = agent.fleet.run_pass("frozen", revision)
    assert time.monotonic() - t0 < 1, "a second pass waited on the hung cluster"
    assert "still waiting for the cluster; no new pass until it returns" in (second.error or "")
    assert len([t for t in threading.enumerate() if t.name == "pass-frozen"]) == 1
    cluster_ctl.thaw(frozen)
    done = wait_for(
        "a pass after the thaw",
        lambda: (r := agent.fleet.run_pass("frozen", revision)).ok and r,
        60,
        interval=0.5,
    )
    assert done.revision == revision.sha
    cm = json.loads(kubectl(frozen.kubeconfig, "get", "cm", "settings", "-n", ns, "-o", "json"))
    assert cm["data"]["greeting"] == "two"


def test_each_cluster_alone_a_frozen_cluster_times_out_while_the_others_converge_within_one_interval(
    tmp_path: Path,
    cluster_pool: ClusterPool,
    cluster_ctl: ClusterControl,
    fresh_cluster,
    e2e: E2E,
    daemons: Daemons,
) -> None:  # type: ignore[no-untyped-def]
    frozen: LocalCluster = fresh_cluster()
    targets = {"pool-a": cluster_pool["pool-a"], "pool-b": cluster_pool["pool-b"], "frozen": frozen}
    ns = e2e.namespace("alone")
    repo = make_repo(tmp_path, {f"clusters/{n}/app.yaml": configmaps(ns, "one") for n in targets})
    interval = 20.0
    cfg = tune(
        write_config(tmp_path, repo, targets),
        defaults={"reconcile_interval": f"{interval:g}s", "pass_deadline": "4s", "request_timeout": "30s"},
    )
    daemons(cfg, backoff_base=1.0, backoff_cap=4.0)
    with HealthWatch(cfg) as health:
        for n in targets:
            wait_for(f"{n} ok", lambda n=n: cluster_status(cfg, n)["state"] == "ok", 60)
        before = _uids(frozen.kubeconfig, ns)
        cluster_ctl.freeze(frozen)
        sha = repo.commit(
            {f"clusters/{n}/app.yaml": configmaps(ns, "two", "settings", "more") for n in targets}
        )
        t0 = time.monotonic()
        for n in ("pool-a", "pool-b"):
            wait_for(
                f"{n} at the new revision",
                lambda n=n: cluster_status(cfg, n)["last_success_revision"] == sha,
                interval,
            )
        converged = time.monotonic() - t0
        assert converged < interval, f"took {converged:.1f}s, interval is {interval:g}s"
        for n in ("pool-a", "pool-b"):
            cm = json.loads(kubectl(targets[n].kubeconfig, "get", "cm", "more", "-n", ns, "-o", "json"))
            assert cm["data"]["greeting"] == "two"
        st = wait_for(
            "frozen timed out",
            lambda: (s := cluster_status(cfg, "frozen"))["state"] == "timed-out" and s,
            20,
        )
        assert "timed out" in st["error"]
        samples = _samples(url(cfg, "/metrics"))
        assert _series(samples, "gitops_agent_reconcile_errors_total", cluster="frozen", reason="timeout")
        cluster_ctl.thaw(frozen)
        wait_for(
            "frozen converged after thaw",
            lambda: cluster_status(cfg, "frozen")["last_success_revision"] == sha,
            60,
        )
    after = _uids(frozen.kubeconfig, ns)
    assert after["settings"] == before["settings"], "an object of the frozen cluster was re-created"
    assert "more" in after
    assert not health.failures, health.failures
    print(f"\nMEASURED other clusters converged {converged:.2f}s after the commit (interval {interval:g}s)")


def _wrong_ca(tmp_path: Path, server_of: LocalCluster, ca_of: LocalCluster) -> Path:
    kc = yaml.safe_load(server_of.kubeconfig.read_text())
    other = yaml.safe_load(ca_of.kubeconfig.read_text())
    kc["clusters"][0]["cluster"]["certificate-authority-data"] = other["clusters"][0]["cluster"][
        "certificate-authority-data"
    ]
    path = tmp_path / "wrong-ca.kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    return path


def test_liveness_revoked_credentials_and_a_wrong_ca_are_clear_errors_and_healthz_stays_ok(
    tmp_path: Path,
    cluster_pool: ClusterPool,
    cluster_ctl: ClusterControl,
    fresh_cluster,
    e2e: E2E,
    daemons: Daemons,
) -> None:  # type: ignore[no-untyped-def]
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    ns = e2e.namespace("live")
    sa = f"{ns}/agent"
    token_kc = cluster_ctl.token(a, sa)
    # One agent, one inventory per real cluster: "revoked" is pool-a's only entry (it writes once
    # its token is rotated); "wrong-ca" never gets an answer it trusts, so it never writes.
    targets = {
        "good-a": fresh_cluster(),
        "good-b": b,
        "revoked": token_kc,
        "wrong-ca": _wrong_ca(tmp_path, a, b),
    }
    files = {
        f"clusters/{n}/app.yaml": configmaps(e2e.delete_namespace_after(f"{ns}-{n}"), "hi") for n in targets
    }
    repo = make_repo(tmp_path, files)
    cfg = tune(write_config(tmp_path, repo, targets), defaults={"reconcile_interval": "30s"}, token=True)
    cluster_ctl.revoke(a, sa)
    daemons(cfg, backoff_base=0.5, backoff_cap=2.0)
    with HealthWatch(cfg) as health:
        for n in ("good-a", "good-b"):
            wait_for(f"{n} ok", lambda n=n: cluster_status(cfg, n)["state"] == "ok", 60)
        revoked = wait_for(
            "revoked failed", lambda: (s := cluster_status(cfg, "revoked"))["state"] == "failed" and s, 30
        )
        assert "HTTP 401" in revoked["error"], revoked["error"]
        wrong = wait_for(
            "wrong CA failed",
            lambda: (s := cluster_status(cfg, "wrong-ca"))["state"] == "failed" and s,
            30,
        )
        assert "TLS certificate verification failed (wrong CA?)" in wrong["error"], wrong["error"]
        # Several backoff rounds go by while the agent stays live.
        wait_for("backoff rounds", lambda: cluster_status(cfg, "revoked")["consecutive_failures"] >= 3, 30)
        samples = _samples(url(cfg, "/metrics"))
        assert _series(
            samples, "gitops_agent_reconcile_errors_total", cluster="revoked", reason="unauthorized"
        )
        assert _series(samples, "gitops_agent_reconcile_errors_total", cluster="wrong-ca", reason="tls")
        assert _series(samples, "gitops_agent_cluster_consecutive_failures", cluster="revoked") >= 3  # type: ignore[operator]
        for n in ("good-a", "good-b"):
            assert _series(samples, "gitops_agent_last_success_timestamp_seconds", cluster=n)
            assert _series(samples, "gitops_agent_reconcile_total", cluster=n, result="success")
        assert http(url(cfg, "/readyz"))[0] == 200

        # The token is rotated in place (same kubeconfig file): picked up without a restart.
        cluster_ctl.token(a, sa)
        http(url(cfg, "/sync?cluster=revoked"), "POST")
        ok = wait_for(
            "rotated token works",
            lambda: (s := cluster_status(cfg, "revoked"))["state"] == "ok" and s,
            30,
        )
        assert ok["applied"] == 2 and ok["pruned"] == 0
    assert health.probes > 10
    assert not health.failures, health.failures


def test_liveness_a_cluster_flapping_for_30_compressed_minutes_backs_off_and_never_fails_healthz(
    tmp_path: Path,
    cluster_pool: ClusterPool,
    cluster_ctl: ClusterControl,
    fresh_cluster,
    e2e: E2E,
    daemons: Daemons,
) -> None:  # type: ignore[no-untyped-def]
    """One minute is one second: interval 5 min, backoff from 30 s capped at 4 min, 30 min in all."""
    flappy: LocalCluster = fresh_cluster()
    ns = e2e.namespace("flap")
    targets = {"steady": cluster_pool["pool-a"], "flappy": flappy}
    repo = make_repo(tmp_path, {f"clusters/{n}/app.yaml": configmaps(ns, "hi") for n in targets})
    cfg = tune(
        write_config(tmp_path, repo, targets),
        defaults={"reconcile_interval": "5s", "pass_deadline": "2s", "request_timeout": "1s"},
    )
    base, cap = 0.5, 4.0
    daemon = daemons(cfg, backoff_base=base, backoff_cap=cap, tick=0.1, stuck_after=2.0)
    with HealthWatch(cfg) as health:
        wait_for("both ok", lambda: all(cluster_status(cfg, n)["state"] == "ok" for n in targets), 30)
        end = time.monotonic() + 30
        down = True
        while time.monotonic() < end:
            # Down for 10 "minutes", up for 3: mostly failing, now and then a success. The sleep is
            # the flapping itself (time passing on purpose), not a wait for something.
            (cluster_ctl.freeze if down else cluster_ctl.thaw)(flappy)
            time.sleep(10.0 if down else 3.0)
            down = not down
        cluster_ctl.thaw(flappy)
        st = daemon.fleet.status["flappy"]
        steady = daemon.fleet.status["steady"]
    backoffs = [(d, why) for _, d, why in st.schedule if why.startswith("backoff")]
    delays = [d for d, _ in backoffs]
    assert delays, list(st.schedule)
    assert max(delays) <= cap * 1.1 + 0.5
    # The delay doubles from the base with consecutive failures: seen growing at least twice.
    grew = sum(1 for x, y in itertools.pairwise(delays) if y > x * 1.5)
    assert grew >= 2, backoffs
    assert any(why == "backoff after 1 failure(s)" for _, why in backoffs)
    assert steady.failures == 0 and steady.state == "ok"
    assert not health.failures, health.failures
    assert health.probes > 200
    print(f"\nMEASURED flapping schedule (delay s, why): {[(round(d, 2), w) for d, w in backoffs]}")
