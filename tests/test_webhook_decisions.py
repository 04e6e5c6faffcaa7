"""The webhook receiver's decisions, pure: signatures (constant-time, two secrets, SHA-1 only when
allowed), which source a push concerns, rate limits, replays (agent/run/webhooks.py)."""

from __future__ import annotations

import json

from agent.config.types import HookKind, SourceConfig
from agent.notify import signing
from agent.run import webhooks
from agent.run.webhooks import Push, Rejection, ReplayCache, TokenBucket

BODY = b'{"ref": "refs/heads/main"}'


def github(secret: str, body: bytes = BODY) -> dict[str, str]:
    return {"X-Hub-Signature-256": signing.body_signature(secret.encode(), body)}


def test_github_signatures_verify_with_the_current_or_the_previous_secret_and_nothing_else() -> None:
    for secret in ("new", "old"):
        assert webhooks.verify(HookKind.GITHUB, github(secret), BODY, ["new", "old"]).rejection is None
    for headers in (github("other"), github("new", b"tampered"), {}):
        assert webhooks.verify(HookKind.GITHUB, headers, BODY, ["new", "old"]).rejection is Rejection.UNSIGNED
    # Header names in any case (HTTP).
    lower = {k.lower(): v for k, v in github("new").items()}
    assert webhooks.verify(HookKind.GITHUB, lower, BODY, ["new"]).rejection is None


def test_a_sha1_signature_is_refused_unless_explicitly_allowed() -> None:
    sha1 = {"X-Hub-Signature": "sha1=" + signing.hexdigest(b"s", BODY, "sha1")}
    refused = webhooks.verify(HookKind.GITHUB, sha1, BODY, ["s"])
    assert refused.rejection is Rejection.UNSIGNED and "SHA-1" in refused.why
    assert webhooks.verify(HookKind.GITHUB, sha1, BODY, ["s"], allow_sha1=True).rejection is None


def test_gitlab_tokens_and_generic_timestamped_signatures() -> None:
    assert webhooks.verify(HookKind.GITLAB, {"X-Gitlab-Token": "t"}, BODY, ["t"]).rejection is None
    assert (
        webhooks.verify(HookKind.GITLAB, {"X-Gitlab-Token": "x"}, BODY, ["t"]).rejection is Rejection.UNSIGNED
    )
    ts = "1000"
    headers = {
        signing.TIMESTAMP: ts,
        signing.TIMESTAMPED_SIGNATURE: signing.timestamped_signature(b"k", ts, BODY),
    }
    assert webhooks.verify(HookKind.GENERIC, headers, BODY, ["k"], now=1100.0).rejection is None
    stale = webhooks.verify(HookKind.GENERIC, headers, BODY, ["k"], now=2000.0, tolerance=300)
    assert stale.rejection is Rejection.UNSIGNED


def test_a_push_concerns_the_sources_of_that_repository_and_ref_only() -> None:
    sources = {
        "fleet": SourceConfig(url="git@github.com:Acme/fleet.git", branch="main"),
        "tagged": SourceConfig(url="https://github.com/acme/fleet", tag="v1"),
        "pinned": SourceConfig(url="https://github.com/acme/fleet", commit="abcdef1"),
        "other": SourceConfig(url="https://github.com/acme/other.git", branch="main"),
    }
    urls = ("https://github.com/acme/fleet.git", "git@github.com:acme/fleet.git")
    assert webhooks.concerned(Push(urls, "refs/heads/main"), sources) == ["fleet"]
    assert webhooks.concerned(Push(urls, "refs/tags/v1"), sources) == ["tagged"]
    assert webhooks.concerned(Push(urls, "refs/heads/dev"), sources) == []
    assert webhooks.concerned(Push(urls, "refs/heads/main", deleted=True), sources) == []


def test_github_and_gitlab_push_bodies_are_read_for_their_repository_and_ref() -> None:
    gh = {
        "ref": "refs/heads/main",
        "repository": {"clone_url": "https://h/a/b.git", "ssh_url": "git@h:a/b.git"},
    }
    assert webhooks.parse(HookKind.GITHUB, json.dumps(gh).encode()) == Push(
        ("https://h/a/b.git", "git@h:a/b.git"), "refs/heads/main"
    )
    gl = {"ref": "refs/heads/main", "after": "0" * 40, "project": {"git_http_url": "https://h/g/p.git"}}
    assert webhooks.parse(HookKind.GITLAB, json.dumps(gl).encode()).deleted
    for body in (b"nope", b"[]", b'{"repository": {}}', b"[" * 100_000):  # the last: RecursionError
        try:
            webhooks.parse(HookKind.GITHUB, body)
        except ValueError:
            continue
        raise AssertionError(f"{body!r} parsed")


def test_a_token_bucket_lets_its_burst_through_then_one_request_per_refill() -> None:
    now = [0.0]
    bucket = TokenBucket(60, 3, clock=lambda: now[0])
    assert [bucket.take() is None for _ in range(4)] == [True, True, True, False]
    now[0] = 1.0
    assert bucket.take() is None and bucket.take() is not None


def test_a_delivery_id_is_accepted_once_within_the_window() -> None:
    now = [0.0]
    cache = ReplayCache(10.0, clock=lambda: now[0], cap=2)
    assert cache.first("a") and not cache.first("a")
    now[0] = 11.0
    assert cache.first("a")  # forgotten after the window
    assert cache.first("b") and cache.first("c") and cache.first("a")  # the cap forgets the oldest
