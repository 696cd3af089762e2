"""Exporter memory: RSS and tracemalloc of the run model after 100,000 steps across 10 runs, and after
50,000 distinct keys are offered to one run (the per-run key cap must hold it). Each scenario runs in
a fresh child interpreter so one scenario's heap does not hide another's."""
from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

from common import rss_bytes, verl_lines


def _steps(total: int, trace: bool) -> dict:
    """A pool of 1,000 real lines (100 per run) is parsed again and again with rising step numbers, so
    the input costs almost nothing and what grows is the model."""
    from omniwatch.core.model import RunStore
    from omniwatch.core.parse import parse_jsonl_line
    runs = 10
    pool = verl_lines(1_000, runs, seed=3)
    base = rss_bytes()
    if trace:
        tracemalloc.start()
    store = RunStore()
    for i in range(total):
        r, line = pool[i % len(pool)]
        s = parse_jsonl_line(line)
        s.step = i // runs + 1
        store.ingest("bench", f"run{r}", s, "jsonl", arrival=0.0, feed=f"run{r}")
    cur, peak = tracemalloc.get_traced_memory() if trace else (0, 0)
    tracemalloc.stop()
    out = {"steps": total, "runs": runs, "steps_total": sum(r.steps_total for r in store.runs.values()),
           "keys_held": sum(len(r.keys) for r in store.runs.values())}
    if trace:
        out.update(tracemalloc_current_mib=cur / 2**20, tracemalloc_peak_mib=peak / 2**20)
    else:
        out.update(rss_growth_mib=(rss_bytes() - base) / 2**20, rss_mib=rss_bytes() / 2**20)
    return out


def _keys(total: int) -> dict:
    from omniwatch.core.model import RunStore
    from omniwatch.core.parse import parse_record
    per_step = 100
    base = rss_bytes()
    tracemalloc.start()
    store = RunStore()
    for s in range(total // per_step):
        data = {f"custom/metric_{s * per_step + i}": float(i) for i in range(per_step)}
        store.ingest("bench", "keys", parse_record({"step": s + 1, "data": data}), "jsonl", arrival=0.0)
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    run = store.runs[("bench", "keys")]
    return {"keys_offered": total, "keys_held": len(run.keys), "cap": store.max_keys,
            "cardinality_cap_errors": store.errors.get(("jsonl", "cardinality_cap"), 0),
            "rss_growth_mib": (rss_bytes() - base) / 2**20, "rss_mib": rss_bytes() / 2**20,
            "tracemalloc_current_mib": cur / 2**20, "tracemalloc_peak_mib": peak / 2**20}


def _child(kind: str, n: int) -> dict:
    here = Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, str(here / "memory.py"), kind, str(n)], capture_output=True, text=True,
                         timeout=1800, cwd=here)
    if out.returncode:
        raise RuntimeError(f"memory child {kind} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(steps: int = 100_000, keys: int = 50_000) -> dict:
    return {"steps": {**_child("steps", steps), **_child("steps-traced", steps)}, "keys": _child("keys", keys)}


if __name__ == "__main__":
    kind, n = sys.argv[1], int(sys.argv[2])
    print(json.dumps(_keys(n) if kind == "keys" else _steps(n, trace=kind == "steps-traced")))
