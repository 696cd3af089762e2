"""``omniwatch report`` / ``compare``: ledger numbers by hand from the raw verl keys of the fixtures, the
report agreeing with the live exporter fed the same lines (directly and through Prometheus), the
backtest of many runs in one pass agreeing with each run backtested alone, the verdict's remedies being the alerts' own, and the
CLI's JSON contract. Browser checks of the pages: tests/test_report_browser.py."""
from __future__ import annotations

import io
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from prometheus_client.openmetrics.exposition import generate_latest

from omniwatch.core import ledger
from omniwatch.alerting import remedies
from omniwatch.prosetext import Ctx
from omniwatch.backtest.backtest import backtest, write_sparse
from omniwatch.backtest.openmetrics import FamilyRender, SampleGrid
from omniwatch.backtest.runfile import load_run
from omniwatch.backtest.timeline import Timeline
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.report.facts import HOUR
from omniwatch.report.gather import facts_of_runs
from omniwatch.report.verdict import verdict
from omniwatch.simulate import Fault, RunSpec, step_dict

from .conftest import SCENARIOS, fixture_path

START = 1_700_000_000.0


def raw_lines(name: str) -> list[dict]:
    return [orjson.loads(x)["data"] for x in fixture_path(name).read_bytes().splitlines() if x.strip()]


def facts(name: str, alerts: bool = False, **kw):
    return facts_of_runs([load_run(str(fixture_path(name)))], starts=[START], alerts=alerts, **kw)[0]


def gpus_of(d: dict) -> int:
    # VeRL-Omni: perf/throughput = perf/total_num_images / (perf/time_per_step * n_gpus)
    return round(d["perf/total_num_images"] / (d["perf/throughput"] * d["perf/time_per_step"]))


# --- the ledger, by hand ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["flowgrpo_healthy", "flowgrpo_reward_bound", "v1_transfer_idle"])
def test_ledger_by_hand_on_the_fixtures(name):
    """Reconstructed arrivals are step + validation apart, so the run's GPU-hours are GPUs x the sum of
    the step timers; the reward bucket is the colocated reward timer (critical-path seconds) x GPUs; the
    untimed rest of each step is inter-stage idle; the buckets sum to the total."""
    lines = raw_lines(name)
    n = gpus_of(lines[4])
    f = facts(name)
    assert (f.gpus, f.gpus_source) == (n, "log")
    total = n * sum(d["timing_s/step"] + d.get("timing_s/testing", 0.0) for d in lines)
    assert f.total_gpu_seconds == pytest.approx(total, rel=1e-9)
    assert sum(f.gpu_hours().values()) * HOUR == pytest.approx(total, rel=1e-6)
    reward = n * sum(max(0.0, d.get("timing_s/reward", 0.0)) for d in lines)
    assert f.gpu_seconds.get(ledger.REWARD, 0.0) == pytest.approx(reward, rel=1e-9)
    timed = lambda d: sum(v for k, v in d.items() if k.startswith("timing_s/") and k.count("/") == 1  # noqa: E731
                          and k[9:] not in ("step", "testing", "start_profile", "stop_profile"))
    idle = n * sum(max(0.0, d["timing_s/step"] - timed(d)) for d in lines)
    assert f.gpu_seconds[ledger.IDLE] == pytest.approx(idle, rel=1e-9)
    assert f.gpu_seconds["gen"] == pytest.approx(n * sum(d["timing_s/gen"] for d in lines), rel=1e-9)
    assert f.gpu_seconds["update_actor"] == pytest.approx(n * sum(d["timing_s/update_actor"] for d in lines), rel=1e-9)


def test_streamed_reward_bucket_is_the_critical_path_seconds_times_gpus():
    lines = raw_lines("flowgrpo_async_reward_tail")
    n = gpus_of(lines[4])
    f = facts("flowgrpo_async_reward_tail")
    tail = sum(min(max(0.0, d["timing_s/gen"] - d["timing_s/agent_loop/generate_sequences/max"]),
                   max(0.0, d["timing_s/agent_loop/compute_score/max"])) + max(0.0, d.get("timing_s/reward", 0.0))
               for d in lines)
    assert f.gpu_seconds[ledger.REWARD] == pytest.approx(n * tail, rel=1e-9)
    gen = sum(d["timing_s/gen"] for d in lines)
    assert f.gpu_seconds["gen"] + f.gpu_seconds[ledger.REWARD] == pytest.approx(
        n * (gen + sum(max(0.0, d.get("timing_s/reward", 0.0)) for d in lines)), rel=1e-9)


def test_validation_and_checkpoint_buckets(tmp_path):
    spec = RunSpec(seed=3, validation_every=5, checkpoint_every=7)
    p = tmp_path / "proj" / "vc.jsonl"
    p.parent.mkdir()
    lines = [step_dict(spec, s) for s in range(1, 31)]
    p.write_bytes(b"".join(orjson.dumps({"step": s, "data": d}) + b"\n" for s, d in enumerate(lines, 1)))
    f = facts_of_runs([load_run(str(p))], starts=[START], alerts=False)[0]
    n = gpus_of(lines[4])
    assert f.gpu_seconds[ledger.VALIDATION] == pytest.approx(n * sum(d.get("timing_s/testing", 0.0) for d in lines))
    assert f.gpu_seconds[ledger.CHECKPOINT] == pytest.approx(n * sum(d.get("timing_s/save_checkpoint", 0.0) for d in lines))
    assert sum(f.gpu_seconds.values()) == pytest.approx(
        n * sum(d["timing_s/step"] + d.get("timing_s/testing", 0.0) for d in lines))


def test_unknown_gpus_are_said_and_the_flag_is_used(tmp_path):
    p = tmp_path / "proj" / "nogpu.jsonl"
    p.parent.mkdir()
    p.write_bytes(b"".join(orjson.dumps({"step": s, "data": {"timing_s/step": 10.0, "timing_s/gen": 6.0}}) + b"\n"
                           for s in range(1, 6)))
    f = facts_of_runs([load_run(str(p))], alerts=False)[0]
    assert (f.gpus, f.gpus_source) == (None, "unknown")
    assert f.total_gpu_seconds == pytest.approx(50.0)  # per GPU: the wall time
    f8 = facts_of_runs([load_run(str(p))], alerts=False, gpus=8)[0]
    assert (f8.gpus, f8.gpus_source) == (8, "flag")
    assert f8.gpu_seconds["gen"] == pytest.approx(8 * 30.0)


# --- the report agrees with the live exporter ---------------------------------------------------------------
@pytest.mark.parametrize("name", SCENARIOS)
def test_report_agrees_with_a_live_runstore_fed_the_same_lines(name):
    """A live exporter's RunStore gets the lines at the times they would have arrived; its ledger
    counters, window statistics and ratios are the report's numbers."""
    run = load_run(str(fixture_path(name)))
    tl = Timeline.of(run, START)
    f = facts_of_runs([load_run(str(fixture_path(name)))], starts=[START], alerts=False)[0]
    now = [tl.arrivals[0]]
    live = RunStore(clock=lambda: now[0])
    by_step = {p.index: p for p in f.steps}
    for i, e in enumerate(run.entries):
        now[0] = tl.arrivals[i]
        rec = live.ingest(run.project, run.experiment, e.parsed, "jsonl", feed=run.feed)
        r = live.runs[(run.project, run.experiment)]
        p = by_step[i]
        assert p.step == rec.step and p.reward_bound == rec.reward_bound_ratio and p.idle == rec.idle_ratio
        st = r.stats
        assert p.reward_bound_min == (st.reward_bound or {}).get("min")
        assert p.mfu_baseline == st.mfu_baseline and p.duration_baseline == st.duration_baseline
    r = live.runs[(run.project, run.experiment)]
    assert set(r.gpu_seconds) == set(f.gpu_seconds)
    for b, v in r.gpu_seconds.items():
        assert f.gpu_seconds[b] == pytest.approx(v, rel=1e-12, abs=1e-9)
    assert (r.gpus.count, r.gpus.source) == (f.gpus, f.gpus_source)
    assert r.modes == f.modes


# --- many runs in one Prometheus pass ------------------------------------------------------------------------
def test_family_render_is_generate_latest_byte_for_byte():
    """The exporter's registry rendered by FamilyRender is generate_latest's text, and its samples land in
    the grid as the parsed text would."""
    for name in ("flowgrpo_async_reward_tail", "v1_transfer_idle"):
        run = load_run(str(fixture_path(name)))
        st = RunStore(clock=lambda: 0.0)
        reg, fr = make_registry(st), FamilyRender(st)
        a, b = SampleGrid(list(range(0, 100_000, 1000))), SampleGrid(list(range(0, 100_000, 1000)))
        for i, e in enumerate(run.entries):
            st.ingest(run.project, run.experiment, e.parsed, "jsonl", arrival=0.0, feed=run.feed)
            ours, theirs = fr.text(), generate_latest(reg).decode()
            assert _no_render_time(ours) == _no_render_time(theirs)
            a.add_render(ours, 2 * i, 2 * i + 2)
            b.add_families(fr.families(), 2 * i, 2 * i + 2)
        assert {k: (f.meta, f.series) for k, f in a.families.items()} == \
            {k: (f.meta, f.series) for k, f in b.families.items() if k != "omniwatch_scrape_duration_seconds"} | \
            {"omniwatch_scrape_duration_seconds": (a.families["omniwatch_scrape_duration_seconds"].meta,
                                                   a.families["omniwatch_scrape_duration_seconds"].series)}


def _no_render_time(text: str) -> str:
    """omniwatch_scrape_duration_seconds is the previous render's own duration: the one line that differs."""
    import re
    return re.sub(r"(?m)^omniwatch_scrape_duration_seconds .*$", "", text)


def _latest(samples: dict[str, list[tuple[int, str]]], t: int, lookback: int) -> dict[str, str]:
    out = {}
    for s, pts in samples.items():
        vis = [v for ts, v in pts if t - lookback <= ts <= t]
        if vis:
            out[s] = vis[-1]
    return out


def _parse(text: str) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        prefix, value, ts = line.rsplit(" ", 2)
        out.setdefault(prefix, []).append((round(float(ts) * 1000), value))
    return out


def test_sparse_samples_answer_every_instant_query_as_dense_ones():
    times = list(range(0, 15_000 * 200, 15_000))
    grid = SampleGrid(times)
    for lo, hi, v in ((0, 17, "1"), (17, 40, "2"), (40, 41, "3"), (60, 130, "4"), (130, 200, "4.5")):
        grid.add_render(f"# HELP x x\n# TYPE x gauge\nx{{a=\"1\"}} {v}\n# EOF\n", lo, hi)
    grid.add_render("# HELP y y\n# TYPE y gauge\ny 7\n# EOF\n", 5, 150)
    dense, sparse = io.StringIO(), io.StringIO()
    nd = grid.write(dense)
    ns = write_sparse(grid, sparse, every=19)
    assert ns - len(times) < (nd - len(times)) / 5  # up stays dense
    d, s = _parse(dense.getvalue()), _parse(sparse.getvalue())
    for t in range(0, times[-1] + 400_000, 5_000):  # any time, on the grid or not, and past the end
        assert _latest(d, t, 300_000) == _latest(s, t, 300_000), t


@pytest.mark.integration
def test_one_prometheus_pass_gives_each_run_its_own_backtest(monkeypatch):
    """What lets the tests and ``report`` batch runs: in one pass, each run gets the alerts (label sets,
    first and last steps, annotations) and evaluation points it gets backtested alone, with the runs
    rendered by forked workers; the report facts are the same rendered in this process."""
    from omniwatch.backtest import backtest as engine
    names = ["flowgrpo_reward_bound", "v1_transfer_idle", "flowgrpo_mfu_above_one"]
    monkeypatch.setattr(engine, "PARALLEL_MIN_LINES", 0)
    passes = []
    real = engine.backtest_many
    monkeypatch.setattr("omniwatch.report.gather.backtest_many",
                        lambda runs, **kw: passes.append(real(runs, **kw)) or passes[-1])
    par = facts_of_runs([load_run(str(fixture_path(n))) for n in names], workers=2, starts=[START] * 3)
    (many,) = passes  # one pass for the three runs
    for n, f, m in zip(names, par, many):
        one = backtest(load_run(str(fixture_path(n))), start=START)
        assert [a.as_json() for a in f.alerts] == one.as_json()["alerts"] == m.as_json()["alerts"] and f.alerts
        assert m.eval_points == one.eval_points
        assert all(a.annotations.get("summary") for a in f.alerts)
    monkeypatch.setattr(engine, "PARALLEL_MIN_LINES", 10**9)
    ser = facts_of_runs([load_run(str(fixture_path(n))) for n in names], starts=[START] * 3, alerts=False)
    for a, b in zip(par, ser):
        assert a.gpu_seconds == b.gpu_seconds and a.steps == b.steps and a.modes == b.modes


# --- the verdict -----------------------------------------------------------------------------------------
@pytest.mark.integration
def test_verdict_costs_and_remedies_on_the_fixtures():
    fs = facts_of_runs([load_run(str(fixture_path(n))) for n in ("flowgrpo_reward_bound", "v1_transfer_idle")])
    rb, idle = fs
    lines = raw_lines("flowgrpo_reward_bound")
    v = verdict(rb)
    assert v[0].alertname == "RewardBoundRollout"
    (first, last), = v[0].steps
    n = gpus_of(lines[4])
    by_hand = n * sum(d["timing_s/reward"] for d in lines[first - 1:last])  # steps 1..40 are lines 0..39
    assert v[0].gpu_seconds == pytest.approx(by_hand, rel=1e-9)
    assert v[0].remedy == remedies.reward_bound().expect(Ctx({}, modes={"trainer": "legacy", "reward": "colocated",
                                                                         "async_mode": "sync"}))
    assert "enable_resource_pool=True" in v[0].remedy
    # one source of remedy text: the verdict's is the annotation Prometheus rendered for the alert
    hit = next(a for a in rb.alerts if a.alertname == "RewardBoundRollout")
    assert hit.annotations["remedy"] == v[0].remedy
    regr = [b for b in v if b.alertname == "StepTimeRegression"]
    assert regr and regr[0].gpu_seconds == 0 and "inhibited" in regr[0].note  # counted under its cause
    vi = verdict(idle)
    assert vi[0].alertname == "InterStageIdleGPU"
    assert vi[0].remedy.startswith("In V1 the untimed work is the TransferQueue fetch")
    assert next(a for a in idle.alerts if a.alertname == "InterStageIdleGPU").annotations["remedy"] == vi[0].remedy
    assert vi[0].gpu_hours > 0


# --- the CLI ---------------------------------------------------------------------------------------------
def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """The CLI, bounded below the test's own timeout (300 s): a run that does not end fails with what it printed
    and the stack of every thread (faulthandler, on SIGABRT)."""
    p = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "omniwatch", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        out, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)   # faulthandler dumps every thread's stack to stderr
        out, err = p.communicate(timeout=30)
        pytest.fail(f"omniwatch {' '.join(args)} did not end within 240 s:\n{out[-3000:]}\n{err[-8000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.integration
def test_report_json_contract_and_alerts_as_backtest(tmp_path):
    fx = str(fixture_path("flowgrpo_reward_bound"))
    r = _cli("report", fx, "--json", "-o", str(tmp_path / "run.html"))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    for k in ("run", "steps", "gpus", "gpus_source", "gpu_hours", "verdict", "alerts"):
        assert k in got
    assert got["steps"] == 40 and got["gpus"] == 4 and got["gpus_source"] == "log"
    assert set(got["gpu_hours"]) >= {"total", "buckets"} and "reward_critical_path" in got["gpu_hours"]["buckets"]
    assert got["gpu_hours"]["total"] == pytest.approx(sum(got["gpu_hours"]["buckets"].values()), rel=1e-5)
    assert [set(v) >= {"bottleneck", "gpu_hours", "remedy"} for v in got["verdict"]] == [True] * len(got["verdict"])
    bt = _cli("backtest", fx, "--json")
    assert bt.returncode == 0, bt.stderr
    assert got["alerts"] == json.loads(bt.stdout)["alerts"]
    page = (tmp_path / "run.html").read_text()
    import re
    assert not re.search(r'<(?:script|link|img|iframe)[^>]*(?:src|href)=', page)  # everything inline
    assert page.count("<script") >= 2
    assert (tmp_path / "run.html").stat().st_size < 3e6


def test_console_log_gives_the_jsonl_ledger(tmp_path):
    a = facts("flowgrpo_healthy")
    c = facts_of_runs([load_run(str(fixture_path("flowgrpo_healthy", ".console.log")), kind="console")],
                      starts=[START], alerts=False)[0]
    assert c.source == "console" and c.gpus == a.gpus
    for b, v in a.gpu_seconds.items():
        assert c.gpu_seconds[b] == pytest.approx(v, rel=1e-6, abs=1e-6)


def test_report_no_alerts_cli_writes_a_page(tmp_path):
    r = _cli("report", str(fixture_path("v1_transfer_idle")), "--no-alerts", "-o", str(tmp_path / "p.html"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "inter_stage_idle" in r.stdout and "No verdict" in r.stdout and (tmp_path / "p.html").stat().st_size > 1e6
    bad = _cli("report", str(tmp_path / "missing.jsonl"), "--no-alerts")
    assert bad.returncode == 1 and "error" in bad.stderr and "Traceback" not in bad.stderr


def write_run(path: Path, spec: RunSpec, steps: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps({"step": s, "data": step_dict(spec, s)}) + b"\n" for s in range(1, steps + 1)))
    return path


def pool_pair(root: Path) -> tuple[Path, Path]:
    """A slow colocated reward model (A), then the same run with a reward pool (B)."""
    a = write_run(root / "qwen" / "colocated.jsonl",
                  RunSpec(seed=11, faults=[Fault("reward_slow", 1, factor=4.0)]), 40)
    b = write_run(root / "qwen" / "reward_pool.jsonl", RunSpec(seed=12, reward="pool"), 40)
    return a, b


def test_compare_names_the_bottleneck_that_moved(tmp_path):
    from omniwatch.report.compare import Comparison
    a, b = pool_pair(tmp_path)
    fa, fb = facts_of_runs([load_run(str(a)), load_run(str(b))], alerts=False)
    c = Comparison(fa, fb, verdict(fa), verdict(fb))
    moved = c.moved()
    assert moved["fell"]["bucket"] == "reward_critical_path"
    total = c.buckets()[-1]
    assert c.unit == "GPU-h per 1,000 images" and total["b"] < total["a"]
    imgs_a = sum(d["perf/total_num_images"] for d in map(lambda x: orjson.loads(x)["data"], a.read_bytes().splitlines()))
    assert total["a"] == pytest.approx(fa.total_gpu_seconds / HOUR / (imgs_a / 1000))
    assert math.isclose(sum(r["a"] for r in c.buckets()[:-1]), total["a"], rel_tol=1e-9)


@pytest.mark.integration
def test_compare_cli_terminal_json_and_html(tmp_path):
    a, b = pool_pair(tmp_path)
    r = _cli("compare", str(a), str(b), "--json", "-o", str(tmp_path / "cmp.html"))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["alerts"]["resolved"] == ["RewardBoundRollout"] or "RewardBoundRollout" in got["alerts"]["resolved"]
    assert got["moved"]["fell"]["bucket"] == "reward_critical_path"
    t = _cli("compare", str(a), str(b), "--quiet")
    assert t.returncode == 0 and "GPU-h per 1,000 images" in t.stdout and "reward_critical_path" in t.stdout


@pytest.mark.integration
def test_index_of_a_log_root_ranks_runs_and_links_pages(tmp_path):
    root = tmp_path / "verl-logs"
    pool_pair(root)
    write_run(root / "other" / "healthy.jsonl", RunSpec(seed=13), 30)
    out = tmp_path / "site" / "index.html"
    r = _cli("report", str(root), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    names = [x["name"] for x in got["runs"]]
    assert names[0] == "qwen/colocated" and set(names) == {"qwen/colocated", "qwen/reward_pool", "other/healthy"}
    assert got["runs"][0]["lost"] > 0 and got["runs"][0]["top"] == "RewardBoundRollout"
    html = out.read_text()
    for x in got["runs"]:
        assert Path(x["page"]).is_file()
        rel = str(Path(x["page"]).relative_to(out.parent))
        assert f'href="{rel}"' in html


def test_gpu_hours_per_day_gauge_is_the_window_share_times_gpus_times_24():
    """omniwatch_gpu_hours_per_day{bucket} (what the annotations quote): the bucket's share of the last
    k normal steps' time x GPUs x 24, by hand from the raw keys; the report's verdict uses the same."""
    from omniwatch import names
    from .test_model import samples
    lines = raw_lines("flowgrpo_reward_bound")
    st = RunStore(clock=lambda: START)
    run = load_run(str(fixture_path("flowgrpo_reward_bound")))
    for e in run.entries:
        st.ingest(run.project, run.experiment, e.parsed, "jsonl", arrival=START, feed=run.feed)
    got = {dict(k)["bucket"]: v for (nm, k), v in samples(st).items() if nm == names.GPU_HOURS_PER_DAY}
    last3 = lines[-3:]
    n = gpus_of(lines[4])
    share = sum(d["timing_s/reward"] for d in last3) / sum(d["timing_s/step"] for d in last3)
    assert got["reward_critical_path"] == pytest.approx(share * n * 24)
    assert sum(got.values()) == pytest.approx(n * 24)
    f = facts("flowgrpo_reward_bound")
    assert f.steps[-1].per_day == pytest.approx(got)


@pytest.mark.integration
def test_live_report_from_prometheus_agrees_with_the_file_report(tmp_path):
    """The exporter's series of a run (backfilled into a real Prometheus, as scraped live) read back by
    `omniwatch report --prometheus`: the same steps, ledger, ratios and GPUs as the file's report."""
    from omniwatch.backtest.backfill import backfill
    from omniwatch.backtest.tsdb import TempPrometheus
    name = "flowgrpo_reward_bound"
    run = load_run(str(fixture_path(name)))
    tl = Timeline.of(run, START)
    backfill(run, tl, str(tmp_path / "data"), recordings=[])
    other = load_run(str(fixture_path("flowgrpo_async_reward_tail")))
    backfill(other, Timeline.of(other, START), str(tmp_path / "data"), recordings=[])
    f = facts(name)
    with TempPrometheus(str(tmp_path / "data")) as prom:
        c = _cli("compare", "--prometheus", prom.url, f"{run.project}/{run.experiment}",
                 f"{other.project}/{other.experiment}", "--until", str(tl.end + 60), "--since", "2d", "--json")
        r = _cli("report", "--prometheus", prom.url, "--project", run.project, "--experiment", run.experiment,
                 "--until", str(tl.end + 60), "--since", "2d", "--json", "-o", str(tmp_path / "live.html"))
        from omniwatch.report.live import live_facts
        lf = live_facts(prom.url, run.project, run.experiment, until=tl.end + 60, since=2 * 86400)
        # the run left hung: 2 hours later the live report prices the open stall as the file's report does with
        # the same end (issue 31: never "0 GPU-h" for a hang)
        hung = live_facts(prom.url, run.project, run.experiment, until=tl.end + 7200, since=2 * 86400)
    from omniwatch.report.gather import facts_of_runs
    (fh,) = facts_of_runs([load_run(str(fixture_path(name)))], starts=[START], alerts=False, until=tl.end + 7200)
    assert hung.end_state == "stalled" and fh.end_state == "unfinished"
    assert hung.open_stall_s > 0 and hung.open_stall_s == pytest.approx(fh.open_stall_s, rel=0.02)
    assert hung.gpu_seconds["stalled"] == pytest.approx(fh.gpu_seconds["stalled"], rel=0.02)
    assert hung.open_stall_s >= 0.9 * 7200 - 3 * max(p.duration or 0 for p in f.steps)
    assert r.returncode == 0, r.stderr
    assert c.returncode == 0, c.stderr
    cmp = json.loads(c.stdout)
    assert cmp["a"]["experiment"] == name and cmp["b"]["experiment"] == "flowgrpo_async_reward_tail"
    assert cmp["unit"] == "GPU-h per 1,000 images" and cmp["a"]["source"] == "prometheus"
    got = json.loads(r.stdout)
    assert got["source"] == "prometheus" and got["gpus"] == f.gpus and got["steps"] == f.n_steps
    assert [p.step for p in lf.steps] == [p.step for p in f.steps]
    for b, v in f.gpu_seconds.items():
        assert lf.gpu_seconds.get(b, 0.0) == pytest.approx(v, rel=1e-9, abs=1e-6)
    for a, b in zip(lf.steps, f.steps):
        assert a.reward_bound == b.reward_bound and a.idle == b.idle and a.mfu == b.mfu
        assert a.reward_bound_min == b.reward_bound_min and a.mfu_baseline == b.mfu_baseline
        for k, v in b.gpu_seconds.items():
            assert a.gpu_seconds.get(k, 0.0) == pytest.approx(v, rel=1e-9, abs=1e-6)
    assert lf.modes == f.modes
    assert got["gpu_hours"]["buckets"]["reward_critical_path"] == pytest.approx(f.gpu_seconds["reward_critical_path"] / HOUR, rel=1e-5)


@pytest.mark.integration
def test_demo_ends_with_the_report_of_a_faulty_run(tmp_path):
    """`make demo`'s last step: the report of the reward-bound demo run, written and its path printed."""
    from rich.console import Console
    from omniwatch import demo
    sc = next(s for s in demo.scenarios(5.0, 30, 10) if s.experiment == demo.REPORT_RUN)
    write_run(tmp_path / "logs" / demo.PROJECT / f"{sc.experiment}.jsonl", sc.spec, 30)
    buf = io.StringIO()
    path = demo._write_report(Console(file=buf, width=300), tmp_path / "logs", tmp_path / "reports")
    assert path is not None and path.is_file() and str(path) in buf.getvalue()
    page = path.read_text()
    assert "RewardBoundRollout" in page and "enable_resource_pool=True" in page


def test_index_without_prometheus_names_unreadable_files_and_goes_on(tmp_path):
    root = tmp_path / "verl-logs"
    write_run(root / "p" / "good.jsonl", RunSpec(seed=2), 12)
    (root / "p" / "empty.jsonl").write_text("")
    out = tmp_path / "site" / "index.html"
    r = _cli("report", str(root), "-o", str(out), "--no-alerts", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert [x["name"] for x in got["runs"]] == ["p/good"] and list(got["skipped"]) == [str(root / "p" / "empty.jsonl")]
    assert "skipped" in r.stderr and out.is_file() and Path(got["runs"][0]["page"]).is_file()


def test_the_verdict_ranks_what_fires_now_by_its_cost_now_then_severity():
    """Issue 32 item 1 (the report's verdict): what still fires at the last step comes first, by the GPU-hours per day
    it costs now, ties broken by severity; what fired earlier follows by the GPU-hours it cost, whatever its
    severity or total. On the reward-bound fixture the first is RewardBoundRollout with its action and a cost now."""
    from omniwatch.report.verdict import Bottleneck, rank

    def b(name, sev, now, firing=True, gpu_s=0.0):
        return Bottleneck(name, gpu_s, "", [], [], severity=sev, firing_at_end=firing, now_per_day=now)
    order = rank([b("Straggler", "warning", 0.0, gpu_s=9e9), b("Old", "critical", 0.0, firing=False, gpu_s=5e9),
                  b("Reward", "warning", 31.7), b("Stall", "critical", 31.7), b("Idle", "warning", 2.0),
                  b("Older", "warning", 0.0, firing=False, gpu_s=6e9)])
    assert [x.alertname for x in order] == ["Stall", "Reward", "Idle", "Straggler", "Older", "Old"]
    v = verdict(facts_of_runs([load_run(str(fixture_path("flowgrpo_reward_bound")))])[0])
    assert v[0].alertname == "RewardBoundRollout" and v[0].firing_at_end and v[0].action
    assert v[0].now_per_day == max(x.now_per_day for x in v if x.firing_at_end) > 0
