"""The run model: idempotent steps, trainer restarts, duplicates across feeds, bounds."""
import tracemalloc

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omniwatch import names
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore, SeenSteps, passthrough_name
from omniwatch.core.parse import ParsedStep, parse_jsonl_line

from .conftest import fixture_path


def step(n, **values):
    return ParsedStep(n, {"timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/reward": 1.0, **values})


def samples(store):
    out = {}
    for fam in text_string_to_metric_families(generate_latest(make_registry(store)).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(store, name, **labels):
    return samples(store)[(name, tuple(sorted(labels.items())))]


def test_seen_steps_ranges():
    s = SeenSteps()
    for x in [1, 2, 3, 5, 4, 10, 9]:
        s.add(x)
    assert s.ranges == [[1, 5], [9, 10]]
    assert 3 in s and 7 not in s and 10 in s


def test_restart_replays_are_not_counted_twice_and_counters_only_grow():
    st = RunStore()
    for n in range(1, 26):
        st.ingest("p", "e", step(n), "jsonl", feed="f")
    total_gen = value(st, names.STAGE_SECONDS_TOTAL, project="p", experiment="e", phase="gen")
    # verl resumes from the checkpoint at step 20 (file truncated): 21..25 run again, then 26..30 are new
    st.trainer_restarted("p", "e", "jsonl")
    for n in range(21, 31):
        st.ingest("p", "e", step(n), "jsonl", feed="f")
    assert value(st, names.STEPS_TOTAL, project="p", experiment="e") == 30
    assert value(st, names.STEPS_REPLAYED_TOTAL, project="p", experiment="e") == 5
    assert value(st, names.TRAINER_RESTARTS_TOTAL, project="p", experiment="e") == 1
    assert value(st, names.STAGE_SECONDS_TOTAL, project="p", experiment="e", phase="gen") == total_gen + 5 * 4.0
    assert value(st, names.STEP, project="p", experiment="e") == 30


def test_step_counter_going_back_without_truncation_is_a_restart():
    """A step already seen arrives again from the same feed with other values: the trainer ran it again
    (a resume from an earlier checkpoint), so a new incarnation starts."""
    st = RunStore()
    for n in range(1, 11):
        st.ingest("p", "e", step(n), "push", feed="push:p/e")
    for n in range(6, 9):
        st.ingest("p", "e", step(n, **{"timing_s/gen": 4.2}), "push", feed="push:p/e")
    assert value(st, names.TRAINER_RESTARTS_TOTAL, project="p", experiment="e") == 1
    assert value(st, names.STEPS_REPLAYED_TOTAL, project="p", experiment="e") == 3
    assert value(st, names.STEP, project="p", experiment="e") == 8
    assert st.runs[("p", "e")].last.flags == frozenset()  # 6, 7 were warm-up of the new incarnation, 8 is normal


def test_the_same_step_from_a_second_feed_is_a_counted_duplicate():
    st = RunStore()
    for n in range(1, 6):
        st.ingest("p", "e", step(n), "jsonl", feed="jsonl:a")
    for n in range(1, 6):
        st.ingest("p", "e", step(n), "console", feed="console:a")
    assert value(st, names.STEPS_TOTAL, project="p", experiment="e") == 5
    assert value(st, names.INGEST_ERRORS, source="console", reason="duplicate_step") == 5
    assert value(st, names.TRAINER_RESTARTS_TOTAL, project="p", experiment="e") == 0


def test_passthrough_names_are_valid_and_the_key_label_keeps_colliding_keys_apart():
    assert passthrough_name("val-core/ocr/reward/mean@1") == "verl_val_core_ocr_reward_mean_at_1"
    st = RunStore()
    st.ingest("p", "e", step(1, **{"a/b_c": 1.0, "a_b/c": 2.0}), "push")
    s = samples(st)
    assert s[("verl_a_b_c", (("experiment", "e"), ("key", "a/b_c"), ("project", "p")))] == 1.0
    assert s[("verl_a_b_c", (("experiment", "e"), ("key", "a_b/c"), ("project", "p")))] == 2.0
    # contract keys are not passed through twice
    assert not any(name == "verl_timing_s_step" for name, _ in s)


def test_ten_thousand_distinct_keys_are_capped_and_counted():
    st = RunStore(max_keys=100)
    st.ingest("p", "e", step(1, **{f"k/{i}": float(i) for i in range(10_000)}), "jsonl")
    assert value(st, names.PASSTHROUGH_KEYS, project="p", experiment="e") == 100
    assert value(st, names.INGEST_ERRORS, source="jsonl", reason="cardinality_cap") == 10_000 + 2 - 100  # timing_s/gen, timing_s/reward pass through; timing_s/step is a contract key


def test_too_many_runs_evict_the_least_recently_active_and_are_counted():
    clock = iter(range(100, 200)).__next__
    st = RunStore(max_runs=3, clock=lambda: float(clock()))
    for i in range(5):   # history at first sight (a day-old backlog): such runs make room (issue 25 item 1)
        st.ingest("p", f"e{i}", step(1), "push", arrival=-100_000.0, backlog=True)
    assert len(st.runs) == 3 and set(st.runs) == {("p", "e2"), ("p", "e3"), ("p", "e4")}
    assert value(st, names.RUNS_EVICTED_TOTAL) == 2
    # live runs are never dropped for a newcomer (issue 35 item 6): the newcomer is refused and counted
    for i in range(5, 10):
        st.ingest("q", f"e{i}", step(1), "push")
    assert set(st.runs) == {("q", "e5"), ("q", "e6"), ("q", "e7")} and value(st, names.RUNS_EVICTED_TOTAL) == 5
    assert st.errors[("push", "too_many_runs")] == 2


@pytest.mark.slow  # make test-quick leaves it to make test
def test_memory_stays_bounded_over_many_steps():
    st = RunStore()
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines()
    parsed = [parse_jsonl_line(x) for x in lines]
    for n in range(1, 2001):
        p = parsed[n % len(parsed)]
        st.ingest("p", "e", ParsedStep(n, p.values), "jsonl")
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for n in range(2001, 12001):
        p = parsed[n % len(parsed)]
        st.ingest("p", "e", ParsedStep(n, p.values), "jsonl")
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown < 2_000_000, grown  # 10,000 more steps held in O(window + baseline) records
    assert len(st.runs[("p", "e")].window.normal) == 23


def test_listener_errors_never_break_ingestion():
    st = RunStore()
    st.listeners.append(lambda run, rec: 1 / 0)
    assert st.ingest("p", "e", step(1), "push") is not None


def test_a_retried_push_of_the_same_step_is_a_duplicate_not_a_restart():
    st = RunStore()
    st.ingest("p", "e", step(1), "push", feed="push:p/e")
    st.ingest("p", "e", step(1), "push", feed="push:p/e")
    assert st.runs[("p", "e")].restarts_total == 0
    assert st.errors[("push", "duplicate_step")] == 1


def test_a_run_without_steps_for_the_expiry_leaves_metrics_and_frees_its_slot():
    now = [1000.0]
    st = RunStore(max_runs=1, run_expiry=3600, clock=lambda: now[0])
    st.ingest("p", "old", step(1), "push")
    assert (names.STEP, (("experiment", "old"), ("project", "p"))) in samples(st)
    now[0] += 3601
    # no evidence it finished (a push feed): it may be hung, so it keeps alerting (test_planned.py)
    assert (names.STEP, (("experiment", "old"), ("project", "p"))) in samples(st)
    st.set_total_steps("p", "old", 1)  # its last step was the planned last
    assert not any(k[0] == names.STEP for k in samples(st))  # finished run: its alerts resolve
    st.ingest("p", "new", step(1), "push")  # the expired run's slot is reused, not refused
    assert set(st.runs) == {("p", "new")} and not st.errors


def _mfu_step(n, mfu, dur=10.0):
    return ParsedStep(n, {"timing_s/step": dur, "timing_s/gen": 4.0, "timing_s/reward": 1.0,
                          "timing_s/update_actor": 4.0, "perf/mfu/actor": mfu})


def _ratio(st):
    s = st.runs[("p", "e")].stats
    base = s.mfu_baseline.get("actor")
    return None if not base or "actor" not in s.mfu else s.mfu["actor"]["max"] / base


def test_a_fix_through_a_restart_never_sets_off_the_next_alert():
    """MFU 2.6 (a wrong device peak), then the trainer is resumed with the peak pinned (log truncated,
    steps resume at 25): the old incarnation's MFU never becomes the new one's baseline, so MFUDrop's
    ratio stays ~1 instead of 0.12."""
    st = RunStore()
    for n in range(1, 31):
        st.ingest("p", "e", _mfu_step(n, 2.6), "jsonl", feed="jsonl:f")
    assert _ratio(st) == pytest.approx(1.0, abs=0.01)
    st.trainer_restarted("p", "e", "jsonl")
    ratios = []
    for n in range(25, 50):
        st.ingest("p", "e", _mfu_step(n, 0.31), "jsonl", feed="jsonl:f")
        ratios.append(_ratio(st))
    seen = [r for r in ratios if r is not None]
    assert seen and min(seen) > 0.9, ratios
    # while the new incarnation fills (2 warm-up + 3 window steps) the old window stands against the old reference
    # (a resume of the same workload is one story); its first 3 normal steps say the MFU reference was impossible:
    # a new reference, and no ratio until 3 of its steps precede the window
    assert ratios[:4] == [pytest.approx(1.0)] * 4 and ratios[4:7] == [None] * 3, ratios
    w = st.runs[("p", "e")].window
    assert w.kept is None and w.reason == "mfu_changed"
    assert value(st, names.TRAINER_RESTARTS_TOTAL, project="p", experiment="e") == 1


def test_a_level_shift_after_a_pause_is_a_new_incarnation_even_without_a_restart_signal():
    """An appended console log, resumed right at its high-water mark: no truncation, no step going back.
    A step after a long pause whose MFU moved 8x is a new incarnation; the same shift without a pause
    (a real regression in one incarnation) is not absorbed."""
    now = [0.0]
    st = RunStore(clock=lambda: now[0])
    for n in range(1, 26):
        now[0] += 10
        st.ingest("p", "e", _mfu_step(n, 2.6), "console", feed="console:f")
    now[0] += 10 * 30  # the trainer was down for 30 typical steps
    for n in range(26, 40):
        now[0] += 10
        st.ingest("p", "e", _mfu_step(n, 0.31), "console", feed="console:f")
    assert st.runs[("p", "e")].restarts_total == 1
    assert _ratio(st) == pytest.approx(1.0, abs=0.01)

    st2 = RunStore(clock=lambda: now[0])
    for n in range(1, 32):
        now[0] += 10
        st2.ingest("p", "e", _mfu_step(n, 0.31 if n < 26 else 0.08), "console", feed="console:f")
    assert st2.runs[("p", "e")].restarts_total == 0
    s = st2.runs[("p", "e")].stats
    assert s.mfu["actor"]["max"] / s.mfu_baseline["actor"] < 0.7  # MFUDrop's condition holds


def test_out_of_order_steps_are_placed_by_number_not_arrival():
    """100 concurrent pushes of steps 1..100 arrive in any order: no restart, exactly the first two
    steps are warm-up, the latest step is 100, the window holds the last steps in step order."""
    import random
    order = list(range(1, 101))
    random.Random(7).shuffle(order)
    st = RunStore()
    for n in order:
        st.ingest("p", "e", step(n), "push", feed="push:p/e")
    run = st.runs[("p", "e")]
    assert run.restarts_total == 0 and run.steps_total == 100 and run.replayed_total == 0
    assert value(st, names.FLAGGED_STEPS_TOTAL, project="p", experiment="e", flag="warmup") == 2
    assert value(st, names.STEP, project="p", experiment="e") == 100
    steps = [r.step for r in run.window.normal]
    assert steps == list(range(100 - len(steps) + 1, 101)) and len(steps) == 23


def test_a_late_lower_step_turns_early_warm_up_guesses_into_normal_steps():
    st = RunStore()
    for n in (5, 6, 7, 1, 2, 3, 4, 8):
        st.ingest("p", "e", step(n), "push", feed="push:p/e")
    run = st.runs[("p", "e")]
    assert [r.step for r in run.window.normal] == [3, 4, 5, 6, 7, 8]
    assert run.warmup_total() == 2
