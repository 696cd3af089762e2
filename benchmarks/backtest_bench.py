"""Backfill + backtest of a 2,000-step run through the real CLI (``omniwatch backtest RUN --json``):
wall time and what it found. "n/a" when the command is not there (area not built) or Prometheus
tooling is missing."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from common import faulty_spec
from omniwatch.simulate import step_dict


def _has_backtest() -> bool:
    r = subprocess.run([sys.executable, "-m", "omniwatch", "backtest", "--help"], capture_output=True, timeout=60)
    return r.returncode == 0


def run(steps: int = 2_000, timeout: float = 900) -> dict:
    if not _has_backtest():
        return {"status": "n/a", "why": "omniwatch backtest is not available"}
    if not (shutil.which("promtool") and shutil.which("prometheus")):
        return {"status": "n/a", "why": "prometheus/promtool not on PATH"}
    with tempfile.TemporaryDirectory() as d:
        run_file = Path(d) / "bench" / "backtest2k.jsonl"
        run_file.parent.mkdir()
        spec = faulty_spec("reward", start=steps // 2, seed=5)  # healthy first half, reward-bound after
        with open(run_file, "wb") as f:
            for s in range(1, steps + 1):
                f.write(orjson.dumps({"step": s, "data": step_dict(spec, s)}) + b"\n")
        cmd = [sys.executable, "-m", "omniwatch", "backtest", str(run_file), "--json"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
    out = {"steps": steps, "fault_from_step": steps // 2, "wall_s": wall, "target_s": 60, "returncode": r.returncode,
           "command": "omniwatch backtest <2000-step run> --json"}
    if r.returncode != 0:
        out["status"] = "failed"
        out["stderr"] = r.stderr[-500:]
        return out
    try:
        res = json.loads(r.stdout)
        out["alerts"] = sorted({a.get("alertname", "?") for a in res.get("alerts", [])})
    except (ValueError, AttributeError):
        out["alerts"] = "unparsed"
    out["status"] = "ok"
    return out
