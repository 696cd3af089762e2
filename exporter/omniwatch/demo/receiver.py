"""A local notification receiver for the demo: the relay forwards to it like to any generic webhook
(Slack and Feishu need the internet; this shows the same messages). Each POST is appended to a JSONL
file that ``omniwatch demo`` reads. ``python -m omniwatch.demo.receiver --port N --out FILE``."""
from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20


def make_handler(out_path: str, lock: threading.Lock):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.send_error(413)
                return
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                self.send_error(400, "not JSON")
                return
            rec = {"received_at": time.time(), "path": self.path,
                   "delivery_id": self.headers.get("X-Omniwatch-Delivery-Id"), "body": body}
            with lock, open(out_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    return Handler


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="omniwatch.demo.receiver", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    srv = ThreadingHTTPServer((args.host, args.port), make_handler(args.out, threading.Lock()))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
