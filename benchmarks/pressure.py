"""Descriptor and connection pressure (issue 14, item 1), on real ``omniwatch serve`` processes under
``prlimit --nofile=1024`` (the common default soft limit) on loopback.

``files``: a VERL_FILE_LOGGER_ROOT of 5,000 JSONL files (50 projects x 100 experiments, 3 steps each):
time to ingest them all, descriptors the process holds, CPU per poll while they are idle and while 1 % of
them grow — against the same watch with an unbounded descriptor pool (``--max-open-files 100000``: one
descriptor per file, the old design) under a limit that fits it (``nofile=8192``) in the same run.

``connections``: /metrics latency on fresh connections (as Prometheus scrapes) with no other client
(baseline), then while 1,000 idle connections are opened and held (slowloris: half a request head, then
nothing), from the same process; descriptors, connections held and the guard's counters.
"""
from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from common import free_port, median, pct, wait_until

TICK = os.sysconf("SC_CLK_TCK")
IDLE_SETTLE_S = 32.0


class Proc:
    def __init__(self, args: list[str], nofile: int, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = ["prlimit", f"--nofile={nofile}:{nofile}", "--", sys.executable, "-m", "omniwatch", "--log-level",
               "WARNING", "serve", "--listen", f"127.0.0.1:{self.port}", *args]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(lambda: self.proc.poll() is None and httpx.get(self.url + "/healthz", timeout=1).status_code == 200,
                   60, what="omniwatch serve")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def cpu_s(self) -> float:
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK

    def metric(self, name: str, **labels) -> float | None:
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if (line.startswith(name + "{") or line.startswith(name + " ")) and \
                    all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

    def sigterm_s(self) -> float:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return float("nan")
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def _line(step: int) -> bytes:
    return orjson.dumps({"step": step, "data": {"timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/reward": 1.0,
                                                "timing_s/update_actor": 4.0, "actor/grad_norm": 0.5}}) + b"\n"


def _watch_once(root: Path, n: int, extra: list[str], nofile: int, poll: float, tmp: Path) -> dict:
    p = Proc(["--watch", str(root), "--max-runs", str(n + 10), "--poll-interval", str(poll), *extra], nofile,
             tmp / f"files-{nofile}.log")
    try:
        t0 = time.monotonic()  # progress read from /api/v1/runs: a 5,000-run /metrics every 0.5 s would slow ingest
        wait_until(lambda: len(httpx.get(p.url + "/api/v1/runs", timeout=30).json()) == n, 300, 1.0, what=f"{n} runs")
        ingest_s = time.monotonic() - t0
        time.sleep(IDLE_SETTLE_S)  # steady state: files unchanged for 30 s are looked at every 4th poll
        fds = p.fds()
        # idle: nothing changes (a root where most runs finished long ago)
        c0, w0 = p.cpu_s(), time.monotonic()
        time.sleep(10.0)
        idle_cpu, idle_wall = p.cpu_s() - c0, time.monotonic() - w0
        # 1 % of the files grow by one step per poll
        growing = sorted(root.glob("*/*.jsonl"))[:: 100]
        handles = [open(f, "ab", buffering=0) for f in growing]
        try:
            c0, w0 = p.cpu_s(), time.monotonic()
            step = 4
            while time.monotonic() - w0 < 10.0:
                for h in handles:
                    h.write(_line(step))
                step += 1
                time.sleep(poll)
            busy_cpu, busy_wall = p.cpu_s() - c0, time.monotonic() - w0
        finally:
            for h in handles:
                h.close()
        fds_busy = p.fds()
        polls_idle, polls_busy = idle_wall / poll, busy_wall / poll
        return {"nofile": nofile, "ingest_s": round(ingest_s, 2), "fds_idle": fds, "fds_busy": fds_busy,
                "cpu_ms_per_poll_idle": round(1000 * idle_cpu / polls_idle, 2),
                "cpu_ms_per_poll_1pct_growing": round(1000 * busy_cpu / polls_busy, 2),
                "cpu_share_idle": round(idle_cpu / idle_wall, 3), "growing_files": len(growing),
                "sigterm_s": round(p.sigterm_s(), 2)}
    finally:
        p.stop()


def files(n: int = 5000, poll: float = 0.5) -> dict:
    if not shutil.which("prlimit"):
        return {"error": "prlimit (util-linux) not found"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        root = tmp / "verl-logs"
        per = 100
        for i in range(n):
            pd = root / f"proj{i // per:03d}"
            pd.mkdir(parents=True, exist_ok=True)
            (pd / f"exp{i % per:03d}.jsonl").write_bytes(_line(1) + _line(2) + _line(3))
        pooled = _watch_once(root, n, [], 1024, poll, tmp)
        for f in root.glob("*/*.jsonl"):  # same content again for the baseline run
            f.write_bytes(_line(1) + _line(2) + _line(3))
        unbounded = _watch_once(root, n, ["--max-open-files", "100000"], 8192, poll, tmp)
    return {"files": n, "poll_interval_s": poll, "pooled": pooled, "one_fd_per_file": unbounded,
            "fd_ratio": round(pooled["fds_idle"] / unbounded["fds_idle"], 3),
            "cpu_idle_ratio": round(pooled["cpu_ms_per_poll_idle"] / max(unbounded["cpu_ms_per_poll_idle"], 1e-9), 2)}


def _scrape(port: int) -> float:
    """One GET /metrics on a fresh connection (http.client: no client-side setup cost in the figure); ms."""
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"/metrics answered {r.status}")
    finally:
        c.close()
    return (time.perf_counter() - t) * 1000


def _scrapes(port: int, n: int) -> list[float]:
    return [_scrape(port) for _ in range(n)]


def connections(idle: int = 1000, scrapes: int = 200) -> dict:
    if not shutil.which("prlimit"):
        return {"error": "prlimit (util-linux) not found"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        root = tmp / "verl-logs" / "proj"
        root.mkdir(parents=True)
        for e in range(20):  # a /metrics of a realistic size: 20 runs
            (root / f"exp{e:02d}.jsonl").write_bytes(b"".join(_line(s) for s in range(1, 31)))
        p = Proc(["--watch", str(tmp / "verl-logs")], 1024, tmp / "conns.log")
        socks: list[socket.socket] = []
        try:
            wait_until(lambda: p.metric("omniwatch_runs") == 20, 60, what="20 runs")
            base = _scrapes(p.port, scrapes)
            fds0 = p.fds()
            t0 = time.monotonic()
            for _ in range(idle):
                s = socket.socket()
                s.settimeout(2)
                try:
                    s.connect(("127.0.0.1", p.port))
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    socks.append(s)
                except OSError:
                    s.close()
            open_s = time.monotonic() - t0
            fds1 = p.fds()
            c0, w0 = p.cpu_s(), time.monotonic()
            loaded = []
            while len(loaded) < scrapes and time.monotonic() - t0 < 8.0:  # inside the 10 s head deadline
                loaded.append(_scrape(p.port))
            cpu = (p.cpu_s() - c0) / (time.monotonic() - w0)
            held = p.metric("omniwatch_http_connections")
            closed = {r: p.metric("omniwatch_http_connections_closed_total", reason=r)
                      for r in ("evicted", "header_timeout", "over_capacity", "accept_error")}
            sig = p.sigterm_s()
        finally:
            for s in socks:
                s.close()
            p.stop()
    return {"idle_connections_opened": len(socks), "opening_s": round(open_s, 2), "scrapes": scrapes,
            "baseline_p50_ms": round(median(base), 2), "baseline_p99_ms": round(pct(base, 99), 2),
            "loaded_scrapes": len(loaded), "loaded_p50_ms": round(median(loaded), 2), "loaded_p99_ms": round(pct(loaded, 99), 2),
            "p50_ratio": round(median(loaded) / median(base), 2), "p99_ratio": round(pct(loaded, 99) / pct(base, 99), 2),
            "server_cpu_share_while_loaded": round(cpu, 3), "fds_before": fds0, "fds_loaded": fds1,
            "connections_held": held, "closed_by_guard": closed, "sigterm_s": round(sig, 2), "nofile": 1024}
