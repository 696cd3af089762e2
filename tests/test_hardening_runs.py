"""Issue 25 items 1, 2 and 8: the run model stays right under a full run cap, a retried push and a flood of
phase names. Each test has its control (the same path with the condition absent, or the real case the
guard must still catch)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fastapi.testclient import TestClient

from omniwatch import names
from omniwatch.app import create_app
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import DIGESTS_KEPT, RunStore
from omniwatch.core.parse import ParsedStep
from omniwatch.push import MAX_STEPS_PER_BODY
from omniwatch.settings import Settings

from .test_model import samples, value

TOKEN = "push-token-hardening-3"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GPU_KEYS = {"perf/total_num_images": 64.0, "perf/throughput": 0.8, "perf/time_per_step": 10.0}  # 8 GPUs


def step(n, **values):
    return ParsedStep(n, {"timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/reward": 1.0, **values})


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


# --- item 1: a new run is never locked out by stale ones -------------------------------------------------
def test_a_new_run_evicts_the_least_recently_active_at_the_cap_logs_once_and_is_counted(caplog):
    caplog.set_level(logging.WARNING, logger="omniwatch.core.model")
    clock = Clock()
    st = RunStore(max_runs=64, clock=clock)
    # a sweep killed a day ago, found in a log root (its lines are a day old at first sight: history, issue 35
    # item 6: a run that can page -- live or stalled -- is never dropped, history is)
    for i in range(70):
        clock.t += 1
        st.ingest("sweep", f"e{i:02d}", step(1), "jsonl", feed=f"jsonl:e{i}", arrival=clock.t - 86_400, backlog=True)
    assert len(st.runs) == 64 and value(st, names.RUNS_EVICTED_TOTAL) == 6  # the sweep's own first 6 made room
    clock.t += 86_400
    for n in range(1, 4):
        st.ingest("live", "new-run", step(n), "push", feed="push:live/new-run")
    st.ingest("live", "second", step(1), "push", feed="push:live/second")
    assert ("live", "new-run") in st.runs and ("live", "second") in st.runs
    assert value(st, names.STEP, project="live", experiment="new-run") == 3
    # the least recently active went: e06 and e07 (e00..e05 went while the sweep itself started)
    assert ("sweep", "e06") not in st.runs and ("sweep", "e07") not in st.runs and ("sweep", "e08") in st.runs
    assert value(st, names.RUNS_EVICTED_TOTAL) == 8 and value(st, names.MAX_RUNS) == 64
    assert not any(reason == "too_many_runs" for _, reason in st.errors)
    lines = [r.getMessage() for r in caplog.records if "run cap reached" in r.getMessage()]
    # one line for the 8 drops: the first (sweep/e00 for sweep/e64), naming the cap and the way out
    assert len(lines) == 1 and "sweep/e00" in lines[0] and "sweep/e64" in lines[0] and "--max-runs 64" in lines[0], lines


def test_control_below_the_cap_nothing_is_evicted_and_expired_runs_go_first(caplog):
    clock = Clock()
    st = RunStore(max_runs=3, clock=clock, run_expiry=60.0, stalled_expiry=60.0)
    for i in range(3):
        st.ingest("p", f"e{i}", step(1), "jsonl")
    assert value(st, names.RUNS_EVICTED_TOTAL) == 0 and len(st.runs) == 3
    clock.t += 120  # all three expired (finished runs): one makes room silently, as before
    with caplog.at_level(logging.WARNING, logger="omniwatch.core.model"):
        st.ingest("p", "new", step(1), "jsonl")
    assert ("p", "new") in st.runs and value(st, names.RUNS_EVICTED_TOTAL) == 0
    assert not [r for r in caplog.records if "run cap reached" in r.getMessage()]


# --- issue 35 item 6: the run cap never drops a run that can page ----------------------------------------------
def test_the_run_cap_never_drops_the_hung_run_that_is_paging_and_says_which_run_it_left_out(caplog):
    """Before: 63 runs stepping and one hung (its trainer still holding the log open, TrainingStalled critical):
    the first new run evicted exactly the hung one, whose critical resolved and never returned. Now a run that can
    page (live, stalled, its writer just gone) is never dropped: the newcomer is not admitted and the log says which,
    once. Control: a finished run at the cap makes room as before."""
    caplog.set_level(logging.WARNING, logger="omniwatch.core.model")
    clock = Clock()
    st = RunStore(max_runs=64, clock=clock)
    for n in range(1, 4):
        st.ingest("p", "hung", step(n), "jsonl", feed="jsonl:hung")
    st.set_log_open("p", "hung", True)
    for n in range(1, 40):   # 63 runs stepping every 10 s, long after the hung one's last step
        clock.t += 10
        for i in range(63):
            st.ingest("p", f"live{i:02d}", step(n), "jsonl", feed=f"jsonl:live{i}")
    for _ in range(3):
        st.ingest("p", "newcomer", step(1), "jsonl", feed="jsonl:newcomer")
    assert ("p", "hung") in st.runs and ("p", "newcomer") not in st.runs
    assert value(st, names.STEPS_TOTAL, project="p", experiment="hung") == 3   # still exported, still paging
    assert value(st, names.RUNS_EVICTED_TOTAL) == 0 and st.errors[("jsonl", "too_many_runs")] == 3
    said = [r.getMessage() for r in caplog.records if "NOT watched" in r.getMessage()]
    assert len(said) == 1 and "p/newcomer" in said[0] and "--max-runs 64" in said[0]
    # control: a run that finished (its config's total reached) makes room for the newcomer
    st.set_total_steps("p", "live00", 39)
    st.ingest("p", "newcomer", step(1), "jsonl", feed="jsonl:newcomer")
    assert ("p", "newcomer") in st.runs and ("p", "live00") not in st.runs and ("p", "hung") in st.runs
    assert value(st, names.RUNS_EVICTED_TOTAL) == 1


def test_a_flood_of_new_runs_never_resets_a_live_run():
    """Before: a sweep's 8 files at a cap of 8 (or 64 pushes at the default cap) evicted a live run and reset it
    (steps_total 13 -> 2, its reference and ledger dropped). Now the newcomers are refused while every run at the
    cap is live. Control: the live runs go on counting."""
    store = RunStore(max_runs=8)
    app = create_app(store, make_registry(store), Settings(push_token=TOKEN))
    with TestClient(app) as c:
        for n in range(1, 14):
            for i in range(8):
                c.post("/api/v1/push", headers=AUTH, json={"project": "live", "experiment": f"r{i}", "step": n,
                                                           "data": {"timing_s/step": 10.0}})
        for i in range(8):
            c.post("/api/v1/push", headers=AUTH, json={"project": "sweep", "experiment": f"s{i}", "step": 1,
                                                       "data": {"timing_s/step": 10.0}})
        c.post("/api/v1/push", headers=AUTH, json={"project": "live", "experiment": "r0", "step": 14,
                                                   "data": {"timing_s/step": 10.0}})
    assert value(store, names.STEPS_TOTAL, project="live", experiment="r0") == 14
    assert all(value(store, names.STEPS_TOTAL, project="live", experiment=f"r{i}") >= 13 for i in range(8))
    assert value(store, names.RUNS_EVICTED_TOTAL) == 0 and store.errors[("push", "too_many_runs")] == 8


# --- item 2: a retried push is idempotent ---------------------------------------------------------------
def _body(first: int, n: int, gen: float = 4.0) -> dict:
    return {"project": "p", "experiment": "e",
            "steps": [{"step": s, "data": {"timing_s/step": 10.0, "timing_s/gen": gen, **GPU_KEYS}}
                      for s in range(first, first + n)]}


def _ledger(store) -> float:
    return sum(store.runs[("p", "e")].gpu_seconds.values())


def test_a_retried_1000_step_push_does_not_double_the_ledger_or_count_a_restart():
    assert DIGESTS_KEPT >= MAX_STEPS_PER_BODY
    store = RunStore()
    app = create_app(store, make_registry(store), Settings(push_token=TOKEN, max_body_bytes=8 << 20))
    with TestClient(app) as c:
        body = _body(1, MAX_STEPS_PER_BODY)
        assert c.post("/api/v1/push", json=body, headers=AUTH).json()["accepted"] == 1000
        gpu_s = _ledger(store)
        assert gpu_s > 0
        # the client timed out after the server applied it, and resends the same body
        r = c.post("/api/v1/push", json=body, headers=AUTH).json()
        assert r == {"accepted": 0, "skipped": {"not_applied": 1000}}
        assert _ledger(store) == gpu_s
        assert value(store, names.TRAINER_RESTARTS_TOTAL, project="p", experiment="e") == 0
        assert value(store, names.STEPS_TOTAL, project="p", experiment="e") == 1000
        assert value(store, names.STEPS_REPLAYED_TOTAL, project="p", experiment="e") == 0
        # control: the trainer really ran steps 501..1000 again (other values): a restart, re-run work counted
        assert c.post("/api/v1/push", json=_body(501, 500, gen=4.5), headers=AUTH).json()["accepted"] == 500
    assert value(store, names.TRAINER_RESTARTS_TOTAL, project="p", experiment="e") == 1
    assert value(store, names.STEPS_REPLAYED_TOTAL, project="p", experiment="e") == 500
    assert _ledger(store) > gpu_s


_CHILD = textwrap.dedent("""
    import json, sys
    from omniwatch.core.model import RunStore
    from omniwatch.core.parse import ParsedStep
    from omniwatch.core.state import Checkpointer
    state, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    st = RunStore()
    cp = Checkpointer(st, [], state)
    cp.load()
    for s in range(first, first + n):
        st.ingest("p", "e", ParsedStep(s, {"timing_s/step": 10.0, "timing_s/gen": 4.0, "note/x": 1.0}), "push",
                  feed="push:p/e")
    cp.save()
    run = st.runs[("p", "e")]
    print(json.dumps({"restarts": run.restarts_total, "steps": run.steps_total, "replayed": run.replayed_total}))
""")


def _child(state, first, n, seed):
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(state), str(first), str(n)], env=env, check=True,
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_identical_step_resent_after_an_exporter_restart_is_not_a_trainer_restart(tmp_path):
    """The digest is checkpointed: it must be the same in the next process (Python's str hash is salted
    per process; two different PYTHONHASHSEEDs stand for two exporter processes)."""
    assert _child(tmp_path, 1, 20, seed=1) == {"restarts": 0, "steps": 20, "replayed": 0}
    assert _child(tmp_path, 11, 10, seed=2) == {"restarts": 0, "steps": 20, "replayed": 0}  # the same 10, resent
    # control: new steps after the restart are applied; the state really carried over
    assert _child(tmp_path, 21, 5, seed=3) == {"restarts": 0, "steps": 25, "replayed": 0}


# --- item 8: phases per run are capped like passthrough keys --------------------------------------------
def test_one_new_phase_name_per_step_is_capped_and_counted():
    st = RunStore(max_phases=16)
    for n in range(1, 3001):
        st.ingest("p", "e", step(n, **{f"timing_s/phase_{n}": 0.1}), "jsonl")
    s = samples(st)
    stage = {lab for (name, lab) in s if name == names.STAGE_SECONDS_TOTAL + "_total" or name == names.STAGE_SECONDS_TOTAL}
    gpu = {lab for (name, lab) in s if name == names.GPU_SECONDS_TOTAL}
    assert len(stage) == 16, len(stage)  # gen, reward, untracked and the first 13 new names
    phases = {dict(lab)["phase"] for lab in stage}
    assert "phase_13" in phases and "phase_14" not in phases and "untracked" in phases
    assert len(gpu) <= 16
    assert value(st, names.INGEST_ERRORS, source="jsonl", reason="phase_cap") == 3000 - 13
    # a dropped timer's time stays in the step's untracked rest: the step still sums to its duration
    last = st.runs[("p", "e")].last
    assert abs(sum(last.phases.values()) - 10.0) < 1e-9 and "phase_3000" not in last.phases
    # the phase names known before the cap still count
    assert value(st, names.STAGE_SECONDS_TOTAL, project="p", experiment="e", phase="gen") == 3000 * 4.0


def test_control_the_usual_phases_are_never_capped():
    st = RunStore()  # default cap
    known = ("feed", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "save_checkpoint")
    for n in range(1, 51):
        st.ingest("p", "e", ParsedStep(n, {"timing_s/step": 20.0, **{f"timing_s/{k}": 1.0 for k in known}}), "jsonl")
    assert not any(reason == "phase_cap" for _, reason in st.errors)
    for k in known:
        assert value(st, names.STAGE_SECONDS_TOTAL, project="p", experiment="e", phase=k) == 50.0


def test_step_digests_remember_the_last_1031_steps_of_any_stride_in_bounded_memory():
    from omniwatch.core.model import StepDigests
    d = StepDigests()
    for s in range(1, 3001):
        d.put(s, "push:p/e", s * 7)
    assert d.get(3000) == ("push:p/e", 21000) and d.get(3000 - DIGESTS_KEPT + 1) is not None
    assert d.get(3000 - DIGESTS_KEPT) is None and len(d) == DIGESTS_KEPT
    strided = StepDigests()  # a run that logs every 8th step: a 1,000-step body still fits
    for s in range(0, 8000, 8):
        strided.put(s, "push:p/e", -s)
    assert all(strided.get(s) == ("push:p/e", -s) for s in range(0, 8000, 8))
    short = StepDigests()  # a run of a few steps holds a few entries, not the 18 KiB table
    short.put(3, "jsonl:a", 1)
    assert short.steps is None and short.rows() == [(3, 0, 1)]


# --- issue 35 item 8: a copied log is judged by its steps' own times, not its file's ----------------------------
def _stale(store, experiment: str) -> float | None:
    return value(store, names.RUN_STALE, project="p", experiment=experiment)


def test_a_copied_log_of_a_killed_run_is_history_not_a_page(tmp_path):
    """Before: a run killed days ago, copied into the watched root without its mtime (cp -r, rsync without -t, a
    restore), paged TrainingStalled critical: history was judged by the file's mtime (now). Now a log read whole at
    first sight that was written faster than its steps ran (its steps' own timers against the file's birth, or the
    scan that first found it) is history, whether the exporter watched the copy happen or started after it.
    Controls: a log written live, step by step, is news; the copied run stepping again is live."""
    import shutil
    import time
    import orjson
    from omniwatch.sources.files import FileSource
    killed = Path(__file__).parent / "fixtures" / "verl" / "flowgrpo_stalled.jsonl"   # 18 steps, ~5.6 min each
    root = tmp_path / "root"
    (root / "p").mkdir(parents=True)
    store = RunStore(clock=time.time)
    src = FileSource(store, [str(root)], "jsonl")
    src.poll_once()
    shutil.copyfile(killed, root / "p" / "watched_copy.jsonl")   # the copy happens while the exporter watches
    live = root / "p" / "live.jsonl"
    with open(live, "wb", buffering=0) as f:   # control: a trainer writing 1-second steps as they end
        for n in range(1, 7):
            time.sleep(1.0)
            f.write(orjson.dumps({"step": n, "data": {"timing_s/step": 1.0, "timing_s/gen": 0.5}}) + b"\n")
            src._last_scan = 0.0
            src.poll_once()
    for _ in range(3):
        src._last_scan = 0.0
        src.poll_once()
    assert _stale(store, "watched_copy") == 1 and _stale(store, "live") == 0
    # a copy made before the exporter started: judged by the file's birth time (statx), where the file system has one
    from omniwatch.sources.tail import birth_time
    root2 = tmp_path / "root2"
    (root2 / "p").mkdir(parents=True)
    shutil.copyfile(killed, root2 / "p" / "earlier_copy.jsonl")
    store2 = RunStore(clock=time.time)
    FileSource(store2, [str(root2)], "jsonl").poll_once()
    if birth_time(str(root2 / "p" / "earlier_copy.jsonl")) is not None:
        assert _stale(store2, "earlier_copy") == 1
    # control: the copied run steps again, live: news (TrainingStalled may escalate from here)
    with open(root / "p" / "watched_copy.jsonl", "ab") as f:
        f.write(orjson.dumps({"step": 19, "data": {"timing_s/step": 300.0}}) + b"\n")
    for _ in range(70):
        src.poll_once()
        if store.runs[("p", "watched_copy")].last.step == 19:
            break
    assert _stale(store, "watched_copy") == 0
