"""Age keys and SOPS files for tests: identities made in Python, files encrypted with the pinned sops.

Age identities are X25519 keys in bech32 (what ``age-keygen`` prints), made here with the
``cryptography`` package the agent depends on anyway, so tests need no second Go tool.
Plaintext goes to ``sops encrypt`` on its standard input and never touches the disk.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PrivateFormat, PublicFormat

from agent.render.binaries import tool

_CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_GEN = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)


def _polymod(values: list[int]) -> int:
    chk = 1
    for v in values:
        top = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ v
        for i in range(5):
            chk ^= _GEN[i] if (top >> i) & 1 else 0
    return chk


def _bech32(hrp: str, data: bytes) -> str:
    acc = bits = 0
    five: list[int] = []
    for byte in data:
        acc = (acc << 8) | byte
        bits += 8
        while bits >= 5:
            bits -= 5
            five.append((acc >> bits) & 31)
    if bits:
        five.append((acc << (5 - bits)) & 31)
    expanded = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]
    mod = _polymod([*expanded, *five, 0, 0, 0, 0, 0, 0]) ^ 1
    checksum = [(mod >> 5 * (5 - i)) & 31 for i in range(6)]
    return hrp + "1" + "".join(_CHARSET[d] for d in five + checksum)


@dataclass(frozen=True)
class AgeKey:
    identity: str  # AGE-SECRET-KEY-1...
    recipient: str  # age1...


def age_key() -> AgeKey:
    key = X25519PrivateKey.generate()
    secret = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, _no_encryption())
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return AgeKey(_bech32("age-secret-key-", secret).upper(), _bech32("age", public))


def _no_encryption():  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.serialization import NoEncryption

    return NoEncryption()


def encrypt(
    plaintext: str,
    *recipients: str,
    kind: str = "yaml",
    encrypted_regex: str | None = "^(data|stringData)$",
) -> str:
    """``plaintext`` encrypted by the pinned sops to ``recipients`` (stdin to stdout, nothing on disk)."""
    argv = [str(tool("sops")), "encrypt", "--age", ",".join(recipients)]
    argv += ["--input-type", kind, "--output-type", kind, "--filename-override", f"in.{kind}"]
    if encrypted_regex is not None and kind in ("yaml", "json"):
        argv += ["--encrypted-regex", encrypted_regex]
    env = {"PATH": "", "HOME": "/nonexistent", "SOPS_DISABLE_VERSION_CHECK": "1"}
    out = subprocess.run(
        argv, input=plaintext.encode(), capture_output=True, env=env, timeout=60, check=False, cwd="/"
    )
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


def decrypt(ciphertext: str, *identities: str, kind: str = "yaml") -> str:
    """What sops makes of ``ciphertext`` with ``identities`` (for checks of what tests wrote)."""
    argv = [str(tool("sops")), "decrypt", "--input-type", kind, "--output-type", kind]
    env = {"PATH": "", "HOME": "/nonexistent", "SOPS_AGE_KEY": "\n".join(identities)}
    out = subprocess.run(
        argv, input=ciphertext.encode(), capture_output=True, env=env, timeout=60, check=False, cwd="/"
    )
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


def environ_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}
