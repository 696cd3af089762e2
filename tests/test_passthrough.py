"""Passthrough shows the present (issue 13 item 9): a verl key the latest step did not carry is not exported
as current; validation keys keep their last value with the step it came from; the key cap and its counted
errors stay; the exporter state round-trips which step carried each key. Everything through the real
collector (``make_registry`` + ``generate_latest``)."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omniwatch import names
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore, passthrough_name
from omniwatch.core.parse import ParsedStep, parse_jsonl_line
from omniwatch.core.state import restore_store, snapshot_store

CKPT = "timing_s/save_checkpoint"
EVICTED = "training/rollout_failure/evicted_groups"
VAL = "val-core/ocr/reward/mean@1"
VAL_SLASH = "val/num_samples"


def step(n: int, **values) -> ParsedStep:
    return ParsedStep(n, {"timing_s/step": 10.0, "timing_s/gen": 4.0, "critic/rewards/mean": float(n), **values})


def exported(store: RunStore) -> dict[tuple[str, str], float]:
    """(family, key label) -> value of every verl_* sample of run p/e."""
    out = {}
    for fam in text_string_to_metric_families(generate_latest(make_registry(store)).decode()):
        for s in fam.samples:
            if s.name.startswith(names.PASSTHROUGH_PREFIX) and s.labels.get("experiment") == "e":
                out[(s.name, s.labels["key"])] = s.value
    return out


def validation_steps(store: RunStore) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(make_registry(store)).decode()):
        for s in fam.samples:
            if s.name == names.VALIDATION_STEP:
                out[s.labels["key"]] = s.value
    return out


def pt(key: str) -> tuple[str, str]:
    return passthrough_name(key), key


def test_a_key_the_latest_step_did_not_carry_is_not_exported():
    st = RunStore()
    st.ingest("p", "e", step(1), "jsonl", feed="f")
    st.ingest("p", "e", step(2, **{CKPT: 30.0, EVICTED: 2.0}), "jsonl", feed="f")
    got = exported(st)
    assert got[pt(CKPT)] == 30.0 and got[pt(EVICTED)] == 2.0
    assert got[pt("critic/rewards/mean")] == 2.0
    st.ingest("p", "e", step(3), "jsonl", feed="f")
    got = exported(st)
    assert pt(CKPT) not in got and pt(EVICTED) not in got     # before the fix: 30.0 and 2.0 forever
    assert got[pt("critic/rewards/mean")] == 3.0 and got[pt("timing_s/gen")] == 4.0
    st.ingest("p", "e", step(4, **{CKPT: 41.0}), "jsonl", feed="f")
    assert exported(st)[pt(CKPT)] == 41.0                        # carried again: its new value
    # held keys (toward the cap) are not the exported ones
    assert st.runs[("p", "e")].passthrough_count() == 4          # gen, rewards/mean, save_checkpoint, evicted


def test_a_non_finite_value_does_not_leave_the_previous_one_standing():
    st = RunStore()
    st.ingest("p", "e", parse_jsonl_line(b'{"step": 1, "data": {"timing_s/step": 10, "actor/grad_norm": 0.7}}'), "jsonl")
    assert exported(st)[pt("actor/grad_norm")] == 0.7
    st.ingest("p", "e", parse_jsonl_line(b'{"step": 2, "data": {"timing_s/step": 10, "actor/grad_norm": null}}'), "jsonl")
    assert pt("actor/grad_norm") not in exported(st)


def test_validation_keys_keep_their_last_value_and_say_which_step_it_came_from():
    st = RunStore()
    for n in range(1, 5):
        st.ingest("p", "e", step(n), "jsonl", feed="f")
    st.ingest("p", "e", step(5, **{VAL: 0.41, VAL_SLASH: 64.0, "timing_s/testing": 20.0}), "jsonl", feed="f")
    for n in (6, 7):
        st.ingest("p", "e", step(n), "jsonl", feed="f")
    got = exported(st)
    assert got[pt(VAL)] == 0.41 and got[pt(VAL_SLASH)] == 64.0
    assert pt("timing_s/testing") not in got                     # not a val- key: only with its step
    assert validation_steps(st) == {VAL: 5, VAL_SLASH: 5}
    st.ingest("p", "e", step(10, **{VAL: 0.47}), "jsonl", feed="f")
    assert exported(st)[pt(VAL)] == 0.47
    assert validation_steps(st) == {VAL: 10, VAL_SLASH: 5}       # each key says its own step


def test_a_late_older_step_does_not_overwrite_newer_values_nor_become_current():
    st = RunStore()
    st.ingest("p", "e", step(5, **{"x/only_in_4": 1.0}), "push", feed="a")
    st.ingest("p", "e", step(7), "push", feed="a")
    st.ingest("p", "e", step(6, **{"x/only_in_4": 6.0, VAL: 0.2}), "push", feed="b")  # late, from another pusher
    got = exported(st)
    assert got[pt("critic/rewards/mean")] == 7.0                 # not step 6's 6.0
    assert pt("x/only_in_4") not in got                          # step 6 is not the latest step
    assert got[pt(VAL)] == 0.2 and validation_steps(st) == {VAL: 6}  # a validation value keeps its step
    st.ingest("p", "e", step(4, **{VAL: 0.1}), "push", feed="b")
    assert exported(st)[pt(VAL)] == 0.2                          # older than the value held


def test_a_trainer_restart_clears_the_present_but_keeps_validation_values():
    st = RunStore()
    for n in range(1, 11):
        st.ingest("p", "e", step(n, **({VAL: 0.3} if n == 10 else {"x/early": 1.0})), "jsonl", feed="f")
    # the same step numbers again with other values: a resumed trainer (new incarnation)
    st.ingest("p", "e", ParsedStep(8, {"timing_s/step": 11.0}), "jsonl", feed="f")
    got = exported(st)
    assert st.runs[("p", "e")].restarts_total == 1
    assert pt("critic/rewards/mean") not in got and pt("timing_s/gen") not in got and pt("x/early") not in got
    assert got[pt(VAL)] == 0.3 and validation_steps(st) == {VAL: 10}


def test_the_key_cap_still_holds_and_counts():
    st = RunStore(max_keys=3)
    st.ingest("p", "e", step(1, **{"a/1": 1.0}), "jsonl", feed="f")          # gen, rewards/mean, a/1
    st.ingest("p", "e", step(2, **{"a/2": 2.0, "a/3": 3.0}), "jsonl", feed="f")
    got = exported(st)
    assert pt("a/2") not in got and pt("a/3") not in got and pt("a/1") not in got
    assert got[pt("timing_s/gen")] == 4.0
    errors = {(s.labels["source"], s.labels["reason"]): s.value
              for fam in text_string_to_metric_families(generate_latest(make_registry(st)).decode())
              for s in fam.samples if s.name == names.INGEST_ERRORS}
    assert errors[("jsonl", "cardinality_cap")] == 2
    st.ingest("p", "e", step(3, **{"a/1": 5.0}), "jsonl", feed="f")
    assert exported(st)[pt("a/1")] == 5.0


def test_the_state_round_trips_which_step_carried_each_key():
    st = RunStore()
    for n in range(1, 6):
        st.ingest("p", "e", step(n, **({VAL: 0.5} if n == 3 else {}), **({CKPT: 9.0} if n == 4 else {})), "jsonl",
                  feed="f")
    before, vsteps = exported(st), validation_steps(st)
    data = snapshot_store(st)
    st2 = RunStore()
    restore_store(st2, data)
    st2.reveal("p", "e")
    assert exported(st2) == before and validation_steps(st2) == vsteps == {VAL: 3}
    assert pt(CKPT) not in before
    # a state written before key_steps existed: nothing is claimed current until a step carries it
    for r in data["runs"]:
        del r["key_steps"]
    st3 = RunStore()
    restore_store(st3, data)
    st3.reveal("p", "e")
    assert exported(st3) == {}
    st3.ingest("p", "e", step(6), "jsonl", feed="f")
    assert exported(st3)[pt("critic/rewards/mean")] == 6.0 and pt(VAL) not in exported(st3)
