"""The webhook receiver of the running agent: Git hosts' pushes poll at once; everything else is
refused with the right status code and reconciles nothing (docs/notifications.md#webhook-receiver).

The repository is served over HTTP on loopback (``git http-backend``, ``tests/gitserver.py``),
standing for the Git host, which logs every request: a push that polls shows as a ref
advertisement there, a refused one as nothing. ``poll_interval = "1h"``: only pushes move the agent.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agent.notify import signing
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import Daemons, configmaps, free_port, http, status, tune, url
from tests.gitserver import GitHttpServer
from tests.sinkkit import add_lines, secret_file
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

SECRET, OLD = "current-hook-secret", "previous-hook-secret"


def post(port: int, hook: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/hook/{hook}", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def github_push(repo_url: str, ref: str = "refs/heads/main") -> bytes:
    return json.dumps({"ref": ref, "repository": {"clone_url": repo_url, "full_name": "acme/fleet"}}).encode()


def signed(body: bytes, delivery: str, secret: str = SECRET, event: str = "push") -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": signing.body_signature(secret.encode(), body),
    }


def _greeting(kubeconfig: Path, ns: str) -> str:
    return kubectl(
        kubeconfig, "get", "cm", "settings", "-n", ns, "-o", "jsonpath={.data.greeting}", check=False
    )


def test_a_signed_push_reconciles_at_once_and_every_bad_request_is_refused_with_its_code_reconciling_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("pushes")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "v0")})
    host = GitHttpServer(repo.path.parent, {}).start()
    e2e.at_end(host.stop)
    repo_url = host.url(repo.path.name)
    port = free_port()
    current, previous = secret_file(tmp_path, "hook", SECRET), secret_file(tmp_path, "old", OLD)
    gitlab_secret = secret_file(tmp_path, "gitlab", "gitlab-token")
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    Path(cfg.file).write_text(
        Path(cfg.file).read_text().replace(f'url = "{repo.path}"', f'url = "{repo_url}"')
    )
    cfg = add_lines(
        cfg,
        f"""
[receiver]
listen = "127.0.0.1:{port}"
max_body_bytes = 4096

[[receivers]]
name = "github"
kind = "github"
secret_file = "{current}"
previous_secret_file = "{previous}"

[[receivers]]
name = "flood"
kind = "github"
secret_file = "{current}"
rate_limit = 1
burst = 20

[[receivers]]
name = "gitlab"
kind = "gitlab"
secret_file = "{gitlab_secret}"
""",
    )
    cfg = tune(cfg, poll="1h")
    daemons(cfg)
    wait_for("the first commit applied", lambda: _greeting(a.kubeconfig, ns) == "v0", 60)

    # A push the agent could only learn of from the webhook (the next poll is an hour away).
    repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "v1")}, "v1")
    body = github_push(repo_url)
    assert post(port, "github", body, signed(body, "delivery-1")) == (
        202,
        {"result": "accepted", "sources": ["default"]},
    )
    wait_for("the pushed commit applied", lambda: _greeting(a.kubeconfig, ns) == "v1", 30)
    # A ping, and a push signed with the previous secret (rotation): accepted.
    assert post(port, "github", b"{}", signed(b"{}", "ping-1", event="ping"))[0] == 200
    assert post(port, "github", body, signed(body, "delivery-2", OLD))[0] == 202

    # From here on, nothing may reconcile: a commit is waiting, and the Git host logs every request.
    time.sleep(1)  # on purpose: the polls the accepted pushes asked for are over
    sha2 = repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "v2")}, "v2")
    seen = len(host.requests)
    sha1_body = github_push(repo_url)
    sha1 = {k: v for k, v in signed(sha1_body, "x").items() if k != "X-Hub-Signature-256"}
    refusals = {
        "wrong signature": (post(port, "github", body, signed(body, "d-3", "guessed")), 401),
        "no signature": (post(port, "github", body, {**sha1, "X-GitHub-Delivery": "d-4"}), 401),
        "SHA-1 when not allowed": (
            post(
                port,
                "github",
                body,
                {
                    **sha1,
                    "X-GitHub-Delivery": "d-5",
                    "X-Hub-Signature": f"sha1={signing.hexdigest(SECRET.encode(), body, 'sha1')}",
                },
            ),
            401,
        ),
        "replayed delivery id": (post(port, "github", body, signed(body, "delivery-1")), 409),
        "no delivery id": (post(port, "github", body, {**signed(body, ""), "X-GitHub-Delivery": ""}), 400),
        "wrong branch": (
            post(port, "github", (b := github_push(repo_url, "refs/heads/dev")), signed(b, "d-6")),
            200,
        ),
        "another repository": (
            post(port, "github", (o := github_push(repo_url.replace("fleet", "other"))), signed(o, "d-7")),
            200,
        ),
        "gitlab, wrong token": (
            post(port, "gitlab", body, {"X-Gitlab-Token": "guessed", "X-Gitlab-Event": "Push Hook"}),
            401,
        ),
        "unknown hook": (post(port, "nope", body, signed(body, "d-8")), 404),
    }
    for what, ((code, doc), expected) in refusals.items():
        assert code == expected, f"{what}: {code} {doc}"
    assert refusals["wrong branch"][0][1]["result"] == "ignored"
    # An oversized body is refused from its Content-Length, before it is read: the agent answers
    # while the client has sent one byte in a million of it.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            b"POST /hook/github HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"X-GitHub-Event: push\r\nContent-Length: 100000000\r\n\r\n{"
        )
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # A flood of unsigned requests is refused for its signature, and never uses up the hook's own
    # rate limit (charged only once a signature verifies): the hook still takes its 20-request
    # burst of signed deliveries (pings here, so nothing polls), and throttles what follows.
    codes: dict[int, int] = {}
    started = time.monotonic()
    for i in range(50):
        code, _ = post(port, "flood", body, signed(body, f"flood-{i}", "guessed"))
        codes[code] = codes.get(code, 0) + 1
    assert codes == {401: 50}, codes
    for i in range(25):
        code, _ = post(port, "flood", b"{}", signed(b"{}", f"ping-{i}", event="ping"))
        codes[code] = codes.get(code, 0) + 1
    burst_seconds = time.monotonic() - started
    assert burst_seconds < 60  # the bucket refills one request a minute
    assert codes == {401: 50, 200: 20, 429: 5}, codes
    print(f"\nMEASURED 50 unsigned then 25 signed requests to one hook in {burst_seconds:.2f}s: {codes}")

    # Nothing reconciled: the Git host was not asked anything, the cluster still holds v1.
    time.sleep(2)  # on purpose: a poll asked for by mistake would have reached the Git host by now
    assert len(host.requests) == seen, [r.path for r in host.requests[seen:]]
    assert _greeting(a.kubeconfig, ns) == "v1"
    code, _ = http(url(cfg, "/healthz"))
    assert code == 200
    answers = {r["name"]: r["answers"] for r in status(cfg)["receiver"]["receivers"]}
    assert answers["flood"] == {"200": 20, "401": 50, "429": 5}
    assert answers["github"]["202"] == 2 and answers["github"]["401"] == 3 and answers["github"]["413"] == 1
    # And the receiver still works: the waiting commit goes in with the next signed push.
    assert post(port, "github", body, signed(body, "delivery-9"))[0] == 202
    wait_for("v2 applied", lambda: _greeting(a.kubeconfig, ns) == "v2", 30)
    assert status(cfg)["revision"] == sha2
