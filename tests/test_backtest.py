"""Backtest: the recorded fixtures back-tested to the alerts their truth files imply, by a real
Prometheus over backfilled blocks with the repository's alerts/ rule files; bad input; the CLI. The runs
of the judged cases are backtested in one pass of the engine (the ``batch`` module fixture)."""
from __future__ import annotations

import argparse
import functools
import json
import os
import threading

import orjson
import pytest

from omniwatch import names
from omniwatch.config import DEFAULT_WARMUP_STEPS
from omniwatch.backtest import add_commands
from omniwatch.backtest.backtest import backtest, backtest_many
from omniwatch.backtest.evaluate import firing_intervals
from omniwatch.backtest.feed import intervals, replay_to_file
from omniwatch.backtest.ruleset import GAPS_ONLY, inline, levels, load
from omniwatch.backtest.runfile import RunFileError, load_run
from omniwatch.backtest.timeline import Timeline, parse_duration, parse_time
from omniwatch.backtest.tsdb import TempPrometheus

from .conftest import SCENARIOS, fixture_path, require_binary, truth

pytestmark = pytest.mark.batch   # CPU-bound, no wall-clock expectation: nice 10 beside live tests (conftest)

START = 1_700_000_000.0  # a fixed past start: results do not depend on the files' mtimes
CORE = set(names.CORE_ALERTS)


@pytest.fixture(scope="module")
def prom_tools():
    require_binary("promtool")
    require_binary("prometheus")


def run_backtest(path, **kw):
    return backtest(load_run(str(path)), start=START, **kw)


BATCH: dict[str, object] = {}  # run key -> a function(tmp directory) that writes it and returns its path


@pytest.fixture(scope="module")
def batch(tmp_path_factory, prom_tools):
    """Every run BATCH lists, backtested in one pass: key -> result."""
    root = tmp_path_factory.mktemp("batch")
    runs = []
    for key, make in BATCH.items():
        run = load_run(str(make(root)))
        if key.endswith("_console"):  # the console log of a JSONL fixture: labels stay distinct
            run.experiment = key
        runs.append(run)
    return dict(zip(BATCH, backtest_many(runs, starts=[START] * len(runs))))


for _s in SCENARIOS:
    BATCH[_s] = lambda root, s=_s: fixture_path(s)
BATCH["flowgrpo_reward_bound_console"] = lambda root: fixture_path("flowgrpo_reward_bound", ".console.log")


def write_jsonl(path, records) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for r in records:
            f.write(orjson.dumps(r) + b"\n")
    return str(path)


def fixture_records(name: str) -> list[dict]:
    return [orjson.loads(line) for line in fixture_path(name).read_bytes().splitlines() if line.strip()]


# --- pure parts ------------------------------------------------------------------------------------
T = [float(15 * k) for k in range(10)]


@pytest.mark.parametrize("truth_at,hold,keep,expected", [
    ([0, 1, 1, 1, 0, 0, 0, 0, 0, 0], 15, 0, [(2, 3)]),          # pending at 1, firing at 2 (15 s later)
    ([0, 1, 0, 1, 0, 0, 0, 0, 0, 0], 15, 0, []),                # reset when false: never held for 15 s
    ([1, 1, 0, 0, 0, 0, 0, 0, 0, 0], 0, 0, [(0, 1)]),           # for: 0 fires at the first true eval
    ([0, 1, 1, 0, 0, 0, 1, 1, 1, 0], 15, 30, [(2, 4), (7, 9)]),  # keep_firing_for 30 s: kept while t - first missing < 30 s
    ([0, 1, 1, 0, 1, 1, 0, 0, 0, 0], 15, 30, [(2, 7)]),         # true again while kept: one interval
    ([1] * 10, 60, 0, [(4, 9)]),
])
def test_for_and_keep_firing_for_follow_prometheus(truth_at, hold, keep, expected):
    got = firing_intervals([bool(x) for x in truth_at], T, hold, keep)
    assert [(i.first, i.last) for i in got] == expected


def test_timeline_from_timers_and_mtime(tmp_path):
    recs = [{"step": 0, "data": {"timing_s/testing": 40.0, "val-core/acc": 0.1}},
            {"step": 1, "data": {"timing_s/step": 100.0}},
            {"step": 2, "data": {"perf/time_per_step": 50.0, "timing_s/testing": 10.0}},
            {"step": 3, "data": {"actor/loss": 0.1}}]  # no timer: the run's median timed line (60 s)
    p = write_jsonl(tmp_path / "proj" / "exp.jsonl", recs)
    os.utime(p, (START + 1000, START + 1000))
    run = load_run(p)
    assert (run.project, run.experiment) == ("proj", "exp")
    tl = Timeline.of(run)
    assert tl.arrivals == [START + 1000 - 260 + x for x in (40, 140, 200, 260)] and tl.end == START + 1000
    tl2 = Timeline.of(run, START)
    assert tl2.arrivals[0] == START + 40 and tl2.step_at(START + 139) == 0 and tl2.step_at(START + 140) == 1
    assert tl2.step_at(START) is None


def test_pace_replaces_the_timers_in_timeline_and_replay(tmp_path):
    """--pace: one line every PACE seconds, whatever the timers say (the clock of an accelerated
    live replay, which a backtest must use to fire at the replay's steps)."""
    p = write_jsonl(tmp_path / "proj" / "exp.jsonl", fixture_records("flowgrpo_reward_bound")[:5])
    run = load_run(p)
    tl = Timeline.of(run, START, pace=2.0)
    assert tl.arrivals == [START + 2.0 * k for k in range(1, 6)] and tl.step_at(START + 5) == 2
    assert intervals(run, pace=0.5) == [0.5] * 5
    assert intervals(run, speed=250) == pytest.approx([w / 250 for w in run.wall_seconds()])
    # a stop event ends the replay between two lines, the file holding exactly the lines written
    stop = threading.Event()
    written: list[int] = []

    class Progress:
        def advance(self, n=1):
            written.append(n)
            if len(written) == 2:
                stop.set()
    out = tmp_path / "root" / "proj" / "exp.jsonl"
    stats = replay_to_file(run, out, progress=Progress(), pace=0.01, stop=stop)
    assert stats.sent == 2 and [e.step for e in load_run(str(out)).entries] == [1, 2]


def test_pace_options_are_checked(tmp_path, capsys):
    for argv in (["backtest", "--pace", "0", "x.jsonl"], ["backfill", "--pace", "nan", "x.jsonl"],
                 ["replay", "--pace", "2", "--speed", "60", "--to", str(tmp_path), "x.jsonl"]):
        with pytest.raises(SystemExit) as e:
            cli(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "pace must be a number > 0" in err and "not allowed with argument" in err


def test_same_group_recording_rules_are_inlined_as_live_evaluates_them(tmp_path):
    """An alert reads its group's earlier recording rules at the evaluation that recorded them."""
    assert inline("a:b:c > 1", {"a:b:c": "max(x)"}) == "(max(x)) > 1"
    kept = ('a:b:c{k="v"}', "a:b:c[5m]", "a:b:c offset 5m", "a:b:c @ 100", 'x{k="a:b:c"}', "a:b:cd", "z:a:b:c")
    for expr in kept:
        assert inline(expr, {"a:b:c": "max(x)"}) == expr
    (tmp_path / "r.rules.yml").write_text("""
groups:
  - name: g1
    rules:
      - record: r:x:min
        expr: max by (p) (x{stat="min"})
      - record: r:x:ratio
        expr: r:x:min / r:y:sum
      - record: r:z:twice
        expr: vector(1)
        labels: {source: a}
      - record: r:z:twice
        expr: vector(2)
        labels: {source: b}
      - alert: A
        expr: r:x:ratio > 1 and r:z:twice > 0 and r:late:sum > 0 and r:y:sum > 0
        for: 15s
      - record: r:late:sum
        expr: sum(y)
  - name: g2
    rules:
      - record: r:y:sum
        expr: sum(y)
      - alert: B
        expr: r:x:min > 1
""")
    rs = load(tmp_path)
    a, b = rs.alerts
    assert a.eval_expr == ('((max by (p) (x{stat="min"})) / r:y:sum) > 1 and r:z:twice > 0 '
                           "and r:late:sum > 0 and r:y:sum > 0")  # other group / twice defined / later: read
    assert b.eval_expr == b.expr == "r:x:min > 1"
    assert {r.record for r in rs.needed_recordings([a], inlined=True)} == {"r:y:sum", "r:z:twice", "r:late:sum"}
    assert {r.record for r in rs.needed_recordings([a])} >= {"r:x:ratio", "r:x:min"}


def test_time_and_duration_parsing():
    assert parse_time("2023-11-14T22:13:20Z") == START == parse_time("1700000000")
    assert parse_duration("15s") == 15 and parse_duration("1m30s") == 90 and parse_duration("500ms") == 0.5
    for bad in ("yesterday", "-5", "nan"):
        with pytest.raises(ValueError):
            parse_time(bad)
    for bad in ("15x", "0s", ""):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_recording_rules_are_levelled_from_the_repo_rules():
    rs = load()
    lv = levels(rs.needed_recordings(rs.evaluated()))
    first = {r.record for r in lv[0]}
    assert len(lv) >= 2 and all(r.record not in first for level in lv[1:] for r in level)
    assert names.ALERT_STALLED not in rs.skipped()  # judged over the gaps between steps
    assert {a.name in GAPS_ONLY for a in rs.alerts if a.name == names.ALERT_STALLED} == {True}
    assert {names.ALERT_REWARD_BOUND, names.ALERT_MFU_DROP} <= {a.name for a in rs.evaluated()}


@functools.lru_cache(maxsize=1)
def endpoint_alerts() -> frozenset[str]:
    from omniwatch.rules import load_alerts
    return frozenset(a.name for a in load_alerts() if a.file.name == "endpoints.rules.yml")


def test_the_endpoint_rule_file_is_not_loaded_and_its_alerts_are_listed_not_evaluated():
    """alerts/endpoints.rules.yml reads only series scraped from the endpoints discovery finds, which a
    recorded run does not carry: a backtest does not load it (nor backfill its recording rules, nor give
    it to promtool) and names its alerts as not evaluated, live-only."""
    rs = load()
    assert [os.path.basename(f) for f in rs.files] == ["omniwatch.rules.yml"]
    ep = endpoint_alerts()
    assert {"RolloutQueueSaturated", "TransferQueueBacklog"} <= ep
    assert all(rs.skipped()[a].startswith("live-only: reads the series of the rollout") for a in ep)
    assert not ep & {a.name for a in rs.alerts}
    assert not [r.record for r in rs.recordings if r.record.startswith(("replica:", "run:tq_"))]


# --- the fixtures -----------------------------------------------------------------------------------
def expected_alerts(t: dict) -> dict[str, int]:
    """alert -> first step the exporter can judge the fault at (warm-up steps are left out of windows
    by design, so a fault present from step 1 is judged from the first step after warm-up)."""
    out = {}
    for f in t["faults"]:
        if f["kind"] == "mfu_value" and f["value"] <= 1:
            continue
        out[names.FAULT_TO_ALERT[f["kind"]]] = max(f["start"], DEFAULT_WARMUP_STEPS + 1)
    return out


@pytest.mark.integration
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fixture_backtests_to_its_truth(batch, scenario):
    t = truth(scenario)
    res = batch[scenario]
    assert set(res.not_evaluated) >= endpoint_alerts()
    assert res.steps == t.get("stalled_after_step", t["steps"])  # a stalled file simply stops
    fired = {}
    for a in res.alerts:
        fired.setdefault(a.alertname, a.first_step)
        fired[a.alertname] = min(fired[a.alertname], a.first_step)
        assert a.labels["project"] == "verl" and a.labels["experiment"] == scenario
        assert a.first_step <= a.last_step
    want = expected_alerts(t)
    assert set(fired) & CORE == set(want), res.as_json()
    for alert, start in want.items():
        assert start <= fired[alert] <= start + 3, (alert, fired[alert], start)
    # judged over the gaps between steps (none is long in these files): a file that simply stops is no
    # stall after its last line (flowgrpo_stalled, live-only there)
    assert names.ALERT_STALLED in res.evaluated and names.ALERT_STALLED not in fired
    assert res.as_json()["gaps_only"] == {names.ALERT_STALLED: res.as_json()["gaps_only"][names.ALERT_STALLED]}
    for a in res.alerts:  # rendered by Prometheus' template engine at the first firing
        assert a.annotations["summary"] and a.annotations["runbook_url"].endswith("#" + a.alertname.lower())
        assert a.annotations["step"] == str(a.first_step), (a.alertname, a.annotations)


def _actor_slow(root):
    """No recorded fixture carries the ``actor_slow`` fault, so this builds it from
    tests/fixtures/verl/flowgrpo_healthy.jsonl: from step 15 update_actor takes twice as long (the
    step grows by the same seconds) and perf/mfu/actor is halved, as the README's fault table says."""
    recs = fixture_records("flowgrpo_healthy")
    for r in recs:
        d = r["data"]
        if r["step"] >= 15:
            extra = d["timing_s/update_actor"]
            d["timing_s/update_actor"] *= 2
            d["timing_s/step"] += extra
            d["perf/time_per_step"] = d["timing_s/step"]
            d["perf/mfu/actor"] /= 2
    return write_jsonl(root / "verl" / "flowgrpo_actor_slow.jsonl", recs)


BATCH["flowgrpo_actor_slow"] = _actor_slow


@pytest.mark.integration
def test_actor_slow_variant_raises_mfu_drop(batch):
    """_actor_slow: update_actor twice as long from step 15, MFU halved."""
    res = batch["flowgrpo_actor_slow"]
    drops = [a for a in res.alerts if a.alertname == names.ALERT_MFU_DROP]
    assert drops and {a.labels["role"] for a in drops} == {"actor"}
    assert 15 <= min(a.first_step for a in drops) <= 18
    assert not {a.alertname for a in res.alerts} & (CORE - {names.ALERT_MFU_DROP})


@pytest.mark.integration
def test_console_log_backtests_like_the_jsonl(batch):
    a, b = batch["flowgrpo_reward_bound"], batch["flowgrpo_reward_bound_console"]
    assert b.run.kind == "console" and a.run.kind == "jsonl"
    key = lambda r: sorted((h.alertname, h.first_step, h.last_step) for h in r.alerts)  # noqa: E731
    assert key(a) == key(b) and key(a)


# --- bad input --------------------------------------------------------------------------------------
def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    add_commands(p.add_subparsers())
    args = p.parse_args(argv)
    return args.func(args)


def test_empty_and_garbage_files_are_clear_errors(tmp_path, capsys):
    empty = tmp_path / "p" / "empty.jsonl"
    empty.parent.mkdir()
    empty.write_bytes(b"")
    with pytest.raises(RunFileError, match="no verl step line"):
        load_run(str(empty))
    assert cli(["backtest", "--json", str(empty)]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "no verl step line" in out.err
    garbage = tmp_path / "p" / "garbage.jsonl"
    garbage.write_bytes(b"not json\n{\"step\": \"x\", \"data\": {}}\n[1,2]\n")
    with pytest.raises(RunFileError, match="malformed_json=1"):
        load_run(str(garbage))
    assert cli(["backtest", str(tmp_path / "missing.jsonl")]) == 1
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.integration
def test_one_step_and_bad_lines_mixed_in(prom_tools, tmp_path, capsys):
    recs = fixture_records("flowgrpo_healthy")[:1]
    p = tmp_path / "p" / "one.jsonl"
    write_jsonl(p, recs)
    with open(p, "ab") as f:
        f.write(b"{broken\n" + b'{"step": 2, "data": {"timing_s/step": "fast"}}\n')
    run = load_run(str(p))
    assert run.skipped == {"malformed_json": 1} and len(run.entries) == 2
    assert cli(["backtest", "--json", "--start", str(int(START)), str(p)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["steps"] == 2 and doc["alerts"] == [] and doc["run"] == str(p)


def _restarted(root):
    """A resumed trainer appends to its console log: steps 1..30, then 21..40 again (the model counts a
    restart and re-runs), plus one step out of order; a reward fault only in the second incarnation."""
    recs = fixture_records("flowgrpo_healthy")
    second = [json.loads(json.dumps(r)) for r in recs[20:]]
    for r in second:
        if r["step"] >= 25:
            r["data"]["timing_s/reward"] *= 6
            r["data"]["timing_s/step"] += r["data"]["timing_s/reward"] * 5 / 6
    odd = json.loads(json.dumps(recs[5]))  # step 6 again, out of order, between the incarnations
    return write_jsonl(root / "verl" / "restarted.jsonl", recs[:30] + [odd] + second)


BATCH["restarted"] = _restarted


@pytest.mark.integration
def test_restart_and_out_of_order_steps(batch):
    """_restarted: no crash; the reward fault injected only in the second incarnation fires after the
    restart, at re-run steps."""
    res = batch["restarted"]
    assert res.steps == 40 and len(res.run.entries) == 30 + 1 + 20
    rb = [a for a in res.alerts if a.alertname == names.ALERT_REWARD_BOUND]
    assert rb and 25 <= rb[0].first_step <= 30 and rb[0].first_index > 31
    assert not {a.alertname for a in res.alerts} & {names.ALERT_IDLE, names.ALERT_MFU_IMPOSSIBLE}


def long_run_records(n: int, step_seconds: float = 30.0) -> list[dict]:
    """n steps cycled from flowgrpo_healthy, every timer scaled so a step takes ``step_seconds``."""
    base = fixture_records("flowgrpo_healthy")
    out = []
    for i in range(n):
        d = dict(base[i % len(base)]["data"])
        f = step_seconds / d["timing_s/step"]
        for k in list(d):
            if k.startswith("timing_s/"):
                d[k] *= f
        d["perf/time_per_step"] = d["timing_s/step"]
        d["training/global_step"] = i + 1
        out.append({"step": i + 1, "data": d})
    return out


@pytest.mark.integration
@pytest.mark.slow
# 2,000 steps in `make test` (a long healthy run is quiet, every evaluation point kept); the 10,000-step run is the
# same property at scale (~35 s of CPU on a loaded 2-core machine): `make test-long`
@pytest.mark.parametrize("steps", [2_000, pytest.param(10_000, marks=pytest.mark.long)])
def test_a_long_healthy_run(prom_tools, tmp_path, steps):
    p = write_jsonl(tmp_path / "verl" / "long.jsonl", long_run_records(steps))
    res = run_backtest(p)
    assert res.steps == steps and not {a.alertname for a in res.alerts} & CORE
    assert res.eval_points >= steps * 30 // 15


# --- processes and concurrency --------------------------------------------------------------------
@pytest.mark.integration
def test_concurrent_backtests_do_not_share_anything(prom_tools):
    results, errors = {}, []

    def one(name):
        try:
            results[name] = run_backtest(fixture_path(name))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=one, args=(n,)) for n in ("flowgrpo_reward_bound", "v1_transfer_idle")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors and len(results) == 2
    assert names.ALERT_REWARD_BOUND in {a.alertname for a in results["flowgrpo_reward_bound"].alerts}
    assert names.ALERT_IDLE in {a.alertname for a in results["v1_transfer_idle"].alerts}
    assert names.ALERT_REWARD_BOUND not in {a.alertname for a in results["v1_transfer_idle"].alerts}


@pytest.mark.integration
def test_temporary_prometheus_is_stopped_even_on_error(prom_tools, tmp_path):
    prom = TempPrometheus(str(tmp_path / "data"))
    with pytest.raises(RuntimeError, match="boom"):
        with prom:
            proc, cfg_dir = prom.proc, prom._tmp
            assert prom.query("vector(1)", START)[0]["value"][1] == "1"
            raise RuntimeError("boom")
    assert proc.poll() is not None and not os.path.exists(cfg_dir)


# --- stalls over the gaps between steps, annotations -------------------------------------------------------
def simulated(tmp_path, name: str, spec, steps: int) -> str:
    from omniwatch.simulate import step_dict
    return write_jsonl(tmp_path / "sim" / f"{name}.jsonl", [{"step": s, "data": step_dict(spec, s)}
                                                             for s in range(1, steps + 1)])


def _hang(root):
    from omniwatch.simulate import Fault, RunSpec
    spec = RunSpec(pace=240, seed=3, checkpoint_every=10, checkpoint_factor=4.5, validation_every=15,
                   validation_factor=1.5, total_steps=37,
                   faults=[Fault("hang", 25, value=3000.0), Fault("reward_slow", 31, factor=5)])
    return simulated(root, "hang", spec, 37)


BATCH["hang"] = _hang


@pytest.mark.integration
def test_stalls_are_judged_over_gaps_planned_work_never_pages_and_a_hang_does(batch):
    """A 4-minute-step run with heavy checkpoints (every 10 steps, 4.5x the step: the first one unseen
    before it happens), validations (every 15, 1.5x), a forced final checkpoint + validation (step 37),
    a 50-minute hang inside step 25 and a reward fault from step 31. The planned work reaches info at
    most; the hang is info, warning and critical after step 24 only; the file's end is no stall."""
    res = batch["hang"]
    stalls = [a for a in res.alerts if a.alertname == names.ALERT_STALLED]
    paging = {(a.severity, a.first_step, a.last_step) for a in stalls if a.severity != "info"}
    assert paging == {("warning", 24, 24), ("critical", 24, 24)}, res.as_json()
    info = sorted(a.first_step for a in stalls if a.severity == "info")
    # the checkpoints of steps 10, 20, 30 (5.5 typical steps), the hang, and the final step's forced
    # checkpoint + validation (7 typical steps: within the warning threshold because every step of a JSONL
    # run may be the last, so the allowance always holds the planned work seen)
    assert info == [9, 19, 24, 29, 36], info
    assert names.ALERT_REWARD_BOUND in {a.alertname for a in res.alerts}
    crit = next(a for a in stalls if a.severity == "critical")
    ann = crit.annotations
    assert ann["summary"] == "Training stopped producing steps." and ann["step"] == "24"
    assert ann["description"].startswith("sim/hang: no step for 4") and "last step 24." in ann["description"]
    # the hang started after step 24 arrived: critical within its 50 minutes
    start = res.timeline.arrivals[res.timeline.steps.index(24)]
    assert crit.first_t - start <= 50 * 60
    for a in res.alerts:
        assert a.annotations.get("step") == str(a.first_step), (a.alertname, a.severity, a.annotations)


def test_annotations_are_rendered_by_promtool_with_shifted_timestamps(prom_tools, tmp_path):
    """annotations.py against a hand-made grid and rule file: time() minus a timestamp-valued series
    keeps its value after the shift to promtool's clock, label values with quotes, newlines and
    non-ASCII survive promtool's %q printing, and run-length notation keeps every sample."""
    from omniwatch.backtest.annotations import Request, _values, go_unquote, render
    from omniwatch.backtest.openmetrics import SampleGrid
    assert _values([[0, 3, "1.0"], [5, 6, "2.5"]], 0, 7, None) == "1.0x2 _x2 2.5 _x2"
    assert _values([[0, 2, "1700000010.5"]], 0, 1, 1700000000.0) == "10.5x1"
    assert go_unquote('"a\\"b\\n\\xc3\\xa9\\u00e9\\\\"', 0) == ('a"b\néé\\', 24)
    rules = tmp_path / "r.rules.yml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: Old\n    expr: time() - last_timestamp_seconds > 40\n    for: 30s\n"
        "    labels: {severity: warning}\n    annotations:\n"
        "      description: 'age {{ $value }} of {{ $labels.experiment }}; "
        "step {{ with query \"step\" }}{{ . | first | value }}{{ end }}'\n")
    t0 = 1_700_000_010  # on the 15 s grid from the epoch, as the backfill's scrapes and evaluations are
    times = [1000 * (t0 + 15 * k) for k in range(40)]
    grid = SampleGrid(times)
    exp = 'a"b\\ né'
    text = ("# TYPE last_timestamp_seconds gauge\n"
            f'last_timestamp_seconds{{experiment="a\\"b\\\\ n\\u00e9"}} {t0 + 30}.0\n'
            "# TYPE step gauge\nstep 7.0\n# EOF\n").replace("\\u00e9", "é")
    grid.add_render(text, 2, 40)
    fired = t0 + 30 + 45 + 30  # true from age 45 (first eval over 40), firing 30 s later
    got = render(grid, [Request("Old", fired, 30.0)], 15.0, 15.0, [str(rules)])
    (labels, ann), = got[0]
    assert labels == {"alertname": "Old", "experiment": exp, "instance": "backfill", "job": "omniwatch",
                      "severity": "warning"}
    assert ann == {"description": f"age 75 of {exp}; step 7"}
    # nothing fires there: nothing is returned
    assert render(grid, [Request("Old", t0 + 30, 30.0)], 15.0, 15.0, [str(rules)]) == {}
