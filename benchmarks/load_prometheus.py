"""Sizing Prometheus for omniwatch: synthetic load of the shape "N GPUs x R concurrent runs".

Two modes:

* ``live`` — an HTTP server exposes what omniwatch would: one exporter target whose runs are REAL
  (a RunStore fed the healthy FlowGRPO fixture, padded to ``--verl-keys`` passthrough keys, rendered by
  the real collector; one step ingested per run every ``--step-s``), and one node-agent target per
  ``--gpus-per-node`` GPUs with the per-GPU series of the GPU sampler (names from the catalogue). A real
  Prometheus scrapes it; after ``--seconds`` we read its RSS, head series and ingest rate
  (``prometheus_tsdb_head_samples_appended_total``).
* ``backfill`` — the same series as OpenMetrics over ``--hours`` at ``--resolution``, turned into TSDB
  blocks by ``promtool tsdb create-blocks-from openmetrics``; a Prometheus serves them and every panel
  query of ``omniwatch.dashboards`` is run as a range query over the whole span (Grafana-like step),
  timings are printed as JSON.

    python benchmarks/load_prometheus.py live --gpus 512 --runs 10 --scrape-interval 1s --seconds 60
    python benchmarks/load_prometheus.py backfill --gpus 64 --runs 10 --hours 24 --resolution 60

``benchmarks/run.py --only prometheus`` runs two live loads (64 GPUs; 512 GPUs with the rules) and
``--only queries`` the 24 h / 60 s backfill, recording them in results.json (:func:`sizing`,
:func:`queries`); docs/scaling.md quotes them. Loopback only; every process started is stopped.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from prometheus_client import generate_latest  # noqa: E402

from omniwatch import names as n  # noqa: E402
from omniwatch.core.exposition import make_registry  # noqa: E402
from omniwatch.core.model import RunStore  # noqa: E402
from omniwatch.core.parse import parse_jsonl_line  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "verl" / "flowgrpo_healthy.jsonl"
PHASES = ("gen", "reward", "old_log_prob", "update_actor", "inter_stage")
GPU_SERIES = [m for m in n.CATALOGUE.values() if m.labels[:3] == n.GPU_LABELS]
PHASE_SERIES = [m for m in n.CATALOGUE.values() if n.GPU_LABELS[0] in m.labels and n.L_PHASE in m.labels]


# --- the series -------------------------------------------------------------------------------------
class Runs:
    """R real runs in a real RunStore; ``step()`` ingests the next fixture step of every run."""

    def __init__(self, runs: int, verl_keys: int):
        import orjson
        self.lines = [orjson.loads(x) for x in FIXTURE.read_bytes().splitlines() if x.strip()]
        self.store = RunStore(max_keys=max(512, verl_keys + 64))
        self.registry = make_registry(self.store)
        self.runs = [("load", f"run{i:02d}") for i in range(runs)]
        self.verl_keys = verl_keys
        self.i = 0
        self.lock = threading.Lock()
        for _ in range(25):  # enough steps for windows and baselines to exist
            self.step()

    def step(self) -> None:
        import orjson
        with self.lock:
            rec = dict(self.lines[self.i % len(self.lines)])
            data = dict(rec["data"])
            have = len(data)
            for k in range(max(0, self.verl_keys - have)):
                data[f"synthetic/key_{k}"] = random.random()
            self.i += 1
            rec = {"step": self.i, "data": data}
            line = orjson.dumps(rec)
            for p, e in self.runs:
                self.store.ingest(p, e, parse_jsonl_line(line), "jsonl")

    def text(self) -> bytes:
        with self.lock:
            return generate_latest(self.registry)


def gpu_text(node: int, gpus_per_node: int, runs: int, total_gpus: int, t: float) -> bytes:
    """Per-GPU series of one node agent (GPU sampler families), values moving with ``t``."""
    out = []
    for m in GPU_SERIES:
        kind = "counter" if m.type == "counter" else "gauge"
        base = m.name[:-6] if kind == "counter" else m.name
        out.append(f"# HELP {base} {m.help}\n# TYPE {base} {kind}\n")
        for g in range(gpus_per_node):
            lab = f'node="node{node:04d}",gpu="{g}",uuid="GPU-{node:04d}-{g}"'
            if len(m.labels) > 3:
                lab += ',name="NVIDIA H200",peak_tflops="989"'
            v = t * 0.5 if kind == "counter" else (1.0 if len(m.labels) > 3 else abs(math.sin(t / 30 + g)))
            out.append(f"{m.name}{{{lab}}} {v:.3f}\n")
    gpu_index = node * gpus_per_node
    for m in PHASE_SERIES:
        base = m.name[:-6]
        out.append(f"# HELP {base} {m.help}\n# TYPE {base} counter\n")
        for g in range(gpus_per_node):
            run = (gpu_index + g) * runs // max(1, total_gpus)
            for ph in PHASES:
                lab = (f'project="load",experiment="run{run:02d}",node="node{node:04d}",gpu="{g}",'
                       f'uuid="GPU-{node:04d}-{g}",phase="{ph}"')
                out.append(f"{m.name}{{{lab}}} {t * 0.1:.3f}\n")
    return "".join(out).encode()


def series_counts(runs: Runs, gpus_per_node: int) -> dict:
    text = runs.text().decode()
    samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    verl = sum(1 for ln in samples if ln.startswith(n.PASSTHROUGH_PREFIX))
    per_run_all = (len(samples) - sum(1 for ln in samples if 'experiment="' not in ln)) / len(runs.runs)
    node = [ln for ln in gpu_text(0, gpus_per_node, len(runs.runs), gpus_per_node, 0).decode().splitlines()
            if ln and not ln.startswith("#")]
    return {"per_run_total": per_run_all, "per_run_verl": verl / len(runs.runs),
            "per_run_omniwatch": per_run_all - verl / len(runs.runs),
            "per_gpu": len(node) / gpus_per_node, "per_node": len(node), "exporter_global": len(samples) - per_run_all * len(runs.runs)}


# --- live ---------------------------------------------------------------------------------------------
class LoadServer:
    def __init__(self, runs: Runs, nodes: int, gpus_per_node: int):
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path == "/exporter":
                    body = runs.text()
                elif self.path.startswith("/node/"):
                    try:
                        i = int(self.path.rsplit("/", 1)[1])
                    except ValueError:
                        i = -1
                    if not 0 <= i < nodes:
                        self.send_error(404)
                        return
                    body = gpu_text(i, gpus_per_node, len(runs.runs), nodes * gpus_per_node, time.time() - outer.t0)
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.t0 = time.time()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def scrape_config(port: int, nodes: int, interval: str) -> dict:
    addr = f"127.0.0.1:{port}"
    return {"global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": "15s"},
            "scrape_configs": [
                {"job_name": "omniwatch", "metrics_path": "/exporter", "static_configs": [{"targets": [addr]}]},
                {"job_name": "omniwatch-agent", "static_configs": [
                    {"targets": [addr], "labels": {"__metrics_path__": f"/node/{i}", "node": f"node{i:04d}"}}
                    for i in range(nodes)]}]}


def cmd_live(a) -> dict:
    from scale_support import Prometheus, poll
    from omniwatch.rules import rule_files
    runs = Runs(a.runs, a.verl_keys)
    nodes = max(1, a.gpus // a.gpus_per_node)
    counts = series_counts(runs, a.gpus_per_node)
    srv = LoadServer(runs, nodes, a.gpus_per_node).start()
    cfg = scrape_config(srv.port, nodes, a.scrape_interval)
    if a.rules:
        cfg["rule_files"] = [str(p) for p in rule_files()]
    prom = Prometheus(cfg)
    stop = threading.Event()

    def stepper():
        while not stop.wait(a.step_s):
            runs.step()

    th = threading.Thread(target=stepper, daemon=True)
    try:
        prom.start()
        th.start()
        poll(lambda: (prom.metric("prometheus_tsdb_head_series") or 0) > 0, 60)
        time.sleep(a.warmup)
        s0, t0 = prom.metric("prometheus_tsdb_head_samples_appended_total"), time.monotonic()
        peak_rss = 0
        end = t0 + a.seconds
        while time.monotonic() < end:
            peak_rss = max(peak_rss, prom.rss_bytes())
            time.sleep(1)
        s1, t1 = prom.metric("prometheus_tsdb_head_samples_appended_total"), time.monotonic()
        return {"mode": "live", "gpus": a.gpus, "runs": a.runs, "nodes": nodes, "scrape_interval": a.scrape_interval,
                "rules": a.rules, "series_counts": counts, "head_series": prom.metric("prometheus_tsdb_head_series"),
                "samples_per_s": (s1 - s0) / (t1 - t0), "rss_bytes_end": prom.rss_bytes(), "rss_bytes_peak": peak_rss,
                "go_heap_inuse_bytes": prom.metric("go_memstats_heap_inuse_bytes"), "seconds": a.seconds}
    finally:
        stop.set()
        prom.stop()
        srv.stop()


# --- backfill ------------------------------------------------------------------------------------------
def _families(text: str) -> dict[str, tuple[str, list[tuple[str, float]]]]:
    """Exposition text -> {family: (type, [(sample name + labels, value)])}."""
    fams: dict[str, tuple[str, list]] = {}
    cur, typ = None, "gauge"
    for ln in text.splitlines():
        if ln.startswith("# TYPE "):
            _, _, cur, typ = ln.split(" ", 3)
            fams.setdefault(cur, (typ, []))
        elif ln and not ln.startswith("#") and cur is not None:
            key, val = ln.rsplit(" ", 1)
            fams[cur][1].append((key, float(val)))
    return fams


def write_openmetrics(path: Path, runs: Runs, nodes: int, gpus_per_node: int, hours: float, resolution: int) -> int:
    end = int(time.time()) - 3 * 3600  # create-blocks wants data older than the head
    start = end - int(hours * 3600)
    stamps = range(start, end, resolution)
    fams = _families(runs.text().decode())
    for i in range(nodes):
        for k, v in _families(gpu_text(i, gpus_per_node, len(runs.runs), nodes * gpus_per_node, 0).decode()).items():
            fams.setdefault(k, (v[0], []))[1].extend(v[1])
    lines = 0
    with open(path, "w") as f:
        for fam, (typ, samples) in fams.items():
            if typ not in ("gauge", "counter"):
                typ = "gauge"
            f.write(f"# TYPE {fam} {typ}\n")
            for key, v0 in samples:
                rnd = random.Random(hash(key))
                buf = []
                for j, ts in enumerate(stamps):
                    v = v0 + j * (0.5 if typ == "counter" else 0) + (0 if typ == "counter" else rnd.random() * 0.01)
                    buf.append(f"{key} {v:.4f} {ts}\n")
                f.write("".join(buf))
                lines += len(buf)
        f.write("# EOF\n")
    return lines


def cmd_backfill(a) -> dict:
    from scale_support import Prometheus, http, poll
    from omniwatch.dashboards.catalog import DASHBOARDS
    from omniwatch.dashboards.verify import substitute
    from omniwatch.promapi import PromAPI
    runs = Runs(a.runs, a.verl_keys)
    nodes = max(1, a.gpus // a.gpus_per_node)
    work = Path(tempfile.mkdtemp(prefix="owbackfill-"))
    try:
        om = work / "data.om"
        t = time.monotonic()
        n_samples = write_openmetrics(om, runs, nodes, a.gpus_per_node, a.hours, a.resolution)
        t_gen = time.monotonic() - t
        t = time.monotonic()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
                        str(om), str(work / "data")], check=True, capture_output=True, timeout=3600)
        t_blocks = time.monotonic() - t
        om.unlink()
        prom = Prometheus({"global": {"scrape_interval": "15s"}, "scrape_configs": []}, work / "p",
                          args=("--storage.tsdb.retention.time=30d",))
        shutil.move(str(work / "data"), str(work / "p" / "data"))
        try:
            prom.start(timeout=300)
            end = time.time() - 3 * 3600
            start = end - a.hours * 3600
            poll(lambda: http.get(f"{prom.url}/api/v1/query", params={"query": "count(omniwatch_step)", "time": end - 60})
                 .json()["data"]["result"], 120)
            step = max(15, int(a.hours * 3600 / 1000))  # Grafana: ~1000 points per panel
            p = PromAPI(prom.url, timeout=120)
            timings, errors = [], 0
            t_all = time.monotonic()
            for d in DASHBOARDS:
                for panel in d.panels():
                    for tgt in panel.targets:
                        q = substitute(tgt.expr, ".*", ".*", "2m", f"{a.resolution}s")
                        t = time.monotonic()
                        try:
                            p.query_range_data(q, start, end, step)  # one request, as Grafana sends it
                        except Exception:
                            errors += 1
                        timings.append((time.monotonic() - t, d.uid, panel.title))
            t_range = time.monotonic() - t_all
            timings.sort(reverse=True)
            return {"mode": "backfill", "gpus": a.gpus, "runs": a.runs, "hours": a.hours, "resolution_s": a.resolution,
                    "samples": n_samples, "generate_s": t_gen, "create_blocks_s": t_blocks,
                    "range_queries": len(timings), "range_query_errors": errors, "range_total_s": t_range,
                    "range_step_s": step, "slowest": [(round(x, 3), u, tt) for x, u, tt in timings[:5]],
                    "rss_bytes_after": prom.rss_bytes()}
        finally:
            prom.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _args(mode: str, argv: list[str]) -> argparse.Namespace:
    return _parser().parse_args([mode, *argv])


def sizing(seconds: float = 20) -> dict:
    """``benchmarks/run.py --only prometheus``: 64 GPUs x 10 runs, then 512 GPUs x 10 runs with the rules
    evaluated, each scraped every second for ``seconds`` after a warm-up."""
    loads = [cmd_live(_args("live", ["--gpus", "64", "--scrape-interval", "1s", "--seconds", str(seconds), "--warmup", "5"])),
             cmd_live(_args("live", ["--gpus", "512", "--scrape-interval", "1s", "--seconds", str(seconds * 1.5),
                                     "--warmup", "10", "--rules"]))]
    return {"loads": loads, "gpus_per_node": 8, "verl_keys": 150}


def queries(hours: float = 24, resolution: int = 60) -> dict:
    """``benchmarks/run.py --only queries``: every panel query over ``hours`` of backfilled 64-GPU data."""
    return cmd_backfill(_args("backfill", ["--gpus", "64", "--hours", str(hours), "--resolution", str(resolution)]))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for name in ("live", "backfill"):
        s = sub.add_parser(name)
        s.add_argument("--gpus", type=int, default=64)
        s.add_argument("--runs", type=int, default=10)
        s.add_argument("--gpus-per-node", type=int, default=8)
        s.add_argument("--verl-keys", type=int, default=150)
    sub.choices["live"].add_argument("--scrape-interval", default="15s")
    sub.choices["live"].add_argument("--seconds", type=float, default=60)
    sub.choices["live"].add_argument("--warmup", type=float, default=10)
    sub.choices["live"].add_argument("--step-s", type=float, default=5)
    sub.choices["live"].add_argument("--rules", action="store_true", help="also evaluate alerts/*.rules.yml")
    sub.choices["backfill"].add_argument("--hours", type=float, default=24)
    sub.choices["backfill"].add_argument("--resolution", type=int, default=60, help="seconds between samples")
    return ap


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    out = cmd_live(a) if a.mode == "live" else cmd_backfill(a)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
