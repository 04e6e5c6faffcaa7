"""The source stage against a real Git HTTP server on loopback (git http-backend behind basic auth)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gitserver import (  # noqa: F401  (fixtures)
    USERS,
    GitHttpServer,
    HangingServer,
    Origin,
    free_port,
    hanging_server_fixture,
    http_server_fixture,
    make_source,
    origin_fixture,
)

from agent.config.types import SourceAuth
from agent.errors import SourceError
from agent.source.auth import mask_url, scrub

PASSWORD = USERS["alice"]


def password_file(tmp_path: Path, secret: str = PASSWORD) -> str:
    path = tmp_path / "git-password"
    path.write_text(secret + "\n")
    return str(path)


def test_right_credentials_from_a_file_fetch_the_branch(
    origin: Origin, http_server: GitHttpServer, tmp_path: Path
) -> None:
    auth = SourceAuth(username="alice", password_file=password_file(tmp_path))
    source, _ = make_source(http_server.url(), tmp_path / "cache", auth=auth)
    rev = source.poll()
    assert rev.sha == origin.head()
    assert (rev.tree / "apps" / "app.yaml").is_file()
    assert {r.user for r in http_server.requests if r.status == 200} == {"alice"}


def test_a_token_from_the_environment_authenticates(
    origin: Origin, http_server: GitHttpServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_TOKEN_FOR_TEST", PASSWORD)
    auth = SourceAuth(username="alice", token_env="GIT_TOKEN_FOR_TEST")
    source, _ = make_source(http_server.url(), tmp_path / "cache", auth=auth)
    assert source.poll().sha == origin.head()


def test_a_poll_with_no_new_commits_makes_no_fetch_request(
    origin: Origin, http_server: GitHttpServer, tmp_path: Path
) -> None:
    auth = SourceAuth(username="alice", password_file=password_file(tmp_path))
    source, _ = make_source(http_server.url(), tmp_path / "cache", auth=auth)
    source.poll()
    assert len(http_server.fetches()) == 1
    advertised = len([r for r in http_server.requests if r.path.endswith("/info/refs")])
    source.poll()
    source.poll()
    assert source.fetch_count == 1
    assert len(http_server.fetches()) == 1  # no POST git-upload-pack: nothing was fetched
    assert (
        len([r for r in http_server.requests if r.path.endswith("/info/refs")]) > advertised
    )  # ls-remote ran

    new = origin.commit({"apps/app.yaml": "kind: Secret\n"}, "update")
    assert source.poll().sha == new
    assert source.fetch_count == 2 and len(http_server.fetches()) == 2


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("wrong-password", "credentials were refused"),
        ("no-credentials", "requires authentication but none is configured"),
        ("password-in-url", "refused the credentials in the URL"),
    ],
)
def test_bad_credentials_give_a_clear_error_that_never_shows_the_secret(
    origin: Origin, http_server: GitHttpServer, tmp_path: Path, how: str, reason: str
) -> None:
    wrong = "WrongHorseBattery-42"
    url, auth = http_server.url(), SourceAuth()
    if how == "wrong-password":
        auth = SourceAuth(username="alice", password_file=password_file(tmp_path, wrong))
    elif how == "password-in-url":
        url = url.replace("http://", f"http://alice:{wrong}@")
    source, log = make_source(url, tmp_path / "cache", auth=auth)
    with pytest.raises(SourceError, match=f"authentication failed: (the server )?{reason}") as err:
        source.poll()
    assert not err.value.retryable
    for text in (str(err.value), repr(err.value), err.value.url, log.text(), repr(source.config.auth)):
        assert wrong not in text and PASSWORD not in text
    assert source.last_good is None


def test_credentials_in_the_url_work_and_are_masked(
    origin: Origin, http_server: GitHttpServer, tmp_path: Path
) -> None:
    url = http_server.url().replace("http://", f"http://alice:{PASSWORD}@")
    source, log = make_source(url, tmp_path / "cache")
    assert source.poll().sha == origin.head()
    assert PASSWORD not in log.text()
    assert source.masked_url == f"http://***@127.0.0.1:{http_server.port}/origin.git"
    assert PASSWORD not in str(source.repo_dir)


def test_rotated_credentials_that_are_refused_keep_the_last_good_revision(
    origin: Origin, http_server: GitHttpServer, tmp_path: Path
) -> None:
    secret = password_file(tmp_path)
    source, _ = make_source(
        http_server.url(), tmp_path / "cache", auth=SourceAuth(username="alice", password_file=secret)
    )
    good = source.poll()
    Path(secret).write_text("revoked")
    with pytest.raises(SourceError, match="authentication failed"):
        source.poll()
    assert source.last_good == good and good.tree.is_dir()


def test_an_unreachable_server_keeps_the_last_good_revision(
    origin: Origin, http_server: GitHttpServer, tmp_path: Path
) -> None:
    auth = SourceAuth(username="alice", password_file=password_file(tmp_path))
    source, _ = make_source(http_server.url(), tmp_path / "cache", auth=auth)
    good = source.poll()
    http_server.stop()
    with pytest.raises(SourceError, match="cannot reach the repository") as err:
        source.poll()
    assert err.value.retryable
    assert source.last_good == good


def test_a_refused_connection_is_reported_as_unreachable(tmp_path: Path) -> None:
    source, _ = make_source(f"http://127.0.0.1:{free_port()}/repo.git", tmp_path / "cache")
    with pytest.raises(SourceError, match="cannot reach the repository") as err:
        source.poll()
    assert err.value.retryable and source.last_good is None


def test_a_hung_server_cannot_hang_the_poll(hanging_server: HangingServer, tmp_path: Path) -> None:
    source, _ = make_source(
        f"http://127.0.0.1:{hanging_server.port}/repo.git", tmp_path / "cache", timeout=1.5
    )
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"timed out|cannot reach"):
        source.poll()
    assert time.monotonic() - started < 10


def test_a_hung_ssh_server_is_cut_off_by_killing_the_helper(
    hanging_server: HangingServer, tmp_path: Path
) -> None:
    """libgit2's own timeouts do not cover libssh2's handshake: the killed child process does."""
    url = f"ssh://git@127.0.0.1:{hanging_server.port}/repo.git"
    source, _ = make_source(url, tmp_path / "cache", timeout=1.5)
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"git ls-remote timed out after 1\.5s") as err:
        source.poll()
    assert err.value.retryable
    assert time.monotonic() - started < 10


def test_a_shallow_fetch_over_http(origin: Origin, http_server: GitHttpServer, tmp_path: Path) -> None:
    origin.commit({"b": "2"}, "second")
    auth = SourceAuth(username="alice", password_file=password_file(tmp_path))
    source, _ = make_source(http_server.url(), tmp_path / "cache", auth=auth, shallow=True)
    rev = source.poll()
    assert rev.sha == origin.head()
    assert (source.repo_dir / "shallow").read_text().strip() == rev.sha
    newer = origin.commit({"c": "3"}, "third")
    assert source.poll().sha == newer


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("https://user:pw@git.example.com/org/repo.git", "https://***@git.example.com/org/repo.git"),
        ("https://ghp_token@git.example.com/r.git", "https://***@git.example.com/r.git"),
        ("https://git.example.com/r.git?private_token=abc", "https://git.example.com/r.git?***"),
        ("ssh://git:pw@host:2222/r.git", "ssh://git:***@host:2222/r.git"),
        ("ssh://git@host/r.git", "ssh://git@host/r.git"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
        ("/srv/git/repo.git", "/srv/git/repo.git"),
        ("file:///srv/git/repo.git", "file:///srv/git/repo.git"),
    ],
)
def test_mask_url_removes_credentials(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_scrub_removes_secrets_and_url_userinfo() -> None:
    text = "fetch https://bob:hunter2@h/r.git failed; token hunter2 rejected"
    assert scrub(text, secrets=("hunter2",)) == "fetch https://***@h/r.git failed; token *** rejected"


def test_a_shallow_source_pinned_to_an_old_commit_fetches_the_history_it_needs(
    origin: Origin, http_server: GitHttpServer, tmp_path: Path
) -> None:
    old = origin.head()
    for i in range(3):
        origin.commit({"n": str(i)}, f"later {i}")
    auth = SourceAuth(username="alice", password_file=password_file(tmp_path))
    source, _ = make_source(http_server.url(), tmp_path / "cache", auth=auth, shallow=True, commit=old[:10])
    assert source.poll().sha == old
