"""A moderation service (OpenAI's /v1/moderations shape) for the policy tests: a real local
HTTP server that flags, answers slowly, waits to be let go, or is not there at all."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

SLOW_S = 2.0


class ModerationHandler(BaseHTTPRequestHandler):
    """Flags any input with `flag_word` in it; /slow/ answers after SLOW_S seconds, /gated/
    once `gate` is set, /nonsense/ in another shape than OpenAI's."""

    seen: list[dict] = []
    flag_word = "forbidden"
    gate = threading.Event()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"body": body, "authorization": self.headers.get("Authorization")})
        if self.path.startswith("/slow/"):
            time.sleep(SLOW_S)
        if self.path.startswith("/gated/"):
            self.gate.wait(10)
        flagged = self.flag_word in body["input"]
        result = {"flagged": flagged, "categories": {}}
        answer = json.dumps(
            {"nope": 1} if self.path.startswith("/nonsense/") else {"id": "modr-1", "results": [result]}
        )
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(answer.encode())
        except (BrokenPipeError, ConnectionResetError):  # the client gave up at its timeout, as it should
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def moderation() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ModerationHandler)
    ModerationHandler.seen = []
    ModerationHandler.flag_word = "forbidden"
    ModerationHandler.gate = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    ModerationHandler.gate.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def down_url() -> str:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/moderations"
