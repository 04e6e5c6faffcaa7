"""The status page with two replicas sharing clusters through Leases, and behind a token.

Two agents in this process share ``pool-a`` and ``pool-b`` through Leases on ``pool-b`` (the
management cluster): each runs one cluster, and the page of each shows both, the other's from
the records its holder keeps in the management cluster; passes in a steady state write no
record. On an address other than loopback the page needs its token: a browser signs in once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from agent.config.load import load_config
from agent.config.types import Config
from agent.run.lease_settings import LeaseSettings
from agent.run.scheduler import Daemon
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import Daemons, configmaps, free_port, http, status, tune, url
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _leases(kubeconfig: Path, ns: str, identity: str) -> LeaseSettings:
    return LeaseSettings(
        enabled=True,
        namespace=ns,
        identity=identity,
        # Long enough that a renewal late on a busy machine does not move a Lease mid-test.
        duration=10,
        renew_deadline=6.0,
        retry_period=1.0,
        kubeconfig=str(kubeconfig),
    )


def _grid(browser: Any, cfg: Config) -> dict[str, tuple[str, str]]:
    """Cluster → (state word, holder text) as the grid of ``cfg``'s agent shows them."""
    browser.get(url(cfg, "/ui/"))
    out = {}
    for row in browser.find_elements(By.CSS_SELECTOR, "tr.app"):
        state = row.find_element(By.CSS_SELECTOR, 'td[data-label="state"] .state').text
        holder = row.find_element(By.CSS_SELECTOR, 'td[data-label="cluster"] .holder').text
        out[row.get_attribute("data-cluster")] = (state, holder)
    return out


def test_each_replica_shows_the_whole_fleet_and_a_steady_fleet_writes_no_record(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons, browser: Any
) -> None:
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    ns, lease_ns = e2e.namespace("ha-page"), e2e.namespace("leases")
    kubectl(b.kubeconfig, "create", "namespace", lease_ns)
    targets = {"pool-a": a, "pool-b": b}
    repo = make_repo(tmp_path, {f"clusters/{n}/app.yaml": configmaps(ns, "v1") for n in targets})
    cfg1 = tune(write_config(tmp_path, repo, targets), defaults={"reconcile_interval": "1s"})
    second = Path(cfg1.file).with_name("second.toml")
    second.write_text(Path(cfg1.file).read_text().replace(cfg1.agent.listen, f"127.0.0.1:{free_port()}"))
    cfg2 = load_config(second)
    one: Daemon = daemons(cfg1, leases=_leases(b.kubeconfig, lease_ns, "one"))
    two: Daemon = daemons(cfg2, leases=_leases(b.kubeconfig, lease_ns, "two"))

    def split() -> dict[str, str] | None:
        held = {c: who for who, cfg in (("one", cfg1), ("two", cfg2)) for c in status(cfg)["leases"]["held"]}
        return held if len(held) == 2 and set(held.values()) == {"one", "two"} else None

    holders = wait_for("each replica holding one cluster", split, 30)

    def both_ok(cfg: Config) -> bool:
        grid = _grid(browser, cfg)
        return {c: s for c, (s, _) in grid.items()} == {"pool-a": "ok", "pool-b": "ok"}

    for cfg in (cfg1, cfg2):
        wait_for(f"{cfg.file}: both clusters ok on its page", lambda cfg=cfg: both_ok(cfg), 60)

    def holders_named() -> bool:
        held = split() or holders
        return all(
            _grid(browser, cfg)[cluster][1] == ("held here" if who == me else f"held by {who}")
            for me, cfg in (("one", cfg1), ("two", cfg2))
            for cluster, who in held.items()
        )

    wait_for("each page naming each cluster's holder", holders_named, 20)

    # Steady: passes go on every second, and no record changes, so none is written.
    writes = (one.page.writes if one.page else -1, two.page.writes if two.page else -1)
    assert min(writes) > 0, writes  # each wrote its cluster's record to the management cluster

    def last_runs() -> dict[str, str]:
        """Cluster → when its holder's last pass ended."""
        return {
            c["cluster"]: c["last_run_at"] or ""
            for cfg in (cfg1, cfg2)
            for c in status(cfg)["clusters"]
            if c["lease_held"]
        }

    seen: dict[str, set[str]] = {c: {t} for c, t in last_runs().items()}

    def two_more_passes() -> bool:
        for c, t in last_runs().items():
            seen.setdefault(c, set()).add(t)
        return len(seen) == 2 and all(len(times) >= 3 for times in seen.values())

    wait_for("two more passes on each cluster", two_more_passes, 30, interval=0.3)
    assert (one.page.writes if one.page else -1, two.page.writes if two.page else -1) == writes


def test_on_an_address_other_than_loopback_the_page_needs_its_token_and_a_browser_signs_in_once(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons, browser: Any
) -> None:
    ns = e2e.namespace("token-page")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "v1")})
    port = free_port()
    token = tmp_path / "ui-token"
    token.write_text("correct-horse-battery\n")
    cfg = tune(write_config(tmp_path, repo, {"pool-a": cluster_pool["pool-a"]}), listen=False)
    text = Path(cfg.file).read_text().replace('listen = ""', f'listen = "0.0.0.0:{port}"')
    Path(cfg.file).write_text(text.replace("[agent]\n", f'[agent]\nui_token_file = "{token}"\n', 1))
    cfg = load_config(cfg.file)
    daemons(cfg)
    base = f"http://127.0.0.1:{port}"
    assert http(f"{base}/healthz")[0] == 200  # the probes need no token
    browser.get(f"{base}/ui/clusters/pool-a")
    assert browser.current_url.startswith(f"{base}/ui/login")
    browser.find_element(By.ID, "token").send_keys("wrong")
    browser.find_element(By.CSS_SELECTOR, "form button").click()
    assert browser.find_element(By.ID, "login-error").text == "Wrong token."
    browser.find_element(By.ID, "token").send_keys("correct-horse-battery")
    browser.find_element(By.CSS_SELECTOR, "form button").click()
    wait_for("the cluster page", lambda: browser.current_url == f"{base}/ui/clusters/pool-a", 10)
    assert browser.find_element(By.TAG_NAME, "h1").text == "Cluster pool-a"
    browser.get(f"{base}/ui/")  # the cookie carries on
    assert browser.find_elements(By.CSS_SELECTOR, 'tr.app[data-cluster="pool-a"]')
    cookies = {c["name"]: c for c in browser.get_cookies()}
    assert "correct-horse-battery" not in str(cookies) and cookies["gitops_agent_ui"]["httpOnly"]
