"""One step-record schema (issue 23 item 4): the state file stores a StepRecord under its own field names, its
validating model is derived from the dataclass, and a state file written by the previous omniwatch (format 2:
renamed keys, signals in one mapping, orjson-based step digests) still loads — upgraded, with one log line."""
import dataclasses
import shutil

import orjson
import pytest

from omniwatch.core import statefile
from omniwatch.core.analytics import WINDOW_VALUE_KEYS, StepRecord
from omniwatch.core.model import RunStore
from omniwatch.core.signals import SIGNALS
from omniwatch.core.parse import parse_jsonl_line
from omniwatch.core.state import VERSION, Checkpointer, snapshot_store

from .conftest import fixture_path
from .test_state import _exposed

V2 = fixture_path("flowgrpo_healthy").parent.parent / "state" / "exporter-state.v2.json"
FEED = "jsonl:/data/proj/exp.jsonl"


def _lines(n=20):
    return fixture_path("flowgrpo_healthy").read_bytes().splitlines()[:n]


def _fed(n=20):
    """What the previous version fed when it wrote the v2 fixture (tests/fixtures/README.md): the same lines,
    arrivals and feed, through this version's code."""
    now = [1_700_000_000.0]
    store = RunStore(clock=lambda: now[0])
    for line in _lines(n):
        p = parse_jsonl_line(line)
        now[0] += p.values["timing_s/step"] + 2.0
        store.ingest("proj", "exp", p, "jsonl", arrival=now[0], feed=FEED)
    return store, now


def _load_v2(tmp_path, now, caplog=None):
    state = tmp_path / "state"
    state.mkdir()
    shutil.copyfile(V2, state / "exporter-state.json")
    store = RunStore(clock=lambda: now[0])
    cp = Checkpointer(store, [], str(state))
    if caplog is None:
        assert cp.load()
    else:
        with caplog.at_level("INFO", logger="omniwatch.core.state"):
            assert cp.load()
    for run in store.runs.values():
        run.visible = True  # as once its file is read again
    return store, cp


def test_a_state_file_of_the_previous_version_loads_upgraded_and_says_so(tmp_path, caplog):
    assert orjson.loads(V2.read_bytes())["version"] == 2 and VERSION == 3
    fresh, now = _fed()
    store, cp = _load_v2(tmp_path, now, caplog)
    upgraded = [r for r in caplog.records if "older omniwatch" in r.getMessage()]
    assert len(upgraded) == 1 and "state format 2" in upgraded[0].getMessage()
    assert not any(r.levelname == "ERROR" for r in caplog.records)
    run = store.runs[("proj", "exp")]
    assert run.steps_total == 20 and run.restarts_total == 0 and len(run.window.normal) == 18
    # every series the restored model renders equals what this version renders after the same lines, but the
    # images per step, which format 2 did not keep with each step: said once, judged again from k new steps
    # (and a declared signal's series the file's steps do not carry: a signal added since, said once)
    before, after = _exposed(fresh), _exposed(store)
    later = [sig for sig in SIGNALS if not any(sig.key in x.values for x in run.window.normal)]
    missing = {"omniwatch_workload_ratio", *(f for sig in later for f in (sig.family, sig.reference) if f)}
    assert {name for name, _ in before.keys() - after.keys()} <= missing
    assert ("omniwatch_workload_ratio", (("experiment", "exp"), ("project", "proj"))) in before.keys() - after.keys()
    assert any("do not carry perf/total_num_images" in r.getMessage() for r in caplog.records)
    for sig in later:
        said = sum(f"(a state from before the {sig.name} signal)" in r.getMessage() for r in caplog.records)
        assert said == (sig.key in run.keys), (sig.name, said)
    for k in before.keys() - after.keys():
        before.pop(k)
    assert len(before) > 100 and before.keys() == after.keys()
    changed = {k: (before[k], after[k]) for k in before if before[k] != pytest.approx(after[k], rel=1e-12)}
    assert not changed, sorted(changed.items())[:5]
    # the next checkpoint is written in the new format
    assert cp.save()
    doc = orjson.loads(cp.path.read_bytes())
    assert doc["version"] == 3 and "reward_bound_ratio" in doc["model"]["runs"][0]["last"]


def test_a_step_resent_after_restoring_a_previous_version_state_is_a_duplicate_not_a_restart(tmp_path):
    """The v2 file's step digests are orjson-based; a re-sent identical step must still be recognised (else it
    counts as a trainer restart and wipes the window: the bug of issue 23)."""
    _, now = _fed()
    store, _ = _load_v2(tmp_path, now)
    run = store.runs[("proj", "exp")]
    assert run.digests.legacy
    store.ingest("proj", "exp", parse_jsonl_line(_lines()[19]), "jsonl", arrival=now[0] + 5, feed=FEED)
    assert run.restarts_total == 0 and run.steps_total == 20 and len(run.window.normal) == 18
    assert store.errors[("jsonl", "duplicate_step")] == 1
    # control: the same step with other content from the same feed is a re-run (the trainer restarted)
    changed = parse_jsonl_line(_lines()[19])
    changed.values["timing_s/gen"] += 1.0
    store.ingest("proj", "exp", changed, "jsonl", arrival=now[0] + 10, feed=FEED)
    assert run.restarts_total == 1


def test_the_state_file_stores_a_step_record_under_its_own_field_names():
    store, _ = _fed()
    names = [f.name for f in dataclasses.fields(StepRecord)]
    assert list(statefile.Record.model_fields) == names == list(statefile.RECORD_FIELDS)
    run = snapshot_store(store)["runs"][0]
    for rec in [run["last"], *run["window"], *run["reference"]]:
        assert list(rec) == names
        assert set(rec["values"]) <= WINDOW_VALUE_KEYS
    # a record survives the round trip (JSON, as on disk) field for field
    live = store.runs[("proj", "exp")].last
    back = statefile.record_from_json(orjson.loads(orjson.dumps(statefile.record_to_json(live))))
    assert back == dataclasses.replace(live, values={k: v for k, v in live.values.items() if k in WINDOW_VALUE_KEYS})
    assert back != live  # control: the live latest record still holds every raw value (its callers read them)


def test_a_record_field_of_the_wrong_type_refuses_the_whole_file():
    store, _ = _fed(6)
    doc = orjson.loads(orjson.dumps({"version": VERSION, "files": {}, "model": snapshot_store(store)}))
    assert statefile.check(doc, VERSION)[1] == 0
    doc["model"]["runs"][0]["last"]["grad_norm_nonfinite"] = "no"
    with pytest.raises(statefile.StateInvalid, match="last.grad_norm_nonfinite"):
        statefile.check(doc, VERSION)
