"""Per-step counters read over steps, not over the scrape interval (issue 15, item 2), proven with promtool.

omniwatch_stage_seconds_total, the GPU phase counters and the ledger's omniwatch_gpu_seconds_total move once
per training step. Every panel that reads them is a ratio of two increases over each run's own window (``$window``
typical steps of that run, three by default). Here each such panel expression, with the dashboard variables substituted as
Grafana would, becomes a recording rule in a temporary rule file, evaluated by ``promtool test rules`` over
input series of a 15-minute-step run (and a 5-minute one beside it) scraped every 15 s for 3 hours: at
every evaluation time from the first step on, every ratio exists and lies in [0, 1]. The old reading (a
rate over $__rate_interval of a per-step counter) is the negative control: the same check fails on it
(750 % at a step boundary).
"""
from __future__ import annotations

import subprocess

import pytest
import yaml

from omniwatch import names as n
from omniwatch.dashboards import panels as spec
from omniwatch.dashboards.catalog import DASHBOARDS
from omniwatch.dashboards.verify import substitute

from .conftest import require_binary

SCRAPE_S = 15
HOURS = 3
RUNS = {"video-15min": 900, "image-5min": 300}  # experiment -> step seconds
# Share of the step each timed phase takes (untracked included): stage_seconds_total moves by these x step.
STAGES = {"gen": 0.55, "reward": 0.2, "old_log_prob": 0.05, "adv": 0.01, "update_actor": 0.12,
          "update_weights": 0.02, n.UNTRACKED_PHASE: 0.05}
# Per GPU and phase, (busy, idle) shares of the step as the NVML attribution adds them at the step's end.
GPU_PHASES = {"gen": (0.5, 0.05), "reward": (0.02, 0.18), "old_log_prob": (0.05, 0.0), "update_actor": (0.11, 0.01),
              "update_weights": (0.01, 0.01), "inter_stage": (0.0, 0.05)}
GPUS = ("0", "1")
# The ledger (omniwatch_gpu_seconds_total{bucket}): GPU-seconds per bucket, the run's 4 GPUs x the step's wall time.
RUN_GPUS = 4
LEDGER = {"gen": 0.45, "reward_critical_path": 0.2, "old_log_prob": 0.05, "update_actor": 0.12, "update_weights": 0.02,
          "inter_stage_idle": 0.05, "outside_step_timer": 0.01, "checkpoint": 0.1}
EVAL_FROM_S, EVAL_EVERY_S = 20 * 60, 5 * 60


def _counter(step_s: int, per_step: float) -> str:
    """Explicit samples of a counter that moves once per step (at the step's end), scraped every 15 s."""
    samples = HOURS * 3600 // SCRAPE_S + 1
    return " ".join(f"{(i * SCRAPE_S // step_s) * per_step:g}" for i in range(samples))


def input_series() -> list[dict]:
    out = []
    for exp, step_s in RUNS.items():
        run = f'job="omniwatch",instance="x:1",project="p",experiment="{exp}"'
        for phase, share in STAGES.items():
            out.append({"series": f'{n.STAGE_SECONDS_TOTAL}{{{run},phase="{phase}"}}',
                        "values": _counter(step_s, share * step_s)})
        for bucket, share in LEDGER.items():
            out.append({"series": f'{n.GPU_SECONDS_TOTAL}{{{run},bucket="{bucket}"}}',
                        "values": _counter(step_s, share * step_s * RUN_GPUS)})
        # each run's own window comes from its typical step (spec.increase_w)
        out.append({"series": f"{n.TYPICAL_STEP}{{{run}}}", "values": f"{step_s}x{HOURS * 3600 // SCRAPE_S}"})
        out.append({"series": f"{n.STEP}{{{run}}}", "values": _counter(step_s, 1)})
        for gpu in GPUS:
            g = f'{run},node="n-{exp}",gpu="{gpu}",uuid="GPU-{exp}-{gpu}"'
            for phase, (busy, idle) in GPU_PHASES.items():
                out.append({"series": f'{n.GPU_PHASE_BUSY_SECONDS_TOTAL}{{{g},phase="{phase}"}}',
                            "values": _counter(step_s, busy * step_s)})
                out.append({"series": f'{n.GPU_PHASE_IDLE_SECONDS_TOTAL}{{{g},phase="{phase}"}}',
                            "values": _counter(step_s, idle * step_s)})
    return out


def windowed_ratio_panels():
    """(dashboard, panel, target) of every target that reads a per-step counter over $window."""
    for d in DASHBOARDS:
        for p in d.panels():
            for t in p.targets:
                if spec.WINDOW in t.expr:
                    yield d, p, t


def _promtool_check(tmp_path, exprs: dict[str, str]) -> subprocess.CompletedProcess:
    """Record each expression; at every evaluation time expect: some series exist, none outside [0, 1]."""
    promtool = require_binary("promtool")
    rules = {"groups": [{"name": "panels", "rules": [{"record": r, "expr": e} for r, e in exprs.items()]}]}
    (tmp_path / "panels.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = []
    for t in range(EVAL_FROM_S, HOURS * 3600 + 1, EVAL_EVERY_S):
        for r in exprs:
            tests.append({"expr": f"{r} > 1 or {r} < 0", "eval_time": f"{t}s", "exp_samples": []})
            tests.append({"expr": f"clamp_max(count({r}), 1)", "eval_time": f"{t}s",
                          "exp_samples": [{"labels": "{}", "value": 1}]})
    # rules evaluated only at the checked times (every 5 minutes): the same values, 20x fewer evaluations
    doc = {"rule_files": ["panels.rules.yml"], "evaluation_interval": f"{EVAL_EVERY_S}s",
           "tests": [{"name": "per-step ratios over 15-minute steps", "interval": f"{SCRAPE_S}s",
                      "input_series": input_series(), "promql_expr_test": tests}]}
    (tmp_path / "panels.test.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    return subprocess.run([promtool, "test", "rules", str(tmp_path / "panels.test.yml")], capture_output=True,
                          text=True, timeout=300)


def test_every_per_step_counter_panel_is_a_ratio_panel():
    found = list(windowed_ratio_panels())
    assert len({p.title for _, p, _ in found}) >= 3, "the reward-share, GPU-idle-share and ledger panels read $window"
    for d, p, t in found:
        assert p.unit == "percentunit" and p.min == 0 and p.max == 1, (d.uid, p.title)
        assert " offset " in t.expr and spec.RATE_INTERVAL not in t.expr, (d.uid, p.title, t.expr)


@pytest.mark.slow  # make test-quick leaves it to make test
@pytest.mark.parametrize("window_steps", [3, 1], ids=["3-typical-steps", "1-fast-step"])
def test_ratio_panels_stay_within_0_and_1_on_15_minute_steps(tmp_path, window_steps):
    # $window typical steps of each run (3 by default, each run over its own); and one step (a window of one
    # step may hold no step end at times: its ratios may vanish, never leave [0, 1]).
    window = str(window_steps)
    exprs = {f"panel:ratio_{i}:window": substitute(t.expr, window=window)
             for i, (_, _, t) in enumerate(windowed_ratio_panels())}
    r = _promtool_check(tmp_path, exprs)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def test_the_old_rate_reading_of_a_per_step_counter_fails_the_same_check(tmp_path):
    """Negative control: reward seconds per second over $__rate_interval (1 m), the old 'reward share' panel,
    leaves [0, 1] at every step boundary of the 15-minute run, and the check says so."""
    old = substitute(f"sum by (project, experiment, phase) "
                     f"({spec.rate(spec.sel(n.STAGE_SECONDS_TOTAL, phase='=~gen|reward'))})")
    r = _promtool_check(tmp_path, {"panel:old_rate:interval": old})
    assert r.returncode != 0
    assert "panel:old_rate:interval > 1" in r.stdout + r.stderr
