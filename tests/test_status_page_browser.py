"""The status page in a real headless Chromium, against the agent running on real local clusters.

One fleet for the module (``fleet``): on ``pool-a`` an app that applied and yields
``spec.replicas`` to an HPA and a Secret field to the controller manager, an app with an object
the server rejects (its label holds markup, which the server's message quotes), and a suspended
app; ``pool-b`` frozen for the whole module, so its passes fail on a request that timed out.
The commit subject holds markup too. Chromium reads the pages as a person would, and tells
whether a script ran.
"""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By

from agent.config.load import load_config
from agent.config.types import Config
from agent.dev import localcluster
from agent.run.scheduler import Daemon
from tests import daemonkit
from tests.agentkit import make_repo, unique
from tests.clusters import ClusterPool, kubectl, scale_as_hpa
from tests.daemonkit import http, url
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

MARKUP = "<img src=x onerror=alert(1)>"
SECRET_GIT = "sentinel-git-7f3a9c"
SECRET_LIVE = "sentinel-live-51e0b2"
YIELD_SCALE = "spec.replicas owned by kube-controller-manager (scale), kept 5, Git says 3"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def web_app(ns: str) -> str:
    return f"""\
apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {ns}
spec:
  replicas: 3
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
        - name: web
          image: registry.example/web:1
---
apiVersion: v1
kind: Secret
metadata:
  name: db
  namespace: {ns}
data:
  password: {b64(SECRET_GIT)}
"""


def broken_app(ns: str) -> str:
    # The server refuses the label value and quotes it in its message.
    return f"""\
apiVersion: v1
kind: ConfigMap
metadata:
  name: bad
  namespace: {ns}
  labels:
    note: {json.dumps(MARKUP)}
data:
  k: v
"""


def config_map(ns: str, name: str, with_namespace: bool = False) -> str:
    head = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n" if with_namespace else ""
    return (
        head
        + f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  k: v\n"
    )


@dataclass
class Fleet:
    config: Config
    daemon: Daemon
    ns: str

    def page(self, path: str) -> str:
        return url(self.config, path)


def _status(cfg: Config) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["cluster"], c["app"]): c for c in daemonkit.status(cfg)["clusters"]}


def _html(cfg: Config, path: str) -> str:
    code, body = http(url(cfg, path))
    return body if code == 200 else ""


@pytest.fixture(scope="module")
def fleet(cluster_pool: ClusterPool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("page")
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    ns = unique("page")
    repo = make_repo(tmp, {"apps/web/app.yaml": web_app(ns)})
    repo.commit(
        {
            "apps/web/app.yaml": web_app(ns),
            "apps/broken/app.yaml": broken_app(ns),
            "apps/paused/app.yaml": config_map(ns, "paused"),
            "clusters/pool-b/app.yaml": config_map(ns, "b", with_namespace=True),
        },
        f"deploy {MARKUP}",
    )
    agent = unique("agent")
    text = f"""\
[agent]
name = "{agent}"
cache_dir = "{tmp / "cache"}"
listen = "127.0.0.1:{daemonkit.free_port()}"
reload_interval = "0s"

[source]
url = "{repo.path}"
poll_interval = "1s"

[defaults]
pass_deadline = "60s"
request_timeout = "10s"
connect_timeout = "2s"
reconcile_interval = "1h"

[[clusters]]
name = "pool-a"
kubeconfig = "{a.kubeconfig}"

[[clusters]]
name = "pool-b"
kubeconfig = "{b.kubeconfig}"
path = "clusters/pool-b"

[[apps]]
name = "web"
cluster = "pool-a"
path = "apps/web"

[[apps]]
name = "broken"
cluster = "pool-a"
path = "apps/broken"

[[apps]]
name = "paused"
cluster = "pool-a"
path = "apps/paused"
suspend = true
"""
    (tmp / "agent.toml").write_text(text)
    cfg = load_config(tmp / "agent.toml")
    localcluster.freeze("pool-b", b.state_dir)
    daemon = daemonkit.start_daemon(cfg)
    try:
        want = {
            ("pool-a", "web"): "ok",
            ("pool-a", "broken"): "failed",
            ("pool-a", "paused"): "suspended",
            ("pool-b", "pool-b"): "failed",
        }
        wait_for("every app's first pass", lambda: {k: _status(cfg)[k]["state"] for k in want} == want, 90)
        # An HPA scales web through /scale; the controller manager rewrites the Secret's password.
        scale_as_hpa(a.kubeconfig, ns, 5)
        kubectl(
            a.kubeconfig,
            "patch",
            "secret",
            "db",
            "-n",
            ns,
            "--type=merge",
            "--field-manager=kube-controller-manager",
            "-p",
            json.dumps({"data": {"password": b64(SECRET_LIVE)}}),
        )
        assert daemon.sync("pool-a")[0] == 202  # the HTTP side of /sync: tests/test_listeners.py
        wait_for(
            "web's yields on its page",
            lambda: (
                "kept 5" in _html(cfg, "/ui/clusters/pool-a/apps/web")
                and "data.password owned by kube-controller-manager"
                in _html(cfg, "/ui/clusters/pool-a/apps/web")
            ),
            60,
        )
        yield Fleet(cfg, daemon, ns)
    finally:
        with contextlib.suppress(Exception):
            daemonkit.stop_daemon(daemon)
        localcluster.thaw("pool-b", b.state_dir)
        for cluster in (a, b):
            with contextlib.suppress(OSError):
                localcluster.api_request(cluster, "DELETE", f"/api/v1/namespaces/{ns}")


def _row(browser: Any, cluster: str, app: str) -> Any:
    return browser.find_element(By.CSS_SELECTOR, f'tr.app[data-cluster="{cluster}"][data-app="{app}"]')


def _cell(row: Any, label: str) -> str:
    return str(row.find_element(By.CSS_SELECTOR, f'td[data-label="{label}"]').text)


def _state(row: Any) -> str:
    """The state word of a grid row (a tag such as ``behind`` may follow it in its cell)."""
    return str(row.find_element(By.CSS_SELECTOR, 'td[data-label="state"] .state').text)


def _no_script_ran(browser: Any) -> None:
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 (reading it is what raises when there is none)
    assert browser.find_elements(By.TAG_NAME, "img") == []


def test_the_grid_shows_each_cluster_and_app_in_its_state_and_a_link_reaches_the_yielded_field_and_its_owner(
    fleet: Fleet, browser: Any
) -> None:
    browser.get(fleet.page("/ui/"))
    want = {
        ("pool-a", "web"): "ok",
        ("pool-a", "broken"): "failed",
        ("pool-a", "paused"): "suspended",
        ("pool-b", "pool-b"): "failed",
    }
    got = {(c, a): _state(_row(browser, c, a)) for c, a in want}
    assert got == want
    assert "timed out" in _cell(_row(browser, "pool-b", "pool-b"), "last error")
    assert "Invalid value" in _cell(_row(browser, "pool-a", "broken"), "last error")
    revision = _cell(_row(browser, "pool-a", "web"), "revision")
    assert revision and revision == _status(fleet.config)[("pool-a", "web")]["revision"][:12]
    _row(browser, "pool-a", "web").find_element(By.CSS_SELECTOR, "a.app-link").click()
    wait_for("the app page", lambda: browser.current_url.endswith("/ui/clusters/pool-a/apps/web"), 10)
    yields = browser.find_element(By.ID, "yields").text
    assert f"Deployment.apps/{fleet.ns}/web: {YIELD_SCALE}" in yields
    web = browser.find_element(By.CSS_SELECTOR, f'tr[data-key="Deployment.apps/{fleet.ns}/web"]')
    assert "yielded" in web.text and YIELD_SCALE in web.text


def test_markup_in_a_server_message_and_a_commit_subject_shows_as_text_and_runs_no_script(
    fleet: Fleet, browser: Any
) -> None:
    for path in ("/ui/", "/ui/clusters/pool-a/apps/broken", "/ui/history", "/ui/events"):
        browser.get(fleet.page(path))
        _no_script_ran(browser)
    browser.get(fleet.page("/ui/clusters/pool-a/apps/broken"))
    bad = browser.find_element(By.CSS_SELECTOR, f'tr[data-key="ConfigMap/{fleet.ns}/bad"]')
    assert MARKUP in bad.text and "HTTP 422" in bad.text  # the server's message, as text
    assert f"deploy {MARKUP}" in browser.find_element(By.CSS_SELECTOR, ".facts").text  # the commit subject
    browser.get(fleet.page("/ui/history?cluster=pool-a&app=broken"))
    assert f"deploy {MARKUP}" in browser.find_element(By.CSS_SELECTOR, "table.history").text
    _no_script_ran(browser)


def test_a_secret_applied_by_the_agent_never_shows_its_data_on_any_page_even_a_yielded_field(
    fleet: Fleet, browser: Any
) -> None:
    quoted = urllib.parse.quote
    pages = ["/ui/", "/ui/history", "/ui/events", "/ui/clusters/pool-a", "/ui/clusters/pool-b"]
    pages += [f"/ui/clusters/pool-a/apps/{a}" for a in ("web", "broken", "paused")]
    pages += [f"/ui/history?cluster=pool-a&app={quoted(a)}" for a in ("web", "broken")]
    secrets = (SECRET_GIT, SECRET_LIVE, b64(SECRET_GIT), b64(SECRET_LIVE))
    for path in pages:
        browser.get(fleet.page(path))
        source = browser.page_source
        assert not [s for s in secrets if s in source], path
    browser.get(fleet.page("/ui/clusters/pool-a/apps/web"))
    yields = browser.find_element(By.ID, "yields").text
    masked = "data.password owned by kube-controller-manager (Update), kept ***, Git says ***"
    assert f"Secret/{fleet.ns}/db: {masked}" in yields


def test_the_pages_fit_a_phone_and_say_each_state_in_words(fleet: Fleet, browser: Any) -> None:
    browser.set_window_size(390, 844)
    browser.get(fleet.page("/ui/"))
    width = browser.execute_script("return document.documentElement.scrollWidth")
    viewport = browser.execute_script("return window.innerWidth")
    assert width <= viewport, (width, viewport)
    assert _state(_row(browser, "pool-a", "paused")) == "suspended"
    browser.get(fleet.page("/ui/clusters/pool-a/apps/web"))
    width = browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= viewport, (width, viewport)
