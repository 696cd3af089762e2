"""The looping H200 replay that feeds the GPU panels (``omniwatch.gpu.loop``): wall-clock playback
through the real sampler and phase attribution reproduces, lap after lap, what the one-shot replay of
the same trace measured; bad traces and bad ``--gpu`` values are clear errors."""
from __future__ import annotations

import argparse
import json

import orjson
import pytest

from omniwatch.gpu import loop
from omniwatch.gpu.attribution import INTER_STAGE, Attributor
from omniwatch.gpu.sampler import GpuSampler
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_jsonl_line

TRACE = loop.DEFAULT_TRACE
RUN = ("replay", "h200")


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_samples_are_continuous_strictly_increasing_and_wrap_around_laps():
    clock = Clock(5000.0)
    b = loop.replay_backend(TRACE, gpus=3, clock=clock)
    lap = b.trace.lap_us / 1e6
    devs = b.open()
    assert len({d.uuid for d in devs}) == 3 and all(d.name == "NVIDIA H200" for d in devs)
    first = devs[0].samples(0)                       # a first read returns recent history, like NVML's ring
    assert first and first[-1][0] <= 5000.0 * 1e6
    last, n = first[-1][0], 0
    for _ in range(int(2.5 * lap)):
        clock.t += 1.0
        got = devs[0].samples(last)
        assert all(a[0] < b_[0] for a, b_ in zip(got, got[1:]))
        if got:
            assert got[0][0] > last and got[-1][0] <= clock.t * 1e6
            last = got[-1][0]
        n += len(got)
    per_s = n / int(2.5 * lap)
    assert 4.5 < per_s < 5.5                         # the H200's ~5 Hz, uninterrupted across two wraps
    # the GPUs are spread over the lap: not in lockstep
    assert devs[1].samples(0)[-40:] != devs[0].samples(0)[-40:]


def test_gauges_follow_utilisation_and_the_traced_memory():
    clock = Clock(0.0)
    b = loop.replay_backend(TRACE, clock=clock)
    d = b.open()[0]
    tr = b.trace
    watts, clocks = set(), set()
    for _ in range(int(tr.lap_us / 1e6)):
        clock.t += 1.0
        d.samples(int((clock.t - 1) * 1e6))
        watts.add(round(d.power_watts()))
        clocks.add(d.sm_clock_hz())
    r = loop.H200_READINGS
    assert min(watts) == round(r["idle_w"]) and max(watts) == round(r["busy_w"])
    assert min(clocks) == r["busy_sm_hz"] and max(clocks) == r["idle_sm_hz"]
    used, total = d.memory()
    assert total == tr.memory_total and 0 < used < total


def test_looped_playback_attributes_each_lap_like_the_one_shot_replay():
    """Steps ingested when their recorded end comes round, laid out over the replayed samples by the
    real attribution code: each lap's idle per phase equals the timing-layout figures the one-shot
    replay of the trace recorded (``results.per_phase[*].timing_layout_idle_s``)."""
    expected = {ph: v["timing_layout_idle_s"] for ph, v in json.loads(TRACE.read_text())["results"]["per_phase"].items()}
    clock = Clock(10_000.0)
    b = loop.replay_backend(TRACE, clock=clock)
    store = RunStore()
    sampler = GpuSampler(b, store, node="replay", clock=clock)
    att = Attributor(sampler, store, clock=clock)
    store.listeners.append(att.on_step)
    lap = b.trace.lap_us / 1e6
    step, seen = 0, clock.t
    per_lap = []
    for lap_no in (1, 2):
        while clock.t < 10_000.0 + lap_no * lap:
            clock.t += 0.5
            for arrival, timing in b.steps_between(seen, clock.t):
                step += 1
                line = orjson.dumps({"step": step, "data": timing})
                store.ingest(*RUN, parse_jsonl_line(line), "jsonl", arrival=arrival)
            seen = clock.t
            sampler.poll_once()
        per_lap.append({ph: idle for ph, (_busy, idle) in att.phase_totals(*RUN).items()})
    assert step == 2 * len(b.trace.steps)
    for ph in ("reward", "old_log_prob", "update_actor", INTER_STAGE):
        assert per_lap[0][ph] == pytest.approx(expected[ph], abs=0.3), ph
        assert per_lap[1][ph] - per_lap[0][ph] == pytest.approx(expected[ph], abs=0.3), ph
    assert att.ratios[RUN][1]["reward"] > 0.3        # odd steps score on the CPU: the GPU waits


@pytest.mark.parametrize("content, why", [
    (None, "cannot read"),
    (b"{not json", "not JSON"),
    (b'{"samples_us": [[1, 0]]}', "not an NVML trace"),
    (b'{"samples_us": [[1, 0]], "spans": []}', "fewer than two"),
    (b'{"samples_us": [[1, 0], [2, 500], [3, -1]], "spans": []}', "fewer than two"),
    (b'{"samples_us": "x", "spans": []}', "malformed trace"),
    (b"\xff\xfe", "not JSON"),
])
def test_bad_traces_are_value_errors_naming_the_file(tmp_path, content, why):
    p = tmp_path / "t.nvml.json"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(ValueError, match=why) as e:
        loop.load_trace(p)
    assert "t.nvml.json" in str(e.value)


def test_gpu_option_parses_modes_and_replays():
    assert [loop.gpu_option(v) for v in ("auto", "ON", " off ")] == ["auto", "on", "off"]
    b = loop.gpu_option("replay:")                   # alone: the committed H200 trace
    assert isinstance(b, loop.LoopBackend) and b.trace.name == TRACE.name
    assert loop.settings_extra(b) == {"gpu": "on", "gpu_backend": b}
    assert loop.settings_extra("off") == {"gpu": "off"} and loop.settings_extra(None) == {}
    for bad in ("maybe", "replay:/no/such/trace.json", "replay"):
        with pytest.raises(argparse.ArgumentTypeError):
            loop.gpu_option(bad)
    with pytest.raises(ValueError):
        loop.replay_backend(TRACE, gpus=0)
