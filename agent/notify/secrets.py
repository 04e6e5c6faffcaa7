"""Secrets of sinks and hooks: read from their file or environment variable, masked in all output.

``Secret.get`` reads the value (a file again whenever it changed, so a rotated Kubernetes Secret
takes effect without a restart) and hands it to the ``Masker``, which every text leaving the
notify layer and the receiver passes through (error messages, ``/status``). A secret that cannot
be read is a ``ConfigError`` naming the key, raised when the agent starts.
"""

from __future__ import annotations

import os
import threading
from urllib.parse import urlsplit

from agent.config.types import SecretRef
from agent.errors import ConfigError

MASK = "***"


class Masker:
    """Replaces every secret it was shown with ``***`` (URLs: their path and query too)."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()

    def add(self, value: str) -> None:
        parts = [value]
        if "://" in value:
            u = urlsplit(value)
            # A Slack URL's token is its path; hosts take tokens in queries and user info too.
            parts += [p for p in (u.path, u.query, u.username or "", u.password or "") if len(p) > 3]
        with self._lock:
            self._values.update(p for p in parts if p)

    def scrub(self, text: str) -> str:
        with self._lock:
            values = sorted(self._values, key=len, reverse=True)
        for v in values:
            text = text.replace(v, MASK)
        return text


def show_target(url: str) -> str:
    """A sink's address as it may be shown: scheme and host only."""
    u = urlsplit(url)
    return f"{u.scheme}://{u.hostname or ''}{f':{u.port}' if u.port else ''}/{MASK}" if u.scheme else MASK


class Secret:
    """One configured secret (``key``: its config key, for errors)."""

    def __init__(self, ref: SecretRef, key: str, masker: Masker, *, file: str = "") -> None:
        self.ref = ref
        self.key = key
        self.file = file
        self.masker = masker
        self._stamp: tuple[int, int] | None = None
        self._value = ""
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.ref)

    def __repr__(self) -> str:
        return f"Secret({self.key}, {self.ref.where})"

    def get(self) -> str:
        """The value now; ``ConfigError`` naming the key when it cannot be read or is empty."""
        ref = self.ref
        if ref.value:
            value = ref.value
        elif ref.env:
            value = os.environ.get(ref.env, "").strip()
            if not value:
                raise ConfigError(
                    self.key, f"environment variable {ref.env} is not set or empty", file=self.file
                )
        else:
            value = self._read_file()
        self.masker.add(value)
        return value

    def _read_file(self) -> str:
        path = self.ref.file
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size)
            with self._lock:
                if stamp == self._stamp:
                    return self._value
            with open(path, encoding="utf-8") as f:
                value = f.read().strip()
        except OSError as e:
            raise ConfigError(self.key, f"cannot read {path}: {e.strerror}", file=self.file) from None
        if not value:
            raise ConfigError(self.key, f"{path} is empty", file=self.file)
        with self._lock:
            self._stamp, self._value = stamp, value
        return value
