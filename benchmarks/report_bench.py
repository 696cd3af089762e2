"""``omniwatch report DIR``: 50 runs x 500 steps under one VERL_FILE_LOGGER_ROOT (≈250 s steps, 100 keys per
line, validation every 50 / checkpoint every 100 steps, one of five faults from step 250), replayed and
backtested in ONE temporary Prometheus, one page per run plus the index. Wall time per phase, CPU time
(this process and its children: promtool, Prometheus, page workers) and the machine's load average,
since the 2-core development machine is shared. Target: under 2 minutes.

    .venv/bin/python benchmarks/run.py --only report
    .venv/bin/python benchmarks/report_bench.py [RUNS] [STEPS]
"""
from __future__ import annotations

import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import orjson

from omniwatch.simulate import Fault, RunSpec, step_dict

FAULTS = [None, ("reward_slow", {"factor": 5.0}), ("idle_gap", {"seconds_share": 0.3}),
          ("actor_slow", {"factor": 2.0}), ("mfu_value", {"value": 1.5})]


def write_root(root: Path, runs: int, steps: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for r in range(runs):
        k = FAULTS[r % len(FAULTS)]
        spec = RunSpec(seed=seed + r, extra_keys=rng.randint(30, 70), validation_every=50, checkpoint_every=100,
                       faults=[Fault(k[0], steps // 2, **k[1])] if k else [],
                       trainer="v1" if k and k[0] == "idle_gap" else "legacy")
        p = root / f"proj{r % 3}" / f"run-{r:03d}.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            for s in range(1, steps + 1):
                f.write(orjson.dumps({"step": s, "data": step_dict(spec, s)}) + b"\n")


class TimingProgress:
    """The backtest's progress hooks, recording the wall time and the CPU time (this process and the
    children that ended in it: promtool, Prometheus, workers) of each phase."""

    def __init__(self):
        self.phases: list[tuple[str, float, float]] = []
        self._name, self._t, self._c = None, 0.0, 0.0

    def phase(self, name: str, total=None) -> None:
        self._close()
        self._name, self._t, self._c = name, time.perf_counter(), _cpu()

    def advance(self, n: int = 1) -> None: ...

    def _close(self) -> None:
        if self._name is not None:
            self.phases.append((self._name, time.perf_counter() - self._t, _cpu() - self._c))
            self._name = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close()


def _cpu() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run(runs: int = 50, steps: int = 500) -> dict:
    if not (shutil.which("promtool") and shutil.which("prometheus")):
        return {"status": "n/a", "why": "prometheus/promtool not on PATH"}
    from omniwatch.backtest.runfile import load_run
    from omniwatch.report.index import build_index, find_runs
    from omniwatch.report.gather import facts_of_runs
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "verl-logs"
        write_root(root, runs, steps)
        load0 = os.getloadavg()[0]
        cpu0, t0 = _cpu(), time.perf_counter()
        prog = TimingProgress()
        with prog:
            prog.phase("load runs")
            recorded = [load_run(str(p)) for p in find_runs(root)]
            facts = facts_of_runs(recorded, progress=prog, annotations=False)  # as `omniwatch report DIR`
            out = Path(d) / "report" / "index.html"
            rows = build_index(facts, out, str(root), prog)
        wall = time.perf_counter() - t0
        cpu = _cpu() - cpu0
        size = sum(p.stat().st_size for p in out.parent.rglob("*.html"))
        page = max(p.stat().st_size for p in out.parent.rglob("runs/*/*.html"))
    return {"status": "ok", "runs": runs, "steps": steps, "wall_s": wall, "cpu_s": cpu, "load_avg_before": load0,
            "load_avg_after": os.getloadavg()[0], "phases": [{"phase": n, "s": round(s, 2), "cpu_s": round(c, 2)} for n, s, c in prog.phases],
            "pages_mb": size / 1e6, "largest_page_mb": page / 1e6,
            "alerts": sorted({a for r in rows for a in r["alerts"]}), "cores": os.cpu_count(), "target_s": 120}


if __name__ == "__main__":
    import json
    args = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(run(*args), indent=1))
