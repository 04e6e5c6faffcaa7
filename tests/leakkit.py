"""A loopback HTTP service holding a secret, for the render sandbox's tests (a render must never
read it: docs/safety.md, threat model). It answers every request with the secret and records it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "agent-status-token-9f1c"


class SecretServer:
    """A loopback HTTP service that answers every GET with a secret and counts what reached it."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(f"{self.command} {self.path}")
                body = f'{{"token": "{SECRET}", "data": {{"plaintext": "{SECRET}"}}}}\n'.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PUT = do_GET

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
