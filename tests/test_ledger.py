"""The GPU-hours ledger: buckets that sum to the total, checked against values computed by hand from the
raw verl keys of the fixtures, and the live counters fed by the same function."""
from __future__ import annotations

import orjson
import pytest

from omniwatch import names
from omniwatch.core import ledger
from omniwatch.config import DEFAULT
from omniwatch.core.analytics import analyze_step
from omniwatch.core.model import RunStore
from omniwatch.core.parse import ParsedStep, parse_jsonl_line

from .conftest import fixture_path
from .test_model import samples, value

TOLERANCE = ledger.stall_tolerance_steps(DEFAULT)  # the alert config the shipped rules were made with


def raw(name: str, index: int) -> dict:
    return orjson.loads(fixture_path(name).read_bytes().splitlines()[index])["data"]


def rec_of(d: dict, step: int = 5):
    return analyze_step(step, {k: float(v) for k, v in d.items() if isinstance(v, (int, float))}, 0.0)


def test_gpus_come_from_verl_own_throughput_formula():
    d = raw("flowgrpo_healthy", 4)
    # VeRL-Omni: perf/throughput = total_num_images / (time_per_step * n_gpus)
    assert d["perf/total_num_images"] / (d["perf/throughput"] * d["perf/time_per_step"]) == pytest.approx(4)
    assert ledger.gpus_from_keys({k: float(v) for k, v in d.items()}) == 4
    assert ledger.gpus_from_keys({"perf/total_num_images": 512.0}) is None
    assert ledger.gpus_from_keys({"perf/total_num_images": 512, "perf/throughput": 0.3, "perf/time_per_step": 250}) is None  # 6.8 GPUs


def test_colocated_step_by_hand():
    d = raw("flowgrpo_healthy", 4)
    step = d["timing_s/step"]
    interval = step + 40.0
    got = ledger.split(rec_of(d), interval, step, TOLERANCE)
    timed = {k[9:]: v for k, v in d.items() if k.startswith("timing_s/") and "/" not in k[9:]
             and k[9:] not in ("step", "testing", "start_profile", "stop_profile")}
    assert got["gen"] == pytest.approx(d["timing_s/gen"])
    assert got["reward_critical_path"] == pytest.approx(d["timing_s/reward"])  # colocated: the reward timer
    assert got["update_actor"] == pytest.approx(d["timing_s/update_actor"])
    assert got["inter_stage_idle"] == pytest.approx(step - sum(timed.values()))
    assert got["outside_step_timer"] == pytest.approx(40.0)
    assert "stalled" not in got
    assert sum(got.values()) == pytest.approx(interval)


def test_streamed_reward_tail_is_taken_out_of_gen():
    d = raw("flowgrpo_async_reward_tail", 20)
    tail = min(d["timing_s/gen"] - d["timing_s/agent_loop/generate_sequences/max"],
               d["timing_s/agent_loop/compute_score/max"])
    got = ledger.split(rec_of(d, 21), None, None, TOLERANCE)
    assert got["reward_critical_path"] == pytest.approx(tail + max(0.0, d["timing_s/reward"]))
    assert got["gen"] == pytest.approx(d["timing_s/gen"] - tail)
    assert sum(got.values()) == pytest.approx(d["timing_s/step"])  # no interval: the step itself


def test_validation_checkpoint_and_a_stall_each_have_their_bucket():
    d = dict(raw("flowgrpo_healthy", 4))
    step = d["timing_s/step"]
    d["timing_s/testing"] = 100.0
    d["timing_s/save_checkpoint"] = 300.0  # inside the step timer: the other timers are scaled to fit
    d["timing_s/step"] = step + 300.0
    tol = TOLERANCE * step
    interval = d["timing_s/step"] + 100.0 + tol + 900.0
    got = ledger.split(rec_of(d), interval, step, TOLERANCE)
    assert got["validation"] == pytest.approx(100.0)
    assert got["checkpoint"] == pytest.approx(300.0)
    assert got["outside_step_timer"] == pytest.approx(tol)
    assert got["stalled"] == pytest.approx(900.0)
    assert sum(got.values()) == pytest.approx(interval)


def test_timers_that_exceed_the_step_are_scaled_to_it():
    rec = analyze_step(3, {"timing_s/step": 10.0, "timing_s/gen": 8.0, "timing_s/update_actor": 4.0}, 0.0)
    got = ledger.split(rec, None, None, TOLERANCE)
    assert got == pytest.approx({"gen": 10 * 8 / 12, "update_actor": 10 * 4 / 12})


def test_live_counters_sum_to_gpus_times_wall_time():
    """Steps observed live 300 s apart on a run of 4 GPUs: the counters add up to 4 x the wall time (the
    first step counts its own step timer); backlog steps (file catch-up) count only their step."""
    now = [1000.0]
    st = RunStore(clock=lambda: now[0])
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines()
    wall = 0.0
    for i, line in enumerate(lines[:10]):
        p = parse_jsonl_line(line)
        if i:
            now[0] += 300.0
            wall += 300.0
        else:
            wall += p.values["timing_s/step"]
        st.ingest("p", "e", p, "jsonl", feed="jsonl:f")
    total = sum(v for (name, _), v in samples(st).items() if name == names.GPU_SECONDS_TOTAL)
    assert total == pytest.approx(4 * wall)
    assert value(st, names.RUN_GPUS, project="p", experiment="e", origin="log") == 4
    before = total
    st.ingest("p", "e", parse_jsonl_line(lines[10]), "jsonl", feed="jsonl:f", backlog=True)
    after = st.runs[("p", "e")].gpu_seconds
    assert sum(after.values()) == pytest.approx(before + 4 * parse_jsonl_line(lines[10]).values["timing_s/step"])


def test_a_run_whose_keys_cannot_tell_uses_the_flag_and_says_so():
    st = RunStore(gpus=8)
    st.ingest("p", "e", ParsedStep(1, {"timing_s/step": 10.0, "timing_s/gen": 6.0}), "push")
    assert value(st, names.RUN_GPUS, project="p", experiment="e", origin="flag") == 8
    assert st.runs[("p", "e")].gpu_seconds["gen"] == pytest.approx(48.0)
    st2 = RunStore()
    st2.ingest("p", "e", ParsedStep(1, {"timing_s/step": 10.0, "timing_s/gen": 6.0}), "push")
    assert not st2.runs[("p", "e")].gpu_seconds  # unknown GPUs: nothing invented


def test_the_ledger_does_not_depend_on_when_metrics_were_scraped():
    """Issue 23: the stall tolerance read a typical step that only scrapes refreshed, so the same lines gave
    a `stalled` bucket when /metrics was read after every step and none when it was never read. Steps of
    ~250 s arriving 757 s apart (under the 3-typical-step pause that makes the model read its statistics
    itself, over the 2-typical-step tolerance beyond the step): the same ledger either way, stalled > 0."""
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines()[:12]

    def run(scrape: bool) -> dict[str, float]:
        now = [1000.0]
        st = RunStore(clock=lambda: now[0])
        for i, line in enumerate(lines):
            now[0] += 0.0 if i == 0 else 757.0
            st.ingest("p", "e", parse_jsonl_line(line), "jsonl", feed="jsonl:f")
            if scrape:
                samples(st)
        return dict(st.runs[("p", "e")].gpu_seconds)

    scraped, unscraped = run(True), run(False)
    assert scraped.keys() == unscraped.keys()
    for bucket in scraped:
        assert scraped[bucket] == pytest.approx(unscraped[bucket]), bucket
    assert unscraped["stalled"] > 0  # the pauses beyond the tolerance are stalled time in both
