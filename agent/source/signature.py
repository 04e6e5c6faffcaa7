"""Commit signature verification for the source stage (SSH and OpenPGP).

Called by ``agent.source`` before a commit is checked out, when
``[source.verify]`` names an allowed-signers file and/or a GPG keyring. A
commit passes only if its ``gpgsig`` signature verifies against what is
configured; an unsigned commit, a signature by a key not listed, a bad
signature, or a signature type nothing is configured for is refused with a
``SourceError`` (not retryable: the same commit will be refused again).

SSH signatures are checked the way ``git verify-commit`` does it:
``ssh-keygen -Y find-principals`` names the signer in the allowed-signers file,
then ``ssh-keygen -Y verify -n git`` checks the signature for that principal at
the commit's committer time. OpenPGP signatures are checked with ``gpg
--verify`` in a throw-away ``GNUPGHOME`` into which only the configured keyring
was imported, so the agent's user keyring and trust database never take part;
any agent or keyboxd gpg starts there is stopped afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pygit2

from agent.config.types import SourceVerify
from agent.errors import SourceError

_SSH_HEADER = b"-----BEGIN SSH SIGNATURE-----"
_PGP_HEADER = b"-----BEGIN PGP SIGNATURE-----"
# gpg --status-fd keywords that mean "not acceptable" even when a GOODSIG is also present.
_PGP_FAILURES = ("BADSIG", "ERRSIG", "EXPSIG", "EXPKEYSIG", "REVKEYSIG", "NO_PUBKEY")


@dataclass(frozen=True)
class Verified:
    """Who signed a commit: ``method`` is ``ssh`` or ``gpg``; ``signer`` a principal or key id."""

    method: str
    signer: str


@dataclass(frozen=True)
class SignatureVerifier:
    """Verifies commits against the configured allowed signers / keyring."""

    config: SourceVerify
    #: Seconds a verification may take: the source's ``timeout`` (no default of its own to drift).
    timeout: float

    @property
    def enabled(self) -> bool:
        return bool(self.config.allowed_signers_file or self.config.gpg_keyring_file)

    def verify(self, commit: pygit2.Commit) -> Verified:
        """Return who signed ``commit`` or raise ``SourceError`` saying why it is refused."""
        sha = str(commit.id)
        signature, payload = commit.gpg_signature
        if not signature or payload is None:
            raise SourceError(
                f"commit {sha[:12]} is not signed; signature verification is required", retryable=False
            )
        if signature.lstrip().startswith(_SSH_HEADER):
            if not self.config.allowed_signers_file:
                raise SourceError(
                    f"commit {sha[:12]} has an SSH signature but no allowed_signers_file is configured",
                    retryable=False,
                )
            return self._verify_ssh(sha, signature, payload, commit.committer.time)
        if signature.lstrip().startswith(_PGP_HEADER):
            if not self.config.gpg_keyring_file:
                raise SourceError(
                    f"commit {sha[:12]} has a GPG signature but no gpg_keyring_file is configured",
                    retryable=False,
                )
            return self._verify_gpg(sha, signature, payload)
        raise SourceError(f"commit {sha[:12]} has a signature of an unsupported kind", retryable=False)

    def _run(
        self, argv: list[str], data: bytes, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(
                argv, input=data, capture_output=True, timeout=self.timeout, env=env, check=False
            )
        except FileNotFoundError:
            raise SourceError(
                f"{argv[0]} is not installed; it is needed to verify commit signatures", retryable=False
            ) from None
        except subprocess.TimeoutExpired:
            raise SourceError(f"{argv[0]} did not finish within {self.timeout:g}s") from None

    def _verify_ssh(self, sha: str, signature: bytes, payload: bytes, when: int) -> Verified:
        allowed = str(Path(self.config.allowed_signers_file).expanduser())
        if not Path(allowed).is_file():
            raise SourceError(f"allowed_signers_file not found: {allowed}", retryable=False)
        with tempfile.TemporaryDirectory(prefix="gitops-agent-sig-") as tmp:
            sig_file = Path(tmp) / "commit.sig"
            sig_file.write_bytes(signature)
            found = self._run(
                ["ssh-keygen", "-Y", "find-principals", "-f", allowed, "-s", str(sig_file)], b""
            )
            principals = [p for p in found.stdout.decode(errors="replace").splitlines() if p.strip()]
            if found.returncode != 0 or not principals:
                raise SourceError(
                    f"commit {sha[:12]} is signed by an SSH key that is not in {allowed}", retryable=False
                )
            # git passes the committer time so that keys with valid-after/valid-before apply as then.
            stamp = datetime.fromtimestamp(when, UTC).strftime("%Y%m%d%H%M%S")
            for principal in principals:
                checked = self._run(
                    [
                        "ssh-keygen",
                        "-Y",
                        "verify",
                        "-f",
                        allowed,
                        "-I",
                        principal,
                        "-n",
                        "git",
                        "-s",
                        str(sig_file),
                        f"-Overify-time={stamp}Z",
                    ],
                    payload,
                )
                if checked.returncode == 0:
                    return Verified("ssh", principal)
            reason = checked.stderr.decode(errors="replace").strip().splitlines()
            raise SourceError(
                f"SSH signature of commit {sha[:12]} does not verify: {' '.join(reason[-1:])}",
                retryable=False,
            )

    def _verify_gpg(self, sha: str, signature: bytes, payload: bytes) -> Verified:
        keyring = Path(self.config.gpg_keyring_file).expanduser()
        if not keyring.is_file():
            raise SourceError(f"gpg_keyring_file not found: {keyring}", retryable=False)
        home = tempfile.mkdtemp(prefix="gnupg-")  # short: gpg's socket paths have a length limit
        env = {**os.environ, "GNUPGHOME": home}
        try:
            os.chmod(home, 0o700)
            imported = self._run(
                ["gpg", "--batch", "--no-tty", "--quiet", "--import", str(keyring)], b"", env
            )
            if imported.returncode != 0:
                raise SourceError(
                    f"cannot import gpg_keyring_file {keyring}: "
                    f"{imported.stderr.decode(errors='replace').strip()[-300:]}",
                    retryable=False,
                )
            sig_file = Path(home) / "commit.sig"
            sig_file.write_bytes(signature)
            result = self._run(
                ["gpg", "--batch", "--no-tty", "--status-fd", "1", "--verify", str(sig_file), "-"],
                payload,
                env,
            )
        finally:
            self._stop_gpg(env)
            shutil.rmtree(home, ignore_errors=True)
        status = result.stdout.decode(errors="replace").splitlines()
        words = {
            line.split()[1]: line for line in status if line.startswith("[GNUPG:] ") and len(line.split()) > 1
        }
        bad = [w for w in _PGP_FAILURES if w in words]
        if result.returncode != 0 or bad or "GOODSIG" not in words or "VALIDSIG" not in words:
            why = (
                "signed by a key not in the keyring"
                if "NO_PUBKEY" in words or "ERRSIG" in words
                else (", ".join(bad) or "no valid signature")
            )
            raise SourceError(f"GPG signature of commit {sha[:12]} refused: {why}", retryable=False)
        return Verified("gpg", words["VALIDSIG"].split()[2])

    def _stop_gpg(self, env: dict[str, str]) -> None:
        # gpg may have started gpg-agent/keyboxd for this GNUPGHOME; they must not outlive it.
        if shutil.which("gpgconf"):
            subprocess.run(
                ["gpgconf", "--kill", "all"], env=env, capture_output=True, timeout=10, check=False
            )
