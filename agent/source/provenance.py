"""Signed charts: a chart's provenance file (``<archive>.prov``, written by ``helm package
--sign``) checked against a ``[[helm_repositories]]`` entry's ``keyring_file``.

Called by ``source.charts`` for an entry with ``verify = true``, after the archive's digest was
checked against the index and before it is unpacked (and again for a copy kept in the cache the
first time this process uses it), so nothing of an unverified chart reaches a render. A chart
passes when its ``.prov`` is an OpenPGP clear-signature that ``gpgv`` (Debian's ``gpgv``, the
verify-only tool of GnuPG: no trust database, no agent, only the keyring it is given) checks
against the keyring, and the signed text lists the archive's name with the sha256 the index gave
and the download had. Missing, unsigned, signed by another key, altered, or listing another
digest: ``ChartError`` with problem ``signature`` (the app fails with reason ``chart``).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import ChartError, ChartProblem

__all__ = ["MAX_PROV_BYTES", "ProvenanceChecker", "signed_digest"]

#: Largest provenance file read (real ones are a few KiB: Chart.yaml and a signature).
MAX_PROV_BYTES = 1 << 20
#: Largest keyring file read.
MAX_KEYRING_BYTES = 16 << 20
# gpgv --status-fd keywords that refuse a signature even beside a GOODSIG.
_REFUSED = ("BADSIG", "ERRSIG", "EXPSIG", "EXPKEYSIG", "REVKEYSIG", "NO_PUBKEY")

#: GETs ``url`` within ``limit`` bytes: the body, or ``ChartError`` (the repository's trust and credentials).
Get = Callable[[str, int], bytes]
YamlLoader = Callable[[str], Any]


def signed_digest(text: str, archive: str, load_yaml: YamlLoader) -> str:
    """The sha256 (hex) the signed text of a provenance file lists for ``archive`` ("": none).
    The text is the chart's Chart.yaml, a ``...`` line, then a ``files:`` mapping (Helm's layout)."""
    _, sep, files = text.partition("\n...\n")
    if not sep:
        return ""
    try:
        data = load_yaml(files)
    except Exception:  # the loader's YAML errors: nothing listed
        return ""
    listed = data.get("files") if isinstance(data, dict) else None
    value = listed.get(archive) if isinstance(listed, dict) else None
    if not isinstance(value, str) or not value.startswith("sha256:"):
        return ""
    return value.removeprefix("sha256:").strip().lower()


class ProvenanceChecker:
    """Verifies archives against their ``.prov``; remembers what it verified, per keyring."""

    def __init__(self, load_yaml: YamlLoader, *, timeout: float = 30.0) -> None:
        self.load_yaml = load_yaml
        self.timeout = timeout
        #: (archive digest, keyring digest) verified by this process: a poll asks nothing again.
        self._verified: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def check(self, get: Get, archive_url: str, digest: str, keyring_file: str, *, url: str) -> None:
        """Refuse (``ChartError``, problem ``signature``, naming ``url``) unless ``archive_url``'s
        provenance file is signed by a key of ``keyring_file`` and lists ``digest``."""
        keyring = self._keyring(keyring_file, url)
        ring = hashlib.sha256(keyring.read_bytes()).hexdigest()
        with self._lock:
            if (digest, ring) in self._verified:
                return
        archive = archive_url.rsplit("/", 1)[-1].split("?", 1)[0]
        try:
            prov = get(f"{archive_url}.prov", MAX_PROV_BYTES)
        except ChartError as e:
            raise self._refused(url, f"{archive}: no provenance file ({e.detail})") from None
        text = self._gpgv(prov, keyring, archive, url)
        listed = signed_digest(text, archive, self.load_yaml)
        if listed != digest:
            what = f"lists sha256 {listed[:12]}…" if listed else "does not list it"
            raise self._refused(
                url, f"{archive}: its signed provenance {what}, the archive is {digest[:12]}…"
            )
        with self._lock:
            self._verified.add((digest, ring))

    @staticmethod
    def _refused(url: str, message: str) -> ChartError:
        return ChartError(ChartProblem.SIGNATURE, message, url=url)

    def _keyring(self, keyring_file: str, url: str) -> Path:
        path = Path(keyring_file).expanduser().resolve()
        try:
            if path.stat().st_size > MAX_KEYRING_BYTES:
                raise self._refused(url, f"keyring_file {path} is over {MAX_KEYRING_BYTES} bytes")
        except OSError as e:
            raise self._refused(url, f"cannot read keyring_file {path}: {e.strerror}") from None
        return path

    def _gpgv(self, prov: bytes, keyring: Path, archive: str, url: str) -> str:
        """The signed text of ``prov``, once ``gpgv`` checked its signature against ``keyring``."""
        gpgv = shutil.which("gpgv")
        if gpgv is None:
            raise self._refused(url, "gpgv is not installed (Debian package gpgv, part of gnupg)")
        with tempfile.TemporaryDirectory(prefix="gpgv-") as home:
            (Path(home) / "chart.prov").write_bytes(prov)
            argv = [gpgv, "--homedir", home, "--keyring", str(keyring), "--status-fd", "1"]
            argv += ["--output", str(Path(home) / "signed"), str(Path(home) / "chart.prov")]
            try:
                run = subprocess.run(argv, capture_output=True, timeout=self.timeout, check=False)
            except subprocess.TimeoutExpired:
                raise self._refused(url, f"{archive}: gpgv took more than {self.timeout:g}s") from None
            status = run.stdout.decode("utf-8", "replace").splitlines()
            words = {
                line.split()[1] for line in status if line.startswith("[GNUPG:] ") and len(line.split()) > 1
            }
            if run.returncode != 0 or "VALIDSIG" not in words or words & set(_REFUSED):
                why = next((w for w in _REFUSED if w in words), "")
                reason = {
                    "BADSIG": "the signature does not match: the provenance file was altered",
                    "NO_PUBKEY": "signed by a key that is not in keyring_file",
                    "ERRSIG": "signed by a key that is not in keyring_file, or unreadable",
                }.get(why, f"not a valid signature ({why or 'gpgv exit ' + str(run.returncode)})")
                if not any(w in words for w in ("NEWSIG", "ERRSIG", "BADSIG", "GOODSIG")):
                    reason = "not signed (no OpenPGP signature in the provenance file)"
                raise self._refused(url, f"{archive}: {reason}")
            signed = Path(home) / "signed"
            return signed.read_text("utf-8", "replace") if signed.is_file() else ""
