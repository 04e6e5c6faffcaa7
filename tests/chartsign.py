"""OpenPGP keys that sign charts, made with the machine's gpg: a throw-away GNUPGHOME, the key
exported to legacy keyring files as `helm package --sign --keyring` and `keyring_file` read them."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SigningKey:
    name: str
    #: The secret key, for `helm package --sign --keyring`.
    secret: Path
    #: The public key, for `[[helm_repositories]] keyring_file`.
    public: Path

    @property
    def args(self) -> tuple[str, ...]:
        return ("--sign", "--key", self.name, "--keyring", str(self.secret))


def signing_key(out: Path, name: str = "Chart Signer") -> SigningKey:
    """A new RSA key without passphrase, exported under ``out``; gpg's agent stopped afterwards."""
    home = Path(tempfile.mkdtemp(prefix="gpg-"))  # short: gpg's socket paths have a length limit
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    try:
        uid = f"{name} <{name.lower().replace(' ', '-')}@example.com>"
        subprocess.run(
            [*gpg, "--quick-gen-key", uid, "rsa2048", "sign", "never"], check=True, capture_output=True
        )
        out.mkdir(parents=True, exist_ok=True)
        secret, public = out / f"{name}-secring.gpg", out / f"{name}-pubring.gpg"
        secret.write_bytes(
            subprocess.run([*gpg, "--export-secret-keys"], check=True, capture_output=True).stdout
        )
        public.write_bytes(subprocess.run([*gpg, "--export"], check=True, capture_output=True).stdout)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, check=False)
        shutil.rmtree(home, ignore_errors=True)
    return SigningKey(name, secret, public)
