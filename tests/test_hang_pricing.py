"""The stall priced (issue 31 item 3): a hang is never "0 GPU-h". The ledger books a stall only when the next step
arrives, so the reports add the stall still open at their end (ledger.open_stall): GPUs x the time past the last
step beyond the stall tolerance and the planned work. Here a recorded run of 4 GPUs, 20 s steps, hung for 10 minutes
(its report made 10 minutes after its last line: ``report --until``), is priced >= 0.9 x GPUs x the hung time as
TrainingStalled with the hang's remedy, the index says it stalled, and a finished run is priced nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from omniwatch import names
from omniwatch.core import ledger
from omniwatch.config import DEFAULT
from omniwatch.report.facts import HOUR
from omniwatch.report.gather import facts_of_runs, load_runs
from omniwatch.report.index import end_text
from omniwatch.report.verdict import verdict

GPUS, STEP_S, HUNG_S = 4, 20.0, 600.0


def write_run(path, steps: int, total: int | None = None) -> None:
    """verl file-logger lines: 20 s steps on 4 GPUs (perf/throughput = images / (time_per_step x n_gpus))."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for s in range(1, steps + 1):
            data = {"timing_s/step": STEP_S, "timing_s/gen": 12.0, "timing_s/update_actor": 7.0,
                    "perf/total_num_images": 16, "perf/time_per_step": STEP_S,
                    "perf/throughput": 16 / (STEP_S * GPUS)}
            if total is not None and (s % 5 == 0 or s == total):   # save_freq 5, and verl saves on the last step
                data["timing_s/save_checkpoint"] = 5.0
            f.write(json.dumps({"step": s, "data": data}) + "\n")


def test_open_stall_is_the_gap_beyond_the_due_step_the_tolerance_and_the_planned_work():
    tol = ledger.stall_tolerance_steps(DEFAULT)   # TrainingStalled's info stage less one typical step, as split()
    assert ledger.open_stall(600, 20, tol, 0) == pytest.approx(600 - tol * 20)
    assert ledger.open_stall(600, 20, tol, 100) == pytest.approx(600 - tol * 20 - 100)
    assert ledger.open_stall(40, 20, tol, 0) == 0 and ledger.open_stall(600, None, tol, 0) == 0


def test_a_run_hung_ten_minutes_is_priced_at_least_nine_tenths_of_gpus_times_the_hang(tmp_path):
    hung, done = tmp_path / "root" / "p" / "hung.jsonl", tmp_path / "root" / "p" / "done.jsonl"
    write_run(hung, 15)
    write_run(done, 12, total=12)   # its last step carried the forced final checkpoint, off its cadence: finished
    base = [f for f in facts_of_runs(load_runs([hung]), alerts=False)][0]
    until = base.last_step_at + HUNG_S
    f_hung, f_done = facts_of_runs(load_runs([hung, done]), alerts=False, until=until)
    assert f_hung.gpus == GPUS and f_hung.end_state == "unfinished"
    stalled_h = f_hung.gpu_seconds[ledger.STALLED] / HOUR
    assert stalled_h >= 0.9 * GPUS * HUNG_S / HOUR, stalled_h
    bs = verdict(f_hung)
    assert bs[0].alertname == names.ALERT_STALLED and bs[0].gpu_hours == pytest.approx(stalled_h)
    assert bs[0].gpu_hours >= 0.9 * GPUS * HUNG_S / HOUR
    assert "nothing to do yet" not in bs[0].remedy.lower() and bs[0].remedy.startswith("Check the trainer process")
    assert "still open at the report's end: no step for 10.0 min" in bs[0].note
    assert end_text(f_hung) == "stalled: no step for 10 min"
    # the same run's report without --until ends at its last line: nothing open, but never "finished"
    assert base.open_stall_s == 0 and end_text(base) == "unfinished (no finish seen)"
    # a finished run is priced no stall, whatever the report's end
    assert f_done.end_state == "finished" and f_done.gpu_seconds.get(ledger.STALLED, 0) == 0
    assert end_text(f_done) == "finished"


@pytest.mark.integration
def test_report_until_now_prices_a_hang_in_the_page_and_json(tmp_path):
    """The CLI a person types while the run hangs: `omniwatch report run.jsonl --until now --no-alerts --json`."""
    run = tmp_path / "root" / "p" / "hung.jsonl"
    write_run(run, 15)
    past = os.path.getmtime(run) - HUNG_S
    os.utime(run, (past, past))   # its last line was written 10 minutes ago
    r = subprocess.run([sys.executable, "-m", "omniwatch", "report", str(run), "--until", "now", "--no-alerts",
                        "--json", "-o", str(tmp_path / "r.html"), "--quiet"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    top = out["verdict"][0] if "verdict" in out else out["bottlenecks"][0]
    assert top["bottleneck"] == names.ALERT_STALLED and top["gpu_hours"] >= 0.9 * GPUS * HUNG_S / HOUR, top
