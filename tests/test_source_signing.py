"""Commit signature verification: SSH (allowed signers) and GPG (isolated keyring), accept and refuse."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitserver import Origin, make_source, origin_fixture  # noqa: F401  (fixture)

from agent.config.types import SourceVerify
from agent.errors import SourceError


def ssh_key(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)
    return path


def ssh_signing(origin: Origin, key: Path) -> None:
    origin.signing = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}.pub"]


@pytest.fixture
def trusted_key(tmp_path: Path) -> tuple[Path, Path]:
    """A signing key and an allowed-signers file that lists it for the commit's e-mail."""
    key = ssh_key(tmp_path / "signer")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'ada@example.com namespaces="git" {Path(f"{key}.pub").read_text().strip()}\n')
    return key, allowed


def test_an_ssh_signed_commit_by_an_allowed_signer_is_accepted(
    origin: Origin, tmp_path: Path, trusted_key: tuple[Path, Path]
) -> None:
    key, allowed = trusted_key
    ssh_signing(origin, key)
    signed = origin.commit({"a": "1"}, "signed", sign=True)
    source, log = make_source(
        origin.url, tmp_path / "cache", verify=SourceVerify(allowed_signers_file=str(allowed))
    )
    assert source.poll().sha == signed
    assert log.named("source.signature_verified") == [
        {"sha": signed, "method": "ssh", "signer": "ada@example.com"}
    ]


def test_unsigned_and_untrusted_commits_are_refused_and_the_verified_revision_stays(
    origin: Origin, tmp_path: Path, trusted_key: tuple[Path, Path]
) -> None:
    key, allowed = trusted_key
    ssh_signing(origin, key)
    origin.commit({"a": "1"}, "signed", sign=True)
    source, _ = make_source(
        origin.url, tmp_path / "cache", verify=SourceVerify(allowed_signers_file=str(allowed))
    )
    verified = source.poll()

    unsigned = origin.commit({"a": "2"}, "unsigned")
    with pytest.raises(SourceError, match="is not signed") as err:
        source.poll()
    assert not err.value.retryable
    assert source.last_good == verified
    assert not (source.checkouts / unsigned).exists()
    with pytest.raises(SourceError, match="is not signed"):
        source.poll()  # refused again, without a new fetch
    assert source.fetch_count == 2

    ssh_signing(origin, ssh_key(tmp_path / "stranger"))
    origin.commit({"a": "3"}, "signed by a stranger", sign=True)
    with pytest.raises(SourceError, match=r"not in .*allowed_signers"):
        source.poll()
    assert source.last_good == verified

    ssh_signing(origin, key)
    fixed = origin.commit({"a": "4"}, "signed again", sign=True)
    assert source.poll().sha == fixed


def test_resolve_refuses_an_unsigned_commit_too(
    origin: Origin, tmp_path: Path, trusted_key: tuple[Path, Path]
) -> None:
    _, allowed = trusted_key
    source, _ = make_source(
        origin.url, tmp_path / "cache", verify=SourceVerify(allowed_signers_file=str(allowed))
    )
    with pytest.raises(SourceError, match="is not signed"):
        source.resolve(origin.head())


# -- GPG ---------------------------------------------------------------------------


@pytest.fixture
def gnupg(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A throw-away GNUPGHOME with two keys: ``trusted`` (exported to a keyring file) and ``stranger``."""
    if not shutil.which("gpg"):
        pytest.fail("gpg is not installed (scripts/bootstrap installs gnupg)")
    home = Path(f"/tmp/gpgt-{os.getpid()}-{id(tmp_path) % 10000}")  # short: gpg socket path limit
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*args: str) -> str:
        return subprocess.run(
            ["gpg", "--batch", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", "", *args],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    try:
        ids = {}
        for who in ("trusted", "stranger"):
            gpg("--quick-gen-key", f"{who} <{who}@example.com>", "ed25519", "sign", "never")
            listing = gpg("--with-colons", "--list-secret-keys", f"{who}@example.com")
            ids[who] = next(line.split(":")[4] for line in listing.splitlines() if line.startswith("sec"))
        keyring = tmp_path / "trusted.asc"
        keyring.write_text(gpg("--armor", "--export", ids["trusted"]))
        yield {"GNUPGHOME": str(home), "keyring": str(keyring), **ids}
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def test_gpg_signed_commits_are_accepted_only_from_the_configured_keyring(
    origin: Origin, tmp_path: Path, gnupg: dict[str, str]
) -> None:
    env = {"GNUPGHOME": gnupg["GNUPGHOME"]}
    origin.signing = ["-c", "gpg.program=gpg", "-c", f"user.signingkey={gnupg['trusted']}"]
    signed = origin.commit({"a": "1"}, "gpg signed", sign=True, env=env)
    verify = SourceVerify(gpg_keyring_file=gnupg["keyring"])
    source, log = make_source(origin.url, tmp_path / "cache", verify=verify)
    assert source.poll().sha == signed
    assert log.named("source.signature_verified")[0]["method"] == "gpg"

    origin.signing = ["-c", "gpg.program=gpg", "-c", f"user.signingkey={gnupg['stranger']}"]
    origin.commit({"a": "2"}, "signed by a stranger", sign=True, env=env)
    with pytest.raises(SourceError, match="signed by a key not in the keyring"):
        source.poll()
    assert source.last_good is not None and source.last_good.sha == signed

    origin.commit({"a": "3"}, "unsigned")
    with pytest.raises(SourceError, match="is not signed"):
        source.poll()


def test_an_ssh_signature_is_refused_when_only_a_gpg_keyring_is_configured(
    origin: Origin, tmp_path: Path, trusted_key: tuple[Path, Path]
) -> None:
    key, _ = trusted_key
    ssh_signing(origin, key)
    origin.commit({"a": "1"}, "signed", sign=True)
    keyring = tmp_path / "empty.asc"
    keyring.write_text("")
    source, _ = make_source(
        origin.url, tmp_path / "cache", verify=SourceVerify(gpg_keyring_file=str(keyring))
    )
    with pytest.raises(SourceError, match="SSH signature but no allowed_signers_file"):
        source.poll()
