"""Alert judgment over the configurations VeRL-Omni runs: verl-shaped runs for each trainer (legacy, V1)
x reward layout (colocated reward model, reward pool, reward function) x async mode (sync,
separate_async), all with heavy planned work (checkpoints 4.5x the step every 10 steps, validation 2.5x
every 8, a forced final checkpoint + validation), faults, and restarts after a fix. Each run is
backtested with the repository's rules by a real Prometheus; the test names every alert it expects —
its step window and, where the layout matters, the remedy it must give — and that nothing else fires.

Planned work is an info notice at most (TrainingStalled{severity="info"} in the gap before a heavy
planned step, never warning or critical); a 50-minute hang on a 4-minute step pages; a fix applied
through a restart starts new baselines and sets nothing off. docs/alerts.md lists what each alert was
tested on. The same engine judges live runs: tests/test_backtest_agrees_with_live.py replays some of
these runs into the native stack and finds the same alerts. All cases are backtested in one pass of the
engine (one backfill, one temporary Prometheus, one promtool annotation run: ``backtest_many``); each
run is judged on its own evaluation timestamps, as alone (tests/test_report.py proves a run's result does
not depend on the runs beside it).
"""
from __future__ import annotations

import orjson
import pytest

from omniwatch import names as n
from omniwatch.backtest.backtest import backtest_many
from omniwatch.backtest.runfile import load_run
from omniwatch.simulate import RunSpec, step_dict

from .conftest import require_binary
from .matrix_cases import CASES, FLAGGED, LAYOUTS, PLANNED, STEPS, Case, kth_normal

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.batch]

START = 1_700_000_000.0


def write(tmp_path, case: Case) -> str:
    spec = RunSpec(seed=11, faults=case.faults, **LAYOUTS[case.layout], **PLANNED, **case.extra)
    lines = [{"step": s, "data": step_dict(spec, s)} for s in range(1, STEPS + 1)]
    if case.after_restart:
        resume, changes, faults = case.after_restart
        lines = lines[:20 if case.scenario == "mfu_peak_fix" else resume - 1]
        fixed = RunSpec(seed=12, faults=faults, **{**LAYOUTS[case.layout], **changes}, **PLANNED, **case.extra)
        lines += [{"step": s, "data": step_dict(fixed, s)} for s in range(resume, STEPS + 1)]
    p = tmp_path / "matrix" / f"{case.layout}--{case.scenario}.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    return str(p)


def planned_info_steps() -> set[int]:
    """The steps after which a heavy planned step follows: an info notice there is the staging at work."""
    return {s - 1 for s in FLAGGED}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case backtested in one pass: case id -> its BacktestResult."""
    require_binary("promtool")
    require_binary("prometheus")
    root = tmp_path_factory.mktemp("matrix")
    runs = [load_run(write(root, c)) for c in CASES]  # matrix/<layout>--<scenario>: distinct experiments
    # annotations are asserted on every alert but the info notices before planned work (most hits)
    out = backtest_many(runs, starts=[START] * len(runs), annotations=planned_info_unannotated)
    return {case_id(c): r for c, r in zip(CASES, out)}


def planned_info_unannotated(hit) -> bool:
    return not (hit.alertname == n.ALERT_STALLED and hit.severity == "info" and hit.first_step in planned_info_steps())


def case_id(c: Case) -> str:
    return f"{c.layout}-{c.scenario}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_configuration_gets_exactly_its_alerts_with_the_remedy_that_fits(results, case):
    res = results[case_id(case)]
    assert res.run.experiment == f"{case.layout}--{case.scenario}"
    got = list(res.alerts)
    missing = []
    for e in case.expect:
        match = [a for a in got if a.alertname == e.alert and a.severity == e.severity
                 and all(a.labels.get(k) == v for k, v in e.labels.items())]
        if not match:
            missing.append(e)
            continue
        a = min(match, key=lambda a: a.first_step)
        got.remove(a)
        assert e.first <= a.first_step <= (e.first_max or e.first), (e, a.as_json())
        if e.last is not None:
            assert a.last_step == e.last, (e, a.as_json())
        remedy = a.annotations.get("remedy", "")
        for s in e.remedy:
            assert s in remedy, (e.alert, s, remedy)
        for s in e.not_remedy:
            assert s not in remedy, (e.alert, s, remedy)
        assert a.annotations.get("step") == str(a.first_step)
    assert not missing, (missing, res.as_json()["alerts"])
    # the rest: only info notices before planned work (and during a hang's gap)
    allowed_info = planned_info_steps() | {e.first for e in case.expect if e.alert == n.ALERT_STALLED}
    rest = [a for a in got if not (a.alertname == n.ALERT_STALLED and a.severity == "info"
                                   and a.first_step in allowed_info)]
    assert not rest, [a.as_json() for a in rest]
    if case.after_restart:  # nothing fires on the old incarnation's baselines after the fix: nothing starts after it,
        resume = case.after_restart[0]  # and what fired before ends while the fixed trainer warms up (the window goes
        settled = kth_normal(resume + 2, 3)  # on across a restart until the new incarnation's first 3 normal steps)
        late = [a for a in res.alerts if a.severity != "info" and (a.first_step >= resume or a.last_step > settled)
                and a.alertname in (n.ALERT_MFU_DROP, n.ALERT_STEP_REGRESSION, n.ALERT_REWARD_BOUND)]
        assert not late, [a.as_json() for a in late]
