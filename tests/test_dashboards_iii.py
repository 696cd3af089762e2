"""Dashboards III (issue 26): a stall is a gap, XY charts query at the scrape interval, the validation reward
keeps every key, annotations look back over their own interval, the overview judges each run against its
anchored reference. Each test reads the generated JSON (what Grafana imports) or evaluates the panel's own
query in promtool."""
from __future__ import annotations

import json
import re
from pathlib import Path

from omniwatch import names
from omniwatch.alerting import records
from omniwatch.dashboards import factory
from omniwatch.dashboards import panels as spec
from omniwatch.dashboards.catalog import DASHBOARDS
from omniwatch.stack import PROFILES

from .test_dashboards import _promtool_eval, by_title, load

REPO = Path(__file__).resolve().parents[1]


def test_panels_on_step_windows_show_a_stall_as_a_gap():
    """Item 5: no spanNulls on a timeseries built on step-window ratios ($window increases, recording rules)."""
    checked = 0
    for d in DASHBOARDS:
        j = by_title(load(d))
        for p in d.panels():
            if p.kind != "timeseries":
                continue
            exprs = [t["expr"] for t in j[p.title]["targets"]]
            on_window = any(spec.WINDOW in e or any(r in e for r in spec.ALL_RECORDS) for e in exprs)
            if on_window:
                checked += 1
                assert j[p.title]["fieldConfig"]["defaults"]["custom"]["spanNulls"] is False, (d.uid, p.title)
    assert checked >= 10, checked
    # the ones the issue names
    ov = by_title(load(DASHBOARDS[0]))
    assert ov["Where the GPU-hours went: $experiment"]["fieldConfig"]["defaults"]["custom"]["spanNulls"] is False


def test_xy_charts_query_no_finer_than_a_scrape():
    """Item 8: the XY charts' min interval is the scrape interval (15 s), not 1 s."""
    assert factory.XY_INTERVAL == PROFILES["default"]["scrape_interval"] == "15s"
    found = 0
    for d in DASHBOARDS:
        for p in load(d)["panels"] + [q for r in load(d)["panels"] for q in r.get("panels", [])]:
            if p["type"] == "xychart":
                found += 1
                assert p["interval"] == "15s", p["title"]
                assert all(t["interval"] == "15s" for t in p["targets"]), p["title"]
    assert found >= 8


VAL_CORE = "val-core/geneval/reward/mean@1"
VAL_AUX = "val-aux/geneval/reward/mean@1"


def test_validation_reward_keeps_val_core_and_val_aux(tmp_path):
    """Item 6: the step target carries the y target's ``key``, so merge pairs each key's row with its own step
    (a step row without ``key`` joins one key only); groupBy and partitionByValues keep ``key``. promtool
    evaluates the generated panel's own queries: both keys have the step and their own value."""
    from omniwatch.core.model import passthrough_name
    from omniwatch.dashboards.verify import substitute
    p = by_title(load(DASHBOARDS[0]))["Validation reward"]
    x, y = (substitute(t["expr"]) for t in p["targets"])
    run = 'project="p", experiment="e"'
    series = {f'{names.STEP}{{{run}}}': 120,
              f'{passthrough_name(VAL_CORE)}{{{run}, key="{VAL_CORE}"}}': 0.61,
              f'{passthrough_name(VAL_AUX)}{{{run}, key="{VAL_AUX}"}}': 0.35}
    lab = lambda k: {"project": "p", "experiment": "e", "key": k}  # noqa: E731
    _promtool_eval(tmp_path, series, [(x, [(lab(VAL_AUX), 120), (lab(VAL_CORE), 120)]),
                                      (y, [(lab(VAL_AUX), 0.35), (lab(VAL_CORE), 0.61)])])
    t = {tr["id"]: tr["options"] for tr in p["transformations"]}
    assert t["groupBy"]["fields"]["key"]["operation"] == "groupby"
    assert t["partitionByValues"]["fields"] == ["project", "experiment", "key"]
    # the other XY charts (one series per run) are unchanged
    assert by_title(load(DASHBOARDS[0]))["Reward mean"]["transformations"][3]["options"]["fields"] == [
        "project", "experiment"]


def _annotation(doc, name):
    return next(a for a in doc["annotations"]["list"] if a.get("name") == name)


def test_annotations_look_back_over_their_interval(tmp_path):
    """Item 7: a validation step flagged for one minute and a restart, both between two annotation samples
    3 minutes apart, are annotated at the next sample: the generated queries look back over $__interval
    (a fixed [1m] or an instant value missed both). promtool evaluates the generated queries."""
    import subprocess
    import yaml
    from omniwatch.dashboards.verify import substitute
    from .conftest import require_binary
    doc = load(DASHBOARDS[0])
    flag = substitute(_annotation(doc, "validation / checkpoint steps")["expr"], interval="3m")
    restart = substitute(_annotation(doc, "trainer restarts")["expr"], interval="3m")
    run = 'project="p", experiment="e"'
    t = {"rule_files": [], "evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": [
        {"series": f'{names.STEP_FLAG}{{{run}, flag="validation"}}', "values": "0 0 1 0 0 0"},
        {"series": f'{names.TRAINER_RESTARTS_TOTAL}{{{run}}}', "values": "0 0 1 1 1 1"}],
        "promql_expr_test": [
            {"expr": flag, "eval_time": "4m",
             "exp_samples": [{"labels": f'{{{run}, flag="validation"}}', "value": 1}]},
            {"expr": restart, "eval_time": "4m", "exp_samples": [{"labels": f"{{{run}}}", "value": 1}]}]}]}
    (tmp_path / "a.yml").write_text(yaml.safe_dump(t, sort_keys=False, width=10_000))
    r = subprocess.run([require_binary("promtool"), "test", "rules", str(tmp_path / "a.yml")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def test_per_run_copies_leave_out_the_all_runs_alert_annotation():
    """Item 7: the alerts annotation is filtered off the panels repeated per run (and only those)."""
    for d in DASHBOARDS:
        doc = load(d)
        repeated = sorted(p["id"] for p in doc["panels"] + [q for r in doc["panels"] for q in r.get("panels", [])]
                          if p.get("repeat"))
        flt = _annotation(doc, "omniwatch alerts").get("filter")
        if repeated:
            assert flt == {"exclude": True, "ids": repeated}, d.uid
        else:
            assert not flt, d.uid


def _colour(panel: dict, legend: str, value: float) -> str:
    """The colour Grafana gives ``value`` in the table column named ``legend`` (absolute thresholds: the last
    step whose value is <= the cell's)."""
    for o in panel["fieldConfig"]["overrides"]:
        props = {p["id"]: p["value"] for p in o["properties"]}
        if props.get("displayName") == legend:
            steps = props["thresholds"]["steps"]
            colour = steps[0]["color"]
            for st in steps[1:]:
                if value >= st["value"]:
                    colour = st["color"]
            return colour
    raise AssertionError(f"no column {legend!r}")


def test_a_lasting_slowdown_is_red_against_the_anchored_reference(tmp_path):
    """Item 2: a run 17 % slower than its start (window median 117 s, anchored reference 100 s) with 44 % less
    MFU (window median 0.28, reference 0.50) is red in both new Runs columns, while the fastest-step column
    (step / baseline: 112 s, one fast step) stays green. promtool evaluates the generated columns' queries."""
    from omniwatch.dashboards.verify import substitute
    runs = by_title(load(DASHBOARDS[0]))["Runs"]
    expr = {t["refId"]: substitute(t["expr"]) for t in runs["targets"]}
    legend = {o["matcher"]["options"]: next(p["value"] for p in o["properties"] if p["id"] == "displayName")
              for o in runs["fieldConfig"]["overrides"]}
    ref = {name: ref for ref, name in ((k.removeprefix("Value #"), v) for k, v in legend.items())}
    run = 'project="p", experiment="slow"'
    series = {f"{records.REC_STEP_MEDIAN}{{{run}}}": 117, f"{names.STEP_DURATION_BASELINE}{{{run}}}": 100,
              f"{records.REC_STEP_VS_BASELINE}{{{run}}}": 1.12,
              f'{records.REC_MFU_MEDIAN}{{{run}, role="actor"}}': 0.28,
              f'{names.MFU_BASELINE}{{{run}, role="actor"}}': 0.5}
    lab = {"project": "p", "experiment": "slow"}
    _promtool_eval(tmp_path, series, [(expr[ref["step time vs run start"]], [(lab, 1.17)]),
                                      (expr[ref["MFU vs reference"]], [(lab, 0.56)])])
    assert _colour(runs, "step time vs run start", 1.17) == "red"
    assert _colour(runs, "MFU vs reference", 0.56) == "red"
    assert _colour(runs, "step / baseline", 1.12) == "green"  # what the table showed before
    assert _colour(runs, "step time vs run start", 1.05) == "green"
    assert _colour(runs, "MFU vs reference", 0.95) == "green"


def test_why_slow_sits_under_now_with_the_largest_phase_beside_the_costliest_alert(tmp_path):
    """Item 1 (issue 26): the "Why slow" row sits right under "Now"; beside the costliest firing alert (tests below)
    each run's largest phase of the latest step; a run without one shows "none"."""
    from omniwatch.dashboards.verify import substitute
    doc = load(DASHBOARDS[0])
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows[:3] == ["Now", "Why slow", "Why slow: the full remedy"]
    q = substitute(by_title(doc)["Why slow"]["targets"][1]["expr"])
    slow, quiet = 'project="p", experiment="slow"', 'project="p", experiment="quiet"'
    series = {f"{names.STEP}{{{slow}}}": 50, f"{names.STEP}{{{quiet}}}": 50,
              f'{records.REC_STAGE_SHARE}{{{slow}, phase="gen"}}': 0.6,
              f'{records.REC_STAGE_SHARE}{{{slow}, phase="update_actor"}}': 0.3}
    _promtool_eval(tmp_path, series, [(q, [({"project": "p", "experiment": "slow", "phase": "gen"}, 0.6),
                                           ({"project": "p", "experiment": "quiet", "phase": "none"}, 0)])])


def test_why_slow_and_the_full_remedy_put_the_costliest_on_top():
    """Item 1 (issue 32): across runs too, the costliest first: both tables sort by the GPU-h/day column, largest on
    top, the name Grafana shows for it (sortBy matches display names); the preview orders its rows the same way."""
    doc = load(DASHBOARDS[0])
    for title in ("Why slow", "Remedy: $experiment"):
        p = by_title(doc)[title]
        assert p["options"]["sortBy"] == [{"displayName": "GPU-h/day now", "desc": True}], title
        shown = [o["properties"] for o in p["fieldConfig"]["overrides"]
                 if o["matcher"]["options"] in ("Value", "Value #A")]
        assert {"id": "displayName", "value": "GPU-h/day now"} in shown[0], title
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from omniwatch.dashboards import preview
    panel = next(p for r in DASHBOARDS[0].rows for p in r.panels if p.title == "Why slow")
    costs = {"a-cheap": 1.0, "b-dear": 40.0, "c-mid": 7.0}

    class Prom:
        def query_data(self, expr):
            if expr != panel.targets[0].expr:
                return {"result": []}
            return {"result": [{"metric": {"project": "p", "experiment": e, "alertname": "X", "action": "do"},
                                "value": [0, str(v)]} for e, v in costs.items()]}
    fig, ax = plt.subplots(figsize=(12, 3))
    preview._table(ax, panel, Prom(), lambda e: e)
    cells = ax.tables[0].get_celld()
    runs = [cells[(r, 0)].get_text().get_text() for r in range(1, len(costs) + 1)]
    plt.close(fig)
    assert runs == ["b-dear", "c-mid", "a-cheap"]


def test_one_stall_is_one_firing_alert(tmp_path):
    """Item 9: TrainingStalled firing at info, warning and critical counts once in 'alerts firing'."""
    run = 'project="p", experiment="e"'
    series = {f"{names.STEP}{{{run}}}": 5}
    for sev in ("info", "warning", "critical"):
        series[f'ALERTS{{{run}, alertname="{names.ALERT_STALLED}", alertstate="firing", severity="{sev}"}}'] = 1
    series[f'ALERTS{{{run}, alertname="{names.ALERT_STEP_REGRESSION}", alertstate="firing", severity="warning"}}'] = 1
    _promtool_eval(tmp_path, series, [(spec.firing_by_run(), [({"project": "p", "experiment": "e"}, 2)])])


def test_a_stall_still_going_on_fills_the_stalled_bucket(tmp_path):
    """Item 4: during a stall (no step for an hour, the ledger counter flat), 'Where the GPU-hours went' shows the
    run's GPUs as stalled (it was 0/0 -> no data); a finished run is not stalled; a running run is unchanged.
    promtool evaluates the generated panel query with $window = 3 typical steps of 60 s (read over 180 s), the
    ledger counter flat for 10 minutes."""
    from omniwatch.core import ledger
    from omniwatch.dashboards.verify import substitute
    p = by_title(load(DASHBOARDS[0]))["Where the GPU-hours went: $experiment"]
    q = substitute(p["targets"][0]["expr"], window="3")
    series = {}
    for exp, age, fin in (("hung", 3600, 0), ("done", 3600, 1)):
        r = f'project="p", experiment="{exp}"'
        series.update({f"{records.REC_AGE}{{{r}}}": age, f"{names.TYPICAL_STEP}{{{r}}}": 60,
                       f"{records.REC_STALL_TYPICAL}{{{r}}}": 60, f"{records.REC_STALL_INFO}{{{r}}}": 180,
                       f'{names.RUN_GPUS}{{{r}, origin="log"}}': 8, f"{names.RUN_FINISHED}{{{r}}}": fin,
                       f'{names.GPU_SECONDS_TOTAL}{{{r}, bucket="gen"}}': 5000})
    order = spec.order_key(ledger.STALLED, spec.LEDGER_HEAD, spec.LEDGER_TAIL)[0]
    _promtool_eval(tmp_path, series, [
        (q, [({"project": "p", "experiment": "hung", "bucket": ledger.STALLED, spec.ORDER_LABEL: order}, 1.0),
             ({"project": "p", "experiment": "hung", "bucket": "gen",
               spec.ORDER_LABEL: spec.order_key("gen", spec.LEDGER_HEAD, spec.LEDGER_TAIL)[0]}, 0.0)])], minutes=10)


def test_per_second_and_tflops_panels_carry_units():
    """Item 9: TFLOP/s and per-second panels say their unit (they were 'short')."""
    want = {"MFU implied vs device peak": "suffix: TFLOP/s", "Images per second": "suffix: images/s",
            "Reward preemptions": "suffix: preemptions/s", "Net change of live samples": "suffix: samples/s",
            "Samples written and cleared": "suffix: samples/s"}
    got = {}
    for d in DASHBOARDS:
        for title, p in by_title(load(d)).items():
            title = title.removesuffix(": $experiment")  # fleet panels are drawn once per run
            if title in want:
                got[title] = p["fieldConfig"]["defaults"]["unit"]
    assert got == want


def test_every_alert_has_a_panel_with_its_runbook():
    """Item 9: TransferQueueSlowLeak had no panel and no runbook link; every alert of names.py has one now."""
    rules = "".join(p.read_text() for p in (REPO / "alerts").glob("*.rules.yml"))
    alerts = {a for a in re.findall(r"- alert: (\w+)", rules)} - {names.ALERT_WATCHDOG}
    assert names.ALERT_TQ_SLOW_LEAK in alerts and names.ALERT_RUN_CAP in alerts
    linked = {a for d in DASHBOARDS for p in d.panels() for a in p.alerts}
    assert alerts - linked == set()
    p = by_title(load(next(d for d in DASHBOARDS if d.uid == "omniwatch-transferqueue")))["Utilisation floors (slow leak)"]
    assert any(names.ALERT_TQ_SLOW_LEAK in link["title"] for link in p["links"])
    assert [records.REC_TQ_FLOOR_SHORT in t["expr"] for t in p["targets"]] == [False, True, False, False]


def test_sources_up_timeline_is_not_red_before_the_exporter_existed():
    """Item 9: the exporter row of 'Sources up' has no value where Prometheus never scraped it (it was drawn
    'down' from a vector(0) fallback); a failed scrape (up 0) is still down."""
    p = by_title(load(next(d for d in DASHBOARDS if d.uid == "omniwatch-bottlenecks")))["Sources up"]
    expr = p["targets"][1]["expr"]
    assert "vector(0)" not in expr and expr.startswith("min(up{")


def test_gpu_hours_of_a_run_scraped_by_two_exporters_count_once(tmp_path):
    """Item 9: the Runs table's GPU-hours takes each bucket once across exporters (it summed both)."""
    from omniwatch.dashboards.verify import substitute
    runs = by_title(load(DASHBOARDS[0]))["Runs"]
    expr = next(substitute(t["expr"]) for t in runs["targets"] if names.GPU_SECONDS_TOTAL in t["expr"])
    series = {}
    for inst in ("a:9400", "b:9400"):
        for bucket, secs in (("gen", 7200), ("update_actor", 3600)):
            series[f'{names.GPU_SECONDS_TOTAL}{{project="p", experiment="e", bucket="{bucket}", '
                   f'instance="{inst}"}}'] = secs
    _promtool_eval(tmp_path, series, [(expr, [({"project": "p", "experiment": "e"}, 3.0)])])


def test_least_busy_gpus_are_ranked_once_over_the_range():
    """Item 9: the bottom-10 GPUs are ranked once over the dashboard's range (@ end()), not at every step (which
    drew the union of every GPU ever among the lowest). The live test runs the query against Prometheus."""
    from omniwatch.dashboards import gpus
    p = by_title(load(next(d for d in DASHBOARDS if d.uid == "omniwatch-gpus")))[
        f"Least busy GPUs (bottom {gpus.BOTTOM_K})"]
    expr = p["targets"][0]["expr"]
    assert f"bottomk({gpus.BOTTOM_K}, avg_over_time((" in expr and "[$__range:$__interval] @ end())" in expr
    assert not expr.startswith("bottomk(")


def test_the_exporter_serves_each_runs_remedies_for_its_layout_and_config():
    """Issue 32: /metrics carries, per run, which remedy text each alert renders for that run's layout and trainer
    config (omniwatch_run_remedy -> omniwatch_remedy_info: the one-line action and the full text, as the verdict
    renders them), one series per distinct text; TrainingStalled past its warning has its own (never 'nothing to
    do'); the reward-pool break-even is served beside it."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from omniwatch import trainer_config as tc
    from omniwatch.core.exposition import make_registry
    from omniwatch.core.model import RunStore
    from omniwatch.core.parse import parse_jsonl_line
    from omniwatch.report.verdict import action, remedy
    from .conftest import fixture, fixture_path
    store = RunStore()
    for exp in ("e", "f"):
        for line in fixture_path("flowgrpo_async_reward_tail").read_bytes().splitlines():
            store.ingest("p", exp, parse_jsonl_line(line), "jsonl")
    cfg = tc.read_file(str(fixture("trainer_config/reward_server.pprint.log")))
    store.set_trainer_config(tc.TrainerConfig("p", "f", cfg.source, settings=cfg.settings))
    text = generate_latest(make_registry(store)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    info = {s.labels["variant"]: s.labels for s in fams[names.REMEDY_INFO].samples}
    runs = [s.labels for s in fams[names.RUN_REMEDY].samples]
    layout = {k: v for k, v in next(s.labels for s in fams[names.RUN_INFO].samples if s.labels["experiment"] == "e")
              .items() if k in ("trainer", "reward", "async_mode")}
    for exp, described in (("e", None), ("f", tc.describe(store.runs[("p", "f")].config))):
        mine = {(r["alertname"], r["severity"], r["cause"], r["role"], r["engine"], r["mode"]): r["variant"]
                for r in runs if r["experiment"] == exp}
        assert (names.ALERT_REWARD_BOUND, "warning", "", "", "", "") in mine
        for (alert, sev, cause, role, engine, mode), var in mine.items():
            labels = {k: v for k, v in (("cause", cause), ("role", role), ("engine", engine), ("mode", mode)) if v}
            want = " ".join(remedy(alert, labels, layout, None, severity=sev, trainer_config=described).split())
            assert info[var]["remedy"] == want != "", (exp, alert, sev, labels)
            assert info[var]["action"] == action(alert, labels, layout, None, severity=sev, trainer_config=described)
        stall = {sev: info[mine[(names.ALERT_STALLED, sev, "", "", "", "")]]["remedy"] for sev in
                 ("info", "warning", "critical")}
        assert "nothing to do" in stall["info"] and "nothing to do" not in stall["critical"] + stall["warning"]
    f_rb = info[{(r["experiment"], r["alertname"], r["severity"], r["cause"]): r["variant"] for r in runs}[
        ("f", names.ALERT_REWARD_BOUND, "warning", "")]]
    assert "The reward is a function" in f_rb["remedy"]  # the config was read: a reward function, not a model
    assert len(info) < len(runs)  # texts are shared, not copied per run


def _why_slow(tmp_path, series, want):
    from omniwatch.dashboards.verify import substitute
    q = substitute(by_title(load(DASHBOARDS[0]))["Why slow"]["targets"][0]["expr"])
    _promtool_eval(tmp_path, series, [(q, want)])


def test_why_slow_names_the_costliest_firing_alert_with_its_cost_and_action(tmp_path):
    """Issue 32 item 1: the row is the firing alert that costs most GPU time now, whatever the severities say (the
    reward-bound demo run showed RankStraggler for 255 s while reward cost 31.7 GPU-h/day); ties (findings without a
    cost) go to the more severe; the alert, the part and the cost come from one series; the action is the run's."""
    run = lambda e: f'project="p", experiment="{e}"'  # noqa: E731
    rem = (f'{names.RUN_REMEDY}{{{run("slow")}, alertname="{names.ALERT_REWARD_BOUND}", severity="warning", '
           f'cause="", role="", engine="", mode="", variant="v1"}}')
    series = {
        f"{names.STEP}{{{run('slow')}}}": 50, f"{names.STEP}{{{run('tie')}}}": 50,
        f'ALERTS{{{run("slow")}, alertname="{names.ALERT_REWARD_BOUND}", alertstate="firing", severity="warning"}}': 1,
        f'ALERTS{{{run("slow")}, alertname="{names.ALERT_RANK_STRAGGLER}", alertstate="firing", severity="warning", '
        f'role="actor_rollout", phase="update_actor", rank="1", node="n"}}': 1,
        f'ALERTS{{{run("slow")}, alertname="{names.ALERT_STEP_REGRESSION}", alertstate="firing", severity="warning", '
        f'cause="rollout"}}': 1,
        f'{names.GPU_HOURS_PER_DAY}{{{run("slow")}, bucket="reward_critical_path"}}': 31.75,
        f'{names.STEP_REGRESSION_GPU_HOURS_PER_DAY}{{{run("slow")}, cause="rollout"}}': 4.5,
        rem: 1, f'{names.REMEDY_INFO}{{variant="v1", action="Give scoring its own GPUs", remedy="the full text"}}': 1,
        f'ALERTS{{{run("tie")}, alertname="{names.ALERT_RS_REJECTION}", alertstate="firing", severity="warning", '
        f'mode="decoupled"}}': 1,
        f'ALERTS{{{run("tie")}, alertname="{names.ALERT_MFU_UNSUPPORTED}", alertstate="firing", severity="info", '
        f'role="actor"}}': 1,
        # two roles of one finding are one row (the role blanked before they are aggregated, not after: an error)
        f"{names.STEP}{{{run('mfu')}}}": 50,
        f'ALERTS{{{run("mfu")}, alertname="{names.ALERT_MFU_IMPOSSIBLE}", alertstate="firing", severity="warning", '
        f'role="actor", evidence="value"}}': 1,
        f'ALERTS{{{run("mfu")}, alertname="{names.ALERT_MFU_IMPOSSIBLE}", alertstate="firing", severity="warning", '
        f'role="actor_infer", evidence="device"}}': 1,
        f'ALERTS{{{run("mfu")}, alertname="{names.ALERT_MFU_UNSUPPORTED}", alertstate="firing", severity="info", '
        f'role="actor"}}': 1,
        f'ALERTS{{{run("mfu")}, alertname="{names.ALERT_MFU_UNSUPPORTED}", alertstate="firing", severity="info", '
        f'role="actor_infer"}}': 1,
        # RolloutQueueSaturated keeps its role (its remedy branches on it): two replicas of one role are one row
        f"{names.STEP}{{{run('queue')}}}": 50,
        f'ALERTS{{{run("queue")}, alertname="{names.ALERT_ROLLOUT_SATURATED}", alertstate="firing", '
        f'severity="warning", role="reward", replica="0"}}': 1,
        f'ALERTS{{{run("queue")}, alertname="{names.ALERT_ROLLOUT_SATURATED}", alertstate="firing", '
        f'severity="warning", role="reward", replica="1"}}': 1,
    }
    _why_slow(tmp_path, series, [
        ({"project": "p", "experiment": "slow", "alertname": names.ALERT_REWARD_BOUND, "severity": "warning",
          "part": "reward_critical_path", "variant": "v1", "action": "Give scoring its own GPUs",
          "anchor": "rewardboundrollout"}, 31.75 + 2 ** -9),
        ({"project": "p", "experiment": "tie", "alertname": names.ALERT_RS_REJECTION, "severity": "warning",
          "mode": "decoupled", "part": "no GPU-time cost", "anchor": "rolloutrejectionhigh"}, 2 ** -9),
        ({"project": "p", "experiment": "mfu", "alertname": names.ALERT_MFU_IMPOSSIBLE, "severity": "warning",
          "part": "no GPU-time cost", "anchor": "mfuimpossible"}, 2 ** -9),
        ({"project": "p", "experiment": "queue", "alertname": names.ALERT_ROLLOUT_SATURATED, "severity": "warning",
          "role": "reward", "part": "no GPU-time cost", "anchor": "rolloutqueuesaturated"}, 2 ** -9)])


def test_why_slow_shows_a_regressions_own_cause_and_a_stall_costs_every_gpu(tmp_path):
    run = lambda e: f'project="p", experiment="{e}"'  # noqa: E731
    series = {
        f"{names.STEP}{{{run('grew')}}}": 9, f"{names.STEP}{{{run('hung')}}}": 9,
        f'ALERTS{{{run("grew")}, alertname="{names.ALERT_STEP_REGRESSION}", alertstate="firing", severity="warning", '
        f'cause="actor"}}': 1,
        f'{names.STEP_REGRESSION_GPU_HOURS_PER_DAY}{{{run("grew")}, cause="actor"}}': 12,
        f'{names.STEP_REGRESSION_GPU_HOURS_PER_DAY}{{{run("grew")}, cause="rollout"}}': 20,  # grew more, not the alert's
        f'ALERTS{{{run("hung")}, alertname="{names.ALERT_STALLED}", alertstate="firing", severity="critical"}}': 1,
        f'ALERTS{{{run("hung")}, alertname="{names.ALERT_REWARD_BOUND}", alertstate="firing", severity="warning"}}': 1,
        f'{names.GPU_HOURS_PER_DAY}{{{run("hung")}, bucket="reward_critical_path"}}': 31.7,
        f'{names.RUN_GPUS}{{{run("hung")}, origin="config"}}': 8,
        # a stall at info may be planned work: no cost of its own, the run's reward-bound cost stays first
        f"{names.STEP}{{{run('notice')}}}": 9, f'{names.RUN_GPUS}{{{run("notice")}, origin="config"}}': 8,
        f'ALERTS{{{run("notice")}, alertname="{names.ALERT_STALLED}", alertstate="firing", severity="info"}}': 1,
        f'ALERTS{{{run("notice")}, alertname="{names.ALERT_REWARD_BOUND}", alertstate="firing", severity="warning"}}': 1,
        f'{names.GPU_HOURS_PER_DAY}{{{run("notice")}, bucket="reward_critical_path"}}': 20,
    }
    _why_slow(tmp_path, series, [
        ({"project": "p", "experiment": "notice", "alertname": names.ALERT_REWARD_BOUND, "severity": "warning",
          "part": "reward_critical_path", "anchor": "rewardboundrollout"}, 20 + 2 ** -9),
        ({"project": "p", "experiment": "grew", "alertname": names.ALERT_STEP_REGRESSION, "severity": "warning",
          "cause": "actor", "part": "actor", "anchor": "steptimeregression"}, 12 + 2 ** -9),
        ({"project": "p", "experiment": "hung", "alertname": names.ALERT_STALLED, "severity": "critical",
          "part": "stalled", "anchor": "trainingstalled"}, 192 + 2 ** -8)])


def test_why_slow_says_nothing_grew_for_a_healthy_run(tmp_path):
    """Issue 32 item 7: a healthy run named a growth cause (the largest of noise, which the exporter names too); now
    the exporter's kept cause is named only while it grew by analytics.CAUSE_MIN_SHARE (3 %) of the reference step."""
    run = lambda e: f'project="p", experiment="{e}"'  # noqa: E731
    series = {
        f"{names.STEP}{{{run('healthy')}}}": 9, f"{names.STEP}{{{run('creep')}}}": 9,
        f'{names.STEP_REGRESSION_GPU_HOURS_PER_DAY}{{{run("healthy")}, cause="weight_sync"}}': 0.2,
        f'{names.STEP_REGRESSION_TOP}{{{run("healthy")}, cause="weight_sync"}}': 1,  # named, but 1 % of the step
        f'{names.STEP_REGRESSION}{{{run("healthy")}, cause="weight_sync"}}': 2.5,
        f'{names.STEP_DURATION_BASELINE}{{{run("healthy")}}}': 250,
        f'{names.STEP_REGRESSION_GPU_HOURS_PER_DAY}{{{run("creep")}, cause="rollout"}}': 3.0,
        f'{names.STEP_REGRESSION_TOP}{{{run("creep")}, cause="rollout"}}': 1,
        f'{names.STEP_REGRESSION}{{{run("creep")}, cause="rollout"}}': 10,  # 4 % of the step
        f'{names.STEP_DURATION_BASELINE}{{{run("creep")}}}': 250,
    }
    _why_slow(tmp_path, series, [
        ({"project": "p", "experiment": "healthy", "alertname": "none", "part": "nothing grew"}, 0),
        ({"project": "p", "experiment": "creep", "alertname": "none", "part": "rollout"}, 3.0)])


def test_dashboards_generated_with_a_config_draw_its_thresholds(tmp_path):
    """Issue 23 item 4: the Config is passed to the dashboards: ``dashboards generate --config tuned.yml`` draws
    the tuned thresholds (the rules generated with the same file compare with them), the runbook links follow the
    config's runbook base and $window defaults to its window. The default files keep the defaults."""
    import subprocess
    import sys

    import yaml

    from omniwatch import config

    tuned = {"inter_stage_idle": {"ratio": 0.37}, "gpu_memory": {"ratio": 0.81}, "window": {"k": 4},
             "selectors": {"job": "tuned-exporter"}}
    (tmp_path / "tuned.yml").write_text(yaml.safe_dump(tuned))
    out = tmp_path / "dash"
    r = subprocess.run([sys.executable, "-m", "omniwatch", "dashboards", "generate", "--out", str(out),
                        "--config", str(tmp_path / "tuned.yml")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cfg = config.load(tmp_path / "tuned.yml")
    assert cfg.inter_stage_idle.ratio == 0.37 != config.DEFAULT.inter_stage_idle.ratio

    def steps(doc, title):
        p = by_title(doc)[title]
        return [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]

    bott = json.loads((out / "omniwatch-bottlenecks.json").read_text())
    gpus = json.loads((out / "omniwatch-gpus.json").read_text())
    assert 0.37 in steps(bott, "Inter-stage idle ratio (window min)")
    assert 0.81 in steps(gpus, next(t for t in by_title(gpus) if 0.81 in (steps(gpus, t) if "fieldConfig" in
                                                                           by_title(gpus)[t] else [])))
    window = next(v for v in bott["templating"]["list"] if v["name"] == spec.V_WINDOW)
    assert window["current"]["value"] == "4"
    # issue 32 item 5, through the CLI: the config's job in every query that names one, the default's in none
    texts = {f.name: f.read_text() for f in out.glob("omniwatch-*.json")}
    assert not [n for n, t in texts.items() if f'job=\\"{config.DEFAULT.selectors.job}\\"' in t]
    assert [n for n, t in texts.items() if 'job=\\"tuned-exporter\\"' in t]
    default = by_title(load(DASHBOARDS[1]))
    assert config.DEFAULT.inter_stage_idle.ratio in [
        s["value"] for s in default["Inter-stage idle ratio (window min)"]["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert 0.37 not in [s["value"] for s in
                        default["Inter-stage idle ratio (window min)"]["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    # the check of the tuned files against the same config is clean, against the defaults it is not
    chk = [sys.executable, "-m", "omniwatch", "dashboards", "check", "--out", str(out)]
    assert subprocess.run(chk + ["--config", str(tmp_path / "tuned.yml")], capture_output=True, timeout=120).returncode == 0
    assert subprocess.run(chk, capture_output=True, timeout=120).returncode == 1


def test_render_names_the_preview_extra_when_matplotlib_is_missing(tmp_path):
    """Issue 23 item 3: previews need matplotlib, a declared extra (``omniwatch[preview]``, in dev, so
    ``make install`` installs it); without it ``dashboards render`` says what to install instead of a traceback."""
    import subprocess
    import sys
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["preview"])
    assert set(extras["preview"]) <= set(extras["dev"])
    (tmp_path / "matplotlib").mkdir()  # a package that fails to import stands for a missing matplotlib
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "omniwatch", "dashboards", "render", "--prometheus",
                        "http://127.0.0.1:9", "--out", str(tmp_path / "img")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and "omniwatch[preview]" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_one_phase_palette_on_every_dashboard_and_the_report():
    """Item 10: every panel split by phase or ledger bucket colours each phase with palette.PHASE_COLORS (Grafana
    fixed-colour overrides in the generated JSON), and the report's ledger charts and worker lanes use the same
    colours; the previews draw the panels' fixed colours."""
    from omniwatch import palette
    from omniwatch.core import ledger
    from omniwatch.report import html

    split = 0
    for d in DASHBOARDS:
        doc = load(d)
        for p in doc["panels"] + [q for r in doc["panels"] for q in r.get("panels", [])]:
            legends = [t.get("legendFormat", "") for t in p.get("targets", [])]
            if p["type"] != "timeseries" or not any(re.search(r"\{\{(phase|bucket)\}\}$", lg) for lg in legends):
                continue  # series split by phase or bucket: the legend ends in the phase
            split += 1
            fixed = {o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"]
                     for o in p["fieldConfig"]["overrides"] if o["matcher"]["id"] == "byRegexp"}
            named = {rx.removeprefix(".* ").replace("\\", ""): c for rx, c in fixed.items()}
            assert named, (d.uid, p["title"])
            assert all(c == palette.color(name) for name, c in named.items()), (d.uid, p["title"])
            gen = named.get("gen") or named.get("generate_sequences")  # a timed phase / bucket, or a Ray method
            assert gen == palette.PHASE_COLORS["gen"], (d.uid, p["title"])
    assert split >= 4, split
    for bucket in (*ledger.PHASE_BUCKETS, *ledger.NON_PHASE):
        assert html.bucket_color(bucket) == palette.PHASE_COLORS[bucket]
    assert palette.color("generate_sequences") == palette.PHASE_COLORS["gen"]  # a worker lane's gen
    assert palette.color(ledger.REWARD) == palette.color("reward")           # reward keeps its colour as a bucket


def test_gpu_hours_per_day_count_a_stalls_idle_gpus_while_it_lasts(tmp_path):
    """Item 9: during a stall the exporter's GPU-h/day keeps the pre-stall rate (it moves with steps); the panels
    show the run's GPUs x 24 as 'stalled' instead, and nothing else; a running and a finished run keep the
    exporter's figures. promtool evaluates the bottlenecks bar gauge ('Why slow' prices a stall as TrainingStalled:
    test_why_slow_shows_a_regressions_own_cause_and_a_stall_costs_every_gpu)."""
    from omniwatch.core import ledger
    from omniwatch.dashboards.verify import substitute
    series = {}
    for exp, age, fin in (("hung", 3600, 0), ("running", 30, 0), ("done", 3600, 1)):
        r = f'project="p", experiment="{exp}"'
        series.update({f"{records.REC_AGE}{{{r}}}": age, f"{names.TYPICAL_STEP}{{{r}}}": 60,
                       f"{records.REC_STALL_TYPICAL}{{{r}}}": 60, f"{records.REC_STALL_INFO}{{{r}}}": 180,
                       f'{names.RUN_GPUS}{{{r}, origin="log"}}': 8, f"{names.RUN_FINISHED}{{{r}}}": fin,
                       f"{names.STEP}{{{r}}}": 50,
                       f'{names.GPU_HOURS_PER_DAY}{{{r}, bucket="gen"}}': 150,
                       f'{names.GPU_HOURS_PER_DAY}{{{r}, bucket="reward_critical_path"}}': 30})
    bar = by_title(load(DASHBOARDS[1]))["GPU-hours per day by bucket: $experiment"]
    run = lambda e, **k: {"project": "p", "experiment": e, **k}  # noqa: E731
    order = lambda b: spec.order_key(b, spec.LEDGER_HEAD, spec.LEDGER_TAIL)[0]  # noqa: E731
    _promtool_eval(tmp_path, series, [
        (substitute(bar["targets"][0]["expr"]), [
            (run("hung", bucket=ledger.STALLED, **{spec.ORDER_LABEL: order(ledger.STALLED)}), 192),
            *[(run(e, bucket=b, **{spec.ORDER_LABEL: order(b)}), v) for e in ("running", "done")
              for b, v in (("gen", 150), ("reward_critical_path", 30))]]),
    ])


def test_a_backfill_does_not_export_the_time_outside_the_step_timer():
    """Item 9: a backfill rebuilds arrivals from the timers, so the time outside the step timer would be a flat 0 %
    on the dashboards; the backfill leaves those families out (the live exporter keeps them)."""
    from omniwatch.backtest.backfill import LIVE_ONLY_FAMILIES, render_run
    from omniwatch.backtest.runfile import load_run
    from omniwatch.backtest.timeline import Timeline
    from omniwatch.core.exposition import make_registry
    from omniwatch.core.model import RunStore
    from .conftest import fixture_path

    run = load_run(str(fixture_path("flowgrpo_healthy")))
    tl = Timeline.of(run, 1_700_000_000.0)
    times = [round(t * 1000) for t in range(int(tl.arrivals[0]), int(tl.end) + 60, 15)]
    grid = render_run(run, tl, times)
    assert names.OUTSIDE_STEP_SECONDS in LIVE_ONLY_FAMILIES and names.OUTSIDE_STEP_WINDOW in LIVE_ONLY_FAMILIES
    assert not LIVE_ONLY_FAMILIES & set(grid.families), sorted(LIVE_ONLY_FAMILIES & set(grid.families))
    assert names.STEP in grid.families and names.GPU_SECONDS_TOTAL.removesuffix("_total") in {
        k.removesuffix("_total") for k in grid.families}
    st = RunStore(clock=lambda: 0.0)  # the live registry has them (so the check above can fail)
    for e in run.entries:
        st.ingest(run.project, run.experiment, e.parsed, "jsonl", arrival=0.0, feed=run.feed)
    live = {f.name for f in make_registry(st).collect()}
    assert {names.OUTSIDE_STEP_SECONDS, names.OUTSIDE_STEP_WINDOW} <= live, live & LIVE_ONLY_FAMILIES


def test_preview_titles_read_as_words():
    """Item 10: the previews' title said "(.* / .*, last 2.80171 min)"."""
    from omniwatch.dashboards import preview as render
    assert render._runs_text(".*", ".*") == "all runs"
    assert render._runs_text("p", ".*") == "p / all experiments"
    assert render._duration_text(2.80171) == "3 min" and render._duration_text(0.5) == "30 s"
    assert render._duration_text(150) == "2.5 h"


def test_preview_tables_merge_rows_as_grafana_does():
    """Item 10: the preview drew the 'Why slow' table as one row per query (the phase, the cause, the bucket and the
    remedy of a run on four rows, misaligned under four headers). Grafana's merge joins the queries' rows on the
    fields every frame has (project, experiment) when the fields both rows have agree; the preview does the same."""
    from omniwatch.dashboards.preview import _cell_text, merge_frames
    run = lambda e, **k: {"project": "p", "experiment": e, **k}  # noqa: E731
    frames = [[run("a", phase="gen", v0=0.6), run("b", phase="update_actor", v0=0.5)],
              [run("a", cause="actor", v1=12.0), run("b", cause="none", v1=0.0)],
              [],  # a query with no data (no alert firing anywhere) adds no frame
              [run("a", alertname="MFUDrop", remedy="Profile one step", v3=2.0)]]
    rows = merge_frames(frames)
    assert rows == [run("a", phase="gen", v0=0.6, cause="actor", v1=12.0, alertname="MFUDrop",
                        remedy="Profile one step", v3=2.0),
                    run("b", phase="update_actor", v0=0.5, cause="none", v1=0.0)]
    # two rows of one run that disagree on a field both have stay apart (Grafana's isMergable)
    assert len(merge_frames([[run("a", phase="gen")], [run("a", phase="reward")]])) == 2
    assert merge_frames([[], []]) == []
    # one query (a one-target table): its rows as they are, the value keys never compared with label names
    assert merge_frames([[run("a", role="actor", cause="none", v0=0.0)], []]) == [
        run("a", role="actor", cause="none", v0=0.0)]
    assert merge_frames([[run("a", **{"x": 1.0}), {"project": "p", ("value", 0): 2.0}]]) == [
        run("a", x=1.0), {"project": "p", ("value", 0): 2.0}]
    assert _cell_text("x" * 50, 10) == "x" * 9 + "\u2026" and _cell_text("a\nb", 10) == "a b"


def test_the_stall_panels_follow_the_recorded_stall_thresholds_of_a_tuned_config(tmp_path):
    """The 'stalled' bucket of the GPU-hours panels starts where the ledger's does: (stall.notice_steps - 1)
    typical steps after the last step. The panels read it from the recorded stall thresholds (info less one
    typical step), so rules made with a tuned config move the panels too; they drew the default's 2 typical
    steps whatever the config. promtool: 200 s without a step on 60 s steps is a stall with notice_steps 3
    (tolerance 120 s) and none with notice_steps 5 (240 s)."""
    series = {}
    for exp, notice in (("default", 3), ("tuned", 5)):
        r = f'project="p", experiment="{exp}"'
        series.update({f"{records.REC_AGE}{{{r}}}": 200, f"{records.REC_STALL_TYPICAL}{{{r}}}": 60,
                       f"{records.REC_STALL_INFO}{{{r}}}": notice * 60, f"{names.RUN_FINISHED}{{{r}}}": 0})
    _promtool_eval(tmp_path, series, [(spec.stall_beyond(), [({"project": "p", "experiment": "default"}, 80),
                                                            ({"project": "p", "experiment": "tuned"}, -40)]),
                                      (spec.stall_open(), [({"project": "p", "experiment": "default"}, 1)])])


def test_previews_draw_grafana_colours_gaps_and_the_first_screen():
    """Issue 32 item 8: a Grafana named colour is a colour (the lanes' 'dark-blue' was a query error across the
    panel), a series is cut at its gaps (a stall's bucket was filled back over the pre-stall period), and the first
    screen is the overview's top rows."""
    from omniwatch.dashboards import preview
    from omniwatch.dashboards.lanes import PHASE_MAPPINGS
    from matplotlib.colors import is_color_like
    assert preview._colour("dark-blue") == "#1f60c4" and preview._colour("transparent") == "none"
    assert preview._colour("no-such-colour") == "#888888"
    assert all(is_color_like(preview._colour(c)) or c == "transparent" for _, _, c in PHASE_MAPPINGS)
    segs = preview._segments([0, 1, 2, 10, 11, 12], [1, 1, float("nan"), 2, 2, 3], gap=2.5)
    assert segs == [([0, 1], [1, 1]), ([10, 11, 12], [2, 2, 3])]
    placed = preview.render_layout(DASHBOARDS[0], ["a", "b"], preview.FIRST_SCREEN)
    rows = [pl.row.title for pl, _ in placed if pl.row is not None]
    assert rows == list(preview.FIRST_SCREEN) and min(pl.y for pl, _ in placed) == 0
    titles = {pl.panel.title for pl, _ in placed if pl.panel is not None}
    assert {"Why slow", "Runs", "Time since last step (typical steps)"} <= titles and "Remedy: $experiment" not in titles
    # a stack without fixed colours: one colour per series (fill_between(color=None) drew every one blue)
    import matplotlib.pyplot as plt
    lanes = next(d for d in DASHBOARDS if d.uid == "omniwatch-worker-lanes")
    fleet = next(p for r in lanes.rows for p in r.panels if p.stack and not p.fixed_colors)

    class Prom:
        def query_range_data(self, expr, start, end, step):
            return {"result": [{"metric": {"experiment": "e", "fleet": f, "bucket": "idle"},
                                "values": [[t, "1"] for t in range(0, 60, 5)]} for f in ("actor", "rollout", "reward")]}
    fig, ax = plt.subplots()
    preview._draw_panel(ax, fleet, Prom(), 0, 55, 5, lambda e: e, fleet.title)
    colours = {tuple(c.get_facecolor()[0]) for c in ax.collections}
    plt.close(fig)
    assert len(colours) == 3


def test_the_panel_defects_of_issue_32_are_gone_from_the_generated_json():
    """Issue 32 item 6, on the generated JSON: the step's phases drawn per step (no line across a step that did not
    time a phase, a gap while stalled); one colour per phase in the XY chart and the worker lanes (hex colours, the
    step phase a Ray method runs: train_batch is update_actor's green, not reward's red); the age column carries no
    info-threshold colour; no fleet panel draws every run in one panel."""
    from omniwatch import palette
    from omniwatch.dashboards.catalog import fleet
    from omniwatch.dashboards.lanes import PHASE_MAPPINGS
    ov = by_title(load(DASHBOARDS[0]))
    stack = ov["Step time by phase: $experiment"]
    assert stack["fieldConfig"]["defaults"]["custom"]["spanNulls"] is False
    assert f"unless on (project, experiment) (max by (project, experiment) ({records.REC_AGE}" in \
        stack["targets"][0]["expr"] and records.REC_STALL_INFO in stack["targets"][0]["expr"]
    xy = ov["Seconds per phase by step: $experiment"]
    fixed = {o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"] for o in xy["fieldConfig"]["overrides"]
             if o["matcher"]["id"] == "byRegexp"}
    assert fixed[".* gen"] == palette.color("gen") and fixed[".* update_actor"] == palette.color("update_actor")
    assert fixed[r".* old_log_prob\ \+\ ref\ \+\ teacher"] == palette.color("old_log_prob")
    colours = {text: c for _, text, c in PHASE_MAPPINGS}
    assert colours["train_batch"] == palette.color("update_actor") != palette.color("reward")
    assert colours["generate"] == colours["generate_sequences"] == palette.color("gen")
    assert colours["compute_score"] == palette.color("reward")
    assert all(c.startswith("#") or c in ("transparent", "text") for c in colours.values())
    runs = by_title(load(DASHBOARDS[0]))["Runs"]
    age = next(o for o in runs["fieldConfig"]["overrides"] if o["matcher"]["options"] == "Value #C")
    assert not any(p["id"] == "thresholds" for p in age["properties"])
    for d in DASHBOARDS:
        assert not [p.title for p in d.panels() if fleet(p)], d.uid


def test_the_full_remedy_panel_gives_every_firing_alert_its_text_and_a_quiet_run_its_row(tmp_path):
    from omniwatch.dashboards.verify import substitute
    q = substitute(by_title(load(DASHBOARDS[0]))["Remedy: $experiment"]["targets"][0]["expr"])
    run = lambda e: f'project="p", experiment="{e}"'  # noqa: E731
    rem = lambda a, v: (f'{names.RUN_REMEDY}{{{run("slow")}, alertname="{a}", severity="warning", cause="", role="", '  # noqa: E731
                        f'engine="", mode="", variant="{v}"}}')
    series = {f"{names.STEP}{{{run('slow')}}}": 9, f"{names.STEP}{{{run('quiet')}}}": 9,
              f'ALERTS{{{run("slow")}, alertname="{names.ALERT_REWARD_BOUND}", alertstate="firing", severity="warning"}}': 1,
              f'ALERTS{{{run("slow")}, alertname="{names.ALERT_RANK_STRAGGLER}", alertstate="firing", '
              f'severity="warning", role="actor_rollout", rank="1"}}': 1,
              f'{names.GPU_HOURS_PER_DAY}{{{run("slow")}, bucket="reward_critical_path"}}': 8,
              rem(names.ALERT_REWARD_BOUND, "a"): 1, rem(names.ALERT_RANK_STRAGGLER, "b"): 1,
              f'{names.REMEDY_INFO}{{variant="a", action="pool", remedy="the reward text"}}': 1,
              f'{names.REMEDY_INFO}{{variant="b", action="node", remedy="the straggler text"}}': 1}
    r = lambda **k: {"project": "p", **k}  # noqa: E731
    _promtool_eval(tmp_path, series, [(q, [
        (r(experiment="slow", alertname=names.ALERT_REWARD_BOUND, severity="warning", part="reward_critical_path",
           variant="a", action="pool", remedy="the reward text", anchor="rewardboundrollout"), 8 + 2 ** -9),
        (r(experiment="slow", alertname=names.ALERT_RANK_STRAGGLER, severity="warning", part="no GPU-time cost",
           variant="b", action="node", remedy="the straggler text", anchor="rankstraggler"), 2 ** -9),
        (r(experiment="quiet", alertname="none", action="nothing is firing for this run"), 0)])])


def test_previews_keep_a_left_edge_panels_tick_labels_on_the_page():
    """Issue 32 item 7 (legends and labels inside their panels): a percent panel at the page's left edge had its
    "100.0%" tick cut to "00.0%" (the room for tick labels was an estimate); the plot moves right until its drawn
    labels start inside the panel, its right edge (and the legend beside it) where it was."""
    import matplotlib.pyplot as plt
    from omniwatch.dashboards import preview
    p = next(p for r in DASHBOARDS[0].rows for p in r.panels if p.unit == "percentunit" and p.kind == "timeseries")

    class Prom:
        def query_range_data(self, expr, start, end, step):
            return {"result": [{"metric": {"project": "p", "experiment": "e", "bucket": "gen"},
                                "values": [[t, str(t / 55)] for t in range(0, 60, 5)]}]}
    fig = plt.figure(figsize=(16, 4))
    pad = (6 + 3.3 * preview._tick_chars(p.unit)) / (72 * 16)  # the estimate render_dashboard starts from
    ax = fig.add_axes([pad, 0.2, 0.35, 0.6])
    preview._draw_panel(ax, p, Prom(), 0, 55, 5, lambda e: e, p.title)
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    assert "100%" in [t.get_text() for t in ax.get_yticklabels()]
    right = ax.get_position().x1
    preview.keep_tick_labels_inside(ax, 0.0)
    assert ax.yaxis.get_tightbbox(renderer).x0 >= 0 and abs(ax.get_position().x1 - right) < 1e-9
    plt.close(fig)


def test_preview_axes_label_distinct_ticks_in_one_scale():
    """Issue 32 item 7 (previews that tell the truth): one decimal for every tick labelled distinct ticks alike
    ("0.1, 0.1, 0.1 preemptions/s", "0.01 s, 0.01 s, 0.00 s"); an axis now has one scale (ms, s or min) and the
    decimals its ticks' spacing needs."""
    from omniwatch.dashboards.preview import tick_texts
    assert tick_texts([0, 0.05, 0.1, 0.15], "suffix: preemptions/s") == [
        "0.00 preemptions/s", "0.05 preemptions/s", "0.10 preemptions/s", "0.15 preemptions/s"]
    assert tick_texts([0, 0.0025, 0.005, 0.0075], "s") == ["0.0 ms", "2.5 ms", "5.0 ms", "7.5 ms"]
    assert tick_texts([0, 100, 200, 300], "s") == ["0.0 min", "1.7 min", "3.3 min", "5.0 min"]
    assert tick_texts([0, 0.5, 1.0], "percentunit") == ["0%", "50%", "100%"]
    assert tick_texts([0, 1e8, 2e8], "bytes") == ["0 MiB", "95 MiB", "191 MiB"]
    for ticks in ([0, 0.05, 0.1, 0.15, 0.2], [0.001, 0.002, 0.003], [0, 25, 50, 75, 100]):
        for unit in ("s", "percentunit", "bytes", "suffix: /s"):
            assert len(set(tick_texts(ticks, unit))) == len(ticks), (ticks, unit)


def test_the_first_screen_wraps_the_action_and_the_full_remedy_is_one_click_away():
    """Issue 32 item 2 on the generated JSON: "Why slow"'s action column wraps (215-1,519 characters once showed ~20),
    each row links to its alert's runbook section (the anchor the query returns), and the full remedy of each run
    sits in the collapsed row right below, one panel per selected run, its text wrapped too."""
    doc = load(DASHBOARDS[0])
    top = [p["title"] for p in doc["panels"]]
    assert top.index("Why slow: the full remedy") == top.index("Why slow") + 2  # row, its table, the next row

    def wraps(panel, column):
        o = next(o for o in panel["fieldConfig"]["overrides"] if o["matcher"] == {"id": "byName", "options": column})
        return any(pr["id"] == "custom.cellOptions" and pr["value"].get("wrapText") for pr in o["properties"])
    why = by_title(doc)["Why slow"]
    assert wraps(why, "what to do")
    row = next(p for p in doc["panels"] if p["title"] == "Why slow: the full remedy")
    assert row["collapsed"] is True and [p["title"] for p in row["panels"]] == ["Remedy: $experiment"]
    full = row["panels"][0]
    assert full["repeat"] == "experiment" and wraps(full, "the full remedy") and wraps(full, "what to do")
    for panel in (why, full):
        assert any(lk["url"].endswith("#${__data.fields.anchor}") for lk in panel["fieldConfig"]["defaults"]["links"])


def test_previews_count_what_does_not_fit_and_record_every_query_error():
    """Issue 32 items 7-8: stats were cut at 6 runs silently; now every run is shown or counted ("+N more"), as are
    legend entries ("+N more series") and table rows ("+N more rows"); a failing query is drawn and recorded
    (QUERY_ERRORS: the renderer prints them and exits 1), never a blank panel."""
    import matplotlib.pyplot as plt
    from omniwatch.dashboards import preview
    panels = [p for d in DASHBOARDS for r in d.rows for p in r.panels]
    stat = next(p for p in panels if p.title == "Time since last step (typical steps)")
    series_panel = next(p for p in panels if p.kind == "timeseries" and not p.stack and len(p.targets) == 1)
    table = next(p for p in panels if p.kind == "table" and p.title == "Runs")
    runs = [f"run-{i:02d}" for i in range(40)]

    class Prom:
        def query_range_data(self, expr, start, end, step):
            return {"result": [{"metric": {"project": "p", "experiment": e, "phase": e, "role": e},
                                "values": [[t, "1"] for t in range(0, 60, 5)]} for e in runs]}

        def query(self, expr):
            return [{"metric": {"project": "p", "experiment": e}, "value": [60, "1"]} for e in runs]

        def query_data(self, expr):
            return {"result": self.query(expr)}
    texts = []
    for p in (stat, series_panel, table):
        fig = plt.figure(figsize=(16, 3))
        ax = fig.add_axes([0.05, 0.2, 0.3, 0.6])
        preview._draw_panel(ax, p, Prom(), 0, 55, 5, lambda e: e, p.title)
        texts.append(" ".join(t.get_text() for t in ax.texts) + " " + " ".join(
            t.get_text() for t in (ax.get_legend().get_texts() if ax.get_legend() else [])) + " " + " ".join(
            c.get_text().get_text() for tb in ax.tables for c in tb.get_celld().values()))
        plt.close(fig)
    shown = [sum(f"run-{i:02d}" in t for i in range(40)) for t in texts]
    for (t, n_shown) in zip(texts, shown):
        m = re.search(r"\+(\d+) more", t)
        assert n_shown == 40 or (m and n_shown + int(m.group(1)) == 40), (n_shown, t[-200:])
    assert any(n < 40 for n in shown)  # the check above was exercised

    class Broken:
        def query_range_data(self, *a):
            raise ValueError("bad_data: parse error")
    before = len(preview.QUERY_ERRORS)
    fig, ax = plt.subplots()
    preview._draw_panel(ax, series_panel, Broken(), 0, 55, 5, lambda e: e, "broken")
    plt.close(fig)
    assert preview.QUERY_ERRORS[before:] == ["broken: bad_data: parse error"]
