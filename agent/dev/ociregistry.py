"""A real OCI registry on loopback, as teams run one for charts: the CNCF distribution registry
(``TEST_TOOL_registry``, built by scripts/install-go-tools), its config file and storage under a
directory, on a free port, optionally with htpasswd basic auth and TLS from a local CA; charts go
in with the pinned `helm push`. Its access log says what it answered (``requests``): the
benchmark's poll row counts at the server. The tests' registry (``tests/ociregistry.py``) is this
one with charts and cosign signatures of its own."""

from __future__ import annotations

import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.dev.process import free_port
from agent.render.binaries import go_tool, tool
from agent.render.tools import helm_env


class Registry:
    """A distribution registry's files under ``root``; ``serve`` runs it, ``push`` adds charts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.home = root / "helm-home"
        self.home.mkdir(exist_ok=True)
        self.src = root / "src"
        self.host = ""
        self.username = self.password = ""
        self.ca_file: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``oci://`` prefix the charts are pushed under (``<host>/charts``)."""
        return f"oci://{self.host}/charts"

    @contextmanager
    def serve(
        self, *, username: str = "", password: str = "", cert: tuple[Path, Path, Path] | None = None
    ) -> Iterator[Registry]:
        """Run the registry until the block ends; ``cert`` is (CA, serving cert, serving key)."""
        binary = go_tool("registry")
        if binary is None:
            raise RuntimeError("the OCI registry is not built: run scripts/install-go-tools registry")
        self.username, self.password = username, password
        self.ca_file = cert[0] if cert else None
        lines = [
            "version: 0.1",
            "log:\n  level: warn\n  accesslog:\n    disabled: false",
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'storage'}",
            "  delete:\n    enabled: true",
            "http:",
            "  addr: 127.0.0.1:{port}",
            "  secret: test-only-secret",
        ]
        if cert:
            lines.append(f"  tls:\n    certificate: {cert[1]}\n    key: {cert[2]}")
        if username:
            import bcrypt  # a test extra: the registry's htpasswd file takes bcrypt hashes only

            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
            (self.root / "htpasswd").write_text(f"{username}:{hashed}\n")
            lines.append(f"auth:\n  htpasswd:\n    realm: charts\n    path: {self.root / 'htpasswd'}")
        log = self.root / "registry.log"
        for _ in range(5):  # a port taken between choosing and binding: choose again
            port = free_port()
            config = self.root / "config.yml"
            config.write_text("\n".join(lines).replace("{port}", str(port)) + "\n")
            with open(log, "wb") as out:
                self._process = subprocess.Popen(
                    [str(binary), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT
                )
            self.host = f"127.0.0.1:{port}"
            if self._ready():
                break
            self._stop()
        else:
            raise RuntimeError(f"the registry did not start:\n{log.read_text()[-2000:]}")
        try:
            yield self
        finally:
            self._stop()

    def _ready(self) -> bool:
        scheme = "https" if self.ca_file else "http"
        ctx = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{scheme}://{self.host}/v2/", timeout=1, context=ctx):
                    return True
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def _stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def _tls_flags(self) -> list[str]:
        return ["--ca-file", str(self.ca_file)] if self.ca_file else ["--plain-http"]

    def push_archive(self, archive: Path) -> str:
        """`helm push` a packaged chart under ``url``; its manifest digest."""
        creds = ["--username", self.username, "--password", self.password] if self.username else []
        done = subprocess.run(
            [str(tool("helm")), "push", str(archive), self.url, *self._tls_flags(), *creds],
            check=True,
            capture_output=True,
            text=True,
            env=helm_env(self.home),
        )
        return next(
            line.split()[-1] for line in (done.stdout + done.stderr).splitlines() if "Digest:" in line
        )

    def requests(self) -> list[str]:
        """The requests the registry answered so far, from its access log: ``"METHOD /path"``."""
        log = self.root / "registry.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return [m.group(1) for m in _ACCESS.finditer(text)]


#: A request line of the access log (Apache's combined format).
_ACCESS = re.compile(r'"((?:GET|HEAD|POST|PUT|PATCH|DELETE) /\S*) HTTP/[0-9.]+"')
