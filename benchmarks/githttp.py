"""Git's smart HTTP protocol on loopback for benchmark 5: ``git http-backend`` behind ``http.server``.

Run by ``benchmarks.bench_git.http_backend`` as a process of its own (``python -m
benchmarks.githttp BASE``; it prints its port on stdout), so that serving does not share the
measuring process's interpreter (and its GIL) with the agent's in-process ``GitSource.poll``.
Each request runs ``git http-backend`` as a CGI program, as a web server in front of Git does;
no authentication.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def read_body(h: BaseHTTPRequestHandler) -> bytes:
    """The request's body, sent with a length or chunked (Git sends large pushes/fetches chunked)."""
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                h.rfile.readline()
                return b"".join(chunks)
            chunks.append(h.rfile.read(size))
            h.rfile.readline()
    return h.rfile.read(int(h.headers.get("Content-Length") or 0))


def run_backend(h: BaseHTTPRequestHandler, root: str, body: bytes, *, user: str = "") -> CgiReply:
    """``git http-backend`` run as a CGI program over ``root`` for the request of ``h``."""
    path, _, query = h.path.partition("?")
    env = {
        "PATH": os.environ["PATH"],
        "GIT_PROJECT_ROOT": root,
        "GIT_HTTP_EXPORT_ALL": "1",
        "GIT_CONFIG_NOSYSTEM": "1",
        "REQUEST_METHOD": h.command,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "CONTENT_TYPE": h.headers.get("Content-Type", ""),
        "CONTENT_LENGTH": str(len(body)),
        "REMOTE_ADDR": "127.0.0.1",
        "GIT_PROTOCOL": h.headers.get("Git-Protocol", ""),
    }
    if user:
        env["REMOTE_USER"] = user
    if h.headers.get("Content-Encoding"):
        env["HTTP_CONTENT_ENCODING"] = h.headers["Content-Encoding"]
    backend = ["git", "http-backend"]
    out = subprocess.run(backend, input=body, env=env, capture_output=True, check=False).stdout
    head, _, payload = out.partition(b"\r\n\r\n")
    reply = CgiReply(200, [], payload)
    for line in head.decode().split("\r\n"):
        name, _, value = line.partition(":")
        if name.lower() == "status":
            reply.status = int(value.split()[0])
        elif name:
            reply.headers.append((name, value.strip()))
    return reply


@dataclass
class CgiReply:
    """What a CGI program answered: its status, headers and body."""

    status: int
    headers: list[tuple[str, str]]
    payload: bytes

    def send(self, h: BaseHTTPRequestHandler) -> None:
        h.send_response(self.status)
        for name, value in self.headers:
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(self.payload)))
        h.end_headers()
        h.wfile.write(self.payload)


def _handler(base: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            run_backend(self, base, read_body(self)).send(self)

        def do_POST(self) -> None:
            run_backend(self, base, read_body(self)).send(self)

        def log_message(self, format: str, *args: object) -> None:  # stdout holds only the port
            pass

    return Handler


def main(base: str) -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(base))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
