"""Generated HTTP requests against the running agent's two listeners: each answered (2xx, 3xx or 4xx;
501 for a method HTTP servers do not know), no traceback, the listeners stay up, and no request
without a valid signature starts a poll or a pass (docs/reliability.md, "Fuzzing").

The daemon is the real one (``tests/daemonkit.py``) on ``pool-a``, with its main listener
(``/healthz``, ``/readyz``, ``/metrics``, ``/status``, ``/sync``, the status page under ``/ui/``)
and the webhook receiver (GitHub, GitLab and generic hooks). Requests are written byte by byte on
a socket, so they can be malformed: any method and path (traversal, huge, control characters),
query strings, headers (repeated, huge, lying ``Content-Length``, chunked), bodies, and the hooks'
signature headers signed with a wrong secret or garbled. The client closes its side after
sending, so a ``Content-Length`` longer than the body is seen as a short body, at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.notify import signing
from agent.run.record_store import FileStore
from agent.run.server import HealthServer, Metrics
from agent.run.status import ClusterStatus
from agent.run.statuspage import ClusterSnapshot, Snapshot, StatusPage
from agent.ui import auth
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool
from tests.daemonkit import Daemons, configmaps, free_port, http, tune, url
from tests.fuzzkit import bounded, fuzz_settings
from tests.sinkkit import add_lines, secret_file
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

EXAMPLES = 200
SECRET = "the-real-hook-secret"
HOOKS = ("github", "gitlab", "generic")

MAIN_PATHS = [
    "/healthz",
    "/readyz",
    "/metrics",
    "/status",
    "/sync",
    "/",
    "/ui",
    "/ui/",
    "/ui/login",
    "/ui/logout",
]
MAIN_PATHS += ["/ui/static/app.css", "/ui/app/pool-a/clusters", "/ui/cluster/pool-a", "/ui/static/"]
TRAVERSAL = [
    "/ui/static/../../../../etc/passwd",
    "/ui/static/..%2f..%2f..%2fetc%2fpasswd",
    "/ui/static/%2e%2e/%2e%2e/etc/passwd",
    "/ui/../../etc/passwd",
    "/hook/../healthz",
    "/hook/github/../../status",
    "/hook/%2e%2e/github",
    "//etc/passwd",
    "/ui/static/....//....//etc/passwd",
    "/ui/static/%00",
    "/ui/static/\\..\\..\\etc\\passwd",
]


def raw_request(method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode("utf-8", "surrogateescape") + b"\r\n" + body


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """(which listener, the request's bytes, a short description)."""
    listener = draw(st.sampled_from(["main", "receiver"]))
    hook_paths = [f"/hook/{h}" for h in HOOKS] + ["/hook/", "/hook/nope", "/hook/GITHUB", "/hook"]
    path = draw(
        st.one_of(
            st.sampled_from(MAIN_PATHS if listener == "main" else hook_paths),
            st.sampled_from(TRAVERSAL),
            st.builds(lambda n: "/" + "a" * n, st.sampled_from([1000, 8000, 70_000])),
            st.builds(lambda n: "/ui/" + "%2e%2e/" * n, st.integers(1, 500)),
            st.text(max_size=40).map(lambda t: "/" + t),
        )
    )
    query = draw(
        st.one_of(
            st.just(""),
            st.sampled_from(
                ["?cluster=", "?cluster=nope", "?cluster=pool-a&app=nope", "?app=x", "?cluster=%00"]
            ),
            st.sampled_from(["?cluster=" + "x" * 5000, "?next=//evil.example", "?a=1&a=2&a=3", "?%zz", "?="]),
            st.text(max_size=30).map(lambda t: "?" + t),
        )
    )
    # /sync for the served cluster is a legitimate request for a pass: never generated.
    if path == "/sync" and re.search(r"cluster=pool-a(&|$)", query) and "app=" not in query:
        query = "?cluster=nope"
    others = ["HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "FOO", "get", "G ET"]
    method = draw(st.sampled_from(["GET", "POST"] * 4 + others))
    body = draw(
        st.one_of(
            st.binary(max_size=200),
            st.sampled_from([b"", b"{}", b"[]", b"null", b'{"ref": 1}', b"\xff\xfe", b"{" * 5000]),
            st.builds(
                lambda ref, repo: json.dumps({"ref": ref, "repository": {"clone_url": repo}}).encode(),
                st.sampled_from(["refs/heads/main", "refs/tags/v1", "", "x" * 300]),
                st.sampled_from(["/tmp/x", "https://example.com/a.git", ""]),
            ),
        )
    )
    headers: list[tuple[str, str]] = []
    length = draw(
        st.sampled_from(["exact", "exact", "missing", "short", "long", "abc", "-1", "huge", "two", " 5"])
    )
    if listener == "main" and draw(st.integers(0, 3)) == 0:
        path = draw(st.sampled_from(["/ui/", "/ui/login", "/", "/ui"]))  # the page reads POST bodies
    if length != "missing":
        headers.append(
            (
                "Content-Length",
                {
                    "exact": str(len(body)),
                    "short": str(max(0, len(body) - 3)),
                    "long": str(len(body) + 50),
                    "abc": "abc",
                    "-1": "-1",
                    "huge": "9" * 30,
                    "two": f"{len(body)}, {len(body)}",
                    " 5": " 5",
                }[length],
            )
        )
    if draw(st.booleans()):
        headers.append(("Transfer-Encoding", draw(st.sampled_from(["chunked", "gzip", "identity", "x"]))))
    headers += draw(signatures(body))
    headers += draw(
        st.lists(
            st.tuples(
                st.sampled_from(
                    ["X-Forwarded-For", "Cookie", "Authorization", "Content-Type", "X-Junk", "Expect"]
                ),
                st.one_of(st.text(max_size=30), st.sampled_from(["100-continue", "Bearer x", "a" * 9000])),
            ),
            max_size=3,
        )
    )
    if draw(st.integers(0, 20)) == 0:
        headers += [(f"X-H{i}", "v") for i in range(150)]  # more headers than the server allows
    safe = [(k, v.replace("\r", " ").replace("\n", " ")) for k, v in headers]
    what = f"{listener} {method} {(path + query)[:120]!r} len={length} body={len(body)}B"
    return listener, raw_request(method, path + query, safe, body), what


@st.composite
def signatures(draw: st.DrawFn, body: bytes) -> list[tuple[str, str]]:
    """Each hook's signature headers, never valid: a wrong secret, garbled, stale or missing."""
    wrong = draw(st.sampled_from(["guessed", SECRET + "x", "", SECRET.upper()]))
    stamp = str(int(time.time()) + draw(st.sampled_from([0, -10_000, 10_000])))
    sig_hex = hmac.new(wrong.encode(), body, hashlib.sha256).hexdigest()
    options: list[tuple[str, str]] = [
        (
            "X-Hub-Signature-256",
            draw(
                st.sampled_from(
                    [signing.body_signature(wrong.encode(), body), "sha256=", "sha256=zz", sig_hex, "md5=1"]
                )
            ),
        ),
        ("X-Hub-Signature", "sha1=" + hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()),
        ("X-Gitlab-Token", draw(st.sampled_from([wrong, " " + SECRET, SECRET + " ", SECRET[:-1]]))),
        ("X-Gitops-Timestamp", stamp),
        (
            "X-Gitops-Signature",
            "sha256=" + hmac.new(wrong.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest(),
        ),
        ("X-GitHub-Event", draw(st.sampled_from(["push", "ping", "issues", ""]))),
        ("X-Gitlab-Event", draw(st.sampled_from(["Push Hook", "Tag Push Hook", "x"]))),
        ("X-GitHub-Delivery", draw(st.sampled_from(["d-1", "", "x" * 500]))),
        ("X-Gitlab-Event-UUID", "u-1"),
        ("X-Gitops-Delivery", "g-1"),
    ]
    return draw(st.lists(st.sampled_from(options), max_size=6, unique_by=lambda h: h[0]))


def send(port: int, data: bytes, *, timeout: float = 10.0) -> int | None:
    """The status code the listener answers ``data`` with (None: closed without an answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # it answered and closed before reading everything (413, 431): read that answer
        got = b""
        try:
            while len(got) < 1 << 20 and (chunk := s.recv(65536)):
                got += chunk
        except ConnectionResetError:
            pass
    while (m := re.match(rb"HTTP/1\.[01] (\d{3}) ", got)) and m.group(1).startswith(b"1"):
        got = got.partition(b"\r\n\r\n")[2]  # "100 Continue" (Expect): the final answer follows
    return int(m.group(1)) if m else None


def counters(metrics: str) -> dict[str, float]:
    """What would move if a poll or a pass ran, or a push was accepted."""
    wanted = {
        "passes": "gitops_agent_reconcile_total",
        "polls": "gitops_agent_source_fetch_duration_seconds_count",
        "accepted": 'gitops_agent_webhook_requests_total{code="202"',
    }
    out = dict.fromkeys(wanted, 0.0)
    for line in metrics.splitlines():
        for name, prefix in wanted.items():
            if line.startswith(prefix):
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def test_generated_requests_to_both_listeners_are_answered_without_traceback_and_start_nothing(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, daemons: Daemons, capfd: pytest.CaptureFixture[str]
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("fuzz-http")
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "v0")})
    port = free_port()
    hook = secret_file(tmp_path, "hook", SECRET)
    cfg = write_config(tmp_path, repo, {"pool-a": a}, defaults='reconcile_interval = "1h"')
    tables = [f'[receiver]\nlisten = "127.0.0.1:{port}"\nrate_limit = 1000000\nburst = 1000000\n']
    limits = "rate_limit = 1000000\nburst = 1000000\n"
    tables += [f'[[receivers]]\nname = "{h}"\nkind = "{h}"\nsecret_file = "{hook}"\n{limits}' for h in HOOKS]
    cfg = tune(add_lines(cfg, "\n".join(tables)), poll="1h")
    daemons(cfg)
    main = int(cfg.agent.listen.rsplit(":", 1)[1])
    wait_for("the first pass", lambda: counters(http(url(cfg, "/metrics"))[1])["passes"] >= 1, 60)
    time.sleep(0.5)  # on purpose: the first pass's own metrics settle before the baseline
    before = counters(http(url(cfg, "/metrics"))[1])
    capfd.readouterr()
    answered: dict[int | None, int] = {}

    @fuzz_settings(EXAMPLES)
    @given(requests())
    def one(req: tuple[str, bytes, str]) -> None:
        listener, data, what = req
        with bounded(what, seconds=15.0, peak_bytes=64 << 20, trace=False):
            code = send(main if listener == "main" else port, data)
        answered[code] = answered.get(code, 0) + 1
        assert code is not None, f"{what}: no answer"
        assert 200 <= code < 500 or code == 501 or (code == 503 and b"/readyz" in data[:200]), (
            f"{what}: {code}"
        )

    one()
    assert http(url(cfg, "/healthz")) == (200, "ok\n")
    assert send(port, raw_request("GET", "/hook/github", [], b"")) == 405, "the receiver is down"
    after = counters(http(url(cfg, "/metrics"))[1])
    assert after == before, f"a request started something: {before} -> {after}"
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    assert len(answered) > 5, answered  # a spread of answers, not one refusal for everything


@pytest.mark.parametrize("length", ["abc", "5, 5", "9" * 30 + "x"])
def test_a_status_page_post_with_a_content_length_that_is_not_a_number_is_answered_400(
    tmp_path: Path, length: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Found by the fuzzer: ``int()`` raised ValueError in the handler, which printed a traceback
    and dropped the connection without an answer."""
    snap = Snapshot("agent", (ClusterSnapshot("prod", ClusterStatus("prod")),))
    page = StatusPage(lambda: snap, FileStore(tmp_path), access=auth.Access.OPEN)
    server = HealthServer(
        f"127.0.0.1:{free_port()}",
        metrics=Metrics(),
        last_tick=time.monotonic,
        ready=lambda: None,
        status=dict,
        page=page,
    )
    server.start()
    try:
        assert (
            send(server.port, raw_request("POST", "/ui/login", [("Content-Length", length)], b"token=x"))
            == 400
        )
        assert send(server.port, raw_request("GET", "/healthz", [], b"")) == 200
    finally:
        server.stop()
    assert "Traceback" not in capfd.readouterr().err
