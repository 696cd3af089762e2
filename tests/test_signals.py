"""Signals the seeds name (issue 13 item 11): rollout straggler tail, non-finite actor/grad_norm (a skipped
update), rollout-correction rejection, time outside the step timer, timers that exceed the step.

Per-step values are checked by hand against the raw keys; window statistics over hand-built runs; the
exposition through the real collector; the thresholds of config.py against the simulator's faults
(each fires at its 3rd faulty normal step, never on the healthy runs of every layout)."""
from __future__ import annotations

import logging

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omniwatch import names
from omniwatch.config import DEFAULT
from omniwatch.core.analytics import ARRIVAL_JITTER_SECONDS, RunWindow, analyze_step, time_outside
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.core.parse import ParsedStep, parse_console_line, parse_jsonl_line, parse_record
from omniwatch.simulate import Fault, RunSpec, outside_seconds, step_dict, wall_seconds
from omniwatch.core.state import restore_store, snapshot_store

from .conftest import SCENARIOS, fixture_path

GEN_MAX, GEN_MEAN = "timing_s/agent_loop/generate_sequences/max", "timing_s/agent_loop/generate_sequences/mean"
RS, RS_BYPASS = "rollout_corr/rollout_rs_seq_masked_fraction", "actor/rollout_corr/rollout_rs_seq_masked_fraction"


def run_samples(store: RunStore, experiment: str = "e") -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(make_registry(store)).decode()):
        for s in fam.samples:
            if s.labels.get("experiment") == experiment:
                lab = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("project", "experiment")))
                out[(s.name, lab)] = s.value
    return out


# --- parsing keeps the fact that a value was non-finite ------------------------------------------------
def test_a_null_grad_norm_is_counted_and_kept_as_a_fact_of_the_step():
    p = parse_jsonl_line(b'{"step": 3, "data": {"actor/grad_norm": null, "actor/loss": 0.1, "x/inf": null}}')
    assert "actor/grad_norm" not in p.values and p.dropped == {"non_finite": 2}
    assert p.non_finite == ("actor/grad_norm", "x/inf")
    c = parse_console_line("step:3 - actor/grad_norm:nan - actor/loss:0.1 - actor/lr:inf")
    assert c.non_finite == ("actor/grad_norm", "actor/lr") and c.dropped == {"non_finite": 2}
    r = parse_record({"step": 3, "data": {"actor/grad_norm": float("inf"), "HF_TOKEN": None}})
    assert r.non_finite == ("actor/grad_norm",)              # a secret-named key is never kept, not even its name
    assert parse_jsonl_line(b'{"step": 1, "data": {"actor/grad_norm": 0.5}}').non_finite == ()


# --- per-step values, by hand -------------------------------------------------------------------------
def test_per_step_signals_by_hand():
    rec = analyze_step(7, {"timing_s/step": 100.0, "timing_s/gen": 60.0, "timing_s/update_actor": 30.0,
                           "timing_s/sleep_replicas": 15.0, "timing_s/testing": 40.0, "timing_s/start_profile": 0.5,
                           GEN_MAX: 90.0, GEN_MEAN: 30.0, RS: 0.07}, 0.0, non_finite=("actor/grad_norm",))
    assert rec.timer_residual == pytest.approx(100 - (60 + 30 + 15))   # -5 s, not clamped
    assert rec.phases["untracked"] == 0.0 and rec.idle_ratio == 0.0     # the clamped view hides it
    assert rec.straggler_ratio == pytest.approx(3.0)
    assert rec.grad_norm_nonfinite is True
    assert (rec.rs_seq_masked, rec.rs_mode) == (0.07, "decoupled")
    assert rec.timed_wall == pytest.approx(100 + 40 + 0.5)
    assert rec.flags == {"validation"}

    plain = analyze_step(8, {"timing_s/step": 100.0, "timing_s/gen": 60.0, "actor/grad_norm": 0.4, RS_BYPASS: 0.2}, 0.0)
    assert plain.timer_residual == pytest.approx(40.0) and plain.phases["untracked"] == pytest.approx(40.0)
    assert plain.grad_norm_nonfinite is False and plain.straggler_ratio is None
    assert (plain.rs_seq_masked, plain.rs_mode) == (0.2, "bypass")
    none = analyze_step(9, {"timing_s/step": 10.0, GEN_MAX: 5.0, GEN_MEAN: 0.0, RS: 1.5}, 0.0)
    assert none.grad_norm_nonfinite is None and none.straggler_ratio is None and none.rs_seq_masked is None


def test_time_outside_the_step_timer_by_hand():
    rec = analyze_step(2, {"timing_s/step": 100.0, "timing_s/testing": 40.0, "timing_s/stop_profile": 0.5}, 0.0)
    out, ratio = time_outside(150.0, rec)
    assert out == pytest.approx(150 - 140.5) and ratio == pytest.approx(9.5 / 150)
    # within the arrival jitter: 0 (a 0.5 s poll cannot tell), beyond it: not a live measurement
    assert time_outside(140.5 - ARRIVAL_JITTER_SECONDS / 2, rec) == (0.0, 0.0)
    assert time_outside(140.5 - ARRIVAL_JITTER_SECONDS - 0.1, rec) is None
    assert time_outside(0.0, rec) is None


def test_outside_time_is_measured_on_live_consecutive_arrivals_only():
    st = RunStore(clock=lambda: 10_000.0)
    s = lambda n, **kw: ParsedStep(n, {"timing_s/step": 100.0, "timing_s/gen": 90.0, **kw})  # noqa: E731
    st.ingest("p", "e", s(1), "jsonl", arrival=1000.0, feed="f")
    st.ingest("p", "e", s(2), "jsonl", arrival=1112.0, feed="f")
    run = st.runs[("p", "e")]
    assert run.last.outside_seconds == pytest.approx(12.0) and run.last.outside_ratio == pytest.approx(12 / 112)
    # three lines read from a backlog: one arrival stamp (the file's mtime); the first looks like a huge gap
    for n in (3, 4, 5):
        st.ingest("p", "e", s(n), "jsonl", arrival=2000.0, feed="f")
    recs = {r.step: r for r in run.window.normal}
    assert recs[3].outside_seconds is None and recs[4].outside_seconds is None and recs[5].outside_seconds is None
    st.ingest("p", "e", s(6), "jsonl", arrival=2100.0 + 3.0, feed="f")   # live again
    assert run.last.outside_seconds == pytest.approx(3.0)
    st.ingest("p", "e", s(8), "jsonl", arrival=2400.0, feed="f")         # step 7 missing: not measured
    assert run.last.outside_seconds is None
    # a backlog line the file source flagged (stamped with the file's mtime): not measured, whatever the gap
    st.ingest("p", "e", s(9), "jsonl", arrival=2520.0, feed="f", backlog=True)
    assert run.last.outside_seconds is None
    st.ingest("p", "e", s(10), "jsonl", arrival=2627.0, feed="f")        # live, after the last backlog line
    assert run.last.outside_seconds == pytest.approx(7.0)
    st.trainer_restarted("p", "e", "jsonl")
    st.ingest("p", "e", s(6, **{"timing_s/adv": 1.0}), "jsonl", arrival=2800.0, feed="f")  # first of an incarnation
    assert run.last.outside_seconds is None


# --- window statistics ---------------------------------------------------------------------------------
def test_window_statistics_of_the_signals():
    w = RunWindow(window=3, baseline=5)
    ratios = [1.4, 1.5, 2.6, 3.0, 2.7]
    for n, r in enumerate(ratios, 1):
        rec = analyze_step(n, {"timing_s/step": 100.0, "timing_s/gen": 110.0 if n >= 3 else 90.0,
                               GEN_MAX: 30.0 * r, GEN_MEAN: 30.0, RS: 0.01 * n}, 0.0,
                           non_finite=("actor/grad_norm",) if n in (2, 4) else ())
        rec.outside_ratio = 0.02 * n
        w.add(rec)
    st = w.stats()
    assert st.straggler == pytest.approx({"min": 2.6, "median": 2.7, "max": 3.0})
    assert st.rs_seq_masked == pytest.approx({"min": 0.03, "median": 0.04, "max": 0.05}) and st.rs_mode == "decoupled"
    assert st.outside == pytest.approx({"min": 0.06, "median": 0.08, "max": 0.1})
    assert st.timer_residual == pytest.approx({"min": -0.1, "median": -0.1, "max": -0.1})
    assert st.grad_nonfinite_recent == 2                      # steps 2 and 4 of the last n = 5
    for n in range(6, 9):                                        # three finite updates: step 2 leaves the last 5
        w.add(analyze_step(n, {"timing_s/step": 100.0, "actor/grad_norm": 0.5}, 0.0))
    st = w.stats()
    assert st.grad_nonfinite_recent == 1
    assert st.straggler is None and st.outside is None           # not every window step carries them


def test_the_grad_count_ignores_steps_that_do_not_log_grad_norm_and_one_skip_is_not_a_pattern():
    w = RunWindow(window=3, baseline=20)
    for n in range(1, 4):
        w.add(analyze_step(n, {"timing_s/step": 10.0}, 0.0))
    assert w.stats().grad_nonfinite_recent is None               # never logged: absent, not 0
    w.add(analyze_step(4, {"timing_s/step": 10.0}, 0.0, non_finite=("actor/grad_norm",)))
    assert w.stats().grad_nonfinite_recent == 1 < DEFAULT.grad_norm.nonfinite_steps


# --- through the model and the real collector ------------------------------------------------------------
def test_exported_series_through_the_collector(caplog):
    clock = [5_000.0]
    st = RunStore(clock=lambda: clock[0])
    arrival = 1_000.0
    for n in range(1, 7):
        v = {"timing_s/step": 100.0, "timing_s/gen": 80.0, "timing_s/update_actor": 15.0, GEN_MAX: 60.0,
             GEN_MEAN: 20.0, RS_BYPASS: 0.08}
        if n >= 4:
            v["timing_s/sleep_replicas"] = 10.0                   # nested in gen from step 4: residual 5 - 10 = -5
        line = {"step": n, "data": {**v, "actor/grad_norm": None if n in (3, 5, 6) else 0.5}}
        arrival += 100.0 + 4.0 * n                               # 4n seconds outside the step timer
        with caplog.at_level(logging.WARNING, logger="omniwatch.core.model"):
            st.ingest("p", "e", parse_jsonl_line(orjson.dumps(line)), "jsonl", arrival=arrival, feed="f")
    s = run_samples(st)
    assert s[(names.ROLLOUT_STRAGGLER, ())] == pytest.approx(3.0)
    assert s[(names.ROLLOUT_STRAGGLER_WINDOW, (("stat", "min"),))] == pytest.approx(3.0)
    assert s[(names.GRAD_NORM_NONFINITE, ())] == 1
    assert s[(names.GRAD_NORM_NONFINITE_RECENT, ())] == 3         # steps 3, 5, 6 (warm-up steps 1-2 left out)
    assert s[(names.GRAD_NORM_NONFINITE_TOTAL, ())] == 3
    assert s[(names.RS_SEQ_MASKED_WINDOW, (("mode", "bypass"), ("stat", "median")))] == pytest.approx(0.08)
    assert s[(names.OUTSIDE_STEP_SECONDS, ())] == pytest.approx(24.0)
    # window steps 4, 5, 6: 16/116, 20/120, 24/124
    assert s[(names.OUTSIDE_STEP_WINDOW, (("stat", "min"),))] == pytest.approx(16 / 116)
    assert s[(names.OUTSIDE_STEP_WINDOW, (("stat", "max"),))] == pytest.approx(24 / 124)
    assert s[(names.TIMER_RESIDUAL, ())] == pytest.approx(-5.0)
    assert s[(names.TIMER_RESIDUAL_WINDOW, (("stat", "max"),))] == pytest.approx(-0.05)
    assert s[(names.STAGE_DURATION, (("phase", "untracked"),))] == 0.0  # the clamped view is unchanged
    lines = [r for r in caplog.records if "sum to" in r.getMessage()]
    assert len(lines) == 1 and "timing_s/sleep_replicas" in lines[0].getMessage() and "step 4" in lines[0].getMessage()
    errors = {k: v for k, v in run_samples(st, experiment=None).items() if k[0] == names.INGEST_ERRORS}
    assert errors[(names.INGEST_ERRORS, (("reason", "non_finite"), ("source", "jsonl")))] == 3  # still an ingest error

    # the signals survive an exporter restart (state round-trip)
    st2 = RunStore(clock=lambda: clock[0])
    restore_store(st2, orjson.loads(orjson.dumps(snapshot_store(st))))
    st2.reveal("p", "e")
    assert run_samples(st2) == s
    r1, r2 = st.runs[("p", "e")], st2.runs[("p", "e")]
    sig = lambda r: [(a.step, a.outside_seconds, a.timer_residual, a.grad_norm_nonfinite, a.rs_mode)  # noqa: E731
                     for a in r.window.normal]
    assert len(r1.window.normal) == 4 and sig(r1) == sig(r2)


# --- the thresholds against the simulator's faults, every layout ---------------------------------------------
LAYOUTS = [dict(trainer="legacy"), dict(trainer="legacy", reward="pool"), dict(trainer="v1"),
           dict(trainer="v1", reward="colocated"), dict(trainer="v1", reward="pool", async_mode="separate_async")]
FIRES = {
    "straggler": lambda w, c: w.straggler is not None and w.straggler["min"] > c.straggler.ratio,
    "grad_nonfinite": lambda w, c: (w.grad_nonfinite_recent or 0) >= c.grad_norm.nonfinite_steps,
    "rs_drift": lambda w, c: w.rs_seq_masked is not None and w.rs_seq_masked["min"] > c.rollout_rejection.seq_masked_fraction,
    "outside_gap": lambda w, c: w.outside is not None and w.outside["min"] > c.outside_step.ratio,
    "nested_timer": lambda w, c: w.timer_residual is not None and w.timer_residual["max"] < -c.timer_overlap.tolerance,
}


def simulate(spec: RunSpec, steps: int = 30):
    """The run as a live exporter sees it: verl's JSONL lines arriving at the simulated wall clock."""
    t = [1.7e9]
    st = RunStore(clock=lambda: t[0])
    for n in range(1, steps + 1):
        d = step_dict(spec, n)
        t[0] += wall_seconds(spec, n, d)
        st.ingest("p", "e", parse_jsonl_line(orjson.dumps({"step": n, "data": d})), "jsonl", arrival=t[0], feed="f")
        yield n, st.runs[("p", "e")].stats


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "-".join(x.values()))
@pytest.mark.parametrize("rollout_corr", ["off", "decoupled", "bypass"])
def test_healthy_runs_of_every_layout_fire_nothing(layout, rollout_corr):
    spec = RunSpec(seed=21, validation_every=6, checkpoint_every=8, rollout_corr=rollout_corr, **layout)
    for n, w in simulate(spec):
        assert not [k for k, f in FIRES.items() if f(w, DEFAULT)], n


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "-".join(x.values()))
@pytest.mark.parametrize("fault", [Fault("straggler", 10, factor=3.0), Fault("grad_nonfinite", 10),
                                   Fault("rs_drift", 10, value=0.12), Fault("outside_gap", 10, seconds_share=0.3),
                                   Fault("nested_timer", 10, seconds_share=0.05)], ids=lambda f: f.kind)
def test_each_fault_fires_its_signal_at_the_third_faulty_step(layout, fault):
    spec = RunSpec(seed=22, faults=[fault], rollout_corr="bypass" if fault.kind == "rs_drift" else "off", **layout)
    fired = [n for n, w in simulate(spec) if FIRES[fault.kind](w, DEFAULT)]
    if fault.kind == "straggler" and layout["trainer"] == "v1":
        assert fired == []                                       # V1 logs no agent-loop keys: nothing to see
        return
    assert fired and fired[0] == 12 and fired == list(range(12, 31))
    others = [k for k, f in FIRES.items() if k != fault.kind and any(f(w, DEFAULT) for _, w in simulate(spec))]
    assert others == []


def test_fixtures_never_cross_the_signal_thresholds():
    """The recorded runs (arrivals rebuilt from their timers, as the backtest does: the outside time is 0
    there by construction, so that signal is live-only)."""
    for name in SCENARIOS:
        st = RunStore(clock=lambda: 2e9)
        t = 1.9e9
        for line in fixture_path(name).read_bytes().splitlines():
            p = parse_jsonl_line(line)
            t += p.values["timing_s/step"] + p.values.get("timing_s/testing", 0.0)
            st.ingest("p", "e", p, "jsonl", arrival=t)
            w = st.runs[("p", "e")].stats
            assert not [k for k, f in FIRES.items() if f(w, DEFAULT)], (name, p.step)
        last = st.runs[("p", "e")].stats
        if name != "v1_transfer_idle":
            assert last.straggler["min"] == pytest.approx(1 / 0.7)  # the fixtures' equal-wave tail
        assert last.timer_residual["max"] > 0 and last.grad_nonfinite_recent == 0


def test_outside_seconds_is_deterministic_and_only_the_fault_moves_it():
    spec = RunSpec(seed=3)
    assert outside_seconds(spec, 5) == outside_seconds(RunSpec(seed=3), 5) < 0.003 * spec.pace
    faulty = RunSpec(seed=3, faults=[Fault("outside_gap", 5, seconds_share=0.3)])
    assert outside_seconds(faulty, 4) == outside_seconds(spec, 4)
    assert outside_seconds(faulty, 5) > 0.25 * spec.pace
    assert step_dict(faulty, 5) == step_dict(spec, 5)             # not in the logged dict: only in the arrival gap


def test_after_an_exporter_restart_the_restored_last_step_is_still_the_window_step():
    """A step that voids its predecessor's measurement (a batch) must void the window's record of it,
    also when that predecessor was restored from the state file."""
    st = RunStore(clock=lambda: 10_000.0)
    for n in range(1, 6):
        st.ingest("p", "e", ParsedStep(n, {"timing_s/step": 100.0}), "jsonl", arrival=1000.0 + 110.0 * n, feed="f")
    assert st.runs[("p", "e")].stats.outside["min"] == pytest.approx(10 / 110)
    st2 = RunStore(clock=lambda: 10_000.0)
    restore_store(st2, orjson.loads(orjson.dumps(snapshot_store(st))))
    run = st2.runs[("p", "e")]
    assert run.last is run.window.normal[-1]
    st2.ingest("p", "e", ParsedStep(6, {"timing_s/step": 100.0}), "jsonl", arrival=1000.0 + 110.0 * 5 + 1.0, feed="f")
    assert run.window.normal[-2].step == 5 and run.window.normal[-2].outside_seconds is None
    assert run.stats.outside is None                              # steps 5 and 6 are not live measurements
