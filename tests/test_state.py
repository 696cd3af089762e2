"""Exporter checkpoints: a restart (after SIGKILL or not) resumes from the last checkpoint with no step
counted twice, none lost, and counters that only move forward."""
import os

import pytest

from omniwatch.core.model import RunStore
from omniwatch.sources.files import FileSource
from omniwatch.core.state import Checkpointer

from .conftest import fixture_path


def exporter(state_dir, root):
    store = RunStore()
    src = FileSource(store, [str(root)], "jsonl")
    cp = Checkpointer(store, [src], str(state_dir))
    return store, src, cp


def run_of(store):
    return store.runs[("proj", "exp")]


def test_restart_from_checkpoint_counts_every_step_once(tmp_path):
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines(keepends=True)
    f = tmp_path / "root" / "proj" / "exp.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"".join(lines[:10]) + lines[10][:40])  # a partial line at the end
    store, src, cp = exporter(tmp_path / "state", tmp_path / "root")
    src.poll_once()
    assert cp.save()
    before = run_of(store)
    gen_before = before.stage_seconds_total["gen"]
    assert before.steps_total == 10
    # more lines arrive after the checkpoint; then the exporter is killed (no final save)
    with open(f, "ab") as fh:
        fh.write(lines[10][40:] + b"".join(lines[11:15]))
    src.poll_once()
    assert run_of(store).steps_total == 15
    # restart: the model comes back from the checkpoint, lines after its offset are read again
    with open(f, "ab") as fh:
        fh.write(b"".join(lines[15:20]))
    store2, src2, cp2 = exporter(tmp_path / "state", tmp_path / "root")
    assert cp2.load()
    assert run_of(store2).steps_total == 10
    src2.poll_once()
    r = run_of(store2)
    assert r.steps_total == 20 and r.replayed_total == 0 and r.restarts_total == 0
    expected_gen = sum(__import__("orjson").loads(x)["data"]["timing_s/gen"] for x in lines[:20])
    assert abs(r.stage_seconds_total["gen"] - expected_gen) < 1e-6
    assert r.stage_seconds_total["gen"] >= gen_before
    assert r.last.step == 20 and len(r.window.normal) == 18  # steps 3..20


def test_file_truncated_while_the_exporter_was_down_is_a_trainer_restart(tmp_path):
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines(keepends=True)
    f = tmp_path / "root" / "proj" / "exp.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"".join(lines[:30]))
    store, src, cp = exporter(tmp_path / "state", tmp_path / "root")
    src.poll_once()
    cp.save()
    with open(f, "wb") as fh:  # the trainer resumed from its step-25 checkpoint: "wb" truncates
        fh.write(b"".join(lines[25:35]))
    store2, src2, cp2 = exporter(tmp_path / "state", tmp_path / "root")
    cp2.load()
    src2.poll_once()
    r = run_of(store2)
    assert r.steps_total == 35 and r.replayed_total == 5 and r.restarts_total == 1


def test_corrupt_state_is_set_aside_and_counted(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "exporter-state.json").write_bytes(b"{not json")
    store, src, cp = exporter(tmp_path / "state", tmp_path / "root")
    assert not cp.load()
    assert store.errors[("state", "corrupt_state")] == 1
    assert (tmp_path / "state" / "exporter-state.corrupt").exists()


def test_unwritable_state_dir_keeps_serving_and_reports_it(tmp_path):
    (tmp_path / "state").write_text("a file, not a directory")
    store, src, cp = exporter(tmp_path / "state", tmp_path / "root")
    assert cp.save() is False
    assert store.errors[("state", "write_failed")] == 1
    assert store.sources[("state", str(tmp_path / "state" / "exporter-state.json"))] == 0
    assert os.path.isfile(tmp_path / "state")


def test_log_rotated_while_the_exporter_was_down_is_finished_from_the_old_file(tmp_path):
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines(keepends=True)
    f = tmp_path / "root" / "proj" / "exp.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"".join(lines[:10]))
    store, src, cp = exporter(tmp_path / "state", tmp_path / "root")
    src.poll_once()
    cp.save()
    with open(f, "ab") as fh:  # written after the checkpoint, then logrotate moves the file away
        fh.write(b"".join(lines[10:14]))
    os.rename(f, f.with_name("exp.jsonl.1"))
    f.write_bytes(b"".join(lines[14:20]))
    store2, src2, cp2 = exporter(tmp_path / "state", tmp_path / "root")
    cp2.load()
    src2.poll_once()
    r = run_of(store2)
    assert r.steps_total == 20 and r.restarts_total == 0 and r.replayed_total == 0


def _exported(store):
    from prometheus_client import generate_latest
    from omniwatch.core.exposition import make_registry
    return generate_latest(make_registry(store)).decode()


def test_runs_of_an_earlier_configuration_never_reach_metrics(tmp_path):
    """`make demo`, `make down`, `make up WATCH=<empty dir>`: the demo's runs are in the checkpoint but no
    current source produces them, so they are not exported (no stale TrainingStalled for runs the user
    never started); a run whose log is watched now is exported at once, even if it never steps again."""
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines(keepends=True)
    demo_root, real_root = tmp_path / "demo", tmp_path / "real"
    (demo_root / "omniwatch-demo").mkdir(parents=True)
    (real_root / "proj").mkdir(parents=True)
    (demo_root / "omniwatch-demo" / "stalled.jsonl").write_bytes(b"".join(lines[:8]))
    store, src, cp = exporter(tmp_path / "state", demo_root)
    src.poll_once()
    assert cp.save()

    store2, src2, cp2 = exporter(tmp_path / "state", real_root)  # a different watch, same state dir
    assert cp2.load()
    src2.poll_once()
    text = _exported(store2)
    assert "omniwatch-demo" not in text and "omniwatch_runs 0.0" in text
    # the old run comes back the moment a current source produces it (a pusher resuming, say)
    from omniwatch.core.parse import parse_jsonl_line
    store2.ingest("omniwatch-demo", "stalled", parse_jsonl_line(lines[8]), "push")
    text = _exported(store2)
    assert 'omniwatch_steps_total{experiment="stalled",project="omniwatch-demo"} 9.0' in text

    store3, src3, cp3 = exporter(tmp_path / "state3", demo_root)  # the same watch: exported at once
    src3.poll_once()
    assert cp3.save()
    store4, src4, cp4 = exporter(tmp_path / "state3", demo_root)
    assert cp4.load()
    assert 'omniwatch_step{experiment="stalled",project="omniwatch-demo"} 8.0' in _exported(store4)


# --- state files of any shape (issue 14, item 5) -----------------------------------------------------------
def _valid_state(tmp_path) -> dict:
    """A real checkpoint of 10 steps, as a dict to break one field of."""
    import orjson
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines(keepends=True)
    f = tmp_path / "root" / "proj" / "exp.jsonl"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(b"".join(lines[:10]))
    store, src, cp = exporter(tmp_path / "state", tmp_path / "root")
    src.poll_once()
    assert cp.save()
    return orjson.loads((tmp_path / "state" / "exporter-state.json").read_bytes())


def _run(doc):
    return doc["model"]["runs"][0]


BROKEN = {
    "a JSON list": lambda d: [],
    "model is a list": lambda d: {"version": 1, "model": []},
    "no model": lambda d: {"version": 1},
    "a string": lambda d: "state",
    "seen [[1]]": lambda d: _run(d).update(seen=[[1]]) or d,
    "seen lo > hi": lambda d: _run(d).update(seen=[[9, 1]]) or d,
    "seen overlapping": lambda d: _run(d).update(seen=[[1, 5], [3, 9]]) or d,
    "negative steps_total": lambda d: _run(d).update(steps_total=-3) or d,
    "negative stage seconds": lambda d: _run(d)["stage_seconds_total"].update(gen=-1.0) or d,
    "counter as a string": lambda d: _run(d).update(restarts_total="2") or d,
    "counter as a bool": lambda d: _run(d).update(replayed_total=True) or d,
    "step as a float": lambda d: _run(d)["last"].update(step=3.5) or d,
    "runs is a dict": lambda d: d["model"].update(runs={}) or d,
    "a credential as a label": lambda d: _run(d).update(experiment="hf_" + "A1b2" * 9) or d,
    "negative offset": lambda d: next(iter(d["files"]["jsonl"].values())).update(offset=-1) or d,
    "head not hex": lambda d: next(iter(d["files"]["jsonl"].values())).update(head="zz") or d,
    "errors entry of two": lambda d: d["model"].update(errors=[["jsonl", "x"]]) or d,
    "wrong version": lambda d: d.update(version=7) or d,
    "digest row past the feeds": lambda d: _run(d)["digest_table"].update(rows=[[1, 5, 7]]) or d,
    "digest as a float": lambda d: _run(d)["digest_table"]["rows"][0].__setitem__(2, 1.5) or d,
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_state_file_of_any_shape_is_set_aside_and_the_exporter_starts_clean(tmp_path, what, caplog):
    """Before: `[]` and `{"version": 1, "model": []}` raised AttributeError out of load() (the exporter
    crashed at start and the file stayed, so a supervisor restarted it into the same crash); `seen: [[1]]`
    or a negative counter loaded silently and broke counting later."""
    import orjson
    doc = BROKEN[what](_valid_state(tmp_path))
    path = tmp_path / "state" / "exporter-state.json"
    path.write_bytes(orjson.dumps(doc))
    store, src, cp = exporter(tmp_path / "state", tmp_path / "root")
    with caplog.at_level("ERROR", logger="omniwatch.core.state"):
        assert cp.load() is False
    assert [r.levelname for r in caplog.records] == ["ERROR"], "one clear log line"
    assert "moved to" in caplog.records[0].getMessage()
    assert store.errors[("state", "corrupt_state")] == 1
    assert not path.exists() and (tmp_path / "state" / "exporter-state.corrupt").exists()
    assert not store.runs
    src.poll_once()  # starting clean: the file is read from its start, every step counted once
    assert run_of(store).steps_total == 10 and run_of(store).restarts_total == 0


def test_a_valid_state_passes_the_schema_unchanged(tmp_path):
    from omniwatch.core import statefile
    from omniwatch.core.state import VERSION
    doc = _valid_state(tmp_path)
    assert statefile.check(doc, VERSION) == (doc, 0)


def test_secret_named_keys_in_an_old_state_file_are_dropped_and_counted(tmp_path):
    import orjson
    doc = _valid_state(tmp_path)
    _run(doc)["keys"].update({"env/hf_token": 1.0, "config/x/WANDB_API_KEY": 2.0})
    (tmp_path / "state" / "exporter-state.json").write_bytes(orjson.dumps(doc))
    store, src, cp = exporter(tmp_path / "state", tmp_path / "root")
    assert cp.load()
    assert not {"env/hf_token", "config/x/WANDB_API_KEY"} & set(run_of(store).keys)
    assert store.errors[("state", "secret_key")] == 2
    assert run_of(store).steps_total == 10


# --- every window input survives a restore (issue 18.8) -----------------------------------------------------
def _fed_store(kind: str):
    """A store fed one whole run at its own pace: a recorded fixture, or a simulated run with every signal
    (rollout correction, straggler, non-finite grad norm, nested timers, time outside the step, validation
    and checkpoints, a fault mid-run)."""
    import orjson

    from omniwatch.core.parse import parse_jsonl_line, parse_record
    from omniwatch.simulate import Fault, RunSpec, step_dict
    now = [1_700_000_000.0]
    store = RunStore(clock=lambda: now[0])
    if kind.startswith("sim:"):
        spec = RunSpec(trainer=kind[4:], pace=60.0, seed=3, validation_every=5, checkpoint_every=4,
                       rollout_corr="decoupled" if kind == "sim:legacy" else "bypass",
                       faults=[Fault("straggler", 8, factor=4.0), Fault("grad_nonfinite", 12),
                               Fault("nested_timer", 14, seconds_share=0.2), Fault("outside_gap", 16, seconds_share=0.3),
                               Fault("reward_slow", 18, factor=5.0)])
        lines = [orjson.dumps({"step": i, "data": step_dict(spec, i)}) for i in range(1, 31)]
        recs = [parse_record(orjson.loads(x)) for x in lines]
    else:
        recs = [parse_jsonl_line(x) for x in fixture_path(kind).read_bytes().splitlines() if x.strip()]
    for rec in recs:
        now[0] += float(rec.values.get("timing_s/step", 60.0)) + 2.0
        store.ingest("proj", kind.replace(":", "_"), rec, "jsonl", arrival=now[0])
    return store, now


RESTORE_CASES = ["flowgrpo_healthy", "flowgrpo_reward_bound", "flowgrpo_async_reward_tail", "v1_transfer_idle",
                 "flowgrpo_mfu_above_one", "sim:legacy", "sim:v1"]
VOLATILE = {"omniwatch_scrape_duration_seconds"}


def _exposed(store) -> dict:
    from .test_model import samples
    return {k: v for k, v in samples(store).items() if k[0] not in VOLATILE}


@pytest.mark.parametrize("kind", RESTORE_CASES)
def test_metrics_after_a_restore_equal_the_metrics_before(kind):
    """Every series the exporter renders is the same after a checkpoint round trip (JSON, as on disk): the
    window statistics, baselines, ledger rates, signals and planned work are computed from restored inputs."""
    import json

    from omniwatch.core.state import restore_store, snapshot_store
    store, now = _fed_store(kind)
    before = _exposed(store)
    assert len(before) > 100
    data = json.loads(json.dumps(snapshot_store(store)))
    again = RunStore(clock=lambda: now[0])
    restore_store(again, data)
    for run in again.runs.values():
        run.visible = True  # as once its file is read again
    after = _exposed(again)
    missing, extra = before.keys() - after.keys(), after.keys() - before.keys()
    assert not missing and not extra, (sorted(missing)[:10], sorted(extra)[:10])
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed, sorted(changed.items())[:10]
    # the anchored reference lies before the window the checkpoint keeps: restored from its own records
    for key, run in store.runs.items():
        ref, kept = [r.step for r in run.window.reference], {r.step for r in run.window.normal}
        assert ref and [r.step for r in again.runs[key].window.reference] == ref
        if kind != "sim:legacy" and kind != "sim:v1":
            assert not set(ref) <= kept, (ref, sorted(kept))


class _Reads(dict):
    """A step's raw values that note every key read."""
    seen: set = set()

    def __getitem__(self, k):
        _Reads.seen.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        _Reads.seen.add(k)
        return super().get(k, default)

    def __contains__(self, k):
        _Reads.seen.add(k)
        return super().__contains__(k)


@pytest.mark.parametrize("kind", ["flowgrpo_reward_bound", "sim:legacy", "sim:v1"])
def test_what_the_window_reads_of_a_steps_raw_values_is_what_the_checkpoint_keeps(kind):
    """Window statistics, cost rates and the rendered series read only analytics.WINDOW_VALUE_KEYS of a
    window step's raw values, the keys the checkpoint keeps: a new statistic reading another key fails here."""
    from omniwatch.core.analytics import WINDOW_VALUE_KEYS
    store, _ = _fed_store(kind)
    _Reads.seen = set()
    for run in store.runs.values():
        for rec in {id(r): r for r in [*run.window.normal, *run.window.reference, *run.warm, run.last]}.values():
            rec.values = _Reads(rec.values)
        run.stats_dirty = True
        run.cost_per_day()
    _exposed(store)
    assert _Reads.seen, "nothing read: the probe is not wired"
    assert _Reads.seen <= WINDOW_VALUE_KEYS, sorted(_Reads.seen - WINDOW_VALUE_KEYS)


def test_the_checkpointer_takes_at_most_its_duty_of_a_core():
    """Issue 35's soak: saving 64 runs every 2 s took 8 % of a core. The wait after a save stretches to its CPU time
    over ``duty``: a cheap save keeps the 2 s interval, a 0.16 s one waits 8 s (2 % of a core)."""
    from omniwatch.periodic import Periodic
    cp = Checkpointer(RunStore(), [], "/nonexistent-dir-never-written")
    assert cp.duty == 0.02
    assert cp.next_wait(0.001) == cp.interval == 2.0
    assert cp.next_wait(0.16) == pytest.approx(8.0)
    assert all(cp.next_wait(c) * cp.duty >= c for c in (0.0, 0.01, 0.04, 0.5, 3.0))
    assert Periodic(2.0, fn=lambda: None).next_wait(5.0) == 2.0   # unbounded unless asked
