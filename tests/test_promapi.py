"""The one Prometheus API client: every failure is one PromError naming the path and the query."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from omniwatch.proc import free_port
from omniwatch.promapi import PromAPI, PromError


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _answer(self):
        if self.path.startswith("/api/v1/query_range"):
            n = int(self.headers.get("content-length", 0))
            form = dict(x.split("=", 1) for x in self.rfile.read(n).decode().split("&"))
            start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
            pts = []
            t = start
            while t <= end + 1e-9:
                pts.append([t, "1"])
                t += step
            body = {"status": "success", "data": {"resultType": "matrix",
                                                  "result": [{"metric": {"a": "b"}, "values": pts}]}}
            code = 200
        elif self.path.startswith("/api/v1/query"):
            code, body = 400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
        elif self.path.startswith("/api/v1/label/"):
            code, body = 200, {"status": "success", "data": ["x", "y"]}
        else:
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"Service Unavailable")
            return
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _answer


@pytest.fixture
def fake():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_errors_name_the_path_and_the_query(fake):
    with PromAPI(fake, timeout=5) as api:
        with pytest.raises(PromError, match=r"/api/v1/query 'rate\(x' *: parse error at char 3"):
            api.query("rate(x")
        with pytest.raises(PromError, match=r"/api/v1/alerts: HTTP 503"):
            api.get("/api/v1/alerts")
        assert api.label_values("experiment", '{__name__="omniwatch_step"}') == ["x", "y"]
    with PromAPI(f"http://127.0.0.1:{free_port()}", timeout=2) as api:
        with pytest.raises(PromError, match="ConnectError"):
            api.query("up")
        assert api.ready() is False


def test_range_queries_are_chunked_and_merged_in_time_order(fake):
    from omniwatch.promapi import MAX_POINTS
    with PromAPI(fake, timeout=10) as api:
        series = api.query_range("up", 0.0, 2.5 * MAX_POINTS, 1.0)
    assert len(series) == 1
    ts = [p[0] for p in series[0]["values"]]
    assert ts == sorted(ts) and len(ts) == len(set(ts)) == int(2.5 * MAX_POINTS) + 1
