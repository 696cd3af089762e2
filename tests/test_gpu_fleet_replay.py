"""The GPU replay check (issue 33 item 5): a real H200 run's NVML samples, Ray 2.60 task events and worker
process-title samples (tests/fixtures/gpu/h200_fleet.trace.json, recorded by benchmarks/gpu_fleet_validation.py at
the default 5 s poll) replayed through the sampler, the ledger, the poller (finals, recovery pages), the call
observer and the fleet accountant: the per-bucket figures the live run reported, within 2 %, and the truth (the
workers' own synchronized segments) within 2 %; every call longer than 0.2 s charged to its own fleet and phase."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from omniwatch.gpu import fleettrace as ft

FIXTURE = Path(__file__).parent / "fixtures" / "gpu" / "h200_fleet.trace.json"


@pytest.fixture(scope="module")
def doc():
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def replayed(doc):
    rr = ft.replay(json.loads(json.dumps(doc)), trace=True)
    return rr, ft.score(doc["truth"], rr["accountant"], rr["accountant"].trace)


def test_the_replay_reproduces_the_live_figures_and_the_truth(doc, replayed):
    rr, s = replayed
    assert rr["mismatches"] == 0   # every state-API request of the replayed polls had its recorded answer
    live = doc["live"]["score"]["buckets"]
    for k in ("productive", "overhead", "idle"):
        got = s["buckets"][k]
        assert got["measured_s"] == pytest.approx(live[k]["measured_s"], rel=0.02), k   # the live run's figure
        assert abs(got["error_pct"]) <= 2.0, (k, got)                                   # the truth
    assert s["buckets"]["productive"]["truth_s"] > 80 and s["buckets"]["idle"]["truth_s"] > 10


def test_every_call_longer_than_a_fifth_of_a_second_is_charged_to_its_fleet_and_phase(doc, replayed):
    rr, s = replayed
    calls = [c for c in doc["truth"] if c["exit"] - c["entry"] > 0.2]
    assert s["calls"] == len(calls) == 49 and s["calls_min_share"] >= 0.99, s["calls_below_95pct"]
    led = rr["poller"].ledger
    # 28 calls started and ended between two 5 s polls: found by the observer, recovered from finished pages
    assert led.recovered >= 20 and led.finals_exact >= 15 and led.finals_estimated == 0
    assert {c["phase"] for c in calls} == {"init_model", "wake_up", "generate_sequences", "sleep", "compute_log_prob",
                                           "update_actor", "update_weights"}


def test_the_poll_time_view_of_the_same_run_misses_the_target(doc):
    """The control: the same recording with calls closed at the poll that no longer sees them and no observer
    (what the accountant did before) is far off -- the check can fail."""
    rr = ft.replay(json.loads(json.dumps(doc)), finals=False, observe=False, trace=True)
    s = ft.score(doc["truth"], rr["accountant"], rr["accountant"].trace)
    assert s["buckets"]["overhead"]["error_pct"] > 10 and s["buckets"]["idle"]["error_pct"] > 50
    assert s["calls_min_share"] < 0.5


def test_a_recording_of_another_format_is_refused(doc):
    with pytest.raises(ValueError):
        ft.replay(dict(doc, format=99))
