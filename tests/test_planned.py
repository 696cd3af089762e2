"""Planned work and the end of a run (omniwatch/core/planned.py) through the real run model: checkpoint and
validation durations and cadence as verl's save_freq / test_freq produce them, the allowance the
TrainingStalled rules add, finished runs (forced final checkpoint / validation, the console total),
the log writer seen through /proc, the expiry that follows, and all of it across an exporter restart."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from omniwatch import names
from omniwatch.core.model import RunStore
from omniwatch.core.parse import ParsedStep, clean_values
from omniwatch.core.planned import LogWriterWatch, PlannedWork, total_steps_in, writers
from omniwatch.simulate import RunSpec, step_dict
from omniwatch.sources.files import FileSource
from omniwatch.core.state import Checkpointer

from .test_model import samples, value


class Clock:
    """The store's clock: the latest arrival fed (tests move it on by hand)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def new_store(**kw) -> RunStore:
    return RunStore(clock=Clock(), **kw)


def feed(store, spec: RunSpec, steps, project="p", experiment="e", t0=1000.0):
    """Ingest simulated steps; each arrives when its timers say (step + validation after it)."""
    t = t0
    for s in steps:
        d = step_dict(spec, s)
        t += d["timing_s/step"] + d.get("timing_s/testing", 0.0)
        vals, _ = clean_values(d)
        store.ingest(project, experiment, ParsedStep(s, vals), "push", arrival=t, feed="push:p/e")
    if isinstance(store.clock, Clock):
        store.clock.t = max(store.clock.t, t)
    return t


def run(store, project="p", experiment="e"):
    return store.runs[(project, experiment)]


HEAVY = dict(pace=240.0, checkpoint_every=10, checkpoint_factor=4.5, validation_every=15, validation_factor=1.5)


def test_durations_cadence_and_unseen_kinds_as_verl_produces_them():
    st = new_store()
    feed(st, RunSpec(**HEAVY), range(1, 10))
    p = run(st).planned
    assert p.unseen() == 2 and p.allowance(9) == 0.0  # nothing seen: the rules' reserve covers it
    feed(st, RunSpec(**HEAVY), [10])
    ck = p.kinds["checkpoint"]
    assert ck.every == 10  # seen from step 1: the first save at step 10 means save_freq = 10
    assert abs(ck.seconds - step_dict(RunSpec(**HEAVY), 10)["timing_s/save_checkpoint"]) < 1e-9
    assert p.unseen() == 1
    feed(st, RunSpec(**HEAVY), range(11, 31))
    assert p.unseen() == 0 and p.kinds["validation"].every == 15
    longest = max(step_dict(RunSpec(**HEAVY), s)["timing_s/save_checkpoint"] for s in (10, 20, 30))
    assert ck.seconds == longest
    # JSONL: any next step may be the last one, which forces both (D9): everything seen is allowed for
    both = ck.seconds + p.kinds["validation"].seconds
    assert p.allowance(30) == pytest.approx(both) and p.allowance(31) == pytest.approx(both)
    assert value(st, names.PLANNED_ALLOWANCE, project="p", experiment="e") == pytest.approx(both)
    assert value(st, names.PLANNED_EVERY, project="p", experiment="e", kind="checkpoint") == 10
    assert value(st, names.PLANNED_UNSEEN, project="p", experiment="e") == 0
    assert value(st, names.RUN_FINISHED, project="p", experiment="e") == 0


def test_a_known_total_lets_the_cadence_say_which_step_is_due():
    st = new_store()
    feed(st, RunSpec(**HEAVY), range(1, 31))
    st.set_total_steps("p", "e", 101)
    p = run(st).planned
    ck, val = p.kinds["checkpoint"].seconds, p.kinds["validation"].seconds
    assert p.allowance(30) == 0.0                 # step 31: neither due
    assert p.allowance(39) == pytest.approx(ck)   # step 40: a checkpoint
    assert p.allowance(44) == pytest.approx(val)  # step 45: a validation
    assert p.allowance(59) == pytest.approx(ck + val)
    assert p.allowance(98) == 0.0
    assert p.allowance(100) == pytest.approx(ck + val)  # step 101 is the last: both forced


def test_a_resumed_run_revises_its_cadence_when_a_due_step_passes_without_a_save():
    p = PlannedWork()
    for s in range(51, 100):
        p.observe(s, {"timing_s/step": 10.0})
    p.observe(100, {"timing_s/step": 50.0, "timing_s/save_checkpoint": 40.0})
    assert p.kinds["checkpoint"].every == 50  # 50 or 100: step 50 was before the resume
    for s in range(101, 151):
        p.observe(s, {"timing_s/step": 10.0})
    assert p.kinds["checkpoint"].every == 100  # step 150 carried none
    p.observe(200, {"timing_s/step": 50.0, "timing_s/save_checkpoint": 40.0})
    assert p.kinds["checkpoint"].every == 100 and not p.finished(200)


def test_the_forced_final_checkpoint_and_validation_finish_the_run():
    spec = RunSpec(**HEAVY, total_steps=37)  # 37: off both cadences
    st = new_store()
    feed(st, spec, range(1, 37))
    assert not run(st).planned.finished(36)
    feed(st, spec, [37])
    p = run(st).planned
    assert p.finished(37) and p.kinds["checkpoint"].off_cadence_step == 37
    assert value(st, names.RUN_FINISHED, project="p", experiment="e") == 1
    # a legacy ESI save mid-run is off-cadence too; the next step shows the run went on
    st2 = new_store()
    feed(st2, RunSpec(**HEAVY), range(1, 26))
    vals, _ = clean_values({**step_dict(RunSpec(**HEAVY), 26), "timing_s/save_checkpoint": 900.0})
    st2.ingest("p", "e", ParsedStep(26, vals), "push", arrival=1e6)
    assert run(st2).planned.finished(26)
    feed(st2, RunSpec(**HEAVY), [27], t0=1e6)
    assert not run(st2).planned.finished(27)


def test_step_zero_validation_is_not_a_cadence_occurrence():
    st = new_store()
    st.ingest("p", "e", ParsedStep(0, {"val-core/ocr/reward/mean@1": 0.3}), "push", arrival=1.0)
    feed(st, RunSpec(**HEAVY), range(1, 5))
    p = run(st).planned
    assert p.unseen() == 2 and p.kinds["validation"].g == 0


def test_console_total_line_is_read_and_reaching_it_finishes_the_run(tmp_path):
    assert total_steps_in(b"(TaskRunner pid=1) Total training steps: 120") == 120
    assert total_steps_in("INFO Total diffusion training steps: 64\n") == 64
    assert total_steps_in(b"step:1 - timing_s/step:3") is None and total_steps_in(b"Total training steps: 0") is None
    log = tmp_path / "proj" / "exp.log"
    log.parent.mkdir()
    lines = ["Total training steps: 3"] + [
        "step:%d - timing_s/step:10.0 - timing_s/gen:5.0" % s for s in (1, 2, 3)]
    log.write_text("\n".join(lines) + "\n")
    st = new_store()
    src = FileSource(st, [str(log)], "console")
    src.poll_once()
    assert run(st, "proj", "exp").planned.total == 3
    assert value(st, names.RUN_FINISHED, project="proj", experiment="exp") == 1
    assert value(st, names.RUN_TOTAL_STEPS, project="proj", experiment="exp") == 3


def test_expiry_is_for_finished_or_ended_runs_not_hung_ones():
    st = new_store(run_expiry=3600, stalled_expiry=3 * 86400)
    spec = RunSpec(**HEAVY, total_steps=37)
    for exp in ("unknown", "finished", "open", "closed"):
        feed(st, spec, range(1, 38 if exp == "finished" else 30), experiment=exp)
    st.set_log_open("p", "unknown", False)  # never seen open: stays unknown (a log on another node)
    st.set_log_open("p", "open", True)
    st.set_log_open("p", "closed", True)
    st.set_log_open("p", "closed", False)
    assert run(st, "p", "unknown").planned.log_open is None
    st.clock.t += 3601
    exported = {e for (name, labels) in samples(st) if name == names.STEP for k, e in labels if k == "experiment"}
    assert exported == {"unknown", "open"}, exported  # finished and ended runs resolve; hung ones alert on
    assert value(st, names.RUN_LOG_OPEN, project="p", experiment="open") == 1
    st.clock.t += 3 * 86400
    exported = {e for (name, labels) in samples(st) if name == names.STEP for k, e in labels if k == "experiment"}
    assert exported == {"open"}  # the long bound for unknown runs; a live writer never expires


def test_writers_are_seen_in_proc_and_their_exit_closes_the_run(tmp_path):
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no procfs here: `ls /proc/self/fd` fails")
    log = tmp_path / "proj" / "exp.jsonl"
    log.parent.mkdir()
    log.write_bytes(b"")
    reader = open(log, "rb")  # our own read handle (as FileTail's) is never a writer
    code = f"import time; f = open({str(log)!r}, 'ab', buffering=0); print('ok', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ok"
        real = os.path.realpath(log)
        assert writers({real}) == {real}
        assert writers({real}, exclude={proc.pid}) == set()
        assert writers({real}, proc=str(tmp_path / "no-proc")) is None
        st = new_store()
        src = FileSource(st, [str(tmp_path)], "jsonl")
        log.write_bytes(b'{"step": 1, "data": {"timing_s/step": 10.0}}\n')
        src.poll_once()
        watch = LogWriterWatch(st, [src])
        watch.scan_once()
        assert run(st, "proj", "exp").planned.log_open is True
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while run(st, "proj", "exp").planned.log_open and time.monotonic() < deadline:
            watch.scan_once()
            time.sleep(0.1)
        assert run(st, "proj", "exp").planned.log_open is False
    finally:
        reader.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_planned_facts_survive_an_exporter_restart(tmp_path):
    st = new_store()
    feed(st, RunSpec(**HEAVY), range(1, 31))
    st.set_total_steps("p", "e", 100)
    st.set_log_open("p", "e", True)
    cp = Checkpointer(st, [], str(tmp_path))
    assert cp.save()
    st2 = new_store()
    assert Checkpointer(st2, [], str(tmp_path)).load()
    a, b = run(st).planned, run(st2).planned
    assert b.to_json() == a.to_json()
    assert b.kinds["checkpoint"].every == 10 and b.allowance(39) == a.allowance(39) > 0
    assert b.total == 100 and b.log_open is True


def test_checkpoint_root_reports_the_next_steps_checkpoint_being_written(tmp_path):
    from omniwatch.core.planned import CheckpointWatch, newest_write
    st = new_store()
    feed(st, RunSpec(**HEAVY), range(1, 10))
    root = tmp_path / "checkpoints"
    watch = CheckpointWatch(st, [str(root)])
    watch.scan_once()
    assert (names.CHECKPOINT_WRITE_TS, (("experiment", "e"), ("project", "p"))) not in samples(st)
    (root / "p" / "e" / "global_step_5" / "actor").mkdir(parents=True)  # an old checkpoint: not the next step
    watch.scan_once()
    assert run(st).planned.ckpt_write is None
    shard = root / "p" / "e" / "global_step_10" / "actor" / "model_world_size_8_rank_0.pt"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"x" * 10)
    os.utime(shard, (5000.0, 5000.0))
    os.utime(shard.parent, (4000.0, 4000.0))
    os.utime(shard.parent.parent, (4000.0, 4000.0))
    assert newest_write(str(shard.parent.parent)) == 5000.0
    assert newest_write(str(shard)) is None and newest_write(str(root / "missing")) is None
    watch.scan_once()
    assert value(st, names.CHECKPOINT_WRITE_TS, project="p", experiment="e") == 5000.0
    os.utime(shard, (6000.0, 6000.0))  # the save goes on writing
    watch.scan_once()
    assert value(st, names.CHECKPOINT_WRITE_TS, project="p", experiment="e") == 6000.0
    feed(st, RunSpec(**HEAVY), [10], t0=st.clock.t)  # step 10 arrived: that directory says nothing more
    assert (names.CHECKPOINT_WRITE_TS, (("experiment", "e"), ("project", "p"))) not in samples(st)


def test_serve_flags_wire_the_expiry_and_the_watchers(tmp_path):
    import argparse

    from omniwatch.server import Exporter, add_exporter_args, settings_from_args
    p = argparse.ArgumentParser()
    add_exporter_args(p)
    args = p.parse_args(["--watch", str(tmp_path), "--checkpoint-root", str(tmp_path / "ck"),
                         "--stalled-run-expiry", "60", "--run-expiry", "30"])
    s = settings_from_args(args)
    assert s.checkpoint_roots == [str(tmp_path / "ck")] and s.stalled_expiry_seconds == 60
    ex = Exporter.build(s)
    try:
        assert (ex.store.run_expiry, ex.store.stalled_expiry) == (30, 60)
        assert isinstance(ex.writers, LogWriterWatch) and ex.checkpoints is not None
        ex.start_sources()
    finally:
        ex.stop()
    assert not ex.writers._thread.is_alive() and not ex.checkpoints._thread.is_alive()
    default = settings_from_args(p.parse_args([]))
    assert Exporter.build(default).writers is None  # nothing watched: nothing to scan
