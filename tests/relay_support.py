"""Test helpers for the relay tests: a recording HTTP receiver on loopback and fixture loading."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from omniwatch.proc import free_port, wait_for

__all__ = ["Receiver", "fixture_bodies", "free_port", "wait_for"]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "endpoints" / "alertmanager_0.25_webhook_and_slack.jsonl"


def fixture_bodies(path: str = "/alert") -> list[dict]:
    return [d["body"] for d in map(json.loads, FIXTURE.read_text().splitlines()) if d["path"] == path]


class Receiver:
    """A tiny HTTP server recording every POST. ``codes`` is a list of status codes answered in turn
    (then ``default``); ``start()`` / ``stop()`` make it come and go on the same port."""

    def __init__(self, port: int | None = None, default: int = 200):
        self.port = port or free_port()
        self.default = default
        self.codes: list[int] = []
        self.requests: list[dict] = []   # every request, whatever was answered
        self.accepted: list[dict] = []   # requests answered 2xx
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Receiver":
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(n)
                with outer.lock:
                    code = outer.codes.pop(0) if outer.codes else outer.default
                    rec = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": json.loads(raw or b"null"), "code": code, "t": time.time()}
                    outer.requests.append(rec)
                    if 200 <= code < 300:
                        outer.accepted.append(rec)
                # errors echo the path, as some services do: the relay must redact response text too
                out = b'{"code":0,"msg":"success"}' if code < 300 else json.dumps({"error": "down", "path": self.path}).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def wait_accepted(self, n: int, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.accepted) >= n:
                    return list(self.accepted)
            time.sleep(0.05)
        with self.lock:
            raise AssertionError(f"expected {n} accepted requests, got {len(self.accepted)} "
                                 f"({len(self.requests)} requests in all)")

