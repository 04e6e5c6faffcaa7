"""Notifications from the running agent, to real HTTP servers on loopback standing for a webhook
receiver, Slack and the GitHub and GitLab statuses APIs (docs/notifications.md).

- A failing app alerts once after N failed passes, reminds on the backoff schedule and sends one
  resolved message; a restart in between sends no duplicate (state in a file), and with two
  replicas sharing the cluster through Leases each event is sent once (state in a ConfigMap of
  the management cluster), the second replica taking over the reminders.
- A commit produces ``pending`` then ``success``/``failure`` per (cluster, app) on the GitHub and
  GitLab statuses APIs, with the documented request shape.
- A sink that hangs or answers 500 never slows the passes; retries are bounded; drops are counted.
- No secret of the config shows in logs, Events, notifications or ``/status`` (sentinels).
"""

from __future__ import annotations

import itertools
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent.config.types import Config
from agent.kube.client import KubeClient
from agent.notify import signing
from agent.report.events import events_for
from agent.run.lease_settings import LeaseSettings
from agent.run.scheduler import Daemon
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import (
    Daemons,
    configmaps,
    free_port,
    http,
    start_daemon,
    status,
    stop_daemon,
    tune,
    url,
)
from tests.sinkkit import Sink, add_lines, secret_file, stamp
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

BROKEN = "apiVersion: v1\nkind: ConfigMap\nmetadata: [unclosed\n"
FAST = {"backoff_base": 0.2, "backoff_cap": 0.4}


def _sink(e2e: E2E, mode: str = "ok") -> Sink:
    s = Sink(mode)
    e2e.at_end(s.stop)
    return s


def _kinds(sink: Sink) -> list[str]:
    return [n for n, _, _ in stamp(sink.events())]


def test_a_failing_app_alerts_once_after_n_passes_reminds_on_schedule_and_resolves_once_across_a_restart(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("alerts")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": BROKEN})
    sink = _sink(e2e)
    key = secret_file(tmp_path, "hmac", "hmac-key-of-the-test")
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    cfg = add_lines(
        cfg,
        f"""
[alerts]
after_failures = 3
remind = ["2s", "4s"]

[[notifications]]
name = "hook"
kind = "webhook"
url = "{sink.url}/events"
secret_file = "{key}"
timestamped = true
""",
    )
    cfg = tune(cfg)
    first = daemons(cfg, **FAST)
    wait_for("the first alert", lambda: sink.events(), 30)
    fired = sink.requests()[0]
    event = fired.json
    assert stamp([event]) == [("firing", "ReconcileFailed", "pool-a/pool-a")]
    assert event["severity"] == "error" and event["metadata"]["failures"] == "3"
    assert event["metadata"]["cause"] == "render" and event["involvedObject"]["kind"] == "App"
    assert "app.yaml" in event["message"]  # the render error names its file
    # Signed Flux's way, and over timestamp and body for receivers that refuse replays.
    assert fired.headers[signing.SIGNATURE.lower()] == signing.body_signature(
        b"hmac-key-of-the-test", fired.raw
    )
    ts = fired.headers[signing.TIMESTAMP.lower()]
    assert fired.headers[signing.TIMESTAMPED_SIGNATURE.lower()] == signing.timestamped_signature(
        b"hmac-key-of-the-test", ts, fired.raw
    )
    wait_for("the first reminder", lambda: len(sink.events()) >= 2, 10)
    # A restart: the new agent's passes fail again, but it knows the alert went out.
    stop_daemon(first)
    second = daemons(cfg, **FAST)
    wait_for(
        "the restarted agent failing", lambda: status(cfg)["clusters"][0]["consecutive_failures"] >= 3, 30
    )
    wait_for("the second reminder", lambda: len(sink.events()) >= 3, 15)
    assert _kinds(sink) == ["firing", "reminder", "reminder"]
    at = [r.at for r in sink.requests()]
    # Reminders after 2 s, then 4 s (the last interval repeats), never early.
    assert 2.0 <= at[1] - at[0] < 4.5, at
    assert 4.0 <= at[2] - at[1] < 6.5, at
    repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "fixed")}, "fix")
    wait_for("resolved", lambda: "resolved" in _kinds(sink), 30)
    resolved = sink.events()[-1]
    assert stamp([resolved]) == [("resolved", "ReconcileSucceeded", "pool-a/pool-a")]
    assert resolved["severity"] == "info"
    wait_for("the app ok", lambda: second.fleet.status["pool-a"].app("pool-a").failures == 0, 10)
    before = len(sink.events())
    time.sleep(3)  # on purpose: passes and reminder ticks go by, and nothing more is sent
    assert len(sink.events()) == before
    assert _kinds(sink).count("firing") == 1 and _kinds(sink).count("resolved") == 1


def _replica(cfg_file: str, identity: str, lease_ns: str, mgmt: Path) -> LeaseSettings:
    return LeaseSettings(
        enabled=True,
        namespace=lease_ns,
        identity=identity,
        duration=3,
        renew_deadline=2.0,
        retry_period=0.5,
        kubeconfig=str(mgmt),
    )


def test_with_two_replicas_each_event_is_sent_once_and_the_other_replica_takes_over_the_reminders(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    ns, lease_ns = e2e.namespace("ha-alerts"), e2e.namespace("ha-leases")
    kubectl(b.kubeconfig, "create", "namespace", lease_ns)
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": BROKEN})
    sink = _sink(e2e)
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    cfg = add_lines(
        cfg,
        f"""
[alerts]
after_failures = 2
remind = ["3s"]

[[notifications]]
name = "hook"
kind = "webhook"
url = "{sink.url}/events"
""",
    )
    cfg = tune(cfg, listen=False)
    replicas: dict[str, Daemon] = {}
    for ident in ("one", "two"):
        d = start_daemon(cfg, leases=_replica(cfg.file, ident, lease_ns, b.kubeconfig), **FAST)
        replicas[ident] = d
        e2e.at_end(lambda d=d: stop_daemon(d))
    wait_for("the first alert", lambda: sink.events(), 30)
    holder = sink.events()[0]["reportingInstance"]
    other = "two" if holder == "one" else "one"
    assert holder in replicas
    wait_for("a reminder", lambda: len(sink.events()) >= 2, 10)
    # The holder loses the cluster's Lease (handed back, as in a rolling update) but keeps running,
    # with what it knew of the alert: from now on only the other replica may send.
    leases = replicas[holder].leases
    assert leases is not None
    leases.stop(release=True)
    wait_for("a reminder from the other replica", lambda: sink.events()[-1]["reportingInstance"] == other, 20)
    repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "fixed")}, "fix")
    wait_for("resolved", lambda: "resolved" in _kinds(sink), 30)
    time.sleep(2)  # on purpose: both replicas' ticks go by; nothing more is sent
    events = sink.events()
    kinds = _kinds(sink)
    assert kinds[0] == "firing" and kinds[-1] == "resolved", kinds
    assert kinds.count("firing") == 1 and kinds.count("resolved") == 1, kinds
    assert set(kinds[1:-1]) == {"reminder"}
    # Reminders never repeat: each a schedule step after the one before (3 s apart).
    at = [r.at for r in sink.requests()][: len(kinds) - 1]
    assert all(later - earlier >= 2.9 for earlier, later in itertools.pairwise(at)), at
    assert {e["reportingInstance"] for e in events} == {holder, other}
    # The state lives beside the Leases, in the management cluster, not in the served one.
    cm = json.loads(
        kubectl(b.kubeconfig, "get", "cm", f"{cfg.agent.name}-notify-pool-a", "-n", lease_ns, "-o", "json")
    )
    assert json.loads(cm["data"]["state.json"])["alerts"] == []


def _app_config(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, files: dict[str, str], extra: str
) -> tuple:  # type: ignore[type-arg]
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    repo = make_repo(tmp_path, files)
    cfg = write_config(tmp_path, repo, {"pool-a": a, "pool-b": b})
    cfg = add_lines(
        cfg,
        """
[[apps]]
name = "extra"
cluster = "pool-a"
path = "extra"
wait = true
"""
        + extra,
        agent_lines='public_url = "https://gitops.example.com"',
    )
    return repo, tune(cfg)


def test_a_commit_produces_pending_then_success_or_failure_per_cluster_and_app_on_github_and_gitlab(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    ns = e2e.namespace("statuses")
    github, gitlab = _sink(e2e), _sink(e2e)
    token = secret_file(tmp_path, "gh-token", "ghp_token_of_the_test")
    gl_token = secret_file(tmp_path, "gl-token", "glpat-token-of-the-test")
    files = {
        "clusters/pool-a/app.yaml": configmaps(ns, "a", "a"),
        "clusters/pool-b/app.yaml": configmaps(ns, "b", "b"),
        "extra/app.yaml": configmaps(ns, "x", "x"),
    }
    repo, cfg = _app_config(
        tmp_path,
        cluster_pool,
        e2e,
        files,
        f"""
[[notifications]]
name = "github"
kind = "github"
api_url = "{github.url}"
repository = "acme/fleet"
token_file = "{token}"

[[notifications]]
name = "gitlab"
kind = "gitlab"
api_url = "{gitlab.url}"
repository = "group/sub/fleet"
token_file = "{gl_token}"
""",
    )
    daemons(cfg)
    sha1 = repo.commit(files, "second commit")  # the first poll may see either; wait for this one
    contexts = {f"{cfg.agent.name}/{c}" for c in ("pool-a/pool-a", "pool-b/pool-b", "pool-a/extra")}

    def states(sha: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for r in github.requests():
            if r.path.endswith(sha):
                out.setdefault(r.json["context"], []).append(r.json["state"])
        return out

    wait_for(
        "success everywhere", lambda: all(states(sha1).get(c, [])[-1:] == ["success"] for c in contexts), 60
    )
    assert states(sha1) == {c: ["pending", "success"] for c in contexts}
    r = next(r for r in github.requests() if r.path.endswith(sha1))
    assert r.path == f"/repos/acme/fleet/statuses/{sha1}"
    assert r.headers["authorization"] == "Bearer ghp_token_of_the_test"
    assert r.headers["accept"] == "application/vnd.github+json"
    assert r.headers["x-github-api-version"] == "2022-11-28"
    assert set(r.json) == {"state", "context", "description", "target_url"}
    extra = [
        x.json for x in github.requests() if x.path.endswith(sha1) and x.json["context"].endswith("/extra")
    ]
    assert extra[0]["target_url"] == "https://gitops.example.com/ui/clusters/pool-a/apps/extra"
    assert extra[0]["description"] == "applying to pool-a/extra"
    assert extra[1]["description"] == "rolled out on pool-a/extra"  # success only once rolled out
    # The next commit breaks pool-b's app: failure there, success elsewhere.
    sha2 = repo.commit({**files, "clusters/pool-b/app.yaml": BROKEN}, "break pool-b")
    wait_for(
        "statuses of the next commit",
        lambda: all(len(v) == 2 for v in states(sha2).values()) and len(states(sha2)) == 3,
        60,
    )
    got = states(sha2)
    assert got[f"{cfg.agent.name}/pool-b/pool-b"] == ["pending", "failure"]
    assert (
        got[f"{cfg.agent.name}/pool-a/pool-a"]
        == got[f"{cfg.agent.name}/pool-a/extra"]
        == ["pending", "success"]
    )
    failure = next(
        x.json for x in github.requests() if x.path.endswith(sha2) and x.json["state"] == "failure"
    )
    assert "app.yaml" in failure["description"] and len(failure["description"]) <= 140
    # GitLab: the same lifecycle in its words, on its API.
    wait_for("gitlab", lambda: len([x for x in gitlab.requests() if x.path.endswith(sha2)]) == 6, 30)
    gl = [x for x in gitlab.requests() if x.path.endswith(sha2)]
    assert {x.path for x in gl} == {f"/api/v4/projects/group%2Fsub%2Ffleet/statuses/{sha2}"}
    assert {x.headers["private-token"] for x in gl} == {"glpat-token-of-the-test"}
    assert sorted(x.json["state"] for x in gl if x.json["name"].endswith("pool-b/pool-b")) == [
        "failed",
        "pending",
    ]


def _metric(cfg_text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in cfg_text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def _passes(cfg: Config) -> float:
    """Successful passes of pool-b so far, from /metrics."""
    _, text = http(url(cfg, "/metrics"))
    return _metric(text, "gitops_agent_reconcile_total", cluster="pool-b", app="pool-b", result="success")


def test_a_sink_that_hangs_or_fails_never_slows_the_passes_retries_are_bounded_and_drops_are_counted(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a, b = cluster_pool["pool-a"], cluster_pool["pool-b"]
    ns = e2e.namespace("slow-sinks")
    stuck, down = _sink(e2e, "hang"), _sink(e2e, "fail")
    repo = make_repo(
        tmp_path, {"clusters/pool-a/app.yaml": BROKEN, "clusters/pool-b/app.yaml": configmaps(ns, "healthy")}
    )
    cfg = write_config(tmp_path, repo, {"pool-a": a, "pool-b": b})
    cfg = add_lines(
        cfg,
        f"""
[alerts]
after_failures = 1
remind = ["1s"]

[[notifications]]
name = "stuck"
kind = "webhook"
url = "{stuck.url}/hang"
timeout = "2s"
retries = 0
queue_size = 2

[[notifications]]
name = "down"
kind = "webhook"
url = "{down.url}/fail"
retries = 2
retry_backoff = "100ms"
""",
    )
    cfg = tune(cfg, defaults={"reconcile_interval": "1s"})
    daemon = daemons(cfg, **FAST)
    wait_for("the stuck sink holds a request", lambda: stuck.requests(), 30)
    passes_then = _passes(cfg)
    t0 = time.monotonic()
    wait_for(
        "the stuck sink's queue overflowing",
        lambda: daemon.notifier is not None and daemon.notifier.deliveries[0].counts["dropped"] >= 3,
        30,
    )
    elapsed = time.monotonic() - t0
    passes = _passes(cfg) - passes_then
    # A pass a second on the healthy cluster while a sink hangs: the schedule is kept.
    assert passes >= elapsed * 0.5 - 1, (passes, elapsed)
    durations = daemon.fleet.status["pool-b"].app("pool-b").last_result
    assert durations is not None and durations.started and durations.finished
    assert (durations.finished - durations.started).total_seconds() < 1.0
    # The drop counter counts, in /metrics as in /status.
    code, metrics = http(url(cfg, "/metrics"))
    dropped = _metric(metrics, "gitops_agent_notifications_total", sink="stuck", result="dropped")
    assert dropped >= 3
    sinks = {s["name"]: s for s in status(cfg)["notifications"]["sinks"]}
    assert sinks["stuck"]["dropped"] >= dropped and sinks["stuck"]["queued"] <= 2
    # The failing sink: each message tried 1 + retries times, then counted failed.
    repo.commit(
        {
            "clusters/pool-a/app.yaml": configmaps(ns, "fixed"),
            "clusters/pool-b/app.yaml": configmaps(ns, "healthy"),
        }
    )
    wait_for(
        "resolved reaches the failing sink",
        lambda: any(e["reason"] == "ReconcileSucceeded" for e in down.events()),
        30,
    )
    wait_for(
        "the failing sink idle",
        lambda: daemon.notifier is not None and daemon.notifier.deliveries[1].idle(),
        30,
    )
    failed = daemon.notifier.deliveries[1].counts["failed"]  # type: ignore[union-attr]
    assert failed >= 2 and len(down.requests()) == 3 * failed
    assert sinks["down"]["last_error"].endswith("HTTP 500")
    code, metrics = http(url(cfg, "/metrics"))
    assert _metric(metrics, "gitops_agent_notification_attempts_total", sink="down") == 3 * failed
    assert _metric(metrics, "gitops_agent_notifications_total", sink="down", result="failed") == failed
    code, _ = http(url(cfg, "/healthz"))
    assert code == 200


def test_secret_sentinels_of_the_config_never_appear_in_logs_events_notifications_or_status(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons, capsys: pytest.CaptureFixture[str]
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("secrets")
    slack, hook, gh = _sink(e2e, "fail"), _sink(e2e), _sink(e2e)
    sentinels = {
        "slack": "SENTINEL-SLACK-7f3a",
        "hmac": "SENTINEL-HMAC-91bc",
        "token": "SENTINEL-TOKEN-5d2e",
        "hook": "SENTINEL-HOOK-0a4f",
    }
    slack_url = secret_file(tmp_path, "slack-url", f"{slack.url}/services/{sentinels['slack']}")
    hmac_key = secret_file(tmp_path, "hmac", sentinels["hmac"])
    token = secret_file(tmp_path, "token", sentinels["token"])
    hook_secret = secret_file(tmp_path, "hook", sentinels["hook"])
    port = free_port()
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "one")})
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    cfg = add_lines(
        cfg,
        f"""
[alerts]
after_failures = 1
remind = ["1s"]

[[notifications]]
name = "slack"
kind = "slack"
url_file = "{slack_url}"
retries = 1
retry_backoff = "100ms"

[[notifications]]
name = "hook"
kind = "webhook"
url = "{hook.url}/events"
secret_file = "{hmac_key}"

[[notifications]]
name = "commits"
kind = "github"
api_url = "{gh.url}"
repository = "acme/fleet"
token_file = "{token}"

[receiver]
listen = "127.0.0.1:{port}"

[[receivers]]
name = "github"
kind = "github"
secret_file = "{hook_secret}"
""",
    )
    cfg = tune(cfg)
    daemons(cfg, **FAST)
    wait_for("a success status", lambda: any(r.json["state"] == "success" for r in gh.requests()), 60)
    repo.commit({"clusters/pool-a/app.yaml": BROKEN}, "break")
    wait_for("alerts tried on slack and sent on the hook", lambda: slack.requests() and hook.events(), 30)
    wait_for("slack failed", lambda: status(cfg)["notifications"]["sinks"][0]["failed"] >= 1, 30)
    # Requests signed with a wrong secret, and one carrying the sentinel itself as its signature.
    for sig in ("sha256=00", f"sha256={sentinels['hook']}"):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/hook/github",
            data=b"{}",
            headers={"X-Hub-Signature-256": sig, "X-GitHub-Event": "push", "X-GitHub-Delivery": "d1"},
            method="POST",
        )
        try:
            urllib.request.urlopen(req, timeout=5)
        except urllib.error.HTTPError as e:
            assert e.code == 401
    _, doc = http(url(cfg, "/status"))
    _, metrics = http(url(cfg, "/metrics"))
    client = KubeClient.from_config(cfg.cluster("pool-a"))
    try:
        events = json.dumps(list(events_for(client, cfg.agent.namespace, cfg.agent.name)))
    finally:
        client.close()
    logs = capsys.readouterr()
    sent = b"".join(r.raw + json.dumps(r.headers).encode() for s in (slack, hook, gh) for r in s.requests())
    places = {"/status": doc, "/metrics": metrics, "events": events, "logs": logs.err + logs.out}
    assert "notification failed" in places["logs"]  # the logs did speak of the failing sink
    for name, value in sentinels.items():
        for where, text in places.items():
            assert value not in text, f"the {name} secret appears in {where}"
        if name != "token":  # the token is what the GitHub API must receive, in its header
            assert value.encode() not in sent, f"the {name} secret appears in a notification"
    assert "slack" in doc and "127.0.0.1" in doc  # the sink is shown, by scheme and host only
