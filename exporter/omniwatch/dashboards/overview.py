"""Run overview: is each run alive, where is it, how fast against its own baseline, where each step's
time goes, and the learning curves against training step (the way RL engineers read them in W&B).

Layout (top to bottom): Now (stall gauge top-left, data arriving, one table row per run) -> Alerts
(firing alerts per run) -> Where the step goes (stacked phases, one panel per run) -> Learning curves by
step -> Policy update by step -> Learning signals over time (collapsed).
"""
from __future__ import annotations

from .. import names as n
from ..alerting.config import DEFAULT as CONFIG
from ..analytics import K_ZERO_STD
from ..model import passthrough_name
from .spec import (ALERT_STATE_MAPPINGS, Dashboard, EXP, Panel, REC_AGE, REC_MFU_VS_BASELINE, REC_REWARD_BOUND_MIN,
                   REC_STEP_VS_BASELINE, REC_ZERO_STD_MIN, RUN_BY, RUN_LEGEND, Row, Step, Target, alert_states_by_run,
                   cfg_step, default_tags, firing_by_run, idle_evidence, run_max, sel)

# verl keys the overview plots; the exporter passes each through as verl_<key> with label key=<key>.
K_REWARD_MEAN = "critic/rewards/mean"
K_REWARD_STD_MEAN = "critic/rewards/std_mean"
K_CLIPFRAC = "actor/pg_clipfrac"
K_CLIPFRAC_HIGHER = "actor/pg_clipfrac_higher"
K_CLIPFRAC_LOWER = "actor/pg_clipfrac_lower"
K_RATIO_MEAN = "actor/ratio_mean"
K_RATIO_STD = "actor/ratio_std"
K_PPO_KL = "actor/ppo_kl"
K_GRAD_NORM = "actor/grad_norm"
# Validation metrics: verl logs val-core/<data_source>/<var>/mean@N (and val-aux/...) on test_freq steps.
VAL_REWARD_KEYS = "val-(core|aux)/.*reward.*"


def verl(key: str) -> str:
    """Selector of one passed-through verl key (family name derived exactly as the exporter does)."""
    return sel(passthrough_name(key), **{n.L_KEY: key})


def val_reward() -> str:
    """Every validation reward key of the run (family names vary with the data source)."""
    return sel("", __name__="=~" + n.PASSTHROUGH_PREFIX + "val_.*", **{n.L_KEY: "=~" + VAL_REWARD_KEYS})


# Stacking order of the step-time chart: the FlowGRPO step in execution order, untracked last.
PHASES = ("feed", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", n.UNTRACKED_PHASE)
# One XY column per group (a table-format query per column): the two log-prob forward passes together, so a run
# without a reference model still fills every column.
XY_PHASES = ("feed", "gen", "reward", "old_log_prob|ref", "adv", "update_actor", "update_weights", n.UNTRACKED_PHASE)

STALL_NOTE = "half-way to the stall rule: one step 1.5x the typical step is a checkpoint or validation step, or the start of a hang"
AGE_STEPS = (f"{sel(REC_AGE)} / on ({RUN_BY}) {run_max(sel(n.TYPICAL_STEP))}")
STALL_STEPS = (Step(None, "green"), Step(1.5, "orange", note=STALL_NOTE), cfg_step("stall.notice_steps", "red"))


def step_xy(title: str, description: str, *targets: Target, unit: str = "short", w: int = 8, h: int = 8,
            runbook=(), repeat: bool = False, log: bool = False, minimum=None, maximum=None, thresholds=()) -> Panel:
    """A learning curve against training step: the first target is the run's step (x), the others y."""
    x = Target(run_max(sel(n.STEP)), "step", table=True)
    return Panel(title, description + " X axis: training step (omniwatch_step), one line per run.",
                 (x, *targets), unit=unit, kind="xychart", w=w, h=h, runbook=runbook, repeat=repeat,
                 log_scale=log, min=minimum, max=maximum, thresholds=thresholds)


def key_y(key: str, legend: str | None = None) -> Target:
    return Target(run_max(verl(key)), legend or f"{EXP} {key}", table=True)


NOW = Row("Now", (
    Panel("Time since last step (typical steps)",
          "Per run: seconds since its latest step divided by its typical step (median of recent normal steps). "
          f"1 is a step in progress; orange at 1.5; red at {CONFIG.stall.notice_steps:g}, where TrainingStalled "
          "fires (critical: reserved GPUs idle). A run that stepped recently but stays high means its log stopped "
          "reaching omniwatch: check 'Data arriving'.",
          (Target(AGE_STEPS, RUN_LEGEND),), unit="suffix: × typical step", kind="stat", w=5, h=8, decimals=1,
          thresholds=STALL_STEPS, runbook=n.ALERT_STALLED),
    Panel("Data arriving",
          "Is data reaching Prometheus at all? 'exporter' is up{job=\"omniwatch\"} (Prometheus scrapes the exporter; "
          "DOWN pages as OmniwatchSourceDown); each source is omniwatch_source_up (a log tail, the GPU sampler, "
          "discovery). A stalled run with every source up is a real stall; a source down explains missing steps.",
          (Target(f'min(up{{job="{CONFIG.selectors.job}"}}) or on () vector(0)', "exporter"),
           Target(f"min by ({n.L_SOURCE}) ({n.SOURCE_UP})", "{{source}}")),
          unit="none", kind="stat", w=3, h=8, scope="global", runbook=n.ALERT_SOURCE_DOWN,
          mappings=((1, "up", "green"), (0, "DOWN", "red"))),
    Panel("Runs",
          "One row per run: latest step; seconds since it and the same in typical steps; the fastest of the last "
          "k normal steps over the step-time baseline (StepTimeRegression above "
          f"{CONFIG.step_time.regression_ratio:g}); window minima of the reward-bound ratio (RewardBoundRollout "
          f"above {CONFIG.reward_bound.ratio:g}) and of the inter-stage idle ratio (InterStageIdleGPU above "
          f"{CONFIG.inter_stage_idle.ratio:g}; GPU evidence where sampled); the best window MFU over its baseline "
          f"(lowest role; MFUDrop below {CONFIG.mfu.drop_ratio:g}); firing alerts (Watchdog left out). Colours are "
          "the rules' thresholds. Click a row for that run on the other dashboards.",
          (Target(run_max(sel(n.STEP)), "step", instant=True, table=True, unit="none"),
           Target(run_max(sel(REC_AGE)),
                  "last step age", instant=True, table=True, unit="s"),
           Target(AGE_STEPS, "age / typical step", instant=True, table=True, unit="none", thresholds=STALL_STEPS),
           Target(run_max(sel(REC_STEP_VS_BASELINE)),
                  "step / baseline", instant=True, table=True, unit="none",
                  thresholds=(Step(None, "green"), cfg_step("step_time.regression_ratio", "red"))),
           Target(run_max(sel(REC_REWARD_BOUND_MIN)),
                  "reward-bound min", instant=True, table=True, unit="percentunit",
                  thresholds=(Step(None, "green"), cfg_step("reward_bound.ratio", "red"))),
           Target(run_max(idle_evidence()),
                  "idle min", instant=True, table=True, unit="percentunit",
                  thresholds=(Step(None, "green"), cfg_step("inter_stage_idle.ratio", "red"))),
           Target(f"min by ({RUN_BY}) ({sel(REC_MFU_VS_BASELINE)})", "MFU / baseline", instant=True, table=True, unit="percentunit",
                  thresholds=(Step(None, "red"), cfg_step("mfu.drop_ratio", "green"))),
           Target(firing_by_run(), "alerts firing", instant=True, table=True, unit="none",
                  thresholds=(Step(None, "green"), Step(1, "red", note="any firing alert of the run")))),
          unit="none", kind="table", w=16, h=8,
          runbook=(n.ALERT_STALLED, n.ALERT_STEP_REGRESSION, n.ALERT_REWARD_BOUND, n.ALERT_IDLE, n.ALERT_MFU_DROP)),
))

ALERT_ROW = Row("Alerts", (
    Panel("Alerts of $experiment",
          "Firing (red) and pending (orange) omniwatch alerts of this run over time, one row per alert (Watchdog "
          "left out). Pending means the condition holds and the short 'for' still absorbs scrape jitter. The "
          "same alerts are annotations on every time series.",
          (Target(alert_states_by_run(), EXP + " {{alertname}}"),),
          unit="none", kind="statetimeline", w=24, h=5, repeat=True,
          mappings=ALERT_STATE_MAPPINGS),
))

STEP_TIME = Row("Where the step goes", (
    Panel("Step time vs baseline",
          "Latest step time per run, the fastest of its last k normal steps, and "
          f"{CONFIG.step_time.regression_ratio:g} x its baseline (dashed). The window minimum above the dashed line "
          "is StepTimeRegression; a single spike above it is a validation or checkpoint step (annotated).",
          (Target(run_max(sel(n.STEP_DURATION)), EXP + " latest step"),
           Target(run_max(sel(n.STEP_DURATION_WINDOW, stat="min")), EXP + " window min"),
           Target(f"{CONFIG.step_time.regression_ratio:g} * {run_max(sel(n.STEP_DURATION_BASELINE))}",
                  EXP + f" {CONFIG.step_time.regression_ratio:g} x baseline", dashed=True)),
          unit="s", w=24, h=8, runbook=n.ALERT_STEP_REGRESSION),
    Panel("Step time by phase: $experiment",
          "Seconds of the latest step per timed phase, stacked, one panel per run (a stack never mixes runs); "
          "'untracked' is the step minus all timed phases (transfers, barriers, waiting). A growing 'reward' band is "
          "a reward-bound rollout; a growing 'untracked' band is inter-stage idle GPU time; a single tall step is a "
          "validation or checkpoint step (annotated).",
          (Target(run_max(sel(n.STAGE_DURATION, phase='=~' + '|'.join(PHASES)), n.L_PHASE), EXP + " {{phase}}"),),
          unit="s", stack=True, w=24, h=9, repeat=True, runbook=(n.ALERT_REWARD_BOUND, n.ALERT_IDLE)),
    step_xy("Seconds per phase by step: $experiment",
            "Seconds of each timed phase (and untracked) at each training step of this run (0 for a phase the run "
            "does not time).",
            *(Target(f"sum by ({RUN_BY}) ({run_max(sel(n.STAGE_DURATION, phase='=~' + ph), n.L_PHASE)}) "
                     f"or on ({RUN_BY}) 0 * {run_max(sel(n.STEP))}",
                     f"{EXP} {ph.replace('|', ' + ')}", table=True) for ph in XY_PHASES),
            unit="s", w=24, h=9, repeat=True),
))

CURVES = Row("Learning curves by step", (
    step_xy("Reward mean", "critic/rewards/mean. Flat or falling for many steps means the policy is not improving on "
            "the reward model.", key_y(K_REWARD_MEAN, f"{EXP} reward mean")),
    step_xy("Reward spread within groups", "critic/rewards/std_mean: mean per-prompt reward std. Near zero means all "
            "samples of a prompt score alike and GRPO advantages vanish.", key_y(K_REWARD_STD_MEAN, f"{EXP} reward std")),
    step_xy("Zero-std groups", "critic/rewards/zero_std_ratio: share of prompt groups whose rewards are all equal (no "
            f"learning signal). RewardSaturation fires when the window minimum stays above "
            f"{CONFIG.reward_saturation.zero_std_ratio:g} (see 'Zero-std groups, window min').",
            key_y(K_ZERO_STD, f"{EXP} zero-std ratio"), unit="percentunit", minimum=0, maximum=1,
            thresholds=(Step(None, "green"), cfg_step("reward_saturation.zero_std_ratio", "red")),
            runbook=n.ALERT_REWARD_SATURATION),
    step_xy("Validation reward", "Validation rewards (val-core/<data source>/reward/mean@N and val-aux keys), logged on "
            "test_freq steps; the line holds the last validation between them. Train reward rising while validation "
            "falls is reward hacking or overfitting to the training prompts.",
            Target(run_max(val_reward(), n.L_KEY), EXP + " {{key}}", table=True), w=8),
    Panel("Zero-std groups, window min",
          "The series RewardSaturation thresholds: the lowest zero_std_ratio of the last k normal steps (every one of "
          f"them above {CONFIG.reward_saturation.zero_std_ratio:g} fires), with the latest step's value dashed.",
          (Target(sel(REC_ZERO_STD_MIN),
                  EXP + " window min"),
           Target(run_max(verl(K_ZERO_STD)), EXP + " latest step", dashed=True)),
          unit="percentunit", min=0, max=1,
          thresholds=(Step(None, "green"), cfg_step("reward_saturation.zero_std_ratio", "red")),
          show_thresholds="dashed+area", w=16, runbook=n.ALERT_REWARD_SATURATION),
))

POLICY = Row("Policy update by step", (
    step_xy("Clip fraction", "actor/pg_clipfrac (+ higher/lower). A jump means the update moved the policy far from "
            "the rollout policy (stale samples, too high a learning rate).",
            key_y(K_CLIPFRAC, f"{EXP} clipfrac"), key_y(K_CLIPFRAC_HIGHER, f"{EXP} higher"),
            key_y(K_CLIPFRAC_LOWER, f"{EXP} lower"), unit="percentunit"),
    step_xy("KL (ppo_kl)", "actor/ppo_kl (~1e-3 on healthy runs; its own panel, log scale, so it is not flattened "
            "by ratios near 1). Spikes precede divergence.", key_y(K_PPO_KL, f"{EXP} ppo_kl"), log=True),
    step_xy("Gradient norm", "actor/grad_norm. Spikes precede divergence; a steady climb is a learning rate too high "
            "for the batch.", key_y(K_GRAD_NORM, f"{EXP} grad_norm")),
    step_xy("Importance ratio mean", "actor/ratio_mean (~1). Away from 1 means rollout and training policies "
            "diverge (weights not synced, off-policy drift).", key_y(K_RATIO_MEAN, f"{EXP} ratio mean"), w=12),
    step_xy("Importance ratio std", "actor/ratio_std (~1e-2). Growing means the rollout policy drifts from the "
            "trained one within a step.", key_y(K_RATIO_STD, f"{EXP} ratio std"), w=12),
))

DASHBOARD = Dashboard(
    uid="omniwatch-run-overview",
    title="omniwatch / Run overview",
    description="Each VeRL-Omni run at a glance: alive or stalled, step and speed against its own baseline, alerts, "
                "step time by phase, and the learning curves against training step.",
    rows=(NOW, ALERT_ROW, STEP_TIME, CURVES, POLICY),
    tags=default_tags("overview"),
    variable_metrics=(n.STEP,),
    slots=(
        "stall stages (info/warning/critical): more threshold steps on 'Time since last step' and the table's "
        "'age / typical step' column (cfg_step of each stage)",
        "grad-norm alert: threshold + runbook on 'Gradient norm'; its window series as a time panel beside "
        "'Zero-std groups, window min'",
        "rollout-correction drift: threshold + runbook on 'Importance ratio mean' / 'std'",
        "GPU-hours ledger: a row 'GPU-hours' after 'Where the step goes' (stacked buckets per run, repeated per "
        "run, share of the run's GPU-hours) and a 'GPU-hours' column in 'Runs'",
    ),
)
