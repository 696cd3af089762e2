"""The detection scorecard (issue 30 item 7, docs/scorecard.md) in `make test`: the whole corpus backtested once
(one Prometheus pass, a module fixture), alerts/alertmanager.yml applied by the model, and no figure may be worse
than the committed baseline (benchmarks/scorecard.json; re-baseline with `make scorecard`). The figures come from
the files, not from a copy of them: the same backtest judged with another Alertmanager configuration gives other
numbers."""
from __future__ import annotations

import copy
import json

import pytest

from omniwatch import cli, rules
from omniwatch.scorecard import amsim, baseline, card, scoring

from .conftest import require_binary
from omniwatch.yamlio import load as yaml_load

pytestmark = [pytest.mark.integration, pytest.mark.batch]


@pytest.fixture(scope="module")
def backtested():
    require_binary("prometheus")
    require_binary("promtool")
    return scoring.backtest_corpus(card.corpus_dir())


@pytest.fixture(scope="module")
def current(backtested):
    return scoring.judge(backtested, amsim.load_config(rules.alertmanager_config_path()))


def _base() -> dict:
    return json.loads(card.baseline_path().read_text())


def test_no_figure_is_worse_than_the_committed_baseline(current):
    worse = baseline.regressions(current, _base())
    assert not worse, "\n".join(worse) + f"\n{len(worse)} figure(s) worse than benchmarks/scorecard.json: " \
                                         f"{baseline.REBASELINE}"


def test_alertmanagers_inhibitions_and_grouping_are_read_from_the_file(backtested, current):
    """Without the inhibit rules, StepTimeRegression notifies beside the alert of its cause (more notifications per
    fault); with a 1-hour repeat_interval, a fault that lasts hours is re-sent (more). (A longer group_interval
    would absorb flaps, but the rules' hysteresis leaves none to absorb.)"""
    doc = yaml_load(rules.alertmanager_config_path().read_text())
    bare = copy.deepcopy(doc)
    bare["inhibit_rules"] = []
    no_inhibition = scoring.judge(backtested, amsim.parse_config(bare))
    hourly = copy.deepcopy(doc)
    hourly["route"]["repeat_interval"] = "1h"
    hourly_repeats = scoring.judge(backtested, amsim.parse_config(hourly))
    n = current["totals"]["notifications"]
    assert no_inhibition["totals"]["notifications"] > n < hourly_repeats["totals"]["notifications"]
    by_alert = {a["alertname"]: a for a in no_inhibition["alerts"]}
    assert by_alert["StepTimeRegression"]["notifications_in_faults"] > \
        {a["alertname"]: a for a in current["alerts"]}["StepTimeRegression"]["notifications_in_faults"]


def test_the_comparison_names_every_worse_figure_and_lets_better_ones_pass():
    base = _base()
    better = copy.deepcopy(base)
    f = next(x for x in better["faults"] if x["notifications"] > 1)
    f["notifications"] -= 1
    better["totals"]["notifications_per_fault"] -= 0.01
    assert baseline.regressions(better, base) == []
    worse = copy.deepcopy(base)
    g = next(x for x in worse["faults"] if x["caught"] and "detect_steps" in x)
    old = g["detect_steps"]
    g.update(caught=False, detect_steps=None)
    worse["totals"]["false_healthy"] += 1
    got = baseline.regressions(worse, base)
    assert f"fault {baseline.fault_key(g)} caught: True -> False (higher is better)" in got
    assert f"fault {baseline.fault_key(g)} detect_steps: {old} -> None (lower is better)" in got
    assert any(x.startswith("totals.false_healthy:") for x in got)
    moved = copy.deepcopy(base)
    moved["corpus"]["digest"] = "0" * 64
    assert baseline.regressions(moved, base) == [
        f"the corpus changed (its files' digest differs from the baseline's): {baseline.REBASELINE}"]


def test_the_page_is_the_baseline_rendered():
    doc = card.doc_path().read_text()
    assert card.render_doc(doc, _base()) == doc, "run `omniwatch generate` (or `make scorecard`)"


def test_the_command_checks_against_a_baseline(current, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(scoring, "run_scorecard", lambda *a, **k: current)
    assert cli.main(["scorecard", "--check", "--quiet", "--brief"]) == 0
    tighter = copy.deepcopy(current)
    f = next(x for x in tighter["faults"] if x["notifications"] > 0)
    f["notifications"] -= 1
    path = tmp_path / "scorecard.json"
    path.write_text(json.dumps(tighter))
    assert cli.main(["scorecard", "--check", "--quiet", "--brief", "--baseline", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"fault {baseline.fault_key(f)} notifications" in err and "make scorecard" in err
    assert cli.main(["scorecard", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["totals"] == current["totals"]
