"""Stand-in for a vLLM-Omni rollout server (or a vLLM reward-model server): serves ``/metrics``
with the real family names and label sets (shared/reference/endpoints.md §2.4-2.5), with fixed
scheduler state, so tests can drive the saturation rules through a real Prometheus.

Modes: ``ok`` (metrics), ``hang`` (accepts and never answers), ``garbage`` (200 with an HTML page),
``nostats`` (no vllm families, as with ``disable_log_stats=True``).
Run ``python vllm_omni_server.py --running 8 --waiting 3`` -> prints ``{"port": N}`` and serves on
127.0.0.1 until killed. ``start(...)`` does the same in-process (used inside a Ray actor).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

BUCKETS = (0.05, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Scheduler:
    """Fixed scheduler state rendered under both prefixes (``omni=False``: a plain vLLM server)."""

    def __init__(self, running: int, waiting: int, omni: bool, model: str, latency: float):
        self.running, self.waiting, self.omni, self.model, self.latency = running, waiting, omni, model, latency
        self.t0 = time.time()

    def describe(self):
        return []

    def collect(self):
        done = int((time.time() - self.t0) * 2) + 1  # requests finish at 2/s
        lat_sum = done * self.latency
        buckets = [(str(b), done if self.latency <= b else 0) for b in BUCKETS] + [("+Inf", done)]
        if self.omni:
            for nm, v in (("num_requests_running", self.running), ("num_requests_waiting", self.waiting)):
                g = GaugeMetricFamily(f"vllm_omni:{nm}", f"stand-in {nm}", labels=["model_name"])
                g.add_metric([self.model], v)
                yield g
            c = CounterMetricFamily("vllm_omni:requests_success", "stand-in", labels=["model_name", "finished_reason"])
            c.add_metric([self.model, "stop"], done)
            yield c
            h = HistogramMetricFamily("vllm_omni:e2e_request_latency_s", "stand-in", labels=["model_name"])
            h.add_metric([self.model], buckets, lat_sum)
            yield h
            engine_labels, engine_values = ["model_name", "stage", "replica"], [self.model, "0", "0"]
        else:
            engine_labels, engine_values = ["model_name", "engine"], [self.model, "0"]
        for nm, v in (("num_requests_running", self.running), ("num_requests_waiting", self.waiting),
                      ("kv_cache_usage_perc", 0.5)):
            g = GaugeMetricFamily(f"vllm:{nm}", f"stand-in {nm}", labels=engine_labels)
            g.add_metric(engine_values, v)
            yield g
        for nm, share in (("e2e_request_latency_seconds", 1.0), ("request_queue_time_seconds", 0.6)):
            h = HistogramMetricFamily(f"vllm:{nm}", "stand-in", labels=engine_labels)
            h.add_metric(engine_values, [(b, int(c)) for b, c in buckets], lat_sum * share)
            yield h


def make_handler(mode: str, registry: CollectorRegistry):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if mode == "hang":
                time.sleep(3600)
                return
            if mode == "garbage":  # another service on the port (Prometheus 2.42 accepts some junk, not this)
                body = b"<html><body>this is not a metrics endpoint</body></html>\n"
            elif mode == "nostats":  # vLLM started without --log-stats: process metrics only
                body = b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
            elif self.path.split("?")[0] == "/metrics":
                body = generate_latest(registry)
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    return H


def start(mode: str = "ok", running: int = 8, waiting: int = 3, omni: bool = True, model: str = "standin",
          latency: float = 2.0, port: int = 0) -> ThreadingHTTPServer:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Scheduler(running, waiting, omni, model, latency))
    srv = ThreadingHTTPServer(("127.0.0.1", port), make_handler(mode, reg))
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ok", "hang", "garbage", "nostats"], default="ok")
    p.add_argument("--running", type=int, default=8)
    p.add_argument("--waiting", type=int, default=3)
    p.add_argument("--plain-vllm", action="store_true", help="a reward-model server: vllm:* only, engine label")
    a = p.parse_args()
    srv = start(a.mode, a.running, a.waiting, omni=not a.plain_vllm)
    print(json.dumps({"port": srv.server_address[1]}), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
