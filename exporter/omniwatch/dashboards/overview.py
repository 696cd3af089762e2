"""Run overview: is each run alive, where is it, how fast against its own baseline, where each step's
time goes, and the learning curves against training step (the way RL engineers read them in W&B).

Layout (top to bottom): Now (stall gauge top-left by stage, data arriving, age against each run's stall
thresholds, one table row per run) -> Alerts (firing alerts per run, TrainingStalled per stage) -> Where the
step goes (stacked phases in the exporter's order, one panel per run) -> GPU-hours (ledger buckets per run)
-> Learning curves by step -> Policy update by step (with skipped updates and rejected sequences).
"""
from __future__ import annotations

from .. import ledger
from .. import names as n
from ..alerting.config import DEFAULT as CONFIG
from ..analytics import K_ZERO_STD
from ..alerting.records import (REC_AGE, REC_GRAD_NONFINITE, REC_MFU_MEDIAN, REC_MFU_VS_BASELINE, REC_REWARD_BOUND_MIN,
                                REC_RS_MASKED_MIN, REC_STALL_CRITICAL, REC_STALL_WARNING, REC_STEP_MEDIAN,
                                REC_STAGE_SHARE, REC_STEP_VS_BASELINE,
                                REC_ZERO_STD_MIN)
from .panels import AGE_STEPS, ALERT_STATE_MAPPINGS, alerts_sel, Dashboard, EXP, PHASES, Panel, RUN_BY, RUN_LEGEND, Row, Step, STALL_STAGE_MAPPINGS, Target, age_steps_by_stage, alert_states_by_run, cfg_step, default_tags, firing_by_run, gpu_hours_panel, gpu_hours_per_day, idle_evidence, in_order, per_typical_step, phase_colors, run_max, sel, stage_colors, stall_stage, verl

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


def val_reward() -> str:
    """Every validation reward key of the run (family names vary with the data source)."""
    return sel("", __name__="=~" + n.PASSTHROUGH_PREFIX + "val_.*", **{n.L_KEY: "=~" + VAL_REWARD_KEYS})


# One XY column per group of the exporter's phases (analytics.PHASE_ORDER, then untracked), a table-format
# query per column: the log-prob forward passes (old policy, reference, teacher) share one, so a run without a
# reference model still fills every column; every other phase has its own.
FORWARD_PASSES = ("old_log_prob", "ref", "teacher")
XY_PHASES = tuple(dict.fromkeys("|".join(FORWARD_PASSES) if ph in FORWARD_PASSES else ph for ph in PHASES))

STALL_STEPS = (Step(None, "green"), cfg_step("stall.notice_steps", "yellow"))
def stage_desc(c) -> str:
    """TrainingStalled's stages in words, with ``c``'s thresholds."""
    return (f"TrainingStalled's stages, per run (the rules' own thresholds): info after "
                  f"{c.stall.notice_steps:g} typical steps without a step (perhaps a checkpoint or validation); "
                  f"warning after that plus the planned work that may come before the next step (the run's longest "
                  f"recent checkpoint and validation) plus {c.stall.unseen_planned_steps:g} typical steps while it "
                  f"has not shown both yet; critical {c.stall.critical_extra_steps:g} typical steps after the warning "
                  "(reserved GPUs idle). A finished run (its last step was the planned last) never stalls.")
# omniwatch_run_log_open: 1 a process other than omniwatch holds the log open for writing, 0 it did and no longer
# does (the trainer ended), absent never seen (-1 here).
LOG_WRITER_MAPPINGS = ((1, "writing", "green"), (0, "closed", "orange"), (-1, "not seen", "transparent"))
def step_xy(title: str, description: str, *targets: Target, unit: str = "short", w: int = 8, h: int = 8,
            runbook=(), repeat: bool = False, log: bool = False, minimum=None, maximum=None, thresholds=(),
            keyed: str = "") -> Panel:
    """A learning curve against training step: the first target is the run's step (x), the others y.
    ``keyed``: the single y target has several series per run told apart by its ``key`` label; the step is
    then given once per key (x_by_key) so the merge pairs every key with its step (issue 26 item 6)."""
    x = Target(x_by_key(keyed) if keyed else run_max(sel(n.STEP)), "step", table=True)
    x_axis = " X axis: training step (omniwatch_step), one line per run."
    return Panel(title, (lambda c: description(c) + x_axis) if callable(description) else description + x_axis,
                 (x, *targets), unit=unit, kind="xychart", w=w, h=h, runbook=runbook, repeat=repeat,
                 log_scale=log, min=minimum, max=maximum, thresholds=thresholds,
                 xy_labels=(n.L_KEY,) if keyed else ())


def x_by_key(y_expr: str) -> str:
    """The run's step once per series of ``y_expr`` (labels project, experiment, key): Grafana's merge joins
    table rows on their common fields, so a step row without ``key`` would pair with one key only and drop the
    others (val-core lost to val-aux)."""
    return f"{run_max(sel(n.STEP))} + on ({RUN_BY}) group_right () (0 * {y_expr})"


def step_vs_start() -> str:
    """Median of the run's last k normal steps / its anchored step-time reference (the median of the trainer
    incarnation's first 20 normal steps, omniwatch_step_duration_baseline_seconds): what StepTimeRegression's creep condition judges,
    never a moving baseline (issue 26 item 2)."""
    return f"{run_max(sel(REC_STEP_MEDIAN))} / on ({RUN_BY}) {run_max(sel(n.STEP_DURATION_BASELINE))}"


def mfu_vs_reference() -> str:
    """Per run, the lowest role's window median MFU / its anchored MFU reference (omniwatch_mfu_baseline_ratio)."""
    return (f"min by ({RUN_BY}) ({run_max(sel(REC_MFU_MEDIAN), n.L_ROLE)} / on ({RUN_BY}, {n.L_ROLE}) "
            f"({run_max(sel(n.MFU_BASELINE), n.L_ROLE)} > 0))")


def gpu_hours_accounted() -> str:
    """GPU-hours the ledger accounted per run: each bucket once (``max`` over the exporters that scrape the same
    run: two exporters of one run doubled the sum), then summed over buckets."""
    return f"sum by ({RUN_BY}) ({run_max(sel(n.GPU_SECONDS_TOTAL), n.L_BUCKET)}) / 3600"


def key_y(key: str, legend: str | None = None) -> Target:
    return Target(run_max(verl(key)), legend or f"{EXP} {key}", table=True)


NOW = Row("Now", (
    Panel("Time since last step (typical steps)",
          lambda CONFIG: ("Per run, now: seconds since its latest step divided by its typical step (median of recent normal "
          "steps), named and coloured by the stall stage it reached: running (green), info (yellow), warning (orange), "
          "critical (red), finished (blue). 1 is a step in progress. " + stage_desc(CONFIG) + " A run that stepped "
          "recently but stays high means its log stopped reaching omniwatch: check 'Data arriving'."),
          (Target(age_steps_by_stage(), RUN_LEGEND + " {{stage}}", instant=True),), unit="suffix: × typical step",
          kind="stat",
          w=5, h=8, decimals=1, thresholds=STALL_STEPS, fixed_colors=stage_colors(), runbook=n.ALERT_STALLED),
    Panel("Data arriving",
          "Is data reaching Prometheus at all? 'exporter' is up{job=\"omniwatch\"} (Prometheus scrapes the exporter; "
          "DOWN pages as OmniwatchSourceDown); each source is omniwatch_source_up (a log tail, the GPU sampler, "
          "discovery). A stalled run with every source up is a real stall; a source down explains missing steps.",
          (Target(f'min(up{{job="{CONFIG.selectors.job}"}}) or on () vector(0)', "exporter"),
           Target(f"min by ({n.L_SOURCE}) ({n.SOURCE_UP})", "{{source}}")),
          unit="none", kind="stat", w=3, h=8, scope="global", runbook=n.ALERT_SOURCE_DOWN,
          mappings=((1, "up", "green"), (0, "DOWN", "red"))),
    Panel("Age vs stall thresholds (typical steps)",
          lambda CONFIG: ("Per run, in its typical steps: time since its latest step (solid) against the run's own warning and "
          f"critical thresholds (dashed; the info line at {CONFIG.stall.notice_steps:g} is the same for every run). "
          + stage_desc(CONFIG) + " Log scale: a long stall does not flatten the others."),
          (Target(AGE_STEPS, EXP + " age"),
           Target(per_typical_step(run_max(sel(REC_STALL_WARNING))), EXP + " warning at", dashed=True),
           Target(per_typical_step(run_max(sel(REC_STALL_CRITICAL))), EXP + " critical at", dashed=True)),
          unit="suffix: × typical step", thresholds=STALL_STEPS, show_thresholds="dashed", log_scale=True,
          w=16, h=8, runbook=n.ALERT_STALLED),
    Panel("Runs",
          lambda CONFIG: ("One row per run: latest step; seconds since it and the same in typical steps (info at "
          f"{CONFIG.stall.notice_steps:g}); the stall stage it reached and where its warning and critical stages "
          "start, in typical steps (they add the run's planned work); whether a trainer process holds its log open "
          "(writing; closed: the trainer ended, finished or crashed; not seen: another node, a push feed); the "
          "fastest of the last k normal steps over the step-time baseline (StepTimeRegression above "
          f"{CONFIG.step_time.regression_ratio:g}); the median of the last k normal steps over the run's anchored "
          f"reference, the median of its first {CONFIG.window.reference} normal steps (step time vs run start: red "
          "above StepTimeRegression's creep threshold "
          f"{CONFIG.step_drift.ratio:g}; a lasting slowdown stays red, it never becomes the baseline); window minima "
          "of the reward-bound ratio (RewardBoundRollout "
          f"above {CONFIG.reward_bound.ratio:g}) and of the inter-stage idle ratio (InterStageIdleGPU above "
          f"{CONFIG.inter_stage_idle.ratio:g}; GPU evidence where sampled); the best window MFU over its baseline "
          f"(lowest role; MFUDrop below {CONFIG.mfu.drop_ratio:g}) and the window median MFU over the anchored MFU "
          f"reference (MFU vs reference, lowest role; red below the same {CONFIG.mfu.drop_ratio:g}: a run that lost "
          "44 % of its MFU is red even when one fast step keeps the best window step near the reference); the GPUs the ledger counts (omniwatch_run_gpus: "
          "from the run's keys, or --gpus) and the GPU-hours accounted so far (omniwatch_gpu_seconds_total, since "
          "omniwatch first saw the run); firing alerts (Watchdog left out). Colours are the rules' thresholds. "
          "Click a row for that run on the other dashboards."),
          (Target(run_max(sel(n.STEP)), "step", instant=True, table=True, unit="none"),
           Target(run_max(sel(REC_AGE)),
                  "last step age", instant=True, table=True, unit="s"),
           Target(AGE_STEPS, "age / typical step", instant=True, table=True, unit="none", thresholds=STALL_STEPS),
           Target(stall_stage(), "stall stage", instant=True, table=True, unit="none", mappings=STALL_STAGE_MAPPINGS),
           Target(per_typical_step(run_max(sel(REC_STALL_WARNING))), "warning at (typical steps)", instant=True,
                  table=True, unit="none"),
           Target(per_typical_step(run_max(sel(REC_STALL_CRITICAL))), "critical at (typical steps)", instant=True,
                  table=True, unit="none"),
           Target(f"{run_max(sel(n.RUN_LOG_OPEN))} or on ({RUN_BY}) 0 * {run_max(sel(n.STEP))} - 1", "log writer",
                  instant=True, table=True, unit="none", mappings=LOG_WRITER_MAPPINGS),
           Target(run_max(sel(REC_STEP_VS_BASELINE)),
                  "step / baseline", instant=True, table=True, unit="none",
                  thresholds=(Step(None, "green"), cfg_step("step_time.regression_ratio", "red"))),
           Target(step_vs_start(), "step time vs run start", instant=True, table=True, unit="none",
                  thresholds=(Step(None, "green"), cfg_step("step_drift.ratio", "red"))),
           Target(run_max(sel(REC_REWARD_BOUND_MIN)),
                  "reward-bound min", instant=True, table=True, unit="percentunit",
                  thresholds=(Step(None, "green"), cfg_step("reward_bound.ratio", "red"))),
           Target(run_max(idle_evidence()),
                  "idle min", instant=True, table=True, unit="percentunit",
                  thresholds=(Step(None, "green"), cfg_step("inter_stage_idle.ratio", "red"))),
           Target(f"min by ({RUN_BY}) ({sel(REC_MFU_VS_BASELINE)})", "MFU / baseline", instant=True, table=True, unit="percentunit",
                  thresholds=(Step(None, "red"), cfg_step("mfu.drop_ratio", "green"))),
           Target(mfu_vs_reference(), "MFU vs reference", instant=True, table=True, unit="percentunit",
                  thresholds=(Step(None, "red"), cfg_step("mfu.drop_ratio", "green"))),
           Target(run_max(sel(n.RUN_GPUS)), "GPUs", instant=True, table=True, unit="none"),
           Target(gpu_hours_accounted(), "GPU-hours", instant=True, table=True,
                  unit="suffix: GPU-h"),
           Target(firing_by_run(), "alerts firing", instant=True, table=True, unit="none",
                  thresholds=(Step(None, "green"), Step(1, "red", note="any firing alert of the run")))),
          unit="none", kind="table", w=24, h=8,
          runbook=(n.ALERT_STALLED, n.ALERT_STEP_REGRESSION, n.ALERT_REWARD_BOUND, n.ALERT_IDLE,
                   n.ALERT_MFU_DROP)),
))

def _top(expr: str, label: str) -> str:
    """Per run, the series of ``expr`` (labelled ``label``) with the highest value; a run without one shows
    ``label="none"`` at 0, so every run has its row."""
    return (f"topk by ({RUN_BY}) (1, {expr}) or on ({RUN_BY}) "
            f'label_replace(0 * {run_max(sel(n.STEP))}, "{label}", "none", "", "")')


def largest_phase() -> str:
    """Per run, the timed phase with the largest share of the latest step (label ``phase``)."""
    return _top(run_max(sel(REC_STAGE_SHARE), n.L_PHASE), n.L_PHASE)


def top_cause_per_day() -> str:
    """Per run, the cause of its step-time growth over the anchored reference that costs most, in GPU-hours per
    day at the current rate (omniwatch_step_regression_gpu_hours_per_day, label ``cause``)."""
    return _top(run_max(sel(n.STEP_REGRESSION_GPU_HOURS_PER_DAY), "cause"), "cause")


def top_waste_per_day() -> str:
    """Per run, the ledger bucket outside the step's phases (reward on the critical path, idle, checkpoint,
    validation, outside the step timer, stalled) that costs most GPU-hours per day (label ``bucket``)."""
    waste = "|".join(ledger.NON_PHASE)
    return _top(gpu_hours_per_day(**{n.L_BUCKET: "=~" + waste}), n.L_BUCKET)


def firing_alert() -> str:
    """Per run, one firing alert (critical before warning before info; label ``alertname``; ``none`` if none),
    valued by severity: 3 critical, 2 warning, 1 info."""
    ranked = " or ".join(f'{rank} * {run_max(alerts_sel(alertstate="firing", severity=sev), "alertname")}'
                         for rank, sev in ((3, "critical"), (2, "warning"), (1, "info")))
    return _top(f"max by ({RUN_BY}, alertname) ({ranked})", "alertname")


LAYOUT = "trainer, reward, async_mode"
# The one join that is not on the run: omniwatch_remedy_info is keyed by alert and layout (a handful of series,
# not one ~2 KB text per run); the run's layout labels come from omniwatch_run_info first.
REMEDY_JOIN = (f" * on (alertname, {LAYOUT}) group_left (remedy) "
               f"max by (alertname, {LAYOUT}, remedy) ({n.REMEDY_INFO})")


def firing_alert_remedy() -> str:
    """``firing_alert()`` with the alert's remedy text for the run's layout as label ``remedy``
    (omniwatch_remedy_info joined through omniwatch_run_info); a run without a firing alert, or an alert without
    a remedy, keeps its row without it."""
    with_layout = (f"({firing_alert()}) * on ({RUN_BY}) group_left ({LAYOUT}) "
                   f"{run_max(sel(n.RUN_INFO), 'trainer', 'reward', 'async_mode')}")
    joined = f"({with_layout}){REMEDY_JOIN}"
    return f"max by ({RUN_BY}, alertname, remedy) ({joined}) or on ({RUN_BY}) {firing_alert()}"


WHY_SLOW = Row("Why slow", (
    Panel("Why slow",
          lambda CONFIG: ("One row per run, what its step time goes to and what it costs: the timed phase with the largest share "
          "of the latest step (omniwatch_stage_duration_seconds / the step; the whole breakdown is 'Where the step "
          "goes' below); the part of the step that grew most over the run's anchored reference (the median of its "
          f"first {CONFIG.window.reference} normal steps) and what that growth costs in GPU-hours per day at the "
          "current pace "
          "(omniwatch_step_regression_gpu_hours_per_day, cause 'none' while nothing grew); the costliest ledger "
          "bucket outside the phases (reward on the critical path, inter-stage idle, checkpoint, validation, "
          "outside the step timer, stalled) in GPU-hours per day (omniwatch_gpu_hours_per_day); and the most "
          "severe firing alert of the run with its remedy: what to change, for this run's layout (trainer, reward, "
          "async mode: omniwatch_remedy_info joined through omniwatch_run_info; where the remedy quotes a run's own "
          "value or trainer config, the notification's text is the full one). The runbooks are the panel links."),
          (Target(largest_phase(), "largest phase share", instant=True, table=True, unit="percentunit"),
           Target(top_cause_per_day(), "growth cost (GPU-h/day)", instant=True, table=True, unit="none"),
           Target(top_waste_per_day(), "costliest non-phase bucket (GPU-h/day)", instant=True, table=True,
                  unit="none"),
           Target(firing_alert_remedy(), "most severe firing alert", instant=True, table=True, unit="none",
                  mappings=((0, "none", "green"), (1, "info", "yellow"), (2, "warning", "orange"),
                            (3, "critical", "red")))),
          unit="none", kind="table", w=24, h=6, decimals=1,
          runbook=(n.ALERT_STEP_REGRESSION, n.ALERT_REWARD_BOUND, n.ALERT_IDLE, n.ALERT_MFU_DROP,
                   n.ALERT_STALLED)),
))

ALERT_ROW = Row("Alerts", (
    Panel("Alerts of $experiment",
          "Firing (red) and pending (orange) omniwatch alerts of this run over time, one row per alert (Watchdog "
          "left out) and one per TrainingStalled stage ('TrainingStalled (info)', '(warning)', '(critical)': a "
          "stall escalates row by row). Pending means the condition holds and the short 'for' still absorbs "
          "scrape jitter. The same alerts are annotations on every time series.",
          (Target(alert_states_by_run(), EXP + " {{alertname}}"),),
          unit="none", kind="statetimeline", w=24, h=5, repeat=True,
          mappings=ALERT_STATE_MAPPINGS),
))

STEP_TIME = Row("Where the step goes", (
    Panel("Step time vs baseline",
          lambda CONFIG: ("Latest step time per run, the fastest of its last k normal steps, and "
          f"{CONFIG.step_time.regression_ratio:g} x its baseline (dashed). The window minimum above the dashed line "
          "is StepTimeRegression; a single spike above it is a validation or checkpoint step (annotated)."),
          (Target(run_max(sel(n.STEP_DURATION)), EXP + " latest step"),
           Target(run_max(sel(n.STEP_DURATION_WINDOW, stat="min")), EXP + " window min"),
           Target(f"{CONFIG.step_time.regression_ratio:g} * {run_max(sel(n.STEP_DURATION_BASELINE))}",
                  EXP + f" {CONFIG.step_time.regression_ratio:g} x baseline", dashed=True)),
          unit="s", w=24, h=8, runbook=n.ALERT_STEP_REGRESSION),
    Panel("Step time by phase: $experiment",
          "Seconds of the latest step per timed phase, stacked in step order (the exporter's phase list: "
          + ", ".join(PHASES) + "), one panel per run (a stack never mixes runs); 'untracked' is the step minus all "
          "timed phases (transfers, barriers, waiting). A growing 'reward' band is a reward-bound rollout; a growing "
          "'untracked' band is inter-stage idle GPU time; a single tall step is a validation or checkpoint step "
          "(annotated; save_checkpoint is its own band).",
          (Target(in_order(run_max(sel(n.STAGE_DURATION, phase='=~' + '|'.join(PHASES)), n.L_PHASE), n.L_PHASE,
                           PHASES), EXP + " {{phase}}"),),
          unit="s", stack=True, w=24, h=9, repeat=True, fixed_colors=phase_colors(PHASES),
          runbook=(n.ALERT_REWARD_BOUND, n.ALERT_IDLE)),
    step_xy("Seconds per phase by step: $experiment",
            "Seconds of each timed phase (and untracked) at each training step of this run (0 for a phase the run "
            "does not time).",
            *(Target(f"sum by ({RUN_BY}) ({run_max(sel(n.STAGE_DURATION, phase='=~' + ph), n.L_PHASE)}) "
                     f"or on ({RUN_BY}) 0 * {run_max(sel(n.STEP))}",
                     f"{EXP} {ph.replace('|', ' + ')}", table=True) for ph in XY_PHASES),
            unit="s", w=24, h=9, repeat=True),
))

GPU_HOURS = Row("GPU-hours", (gpu_hours_panel(),))

CURVES = Row("Learning curves by step", (
    step_xy("Reward mean", "critic/rewards/mean. Flat or falling for many steps means the policy is not improving on "
            "the reward model.", key_y(K_REWARD_MEAN, f"{EXP} reward mean")),
    step_xy("Reward spread within groups", "critic/rewards/std_mean: mean per-prompt reward std. Near zero means all "
            "samples of a prompt score alike and GRPO advantages vanish.", key_y(K_REWARD_STD_MEAN, f"{EXP} reward std")),
    step_xy("Zero-std groups", lambda CONFIG: ("critic/rewards/zero_std_ratio: share of prompt groups whose rewards are all equal (no "
            f"learning signal). RewardSaturation fires when the window minimum stays above "
            f"{CONFIG.reward_saturation.zero_std_ratio:g} (see 'Zero-std groups, window min')."),
            key_y(K_ZERO_STD, f"{EXP} zero-std ratio"), unit="percentunit", minimum=0, maximum=1,
            thresholds=(Step(None, "green"), cfg_step("reward_saturation.zero_std_ratio", "red")),
            runbook=n.ALERT_REWARD_SATURATION),
    step_xy("Validation reward", "Validation rewards (val-core/<data source>/reward/mean@N and val-aux keys), logged on "
            "test_freq steps; the line holds the last validation between them. Train reward rising while validation "
            "falls is reward hacking or overfitting to the training prompts.",
            Target(run_max(val_reward(), n.L_KEY), EXP + " {{key}}", table=True), w=8,
            keyed=run_max(val_reward(), n.L_KEY)),
    Panel("Zero-std groups, window min",
          lambda CONFIG: ("The series RewardSaturation thresholds: the lowest zero_std_ratio of the last k normal steps (every one of "
          f"them above {CONFIG.reward_saturation.zero_std_ratio:g} fires), with the latest step's value dashed."),
          (Target(sel(REC_ZERO_STD_MIN),
                  EXP + " window min"),
           Target(run_max(verl(K_ZERO_STD)), EXP + " latest step", dashed=True)),
          unit="percentunit", min=0, max=1,
          thresholds=(Step(None, "green"), cfg_step("reward_saturation.zero_std_ratio", "red")),
          show_thresholds="dashed+area", w=16, runbook=n.ALERT_REWARD_SATURATION),
))

RS_DESC = ("RolloutRejectionHigh reads the share of sequences rejection sampling masked (see 'Rejected sequences, "
           "window min').")
POLICY = Row("Policy update by step", (
    step_xy("Gradient norm", "actor/grad_norm. Spikes precede divergence; a steady climb is a learning rate too high "
            "for the batch. A step whose norm was NaN/Inf (logged null) skipped its update: no point at that step; "
            "GradNormNonFinite counts them (next panel).", key_y(K_GRAD_NORM, f"{EXP} grad_norm"), w=6,
            runbook=n.ALERT_GRAD_NONFINITE),
    Panel("Skipped updates (non-finite grad norm)",
          lambda CONFIG: ("The series GradNormNonFinite thresholds: how many of the run's last "
          f"{CONFIG.window.baseline} normal steps logged actor/grad_norm non-finite (VeRL-Omni zeroed the gradients "
          f"and skipped the optimizer step). {CONFIG.grad_norm.nonfinite_steps} or more fires; one is a bad batch."),
          (Target(sel(REC_GRAD_NONFINITE), EXP + " skipped updates"),),
          unit="none", min=0, max=CONFIG.window.baseline, decimals=0,
          thresholds=(Step(None, "green"), cfg_step("grad_norm.nonfinite_steps", "red")),
          show_thresholds="dashed+area", w=6, runbook=n.ALERT_GRAD_NONFINITE),
    step_xy("Clip fraction", "actor/pg_clipfrac (+ higher/lower). A jump means the update moved the policy far from "
            "the rollout policy (stale samples, too high a learning rate).",
            key_y(K_CLIPFRAC, f"{EXP} clipfrac"), key_y(K_CLIPFRAC_HIGHER, f"{EXP} higher"),
            key_y(K_CLIPFRAC_LOWER, f"{EXP} lower"), unit="percentunit", w=6),
    step_xy("KL (ppo_kl)", "actor/ppo_kl (~1e-3 on healthy runs; its own panel, log scale, so it is not flattened "
            "by ratios near 1). Spikes precede divergence.", key_y(K_PPO_KL, f"{EXP} ppo_kl"), log=True, w=6),
    step_xy("Importance ratio mean", "actor/ratio_mean (~1). Away from 1 means rollout and training policies "
            "diverge (weights not synced, off-policy drift). " + RS_DESC, key_y(K_RATIO_MEAN, f"{EXP} ratio mean"),
            runbook=n.ALERT_RS_REJECTION),
    step_xy("Importance ratio std", "actor/ratio_std (~1e-2). Growing means the rollout policy drifts from the "
            "trained one within a step. " + RS_DESC, key_y(K_RATIO_STD, f"{EXP} ratio std"),
            runbook=n.ALERT_RS_REJECTION),
    Panel("Rejected sequences, window min",
          lambda CONFIG: ("The series RolloutRejectionHigh thresholds, per rollout-correction mode (decoupled: "
          "rollout_corr/rollout_rs_seq_masked_fraction; bypass: actor/rollout_corr/...): the lowest share of "
          "sequences rejection sampling masked over the last k normal steps. Above "
          f"{CONFIG.rollout_rejection.seq_masked_fraction:g} in every one fires: the rollout backend drifts from "
          "the trainer. Only runs with algorithm.rollout_correction (rollout_rs) set log it."),
          (Target(run_max(sel(REC_RS_MASKED_MIN), n.L_MODE), EXP + " {{mode}}"),),
          unit="percentunit", min=0,
          thresholds=(Step(None, "green"), cfg_step("rollout_rejection.seq_masked_fraction", "red")),
          show_thresholds="dashed+area", w=8, runbook=n.ALERT_RS_REJECTION),
))

DASHBOARD = Dashboard(
    uid="omniwatch-run-overview",
    title="omniwatch / Run overview",
    description="Each VeRL-Omni run at a glance: alive, stalling (by stage) or finished, step and speed against its "
                "own baseline, alerts, step time by phase, where its GPU-hours went, and the learning curves against "
                "training step.",
    rows=(NOW, WHY_SLOW, ALERT_ROW, STEP_TIME, GPU_HOURS, CURVES, POLICY),
    tags=default_tags("overview"),
    variable_metrics=(n.STEP,),
)
