"""Git credentials, SSH host-key policy and credential masking for the source stage.

Called by ``agent.source`` (to load credentials once per operation and to mask
every URL and message it produces) and by ``agent.source.remote`` (the child
process that talks to the remote, which turns ``Credentials`` into pygit2
callbacks).

Secrets are read from files or environment variables named in
``[source.auth]`` and live only in a ``Credentials`` value whose ``repr`` hides
them. ``scrub`` removes them (and any URL userinfo) from text before it can
reach a log line, an exception or a report.

SSH host keys: pygit2's ``certificate_check`` is never handed the SSH host
key, but libgit2 (built with libssh2) checks the key against
``<homedir>/.ssh/known_hosts`` and passes the verdict as ``valid``. pygit2's
default callback *accepts* every SSH host regardless of that verdict, so
``AgentCallbacks.certificate_check`` returns ``valid`` itself, and the child
process points libgit2's home directory (``GIT_OPT_SET_HOMEDIR``) at a private
directory whose ``.ssh/known_hosts`` is the configured file (see
``ssh_home``). An unknown or mismatched host key is therefore refused; nothing
is ever added to a known_hosts file.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pygit2
from pygit2.enums import CredentialType

from agent.config.types import SourceAuth
from agent.errors import SourceError

#: Username sent with a bare token over HTTPS when none is configured; GitHub, Gitea and
#: Azure DevOps accept any non-empty name with a token, and this one documents intent.
TOKEN_USERNAME = "x-access-token"
MASK = "***"
_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?[^/:]+:(?!//)")


def is_ssh_url(url: str) -> bool:
    """``ssh://…``, ``git+ssh://…`` or scp-like ``git@host:path``."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("ssh", "git+ssh", "ssh+git"):
        return True
    return not scheme and bool(_SCP_LIKE.match(url)) and not os.path.isabs(url)


def is_local_url(url: str) -> bool:
    """A path or ``file://`` URL: libgit2's local transport (no auth, no shallow fetch)."""
    scheme = urlsplit(url).scheme.lower()
    return scheme == "file" or (not scheme and not is_ssh_url(url))


def strip_credentials(url: str) -> str:
    """The URL without any secret part; used for cache keys and as the masked spelling's base."""
    return mask_url(url, mask="")


def mask_url(url: str, *, mask: str = MASK) -> str:
    """Remove credentials from a URL.

    HTTP(S) userinfo is masked entirely (a bare ``token@host`` is a secret too); an
    SSH user name is kept (it is not a secret) but a password is not; query strings
    are masked because hosts accept ``?private_token=…``.
    """
    if "://" not in url:  # a path, or scp-like user@host:path, never carries a password
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if parts.scheme.lower() in ("ssh", "git+ssh", "ssh+git"):
            user = userinfo.split(":", 1)[0]
            kept = f"{user}:{mask}" if ":" in userinfo and mask else user
        else:
            kept = mask
        netloc = f"{kept}@{hostport}" if kept else hostport
    query = mask if parts.query and mask else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


@dataclass(frozen=True)
class Credentials:
    """What to authenticate with. ``secret`` is a password, token or key passphrase."""

    username: str = ""
    secret: str = field(default="", repr=False)
    ssh_private_key_file: str = ""
    ssh_known_hosts_file: str = ""

    def secrets(self) -> tuple[str, ...]:
        return (self.secret,) if self.secret else ()

    def to_json(self) -> dict[str, str]:
        """For the child process's stdin (a pipe: never argv or the environment)."""
        return {
            "username": self.username,
            "secret": self.secret,
            "ssh_private_key_file": self.ssh_private_key_file,
            "ssh_known_hosts_file": self.ssh_known_hosts_file,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Credentials:
        return cls(**{k: str(data.get(k, "")) for k in cls.__dataclass_fields__})


def _read_secret(kind: str, file: str, env: str, url: str) -> str:
    if file:
        try:
            return Path(file).expanduser().read_text(encoding="utf-8").strip()
        except OSError as e:
            raise SourceError(
                f"cannot read source.auth.{kind}_file {file}: {e.strerror}", url=url, retryable=False
            ) from None
    if env:
        value = os.environ.get(env)
        if value is None:
            raise SourceError(f"environment variable {env} (source.auth.{kind}_env) is not set", url=url)
        return value.strip()
    return ""


def load_credentials(auth: SourceAuth, url: str) -> Credentials:
    """Read the configured secrets now (files may be rotated between polls)."""
    masked = mask_url(url)
    password = _read_secret("password", auth.password_file, auth.password_env, masked)
    token = _read_secret("token", auth.token_file, auth.token_env, masked)
    if password and token:
        raise SourceError("configure either a password or a token, not both", url=masked, retryable=False)
    username = auth.username or (TOKEN_USERNAME if token and not is_ssh_url(url) else "")
    key_file = auth.ssh_private_key_file
    if key_file and not Path(key_file).expanduser().is_file():
        raise SourceError(
            f"source.auth.ssh_private_key_file not found: {key_file}", url=masked, retryable=False
        )
    known_hosts = auth.ssh_known_hosts_file
    if is_ssh_url(url) and not known_hosts:
        default = Path("~/.ssh/known_hosts").expanduser()
        known_hosts = str(default) if default.is_file() else ""
    return Credentials(
        username=username,
        secret=password or token,
        ssh_private_key_file=str(Path(key_file).expanduser()) if key_file else "",
        ssh_known_hosts_file=str(Path(known_hosts).expanduser()) if known_hosts else "",
    )


def scrub(text: str, *, url: str = "", secrets: tuple[str, ...] = ()) -> str:
    """Remove secrets and credential-bearing URLs from text meant for humans."""
    if url:
        text = text.replace(url, mask_url(url))
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    # libgit2 sometimes echoes URLs it built itself (redirects, /info/refs); mask any userinfo.
    return re.sub(r"(https?://)[^/@\s]+@", rf"\1{MASK}@", text)


class AuthRejected(Exception):
    """The server asked again after we answered: the credentials were refused."""


class HostKeyRejected(Exception):
    """The host key is not in the configured known_hosts (unknown or changed)."""


class AgentCallbacks(pygit2.RemoteCallbacks):
    """pygit2 callbacks: answer an auth challenge once, refuse unverified hosts."""

    def __init__(self, credentials: Credentials, *, ssh: bool, url_credentials: bool = False) -> None:
        super().__init__()
        self._creds = credentials
        self._ssh = ssh
        # libgit2 tries a URL's user:password itself and calls us only once they were refused.
        self._url_credentials = url_credentials
        self._asked = 0

    def credentials(
        self, url: str, username_from_url: str | None, allowed_types: CredentialType
    ) -> pygit2.Username | pygit2.UserPass | pygit2.Keypair:
        # libgit2 calls this again after a 401 with no limit; a second call means "refused".
        self._asked += 1
        if self._asked > 1:
            raise AuthRejected("credentials were refused")
        username = username_from_url or self._creds.username or ("git" if self._ssh else "")
        if allowed_types & CredentialType.SSH_KEY and self._creds.ssh_private_key_file:
            return pygit2.Keypair(
                username, None, self._creds.ssh_private_key_file, self._creds.secret or None
            )
        if allowed_types & CredentialType.USERPASS_PLAINTEXT and self._creds.secret:
            return pygit2.UserPass(username, self._creds.secret)
        if allowed_types & CredentialType.USERNAME:
            return pygit2.Username(username)
        if self._url_credentials:
            raise AuthRejected("the server refused the credentials in the URL")
        raise AuthRejected("the server requires authentication but none is configured")

    def certificate_check(self, certificate: None, valid: bool, host: bytes) -> bool:
        # pygit2's default accepts every SSH host; libgit2's own verdict (known_hosts for SSH,
        # the CA bundle for HTTPS) is `valid`, and it is final.
        if not valid:
            if self._ssh:
                raise HostKeyRejected(host.decode(errors="replace"))
            return False
        return True


def ssh_home(credentials: Credentials, home: Path) -> Path:
    """Prepare ``home/.ssh/known_hosts`` (a copy of the configured file) for ``GIT_OPT_SET_HOMEDIR``.

    A copy, not a symlink, so that libgit2 sees exactly the file we checked exists;
    an empty known_hosts refuses every host, which is the point when none is configured.
    """
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = ssh_dir / "known_hosts"
    if credentials.ssh_known_hosts_file:
        shutil.copyfile(credentials.ssh_known_hosts_file, target)
    else:
        target.write_text("")
    return home
