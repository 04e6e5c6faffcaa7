"""SSH transport against a real loopback sshd: host keys from a configured known_hosts, key authentication."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gitserver import Origin, SshServer, make_source, origin_fixture, ssh_server_fixture  # noqa: F401  (fixtures)

from agent.config.types import SourceAuth
from agent.errors import SourceError
from agent.source.auth import is_ssh_url, load_credentials


def ssh_keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def known_hosts(tmp_path: Path, text: str) -> str:
    path = tmp_path / "known_hosts"
    path.write_text(text)
    return str(path)


def test_a_known_host_and_an_authorized_key_fetch_the_branch(
    origin: Origin, ssh_server: SshServer, tmp_path: Path
) -> None:
    auth = SourceAuth(
        ssh_private_key_file=str(ssh_server.client_key),
        ssh_known_hosts_file=known_hosts(tmp_path, ssh_server.known_hosts_line()),
    )
    source, _ = make_source(ssh_server.url(origin.bare), tmp_path / "cache", auth=auth)
    rev = source.poll()
    assert rev.sha == origin.head()
    assert source.poll() == rev and source.fetch_count == 1
    new = origin.commit({"a": "1"}, "over ssh")
    assert source.poll().sha == new


@pytest.mark.parametrize("hosts", ["empty", "other-host", "changed-key"])
def test_an_unknown_or_changed_host_key_is_refused(
    origin: Origin, ssh_server: SshServer, tmp_path: Path, hosts: str
) -> None:
    line = ssh_server.known_hosts_line()
    if hosts == "empty":
        text = ""
    elif hosts == "other-host":
        text = line.replace("[127.0.0.1]", "[192.0.2.1]")
    else:  # the right host, another key: what a man-in-the-middle (or a re-installed server) shows
        other = ssh_keygen(tmp_path / "other_host_key")
        text = f"[127.0.0.1]:{ssh_server.port} ssh-ed25519 {Path(f'{other}.pub').read_text().split()[1]}\n"
    auth = SourceAuth(
        ssh_private_key_file=str(ssh_server.client_key), ssh_known_hosts_file=known_hosts(tmp_path, text)
    )
    source, _ = make_source(ssh_server.url(origin.bare), tmp_path / "cache", auth=auth)
    with pytest.raises(
        SourceError, match=r"SSH host key of 127\.0\.0\.1 is unknown or does not match"
    ) as err:
        source.poll()
    assert not err.value.retryable
    assert Path(auth.ssh_known_hosts_file).read_text() == text  # never trust on first use: nothing was added


def test_without_a_known_hosts_file_every_host_is_refused(
    origin: Origin, ssh_server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh/known_hosts to fall back on
    auth = SourceAuth(ssh_private_key_file=str(ssh_server.client_key))
    source, _ = make_source(ssh_server.url(origin.bare), tmp_path / "cache", auth=auth)
    with pytest.raises(SourceError, match="no known_hosts file configured"):
        source.poll()


def test_a_key_the_server_does_not_know_is_an_authentication_error(
    origin: Origin, ssh_server: SshServer, tmp_path: Path
) -> None:
    stranger = ssh_keygen(tmp_path / "stranger")
    auth = SourceAuth(
        ssh_private_key_file=str(stranger),
        ssh_known_hosts_file=known_hosts(tmp_path, ssh_server.known_hosts_line()),
    )
    source, _ = make_source(ssh_server.url(origin.bare), tmp_path / "cache", auth=auth)
    with pytest.raises(SourceError, match="authentication failed") as err:
        source.poll()
    assert not err.value.retryable


@pytest.mark.parametrize(
    ("url", "ssh"),
    [
        ("ssh://git@h/r.git", True),
        ("git@github.com:o/r.git", True),
        ("https://h/r.git", False),
        ("/srv/r.git", False),
        ("file:///srv/r.git", False),
    ],
)
def test_ssh_urls_are_recognised(url: str, ssh: bool) -> None:
    assert is_ssh_url(url) is ssh


def test_a_missing_private_key_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="ssh_private_key_file not found"):
        load_credentials(SourceAuth(ssh_private_key_file=str(tmp_path / "nope")), "ssh://git@h/r.git")
