"""Ingest + analytics throughput on verl-shaped JSONL (80-120 keys per line): parse only, parse +
``RunStore.ingest``, and ``FileSource.poll_once`` over real files (end to end: the file tail); plus a
cProfile of parse + ingest so the report says *where* the time goes, not just how much there is."""
from __future__ import annotations

import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_jsonl_line
from omniwatch.sources.files import FileSource

from common import verl_lines

RUNS = 10
ROUNDS = 3
# End to end (through the file tail), issue 23: the per-step path was ~5-7k steps/s after the alert-judgment
# work; it must stay at or above this on `make bench` (docs/benchmarks.md quotes it against parse alone).
TARGET_STEPS_PER_S = 15_000


def _ingest_all(store: RunStore, lines) -> None:
    for r, line in lines:
        store.ingest("bench", f"run{r}", parse_jsonl_line(line), "jsonl", arrival=0.0, feed=f"jsonl:run{r}")


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def profile_top(lines, top: int = 12) -> list[dict]:
    prof = cProfile.Profile()
    store = RunStore()
    prof.enable()
    _ingest_all(store, lines)
    prof.disable()
    st = pstats.Stats(prof, stream=io.StringIO())
    total = sum(v[2] for v in st.stats.values()) or 1.0
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _callers) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        where = f"{Path(file).name}:{line}" if file != "~" else "builtin"
        rows.append({"function": f"{where}({fn})", "calls": nc, "tottime_s": round(tt, 4),
                     "cumtime_s": round(ct, 4), "share_of_total": round(tt / total, 3)})
    return rows


def _file_source(lines, steps: int) -> tuple[int, float]:
    """Every line through ``FileSource.poll_once`` over real files (one per run): (steps applied, CPU s)."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "bench"
        root.mkdir()
        per_run = {}
        for r, line in lines:
            per_run.setdefault(r, []).append(line)
        for r, ls in per_run.items():
            (root / f"run{r}.jsonl").write_bytes(b"\n".join(ls) + b"\n")
        fstore = RunStore()
        src = FileSource(fstore, [d], "jsonl", max_line=1 << 20)
        t0 = time.process_time()
        applied, polls = 0, 0
        while applied < steps and polls < 10_000:
            applied += src.poll_once()
            polls += 1
        t_file = time.process_time() - t0
        for t in src.tails.values():
            t.close()
    return applied, t_file


def run(steps: int = 20_000, profile: bool = True, rounds: int = ROUNDS) -> dict:
    """Parse alone, parse + ingest and the file tail, ``rounds`` times interleaved, each path's best round.
    Times are CPU seconds of this process (``time.process_time``, system time of the file reads included):
    the machine is shared, and a path measured while another process held the core would look slower than it
    is; the ratio to parse alone in the same run is the figure that travels between machines."""
    lines = verl_lines(steps, RUNS, seed=1)
    n_values = sum(line.count(b'":') - 1 for _, line in lines)  # keys in data (minus "step"/"data")
    keys_per_line = n_values / len(lines)

    t_parse = t_ingest = t_file = float("inf")
    applied = 0
    for _ in range(rounds):
        t0 = time.process_time()
        for _, line in lines:
            parse_jsonl_line(line)
        t_parse = min(t_parse, time.process_time() - t0)

        store = RunStore()
        t0 = time.process_time()
        _ingest_all(store, lines)
        t_ingest = min(t_ingest, time.process_time() - t0)
        assert sum(r.steps_total for r in store.runs.values()) == steps, "every step must be applied once"

        applied, t = _file_source(lines, steps)
        t_file = min(t_file, t)

    out = {
        "steps": steps, "runs": RUNS, "keys_per_line": round(keys_per_line, 1), "rounds": rounds,
        "clock": "process_time",
        "parse_steps_per_s": _rate(steps, t_parse),
        "ingest_steps_per_s": _rate(steps, t_ingest),
        "ingest_values_per_s": _rate(n_values, t_ingest),
        "file_source_steps_per_s": _rate(applied, t_file),
        "file_source_values_per_s": _rate(n_values * applied / steps, t_file),
        "file_source_applied": applied,
        "file_source_to_parse": t_parse / t_file if t_file > 0 else float("inf"),
        "target_steps_per_s": TARGET_STEPS_PER_S,
    }
    if profile:
        out["profile_lines"] = min(len(lines), 10_000)
        out["profile_top"] = profile_top(lines[: out["profile_lines"]])
    return out
