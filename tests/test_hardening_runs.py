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

from fastapi.testclient import TestClient

from omniwatch import names
from omniwatch.app import create_app
from omniwatch.exposition import make_registry
from omniwatch.model import DIGESTS_KEPT, RunStore
from omniwatch.parse import ParsedStep
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
    caplog.set_level(logging.WARNING, logger="omniwatch.model")
    clock = Clock()
    st = RunStore(max_runs=64, clock=clock)
    # a sweep killed a day ago: 70 experiments of a remote log (no evidence they ended: 3-day expiry)
    for i in range(70):
        clock.t += 1
        st.ingest("sweep", f"e{i:02d}", step(1), "jsonl", feed=f"jsonl:e{i}")
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
    with caplog.at_level(logging.WARNING, logger="omniwatch.model"):
        st.ingest("p", "new", step(1), "jsonl")
    assert ("p", "new") in st.runs and value(st, names.RUNS_EVICTED_TOTAL) == 0
    assert not [r for r in caplog.records if "run cap reached" in r.getMessage()]


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
    from omniwatch.model import RunStore
    from omniwatch.parse import ParsedStep
    from omniwatch.state import Checkpointer
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
    from omniwatch.model import StepDigests
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
