"""Helpers shared by the benchmark sections: verl-shaped input, percentiles, RSS, loopback ports and
an ``omniwatch serve`` subprocess. Nothing here asserts speed; sections return figures for the table."""
from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson

from omniwatch.proc import free_port, stop, wait_for
from omniwatch.simulate import Fault, RunSpec, step_dict

REPO = Path(__file__).resolve().parents[1]
BASE_KEYS = 52  # keys step_dict writes for a legacy trainer without padding


def verl_lines(steps: int, runs: int = 1, seed: int = 0, keys: tuple[int, int] = (80, 120)) -> list[tuple[int, bytes]]:
    """``steps`` JSONL lines spread round-robin over ``runs`` runs, each run padded to a key count drawn
    from ``keys`` (verl lines carry 80-120 keys). Returns (run index, line) pairs, steps in order per run."""
    rng = random.Random(seed)
    specs = [RunSpec(seed=seed + r, extra_keys=max(0, rng.randint(*keys) - BASE_KEYS),
                     validation_every=50, checkpoint_every=100) for r in range(runs)]
    out = []
    for i in range(steps):
        r = i % runs
        s = i // runs + 1
        out.append((r, orjson.dumps({"step": s, "data": step_dict(specs[r], s)})))
    return out


def faulty_spec(kind: str, start: int, seed: int = 0, pace: float = 250.0) -> RunSpec:
    faults = {
        "reward": Fault("reward_slow", start, factor=5.0),
        "idle": Fault("idle_gap", start, seconds_share=0.3),
        "mfu_impossible": Fault("mfu_value", start, value=1.5),
        "mfu_drop": Fault("actor_slow", start, factor=2.0),
    }
    return RunSpec(seed=seed, pace=pace, faults=[faults[kind]] if kind in faults else [])


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no data."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size from /proc (Linux), no extra dependency."""
    with open(f"/proc/{pid or 'self'}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@contextmanager
def serve_process(args: list[str], env: dict | None = None, log: Path | None = None):
    """``omniwatch serve`` on a free loopback port as a subprocess; yields (proc, base_url)."""
    port = free_port()
    out = open(log, "ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "omniwatch", "--log-level", "WARNING", "serve",
                             "--listen", f"127.0.0.1:{port}", *args],
                            env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is None and httpx.get(url + "/healthz", timeout=1).status_code == 200,
                 30, 0.1, what="omniwatch serve")
        yield proc, url
    finally:
        stop(proc, 10)
        if log:
            out.close()
