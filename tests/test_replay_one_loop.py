"""Issue 34 item 3: one replay loop (backfill and backtest) and one parsed model of the rule files."""
from __future__ import annotations

import re
from pathlib import Path

from omniwatch import rules
from omniwatch.backtest import backfill
from omniwatch.backtest.backtest import RunPlan, _render
from omniwatch.backtest.openmetrics import SampleGrid
from omniwatch.backtest.ruleset import load
from omniwatch.backtest.runfile import load_run
from omniwatch.backtest.timeline import Timeline

from .conftest import fixture_path

PKG = Path(rules.__file__).parent


def test_backfill_and_backtest_replay_the_same_families():
    run = load_run(str(fixture_path("flowgrpo_healthy")))
    tl = Timeline.of(run, 1_700_000_000.0)
    times = backfill.scrape_grid(tl, 15.0, 60.0)
    filled = backfill.render_run(run, tl, times)
    tested = SampleGrid(times, filled.job, filled.instance)
    _render(0, RunPlan(run, tl, lo=0, hi=len(times)), tested, None, None, None, backfill.NullProgress())
    assert filled.families and set(filled.families) == set(tested.families)
    timed = "omniwatch_scrape_duration_seconds"  # how long this process took to render: not the run's
    assert ({n: f.series for n, f in filled.families.items() if n != timed}
            == {n: f.series for n, f in tested.families.items() if n != timed})
    assert not backfill.LIVE_ONLY_FAMILIES & set(filled.families)  # left out by the one loop, for both


def test_one_module_parses_rule_files():
    callers = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py") if "load_rule_file(" in p.read_text()}
    assert callers == {"rules.py", "export.py"}  # export.py writes the groups as they are
    models = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
              if re.search(r"^class (AlertRule|RecordingRule)\b", p.read_text(), re.M)}
    assert models == set()
    rs = load()
    parsed = rules.load_rules(rules.rule_files())
    assert {a.name for a in rs.alerts} | set(rs.live_only) == {r.name for r in parsed if isinstance(r, rules.LoadedAlert)}
    assert all(type(a) is rules.LoadedAlert for a in rs.alerts) and all(type(r) is rules.Record for r in rs.recordings)
