"""The trainer's configuration (omniwatch/trainer_config.py, issue 22 item 4) and what the run model does with
it: VeRL-Omni's config print and Hydra's .hydra/config.yaml as a real Hydra app wrote them from VeRL-Omni's
own config (tests/fixtures/trainer_config/), Ray's driver prefix, the facts read (total steps, cadence, SP,
engine, LoRA, GPU pools), the series exported, the console source reading the print live, hostile files
(counted skips), history runs (item 6) and the provisional typical step (item 5)."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from omniwatch import names, trainer_config as tc
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_record
from omniwatch.sources.files import FileSource
from omniwatch.core.state import restore_store, snapshot_store

from .conftest import REPO, fixture
from .test_model import samples, value

CFG = "trainer_config"
RUN = ("whole_run",)


def whole_run(name: str) -> list[dict]:
    return [json.loads(line) for line in fixture(f"whole_run/{name}.jsonl").read_text().splitlines()]


def feed(store: RunStore, name: str, lines: list[dict] | None = None, t0: float = 1_000_000.0, step_s=250.0):
    for i, rec in enumerate(lines if lines is not None else whole_run(name)):
        store.clock_t = t0 + i * step_s
        store.ingest("whole_run", name, parse_record(rec), "jsonl", arrival=t0 + i * step_s)
    return store.runs[("whole_run", name)]


def new_store(**kw) -> RunStore:
    s = RunStore(clock=lambda: s.clock_t, **kw)
    s.clock_t = 1_000_000.0
    return s


# --- the readers --------------------------------------------------------------------------------------------
EXPECTED = {
    "finished_on_cadence": dict(total_steps=40, save_freq=10, test_freq=10, sp=1, engine="fsdp", lora=True,
                                trainer="legacy", async_mode=None, gpus=4),
    "no_validation_15min": dict(total_steps=40, save_freq=10, test_freq=-1, sp=1, engine="fsdp", lora=True,
                                trainer="legacy", async_mode=None, gpus=4),
    "mfu_sp4": dict(total_steps=20, save_freq=-1, test_freq=-1, sp=4, engine="fsdp", lora=True, trainer="legacy",
                    async_mode=None, gpus=4),
    "v1_separate_async": dict(total_steps=12, save_freq=100, test_freq=20, sp=1, engine="fsdp", lora=True,
                              trainer="v1", async_mode="separate_async", gpus=8),
}


def _check(cfg: tc.TrainerConfig, case: str) -> None:
    assert (cfg.project, cfg.experiment) == ("whole_run", case)
    got = {k: getattr(cfg, k) for k in EXPECTED[case]}
    assert got == EXPECTED[case]


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_verl_omni_config_print_is_read(case):
    cfg = tc.read_file(str(fixture(f"{CFG}/{case}.pprint.log")))
    assert cfg.source == "pprint"
    _check(cfg, case)


@pytest.mark.parametrize("case", ["finished_on_cadence", "v1_separate_async"])
def test_hydra_config_yaml_says_the_same_as_the_print(case):
    """Hydra's file keeps interpolations unresolved (${oc.select:...}); the facts are the print's."""
    y = tc.read_file(str(fixture(f"{CFG}/{case}.hydra/config.yaml")))
    p = tc.read_file(str(fixture(f"{CFG}/{case}.pprint.log")))
    assert y.source == "yaml"
    assert {**y.to_json(), "source": "", "path": ""} == {**p.to_json(), "source": "", "path": ""}
    _check(y, case)


def test_separate_async_pools_and_the_standalone_rollout():
    cfg = tc.read_file(str(fixture(f"{CFG}/v1_separate_async.pprint.log")))
    assert cfg.pools() == {"trainer": 4, "rollout": 4} and cfg.gpus == 8


def test_ray_driver_prefix_and_colours_are_stripped():
    """On the driver's console the TaskRunner's print carries Ray's "(TaskRunner pid=N, ip=A)" prefix
    (docs.ray.io Logging), coloured on a terminal; other output surrounds it."""
    text = fixture(f"{CFG}/mfu_sp4.pprint.log").read_text()
    lines = ["2026-12-01 10:00:00,000 INFO worker.py:1 -- Started a local Ray instance.",
             "\x1b[36m(TaskRunner pid=48211, ip=10.0.0.7)\x1b[0m TaskRunner hostname: node7, PID: 48211"]
    lines += [f"\x1b[36m(TaskRunner pid=48211, ip=10.0.0.7)\x1b[0m {ln}" for ln in text.splitlines()]
    lines += ["(TaskRunner pid=48211) Total training steps: 20", "step:1 - timing_s/step:300.0"]
    cfg = tc.facts(tc.parse_pprint_text("\n".join(lines)), "console")
    _check(cfg, "mfu_sp4")


def test_interpolations_resolve_through_oc_select_and_defaults():
    d = {"trainer": {"n_gpus_per_node": 8, "nnodes": 2, "project_name": "p", "experiment_name": "e",
                     "total_training_steps": "${oc.select:trainer.steps,300}", "save_freq": "${oc.env:FREQ}",
                     "test_freq": "${trainer.other}", "other": 5},
         "actor_rollout_ref": {"actor": {"strategy": "veomni", "veomni_config": {"ulysses_parallel_size": 2}},
                               "model": {"lora_rank": 0}}}
    cfg = tc.facts(d, "yaml")
    assert (cfg.total_steps, cfg.save_freq, cfg.test_freq, cfg.gpus, cfg.engine, cfg.sp, cfg.lora) == \
        (300, None, 5, 16, "veomni", 2, False)
    assert tc.assumptions(cfg) == ["save_freq/test_freq not in the config: inferred from the steps"]
    assert len(tc.assumptions(None)) == 4


# --- hostile and broken files: counted skips, never a crash ---------------------------------------------------
def _hostile(tmp_path) -> dict[str, bytes]:
    bomb = b"a: &a ['x','x','x','x','x','x','x','x','x','x']\n"
    for i in range(1, 9):
        bomb += f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join(['*' + chr(96 + i)] * 10)}]\n".encode()
    bomb += b"trainer: {n: *i}\n"
    return {
        "malformed.yaml": b"trainer: [unclosed\n  - {",
        "list.yaml": b"- 1\n- 2\n",
        "no_trainer.yaml": b"actor_rollout_ref: {}\n",
        "deep.yaml": b"trainer: " + b"[" * 50_000 + b"]" * 50_000 + b"\n",
        "bomb.yaml": bomb,
        "binary.yaml": b"\x00\x01\x02trainer:",
        "huge.yaml": b"trainer: {}\n" + b"#" * (tc.MAX_BYTES + 10),
        "bad_types.yaml": (b"trainer: {project_name: [1], experiment_name: {a: 1}, total_training_steps: 1e99, "
                           b"save_freq: abc, test_freq: true, nnodes: -3, n_gpus_per_node: 99999999999}\n"),
        "never_closes.log": b"{'trainer': {'a': [\n" + b"  1,\n" * (tc.MAX_LINES + 5),
        "bad_literal.log": b"{'trainer': {'a': __import__('os').system('true')}}\n",
        "deep_literal.log": b"{'trainer': " + b"[" * 20_000 + b"]" * 20_000 + b"}\n",
    }


def test_hostile_config_files_are_counted_skips_never_a_crash(tmp_path):
    for name, data in _hostile(tmp_path).items():
        (tmp_path / name).write_bytes(data)
    os.mkfifo(tmp_path / "fifo.config.yaml")
    os.symlink("/dev/zero", tmp_path / "zero.config.yaml")
    store = new_store()
    # a glob takes every regular file it matches; a directory walk takes configs by name (the FIFO and the link,
    # named as configs; test_hardening_inputs.py: the other names are not read at all)
    watch = tc.ConfigWatch(store, [str(tmp_path / "*"), str(tmp_path), str(tmp_path / "missing.yaml")])
    # the FIFO (no writer) and the link to /dev/zero end the scan, not hang it: it returns (the join is a hang guard)
    scanned: list[int] = []
    th = threading.Thread(target=lambda: scanned.append(watch.scan_once()), daemon=True)
    th.start()
    th.join(120)
    assert scanned == [0], "the scan hung on the FIFO or /dev/zero"
    errs = {r: c for (src, r), c in store.errors.items() if src == tc.SOURCE}
    # every file that should have been a config is one counted skip (bad_types: no usable run name), and
    # so are the FIFO, the link to /dev/zero (not regular files) and the named file that is missing
    assert sum(errs.values()) == len(_hostile(tmp_path)) + 3
    assert errs.get("not_regular_file") == 2
    assert errs.get("malformed_yaml", 0) >= 1 and errs.get("config_too_large", 0) >= 2
    # bad_types and the alias bomb (read in its distinct nodes, cheaply) name no run
    assert errs.get("no_run_name") == 2 and errs.get("unreadable_file") == 1 and errs.get("too_deep") == 1
    assert not store.runs and not store.trainer_configs
    # unchanged files are not read (or counted) again
    assert watch.scan_once() == 0
    assert sum(c for (src, _), c in store.errors.items() if src == tc.SOURCE) == sum(errs.values())
    assert value(store, names.INGEST_ERRORS, source=tc.SOURCE, reason="malformed_yaml") >= 1


def test_a_config_dir_finds_hydra_run_dirs_and_matches_runs_by_name(tmp_path):
    run_dir = tmp_path / "outputs" / "2026-12-01" / "10-00-00" / ".hydra"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_bytes(fixture(f"{CFG}/finished_on_cadence.hydra/config.yaml").read_bytes())
    (run_dir / "overrides.yaml").write_text("- trainer.save_freq=10\n")  # Hydra's other files: not configs
    (tmp_path / "notes.txt").write_text("nothing printed here\n")       # not a config: silently not one
    store = new_store()
    assert tc.ConfigWatch(store, [str(tmp_path)]).scan_once() == 1
    assert not store.errors
    run = feed(store, "finished_on_cadence")
    assert run.config is not None and run.config.source == "yaml"


def test_up_finds_a_hydra_config_and_a_console_log_with_the_config_print_under_a_named_dir(tmp_path):
    """Issue 31 item 2: `make up TRAINER_CONFIG=DIR` / `omniwatch up --trainer-config DIR` — under the directory the
    user names, a Hydra run dir's .hydra/config.yaml and a console log with VeRL-Omni's config print (any depth) are
    both found and matched to their runs; `make up` passes every TRAINER_CONFIG path to `omniwatch up`."""
    import subprocess
    hydra = tmp_path / "outputs" / "2026-12-01" / "10-00-00" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_bytes(fixture(f"{CFG}/finished_on_cadence.hydra/config.yaml").read_bytes())
    logs = tmp_path / "logs" / "v1"
    logs.mkdir(parents=True)
    (logs / "train.log").write_bytes(fixture(f"{CFG}/v1_separate_async.pprint.log").read_bytes())
    found = sorted(os.path.relpath(p, tmp_path) for p in tc.expand(str(tmp_path)))
    assert found == ["logs/v1/train.log", "outputs/2026-12-01/10-00-00/.hydra/config.yaml"]
    configs = tc.load_all([str(tmp_path)])
    assert {c.source for c in configs.values()} == {"yaml", "pprint"} and len(configs) == 2
    r = subprocess.run(["make", "-n", "up", f"TRAINER_CONFIG={tmp_path} /other/dir", "WATCH=/w"], cwd=REPO,
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert f"--trainer-config '{tmp_path}' --trainer-config '/other/dir'" in r.stdout, r.stdout + r.stderr


# --- what the run model does with it --------------------------------------------------------------------------
def _cfg(case: str, kind: str = "pprint") -> tc.TrainerConfig:
    path = f"{CFG}/{case}.pprint.log" if kind == "pprint" else f"{CFG}/{case}.hydra/config.yaml"
    return tc.read_file(str(fixture(path)))


def test_a_finish_on_both_cadences_is_finished_with_a_config_and_said_without():
    bare = new_store()
    run = feed(bare, "finished_on_cadence")
    assert value(bare, names.RUN_FINISHED, project="whole_run", experiment="finished_on_cadence") == 0
    info = ("source", "none"), ("engine", "unknown"), ("trainer", "unknown"), ("async_mode", "unknown"), ("lora", "unknown")
    assert samples(bare)[(names.TRAINER_CONFIG_INFO, tuple(sorted((("project", "whole_run"),
                                                                    ("experiment", "finished_on_cadence")) + info)))] == 1
    assert tc.assumptions(run.config)[0].startswith("no trainer configuration read")
    store = new_store()
    store.set_trainer_config(_cfg("finished_on_cadence"))  # before the run's first line (the print comes first)
    feed(store, "finished_on_cadence")
    rl = dict(project="whole_run", experiment="finished_on_cadence")
    assert value(store, names.RUN_FINISHED, **rl) == 1
    assert value(store, names.TRAINER_CONFIG_TOTAL_STEPS, **rl) == 40
    assert value(store, names.TRAINER_CONFIG_EVERY, kind="checkpoint", **rl) == 10
    assert value(store, names.TRAINER_CONFIG_INFO, source="pprint", engine="fsdp", trainer="legacy",
                 async_mode="unknown", lora="true", **rl) == 1
    # and one applied after the steps (--trainer-config read later) decides the same
    late = new_store()
    feed(late, "finished_on_cadence")
    late.set_trainer_config(_cfg("finished_on_cadence", "yaml"))
    assert value(late, names.RUN_FINISHED, **rl) == 1


def test_validation_off_in_the_config_leaves_no_reserve():
    lines = whole_run("no_validation_15min")[:25]  # hung after step 25
    rl = dict(project="whole_run", experiment="no_validation_15min")
    bare, store = new_store(), new_store()
    store.set_trainer_config(_cfg("no_validation_15min"))
    feed(bare, "no_validation_15min", lines)
    feed(store, "no_validation_15min", lines)
    assert value(bare, names.PLANNED_UNSEEN, **rl) == 1      # validation never seen: a reserve for ever
    assert value(store, names.PLANNED_UNSEEN, **rl) == 0     # test_freq=-1: no validation will come
    assert value(store, names.RUN_FINISHED, **rl) == 0
    assert value(store, names.TRAINER_CONFIG_EVERY, kind="validation", **rl) == -1
    # step 29 -> 30 is a checkpoint due by save_freq=10: its allowance is there, no validation's
    store2 = new_store()
    store2.set_trainer_config(_cfg("no_validation_15min"))
    feed(store2, "no_validation_15min", whole_run("no_validation_15min")[:29])
    run = store2.runs[("whole_run", "no_validation_15min")]
    assert run.planned.allowance(29) == run.planned.kinds["checkpoint"].seconds
    assert run.planned.allowance(25) == 0.0


def test_a_configured_cadence_only_reserves_the_step_a_first_checkpoint_is_due():
    store = new_store()
    store.set_trainer_config(_cfg("finished_on_cadence"))
    run = feed(store, "finished_on_cadence", whole_run("finished_on_cadence")[:5])
    assert run.planned.unseen(5) == 0 and run.planned.unseen(9) == 2  # step 10 carries both, first time


def test_sp_and_gpu_pools_are_exported_and_the_ledger_counts_every_pool():
    store = new_store()
    store.set_trainer_config(_cfg("v1_separate_async", "yaml"))
    store.set_trainer_config(_cfg("mfu_sp4"))
    feed(store, "v1_separate_async")
    feed(store, "mfu_sp4")
    a = dict(project="whole_run", experiment="v1_separate_async")
    assert value(store, names.RUN_GPUS, origin="config", **a) == 8
    assert value(store, names.TRAINER_CONFIG_GPUS, pool="rollout", **a) == 4
    assert value(store, names.TRAINER_CONFIG_SP, project="whole_run", experiment="mfu_sp4") == 4
    bare = new_store()
    feed(bare, "v1_separate_async")
    assert value(bare, names.RUN_GPUS, origin="log", **a) == 4  # the log sees the trainer's GPUs only
    flag = new_store(gpus=8, gpus_override=True)  # report --gpus 8
    flag.set_trainer_config(_cfg("v1_separate_async"))
    feed(flag, "v1_separate_async")
    assert value(flag, names.RUN_GPUS, origin="flag", **a) == 8


def test_the_console_source_reads_the_config_print_live(tmp_path):
    """A console log (Ray driver output) whose TaskRunner printed the config, then step lines: the run the
    log's steps go to gets it (source console), and so does the run the config names."""
    log = tmp_path / "proj" / "exp.log"
    log.parent.mkdir()
    text = fixture(f"{CFG}/finished_on_cadence.pprint.log").read_text().splitlines()
    steps = fixture("verl/flowgrpo_healthy.console.log").read_text().splitlines()[:3]
    log.write_text("\n".join(["(TaskRunner pid=7) TaskRunner hostname: n, PID: 7"]
                             + [f"(TaskRunner pid=7) {ln}" for ln in text] + steps) + "\n")
    store = new_store()
    src = FileSource(store, [str(log)], "console", clock=lambda: 1_000_000.0)
    src.poll_once()
    run = store.runs[("proj", "exp")]
    assert run.steps_total == 3 and run.config is not None and run.config.source == "console"
    assert store.trainer_configs[("whole_run", "finished_on_cadence")] is run.config
    assert value(store, names.TRAINER_CONFIG_INFO, project="proj", experiment="exp", source="console",
                 engine="fsdp", trainer="legacy", async_mode="unknown", lora="true") == 1
    assert not [k for k in store.errors if k[0] == tc.SOURCE]


def test_config_and_staleness_survive_an_exporter_restart():
    store = new_store()
    store.set_trainer_config(_cfg("finished_on_cadence"))
    feed(store, "finished_on_cadence")
    data = json.loads(json.dumps(snapshot_store(store)))
    again = new_store()
    restore_store(again, data)
    run = again.runs[("whole_run", "finished_on_cadence")]
    assert run.config == store.runs[("whole_run", "finished_on_cadence")].config
    assert run.planned.finished(run.last.step if run.last else 40) or run.planned.total == 40
    assert run.planned.kinds["validation"].configured == 10


# --- hangs from step 1 (item 5) -----------------------------------------------------------------------------
def test_a_run_of_warm_up_steps_only_exports_its_warm_up_step():
    store = new_store()
    feed(store, "hang_in_step3")
    rl = dict(project="whole_run", experiment="hang_in_step3")
    s = samples(store)
    assert (names.TYPICAL_STEP, tuple(sorted(rl.items()))) not in s  # no normal step yet
    assert value(store, names.WARMUP_STEP, **rl) == pytest.approx(whole_run("hang_in_step3")[0]["data"]["timing_s/step"])


# --- history is not news (item 6) -----------------------------------------------------------------------------
def _polls_until_read(src, store, key, step: int) -> None:
    """A file idle for half an hour by its own mtime is looked at every DORMANT_EVERY-th poll (issue 35 item 5)."""
    from omniwatch.sources import files as F
    for _ in range(F.DORMANT_EVERY):
        src.poll_once()
        if store.runs[key].last.step == step:
            return
    raise AssertionError(f"{key} step {step} not read in {F.DORMANT_EVERY} polls")


def test_a_log_root_of_old_runs_is_history_live_lines_are_news(tmp_path):
    root = tmp_path / "root"
    (root / "whole_run").mkdir(parents=True)
    now = time.time()
    for name, age in (("hang_in_step3", 2 * 86400), ("finished_on_cadence", 60)):
        p = root / "whole_run" / f"{name}.jsonl"
        p.write_bytes(fixture(f"whole_run/{name}.jsonl").read_bytes())
        os.utime(p, (now - age, now - age))
    store = RunStore(clock=time.time)
    src = FileSource(store, [str(root)], "jsonl")
    src.poll_once()
    old = dict(project="whole_run", experiment="hang_in_step3")
    assert value(store, names.RUN_STALE, **old) == 1
    assert value(store, names.RUN_STALE, project="whole_run", experiment="finished_on_cadence") == 0
    assert value(store, names.STALE_RUNS) == 1
    # a live line brings it back: news again
    with open(root / "whole_run" / "hang_in_step3.jsonl", "ab") as f:
        rec = whole_run("hang_in_step3")[-1]
        f.write(json.dumps({"step": 3, "data": rec["data"]}).encode() + b"\n")
    _polls_until_read(src, store, ("whole_run", "hang_in_step3"), 3)
    assert value(store, names.RUN_STALE, **old) == 0 and value(store, names.STALE_RUNS) == 0


def test_stale_horizon_zero_turns_it_off_and_a_live_writer_is_no_history(tmp_path):
    p = tmp_path / "p" / "e.jsonl"
    p.parent.mkdir()
    p.write_bytes(fixture("whole_run/hang_in_step3.jsonl").read_bytes())
    os.utime(p, (time.time() - 86400,) * 2)
    off = RunStore(clock=time.time, stale_horizon=0)
    FileSource(off, [str(p)], "jsonl").poll_once()
    assert value(off, names.RUN_STALE, project="p", experiment="e") == 0
    on = RunStore(clock=time.time)
    FileSource(on, [str(p)], "jsonl").poll_once()
    assert value(on, names.RUN_STALE, project="p", experiment="e") == 1
    on.set_log_open("p", "e", True)  # a live process holds it open: hung, not history
    assert value(on, names.RUN_STALE, project="p", experiment="e") == 0


def test_history_at_first_sight_is_counted_in_the_runs_own_steps_not_a_fixed_age(tmp_path):
    """Issue 31 item 6: on the first `up`, a run whose last line is older than stall.history_steps (3) of its typical
    steps plus its planned allowance is history (info once, never paged) whatever its age: an hour-old hang is
    history (the 6-hour horizon alone paged it critical 37 s after `up`); one a couple of steps old is live (it may
    be mid-step); before a normal step the provisional step counts; a new line makes a history run live again."""
    from omniwatch.config import DEFAULT
    root = tmp_path / "root"
    (root / "w").mkdir(parents=True)
    now = time.time()
    recs = whole_run("finished_on_cadence")[:12]          # 240 s steps: 3 typical steps = 12 min
    early = whole_run("hang_in_step3")[:2]               # warm-up steps only (308 s, 255 s): provisional 462 s
    cases = {"hour_old": (recs, 3600), "two_steps_old": (recs, 2 * 240), "early_old": (early, 3 * 462 + 60),
             "early_fresh": (early, 400)}
    for name, (lines, age) in cases.items():
        p = root / "w" / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in lines))
        os.utime(p, (now - age, now - age))
    store = RunStore(clock=time.time)
    src = FileSource(store, [str(root)], "jsonl")
    src.poll_once()
    got = {name: value(store, names.RUN_STALE, project="w", experiment=name) for name in cases}
    assert got == {"hour_old": 1, "two_steps_old": 0, "early_old": 1, "early_fresh": 0}, got
    run = store.runs[("w", "hour_old")]
    typ = run.window.typical_step()
    assert store.history_threshold(run) == pytest.approx(DEFAULT.stall.history_steps * typ
                                                         + run.planned.allowance(run.last.step))
    assert value(store, names.STALE_RUNS) == 2
    # a new line: live again (TrainingStalled may escalate from now on)
    with open(root / "w" / "hour_old.jsonl", "a") as f:
        f.write(json.dumps({"step": 13, "data": recs[-1]["data"]}) + "\n")
    _polls_until_read(src, store, ("w", "hour_old"), 13)
    assert value(store, names.RUN_STALE, project="w", experiment="hour_old") == 0
    # live evidence from Ray (the run's job still runs: discovery/jobs.py) also clears it
    from omniwatch.core.planned import JobState
    assert store.set_ray_job("w", "early_old", JobState("03000000", "DRIVER", "RUNNING"))
    assert value(store, names.RUN_STALE, project="w", experiment="early_old") == 0


# --- remedies that fit the run's engine and LoRA (from its config) --------------------------------------------
def test_remedies_name_the_engine_keys_and_layered_summon_only_for_lora():
    from omniwatch.alerting import remedies
    from omniwatch.prosetext import Ctx, key_of, setting_series

    def actor(settings=None, **info):
        series = {key_of(names.TRAINER_CONFIG_INFO, f'{k}="{v}"'): 1 for k, v in info.items()}
        return remedies.step_regression().expect(Ctx({"project": "p", "experiment": "e", "cause": "actor"}, 1.0,
                                                     {**series, **setting_series(settings)}, None))
    lora = tc.read_file(str(fixture(f"{CFG}/finished_on_cadence.pprint.log"))).settings  # LoRA 64, both offloaded
    fsdp_lora = actor({**lora, "layered_summon": False})
    assert "fsdp_config.param_offload=False" in fsdp_lora and "layered_summon=True" in fsdp_lora
    assert "layered_summon" not in actor(lora)  # it already has it on: nothing to propose
    full = actor({**lora, "lora_rank": 0, "layered_summon": False})
    assert "layered_summon" not in full
    veo = actor(tc.read_file(str(fixture(f"{CFG}/veomni_offload.pprint.log"))).settings)
    assert "veomni_config.param_offload=False" in veo and "fsdp_config" not in veo
    unknown = actor(engine="unknown", lora="unknown", source="none")
    assert "fsdp_config.param_offload=False" in unknown and "for a LoRA run with both on keep" in unknown
    assert "No trainer config was read for this run" in unknown
    veomni_keys = {ln.strip() for ln in fixture("verl_omni/config_keys_veomni_only.txt").read_text().splitlines()
                   if ln.strip() and not ln.startswith("#")}
    assert remedies.VEOMNI_KEYS and remedies.VEOMNI_KEYS <= veomni_keys


def test_the_demo_finishes_its_runs_when_it_ends(tmp_path):
    """demo.finish_runs writes each run's config with its last written step as the total: read through
    --trainer-config, every demo run is finished (never a stall) once the demo is over."""
    from omniwatch import demo
    from omniwatch.simulate import RunSpec, step_dict
    scs = demo.scenarios(5.0, 20, 8)
    store = new_store()
    for sc in scs:
        for s in range(1, 7):
            store.ingest(demo.PROJECT, sc.experiment, parse_record({"step": s, "data": step_dict(RunSpec(), s)}),
                         "jsonl", arrival=1_000_000.0 + s)
        sc.written = 6
    demo.finish_runs(scs, tmp_path)
    assert tc.ConfigWatch(store, [str(tmp_path)]).scan_once() == len(scs)
    for sc in scs:
        assert value(store, names.RUN_FINISHED, project=demo.PROJECT, experiment=sc.experiment) == 1


def test_a_config_never_puts_its_own_strings_into_labels():
    d = {"trainer": {"project_name": "p", "experiment_name": "e", "use_v1": True,
                     "v1": {"trainer_mode": "hf_abcdefghijklmnopqrstuvwxyz0123456789"}},
         "actor_rollout_ref": {"actor": {"strategy": "ghp_abcdefghijklmnopqrstuvwxyz0123456789"}}}
    cfg = tc.facts(d, "yaml")
    assert (cfg.engine, cfg.async_mode, cfg.trainer) == ("other", "other", "v1")


def test_the_report_page_says_what_was_read_or_assumed():
    from omniwatch.backtest.runfile import load_run
    from omniwatch.report.gather import facts_of_runs
    from omniwatch.report.html import run_page
    from omniwatch.report.verdict import verdict
    bare = load_run(str(fixture("whole_run/v1_separate_async.jsonl")))
    conf = load_run(str(fixture("whole_run/v1_separate_async.jsonl")))
    assert not tc.attach([conf], [str(fixture(f"{CFG}/v1_separate_async.hydra/config.yaml"))])
    fb, fc = facts_of_runs([bare, conf], alerts=False)
    pb, pc = run_page(fb, verdict(fb)), run_page(fc, verdict(fc))
    assert "Assumed: no trainer configuration read" in pb and "Trainer config" not in pb
    assert "Trainer config (yaml): total_steps 12" in pc and "gpus 8" in pc and "Assumed:" not in pc


# -- every GPU pool counted (issue 33 item 4) ------------------------------------------------------------------
def _layout(**edits) -> dict:
    """VeRL-Omni's composed config of the separate_async case (Hydra's config.yaml), with keys set."""
    d = tc.parse_yaml_text(fixture(f"{CFG}/v1_separate_async.hydra/config.yaml").read_text())
    for dotted, v in edits.items():
        node = d
        *path, last = dotted.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = v
    return d


def test_a_fully_async_standalone_rollout_and_a_distillation_teacher_pool_count_all_their_gpus():
    # fully async (VeRL-Omni omni_megatron_trainer.yaml: actor_rollout_ref.hybrid_engine false, top-level rollout
    # pool); not V1 separate_async, so actor_rollout_ref.rollout.nnodes is not the pool
    d = _layout(**{"trainer.use_v1": False, "actor_rollout_ref.hybrid_engine": False, "rollout.nnodes": 2,
                   "rollout.n_gpus_per_node": 8, "trainer.nnodes": 1, "trainer.n_gpus_per_node": 8})
    c = tc.facts(d, "yaml")
    assert (c.gpus_trainer, c.gpus_rollout_pool, c.gpus_teacher_pool, c.gpus) == (8, 16, 0, 24)
    assert c.pools() == {"trainer": 8, "rollout": 16}
    # distillation teacher pool (verl's V1 trainer_base teacher_pool) beside a reward pool
    d = _layout(**{"trainer.use_v1": False, "distillation.enabled": True, "distillation.nnodes": 1,
                   "distillation.n_gpus_per_node": 4, "reward.reward_model.enable_resource_pool": True,
                   "reward.reward_model.nnodes": 1, "reward.reward_model.n_gpus_per_node": 2,
                   "trainer.nnodes": 2, "trainer.n_gpus_per_node": 8})
    c = tc.facts(d, "yaml")
    assert c.pools() == {"trainer": 16, "reward": 2, "teacher": 4} and c.gpus == 22
    # the keys present but the features off count nothing
    off = tc.facts(_layout(**{"trainer.use_v1": False, "distillation.enabled": False, "distillation.nnodes": 1,
                              "distillation.n_gpus_per_node": 4, "actor_rollout_ref.hybrid_engine": True,
                              "rollout.nnodes": 2, "rollout.n_gpus_per_node": 8}), "yaml")
    assert off.gpus_teacher_pool == 0 and off.gpus_rollout_pool == 0


def test_the_report_splits_gpu_hours_by_pool_and_they_add_up(tmp_path):
    """A distillation layout (trainer 4 + teacher 2 + reward 2) read from its config: the ledger multiplies by 8,
    the report's per-pool GPU-hours are each pool's GPUs x the run's wall time and add up to the total."""
    import yaml
    from omniwatch.backtest.runfile import load_run
    from omniwatch.report.gather import facts_of_runs
    d = _layout(**{"distillation.enabled": True, "distillation.nnodes": 1, "distillation.n_gpus_per_node": 2,
                   "reward.reward_model.enable_resource_pool": True, "reward.reward_model.nnodes": 1,
                   "reward.reward_model.n_gpus_per_node": 2, "trainer.v1.trainer_mode": "sync"})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(d))
    run = load_run(str(fixture("whole_run/v1_separate_async.jsonl")))
    assert not tc.attach([run], [str(tmp_path / "config.yaml")])
    f = facts_of_runs([run], alerts=False)[0]
    assert (f.gpus, f.gpus_source, f.pools, f.pools_source) == (8, "config", {"trainer": 4, "reward": 2, "teacher": 2}, "config")
    hours = f.pool_gpu_hours()
    assert sum(hours.values()) == pytest.approx(f.total_gpu_seconds / 3600.0, rel=1e-9)
    assert hours["teacher"] == pytest.approx(hours["reward"]) == pytest.approx(hours["trainer"] / 2)
    from omniwatch.report.html import header_rows
    row = dict(header_rows(f))["GPU pools"]
    assert "teacher 2 GPUs" in row and "from the trainer config" in row


def test_ray_placement_groups_give_the_pools_when_no_config_says():
    """verl names a pool's placement groups after it (RayResourcePool: <pool>verl_group_<counts>:<i>; a standalone
    replica's rollout_pool_<rank>): GPUs per pool from their GPU bundles; the ledger uses them (origin ray)."""
    from omniwatch.discovery import pools
    pg = lambda name, gpus, state="CREATED": {"name": name, "state": state, "bundles": [  # noqa: E731
        {"bundle_id": {"bundle_index": i}, "unit_resources": {"CPU": 1.0, "GPU": 1.0}} for i in range(gpus)]}
    rows = [pg("global_poolverl_group_4_4:0", 4), pg("global_poolverl_group_4_4:1", 4), pg("teacher_poolverl_group_2:0", 2),
            pg("rollout_pool_0verl_group_2:0", 2), pg("rollout_pool_reward_0verl_group_1:0", 1),
            pg("some_users_pg", 1), pg("global_poolverl_group_8:0", 8, state="REMOVED"),
            {"name": "cpu_only", "state": "CREATED", "bundles": [{"unit_resources": {"CPU": 4.0}}]}, "junk",
            {"name": "bad", "state": "CREATED", "bundles": [{"unit_resources": {"GPU": "x"}}, None]}]
    assert pools.pools(rows) == {"trainer": 8, "teacher": 2, "rollout": 2, "reward": 1, "other": 1}
    store = new_store()
    store.set_ray_pools("whole_run", "v1_separate_async", {"trainer": 4, "rollout": 4})
    feed(store, "v1_separate_async")
    a = dict(project="whole_run", experiment="v1_separate_async")
    assert value(store, names.RUN_GPUS, origin="ray", **a) == 8
    assert value(store, names.RUN_POOL_GPUS, pool="rollout", origin="ray", **a) == 4
    conf = new_store()   # a config read wins over Ray's view
    conf.set_ray_pools("whole_run", "v1_separate_async", {"trainer": 4})
    conf.set_trainer_config(_cfg("v1_separate_async", "yaml"))
    feed(conf, "v1_separate_async")
    assert value(conf, names.RUN_GPUS, origin="config", **a) == 8
    assert value(conf, names.RUN_POOL_GPUS, pool="rollout", origin="config", **a) == 4
    late = new_store()   # pools read after the run's last step (a run hung at its first step): counted now
    feed(late, "v1_separate_async")
    late.set_ray_pools("whole_run", "v1_separate_async", {"trainer": 4, "teacher": 2})
    assert value(late, names.RUN_GPUS, origin="ray", **a) == 6


# --- issue 32 item 5: the settings remedies branch on, read from VeRL-Omni's own generated configs ----------------
GEN = "verl_omni/generated"


def _yaml(rel: str) -> dict:
    return tc.parse_yaml_text(fixture(rel).read_text())


def _set(d: dict, dotted: str, value) -> dict:
    """A Hydra command-line override ``dotted=value`` applied to a composed config (the key must exist)."""
    node = d
    *parents, last = dotted.split(".")
    for p in parents:
        node = node[p]
    assert last in node, f"{dotted} is not a key of the config"
    node[last] = value
    return d


@pytest.mark.parametrize("name,engine", [("_generated_diffusion_trainer", "fsdp"),
                                         ("_generated_diffusion_veomni_trainer", "veomni"),
                                         ("_generated_omni_trainer", "fsdp")])
def test_verl_omni_generated_configs_state_every_setting_the_remedies_read(name, engine):
    """VeRL-Omni's generated reference configs (scripts/generate_trainer_config.sh) hold every key SETTINGS reads, with
    the defaults the remedies then quote: nothing offloaded, no LoRA, the naive (colocated) checkpoint engine, a
    function reward (reward.reward_model.enable False), resume auto."""
    cfg = tc.read_file(str(fixture(f"{GEN}/{name}.yaml")))
    assert cfg.engine == engine and cfg.lora is False and cfg.sp == 1
    s = cfg.settings
    missing = set(tc.SETTINGS) - set(s)
    # ppo_micro_batch_size_per_gpu defaults to null (the examples set it); the omni (LLM) trainer has no rollout
    # step_execution
    assert missing <= {"micro_batch"} | ({"step_execution"} if name == "_generated_omni_trainer" else set()), missing
    assert (s["param_offload"], s["optimizer_offload"], s["lora_rank"], s["reward_model"], s["reward_pool"]) == \
        (False, False, 0, False, False)
    assert s["checkpoint_backend"] == "naive" and s["resume_mode"] == "auto" and s["bucket_megabytes"] == 2048


def test_the_omni_trainers_lora_section_and_its_deprecated_ulysses_key_are_read():
    """The omni trainer sets LoRA as model.lora.rank (verl's RayPPOTrainer reads it before model.lora_rank) and still
    carries verl's deprecated actor-level ulysses_sequence_parallel_size (FSDPActorConfig.__post_init__ copies it over
    the engine's when above 1): issue 32 item 5 — LoRA read as 'no LoRA', the SP key never consulted."""
    base = _yaml(f"{GEN}/_generated_omni_trainer.yaml")
    assert base["actor_rollout_ref"]["model"]["lora"]["rank"] == 0 and base["actor_rollout_ref"]["model"]["lora_rank"] == 0
    d = _set(_set(base, "actor_rollout_ref.model.lora.rank", 16), "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 2)
    cfg = tc.facts(d, "yaml")
    assert cfg.lora is True and cfg.settings["lora_rank"] == 16 and cfg.sp == 2
    # the flat key alone is LoRA too; an adapter path is LoRA whatever the rank says
    flat = tc.facts(_set(_yaml(f"{GEN}/_generated_omni_trainer.yaml"), "actor_rollout_ref.model.lora_rank", 8), "yaml")
    assert flat.lora is True and flat.settings["lora_rank"] == 8
    adapter = tc.facts(_set(_yaml(f"{GEN}/_generated_diffusion_trainer.yaml"), "actor_rollout_ref.model.lora_adapter_path",
                            "/ckpt/adapter"), "yaml")
    assert adapter.lora is True and adapter.settings["lora_rank"] == 0
    # the engine's own key wins while the deprecated one stays at its default 1
    sp4 = tc.facts(_set(_yaml(f"{GEN}/_generated_omni_trainer.yaml"),
                        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 4), "yaml")
    assert sp4.sp == 4


RENDERED = {  # rendered by a real Hydra app from VeRL-Omni's config and its example scripts' overrides (README)
    "v1_sync_reward_pool": dict(trainer="v1", lora=True, param_offload=False, optimizer_offload=False, reward_model=True,
                                reward_pool=True, reward_pool_gpus_per_node=1, reward_pool_nodes=1, lora_rank=32,
                                micro_batch=8, trainer_gpus=2, checkpoint_backend="naive"),
    "reward_server": dict(trainer="legacy", lora=False, param_offload=True, optimizer_offload=True, reward_model=False,
                          reward_pool=False, layered_summon=True, micro_batch=16, trainer_gpus=4),
    "veomni_offload": dict(trainer="legacy", lora=False, param_offload=True, optimizer_offload=True, reward_model=True,
                           reward_pool=False, reward_tp=4, reward_workers=1, engine="veomni"),
    "v1_separate_async": dict(trainer="v1", async_mode="separate_async", checkpoint_backend="nccl",
                              parameter_sync_step=4, bucket_megabytes=2048, param_offload=False, lora_rank=32),
    "finished_on_cadence": dict(trainer="legacy", param_offload=True, layered_summon=True, reward_model=True,
                                resume_mode="auto", lora_rank=64),
}


@pytest.mark.parametrize("case", sorted(RENDERED))
def test_settings_of_configs_rendered_from_verl_omni_examples(case):
    cfg = tc.read_file(str(fixture(f"{CFG}/{case}.pprint.log")))
    got = {k: getattr(cfg, k) if k in ("trainer", "lora", "engine", "async_mode") else cfg.settings.get(k)
           for k in RENDERED[case]}
    assert got == RENDERED[case]


def test_settings_are_exported_with_their_words_and_survive_a_checkpoint(tmp_path):
    store = new_store()
    store.set_trainer_config(_cfg("v1_separate_async"))
    feed(store, "v1_separate_async")
    a = dict(project="whole_run", experiment="v1_separate_async")
    assert value(store, names.TRAINER_CONFIG_SETTING, setting="checkpoint_backend", value="nccl", **a) == 1
    assert value(store, names.TRAINER_CONFIG_SETTING, setting="param_offload", value="false", **a) == 0
    assert value(store, names.TRAINER_CONFIG_SETTING, setting="lora_rank", value="32", **a) == 32
    restored = new_store()
    restore_store(restored, snapshot_store(store))
    assert restored.runs[("whole_run", "v1_separate_async")].config.settings == \
        store.runs[("whole_run", "v1_separate_async")].config.settings


def test_settings_are_a_closed_set_whatever_a_config_or_state_file_says():
    d = {"trainer": {"project_name": "p", "experiment_name": "e", "resume_mode": "resume_path\nx",
                     "v1": {"separate_async": {"parameter_sync_step": -3}}},
         "actor_rollout_ref": {"rollout": {"checkpoint_engine": {"backend": "evil\"}{", "update_weights_bucket_megabytes": 10**12}},
                               "actor": {"fsdp_config": {"param_offload": "yes"}}}}
    cfg = tc.facts(d, "yaml")
    assert cfg.settings == {"checkpoint_backend": "other", "resume_mode": "other"}
    assert tc.TrainerConfig.from_json({**cfg.to_json(), "settings": {"param_offload": "x", "bogus": 1,
                                                                     "lora_rank": True, "max_num_seqs": 4}}).settings \
        == {"max_num_seqs": 4}


def _flipped(value, setting: str):
    """Another value than ``value`` for ``setting``, as a Hydra override would set it."""
    kind = tc.SETTINGS[setting][0]
    if kind == "bool":
        return not value
    if kind == "enum":
        return next(w for w in tc.ENUMS[setting] if w != value)
    return (value or 0) + 3


def _path(setting: str, engine: str) -> str:
    return tc.SETTINGS[setting][1].replace("{engine}", f"{engine}_config")


@pytest.mark.parametrize("name,engine", [("_generated_diffusion_trainer", "fsdp"),
                                         ("_generated_diffusion_veomni_trainer", "veomni"),
                                         ("_generated_omni_trainer", "fsdp")])
def test_every_config_fact_is_read_when_set_on_verl_omni_generated_configs(name, engine):
    """Issue 32 item 4: each fact the remedies read (offloads of the run's engine, micro batch, checkpoint engine and
    bucket, reward model vs function and its pool, sync step, resume mode, ...) read from VeRL-Omni's own generated
    config with a value other than its default set where Hydra sets it: the setting follows (it is not a default)."""
    base = _yaml(f"{GEN}/{name}.yaml")
    checked = []
    for setting, (_, dotted) in tc.SETTINGS.items():
        if not dotted:
            continue
        path = _path(setting, engine)
        node = base
        for part in path.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is KeyError:  # the omni (LLM) trainer has no rollout.step_execution
            assert (name, setting) == ("_generated_omni_trainer", "step_execution"), (name, path)
            continue
        new = _flipped(node, setting)
        got = tc.facts(_set(_yaml(f"{GEN}/{name}.yaml"), path, new), "yaml").settings.get(setting)
        assert got == new, (name, setting, path, node, new, got)
        checked.append(setting)
    assert {"param_offload", "optimizer_offload", "reward_model", "reward_pool", "parameter_sync_step",
            "checkpoint_backend", "bucket_megabytes", "resume_mode", "micro_batch"} <= set(checked)
