"""A Ray dashboard on 127.0.0.1 that misbehaves on demand (issue 35's attacks on the task-event source).

Behind it, the demo's state-API stand-in (``omniwatch.demo.raytasks.StateStandIn``: rows byte-shaped as the
recorded Ray 2.60 ones, a FlowGRPO step every 10 s, job ``01000000``). ``mode`` says how it answers:

- ``ok``: as the stand-in does;
- ``slow``: every answer after ``delay`` seconds;
- ``trickle``: the head at once, then the body one byte every ``delay`` seconds (``trickling`` counts the
  connections it is trickling to now);
- ``flood``: ignores ``limit``: ``flood_rows`` detailed rows streamed as they are generated (``sent`` counts the
  bytes the client took before it hung up);
- ``echo``: HTTP 500 whose ``msg`` echoes the request's ``Authorization`` header, as a careless proxy does.

``rows`` (a function of a kind and its rows) rewrites what the stand-in answers (bad fields, long names, clocks
ahead). ``paths`` records every request path. Stop with ``close()``; every loop checks ``stopped``.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from omniwatch.demo import raytasks as demo


class FakeDashboard:
    def __init__(self, workers: int = 0):
        self.standin = demo.StateStandIn(workers=workers) if workers else demo.StateStandIn()
        self.mode = "ok"
        self.delay = 1.0
        self.rows = None
        self.flood_rows = 100_000
        self.trickling = 0
        self.inflight = 0        # requests being answered now (any mode)
        self.sent = 0
        self.paths: list[str] = []
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                with fake.lock:
                    fake.paths.append(self.path)
                    fake.inflight += 1
                try:
                    fake._answer(self)
                except OSError:
                    pass
                finally:
                    with fake.lock:
                        fake.inflight -= 1

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()

    def body(self, path: str) -> tuple[int, bytes]:
        status, raw = self.standin.answer(path)
        if self.rows is not None and status == 200:
            doc = json.loads(raw)
            kind = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            res = doc["data"]["result"]
            res["result"] = self.rows(kind, res["result"])
            raw = json.dumps(doc).encode()
        return status, raw

    def _send(self, h, status: int, raw: bytes, length: int | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        if length is None:
            h.send_header("Content-Length", str(len(raw)))
        else:
            h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Connection", "close")
        h.end_headers()

    def _answer(self, h) -> None:
        mode = self.mode
        if mode == "slow":
            self.stopped.wait(self.delay)
        if mode == "echo":
            raw = json.dumps({"result": False, "data": {}, "msg": "bad request headers: {'Authorization': '"
                              + str(h.headers.get("Authorization")) + "'}"}).encode()
            self._send(h, 500, raw)
            h.wfile.write(raw)
            return
        if mode == "flood":
            self._flood(h)
            return
        status, raw = self.body(h.path)
        self._send(h, status, raw)
        if mode != "trickle":
            h.wfile.write(raw)
            return
        self.trickling += 1
        try:
            for b in raw:
                if self.stopped.wait(self.delay):
                    return
                h.wfile.write(bytes([b]))
                h.wfile.flush()
        finally:
            self.trickling -= 1

    def _flood(self, h) -> None:
        """``flood_rows`` detailed RUNNING rows whatever ``limit`` said, generated while they are sent."""
        row = json.dumps(dict(self.standin.task, task_id="{}", start_time_ms=1.7e12)).encode()
        head = b'{"result": true, "msg": "", "data": {"result": {"total": %d, "num_after_truncation": %d, ' \
               b'"num_filtered": %d, "result": [' % ((self.flood_rows,) * 3)
        self._send(h, 200, b"", length=-1)

        def chunk(data: bytes) -> None:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.sent += len(data)
        chunk(head)
        batch = []
        for i in range(self.flood_rows):
            if self.stopped.is_set():
                return
            batch.append(row.replace(b'"{}"', b'"%040x"' % i))
            if len(batch) == 200:
                chunk(b",".join(batch) + (b"," if i + 1 < self.flood_rows else b""))
                batch = []
        if batch:
            chunk(b",".join(batch))
        chunk(b"]}}}")
        h.wfile.write(b"0\r\n\r\n")
