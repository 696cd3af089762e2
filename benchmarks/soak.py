#!/usr/bin/env python3
"""The soak (issue 35): a real ``omniwatch serve`` beside 64 runs stepping every 2 s and Ray's state API of 512
workers, for ``duration`` seconds, scraped as Prometheus scrapes it.

- 64 runs: JSONL files under one ``--watch`` root (``<root>/soak/runNN.jsonl``), each held open as verl's
  FileLogger holds it and appended one verl-shaped line (``omniwatch.simulate.step_dict``, 80-120 keys,
  ``timing_s/step`` 2 s) every 2 s, the runs' steps spread evenly over the 2 s;
- Ray: the package's state-API stand-in (``python -m omniwatch.demo.raytasks --workers 512``, its own process, so
  its CPU is not the exporter's): 512 ``WorkerDict`` ranks on 64 nodes, a FlowGRPO step every 10 s (three phases
  per rank, one straggling rank, every third step held), Ray's filters, limits and finished rows by task id; the
  exporter polls it every 5 s (``--ray-tasks``, the default interval) as the run ``soak/run00``'s job;
- scrapes: ``GET /metrics`` every 15 s with a 10 s timeout (Prometheus' defaults); a scrape that fails or
  answers other than 200 is counted.

Measured from the exporter's ``/proc/<pid>``: CPU (utime + stime) as a share of one core, over the whole soak and
after ``fill`` seconds (the step windows and the Ray task ledger full: 22 steps x 2 s, 20,000 calls at ~150 calls/s);
RSS every 5 s, its growth after ``fill`` (last - first) and its least-squares slope (MiB/min). Nothing here is a
pass/fail test; the issue's targets (CPU <= 10 % of a core, RSS flat once the windows fill, no failed scrape) are
printed beside the figures.

    .venv/bin/python benchmarks/soak.py [--duration 600] [--fill 180] [--runs 64] [--workers 512]
    .venv/bin/python benchmarks/soak.py --ledger-fill      # the Ray source alone until its ledger is full
    .venv/bin/python benchmarks/run.py --only soak [--soak-seconds 600]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import median, pct, rss_bytes, serve_process  # noqa: E402

from omniwatch.demo.raytasks import JOB_ID  # noqa: E402
from omniwatch.proc import free_port, stop, wait_for  # noqa: E402
from omniwatch.simulate import RunSpec, step_dict  # noqa: E402

RUNS, STEP_S, WORKERS, SCRAPE_S, SCRAPE_TIMEOUT_S, SAMPLE_S = 64, 2.0, 512, 15.0, 10.0, 5.0
TARGET_CPU_SHARE = 0.10
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK   # utime, stime


def _writers(root: Path, stop_ev: threading.Event, written: list[int], runs: int = RUNS) -> threading.Thread:
    rng = random.Random(35)
    specs = [RunSpec(seed=r, pace=STEP_S, extra_keys=rng.randint(28, 68), validation_every=50, checkpoint_every=100)
             for r in range(runs)]
    (root / "soak").mkdir(parents=True, exist_ok=True)
    files = [open(root / "soak" / f"run{r:02d}.jsonl", "ab", buffering=0) for r in range(runs)]

    def loop():
        t0 = time.monotonic()
        i = 0
        try:
            while runs and not stop_ev.is_set():
                r, s = i % runs, i // runs + 1
                due = t0 + i * STEP_S / runs
                delay = due - time.monotonic()
                if delay > 0 and stop_ev.wait(delay):
                    break
                files[r].write(orjson.dumps({"step": s, "data": step_dict(specs[r], s)}) + b"\n")
                written[0] += 1
                i += 1
        finally:
            for f in files:
                f.close()
    th = threading.Thread(target=loop, name="soak-writers", daemon=True)
    th.start()
    return th


def run(duration: float = 600.0, fill: float | None = None, runs: int = RUNS, workers: int = WORKERS) -> dict:
    """``runs`` and ``workers`` (0: none) split the load, to tell which part costs what."""
    fill = min(180.0, duration / 2) if fill is None else fill
    tmp = Path(tempfile.mkdtemp(prefix="omniwatch-soak-"))
    root = tmp / "logs"
    root.mkdir()
    ray_port = free_port()
    ray = subprocess.Popen([sys.executable, "-m", "omniwatch.demo.raytasks", "--port", str(ray_port),
                            "--workers", str(workers)], stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL) \
        if workers else None
    stop_ev = threading.Event()
    written = [0]
    samples: list[tuple[float, float, int]] = []     # (seconds since start, exporter CPU s, RSS bytes)
    scrapes: list[tuple[float, bool, float, int]] = []  # (t, ok, seconds, bytes)
    last_text = [""]
    try:
        if ray:
            wait_for(lambda: httpx.get(f"http://127.0.0.1:{ray_port}/api/version", timeout=1).status_code == 200,
                     30, 0.1, what="the Ray state API stand-in")
        writers = _writers(root, stop_ev, written, runs)
        args = ["--watch", str(root), "--state-dir", str(tmp / "state")]
        if ray:
            args += ["--ray-tasks", f"http://127.0.0.1:{ray_port}", "--ray-job", JOB_ID, "--discovery-project", "soak",
                     "--discovery-experiment", "run00"]
        with serve_process(args, log=tmp / "exporter.log") as (proc, url):
            t0 = time.monotonic()
            client = httpx.Client(timeout=SCRAPE_TIMEOUT_S)

            def scraper():
                k = 0
                while not stop_ev.is_set():
                    due = t0 + k * SCRAPE_S
                    if stop_ev.wait(max(0.0, due - time.monotonic())):
                        return
                    t = time.monotonic()
                    try:
                        r = client.get(f"{url}/metrics")
                        ok, size = r.status_code == 200, len(r.content)
                        if ok:
                            last_text[0] = r.text
                    except httpx.HTTPError:
                        ok, size = False, 0
                    scrapes.append((t - t0, ok, time.monotonic() - t, size))
                    k += 1
            sc = threading.Thread(target=scraper, name="soak-scraper", daemon=True)
            sc.start()
            while (now := time.monotonic() - t0) < duration:
                samples.append((now, _cpu_s(proc.pid), rss_bytes(proc.pid)))
                time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - t0 - now)))
            samples.append((time.monotonic() - t0, _cpu_s(proc.pid), rss_bytes(proc.pid)))
            stop_ev.set()
            sc.join(SCRAPE_TIMEOUT_S + 2)
            client.close()
            alive = proc.poll() is None
        writers.join(5)
    finally:
        stop_ev.set()
        if ray:
            stop(ray, 5)
    log_tail = (tmp / "exporter.log").read_text(errors="replace")[-2000:]

    def metric(name: str) -> float | None:
        for line in last_text[0].splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                try:
                    return float(line.rsplit(" ", 1)[1])
                except ValueError:
                    return None
        return None

    after = [s for s in samples if s[0] >= fill]
    a0, a1 = after[0], after[-1]
    xs, ys = [s[0] / 60 for s in after], [s[2] / 2**20 for s in after]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sum((x - mx) ** 2 for x in xs) or 1)
    per_min = []
    for m in range(int(duration // 60)):
        w = [s for s in samples if m * 60 <= s[0] <= (m + 1) * 60]
        if len(w) >= 2:
            per_min.append(round(100 * (w[-1][1] - w[0][1]) / (w[-1][0] - w[0][0]), 1))
    lat = [s[2] for s in scrapes if s[1]]
    failed = [round(s[0], 1) for s in scrapes if not s[1]]
    return {
        "status": "ok", "runs": runs, "step_s": STEP_S, "workers": workers, "scrape_interval_s": SCRAPE_S,
        "duration_s": round(samples[-1][0], 1), "fill_s": fill, "steps_written": written[0],
        "cpu_share_total": round((samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]), 4),
        "cpu_share_after_fill": round((a1[1] - a0[1]) / (a1[0] - a0[0]), 4),
        "cpu_percent_per_minute": per_min, "target_cpu_share": TARGET_CPU_SHARE,
        "rss_mib_start": round(samples[0][2] / 2**20, 1), "rss_mib_at_fill": round(a0[2] / 2**20, 1),
        "rss_mib_end": round(a1[2] / 2**20, 1), "rss_mib_max": round(max(s[2] for s in samples) / 2**20, 1),
        "rss_growth_after_fill_mib": round((a1[2] - a0[2]) / 2**20, 1), "rss_slope_after_fill_mib_per_min": round(slope, 2),
        "rss_mib_per_minute": [round(min(samples, key=lambda s: abs(s[0] - 60 * m))[2] / 2**20, 1)
                               for m in range(int(samples[-1][0] // 60) + 1)],
        "scrapes": len(scrapes), "scrapes_failed": len(failed), "failed_at_s": failed[:20],
        "scrape_p50_ms": round(1000 * median(lat), 1) if lat else None,
        "scrape_p99_ms": round(1000 * pct(lat, 99), 1) if lat else None,
        "scrape_max_ms": round(1000 * max(lat), 1) if lat else None,
        "metrics_kib": round(scrapes[-1][3] / 1024, 1) if scrapes else None,
        "runs_exported": metric("omniwatch_runs"), "ray_polls": metric("omniwatch_ray_task_polls_total"),
        "state_api_calls": metric("omniwatch_ray_state_api_calls_total"),
        "ray_up": "omniwatch_ray_task_poll_seconds" in last_text[0], "exporter_alive_at_end": alive,
        "exporter_log_tail": log_tail if not alive else "",
    }


def ledger_fill(polls: int = 360, every_s: float = 3.3, workers: int = WORKERS) -> list[dict]:
    """Where the Ray source's memory stops: one TaskPoller in this process against the stand-in on a simulated clock
    (a poll every ``every_s`` s of Ray time, as fast as it runs), RSS and the ledger's bounded structures every 40
    polls: the done calls (20,000), the change log (80,000) and the dispatches' calls fill, then RSS is flat."""
    import gc

    from omniwatch.demo import raytasks as dr
    from omniwatch.discovery.taskwatch import TaskPoller
    clock = [1_800_000_000.0]

    class Simulated(dr.StateStandIn):
        def answer(self, path, now=None):
            return super().answer(path, now=clock[0])
    srv, port = dr.serve(standin=Simulated(workers=workers))
    p = TaskPoller(f"http://127.0.0.1:{port}", interval=5.0, timeout=30, job_id=dr.JOB_ID)
    led, out = p.ledger, []
    try:
        for i in range(polls + 1):
            clock[0] += every_s
            p.poll(now=clock[0])
            if i % 40 == 0:
                gc.collect()
                out.append({"ray_minutes": round(i * every_s / 60, 1), "rss_mib": round(rss_bytes() / 2**20, 1),
                            "done_calls": len(led.done), "changes": len(led.changes), "dispatch_calls": led.dispatch_calls})
    finally:
        p.api.close()
        srv.shutdown()
        srv.server_close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds (the issue's soak: 600)")
    p.add_argument("--fill", type=float, default=None, help="seconds before RSS growth is measured (default 180)")
    p.add_argument("--runs", type=int, default=RUNS, help="runs stepping (0: none)")
    p.add_argument("--workers", type=int, default=WORKERS, help="Ray workers (0: no Ray source)")
    p.add_argument("--ledger-fill", action="store_true", help="only the Ray source, in-process, on a simulated clock: "
                   "RSS until the task ledger's bounds fill (ledger_fill)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    r = ledger_fill(workers=a.workers) if a.ledger_fill else run(a.duration, a.fill, a.runs, a.workers)
    print(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
