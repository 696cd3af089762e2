"""Run overview: is each run alive, where is it, how fast against its own baseline, where each step's
time goes, and the learning curves against training step (the way RL engineers read them in W&B).

Layout (top to bottom): Now (stall gauge top-left by stage, data arriving, age against each run's stall
thresholds, one table row per run) -> Alerts (firing alerts per run, TrainingStalled per stage) -> Where the
step goes (stacked phases in the exporter's order, one panel per run) -> GPU-hours (ledger buckets per run)
-> Learning curves by step -> Policy update by step (with skipped updates and rejected sequences).
"""
from __future__ import annotations

from .. import palette
from ..core import ledger
from .. import names as n
from ..config import Config
from ..core.analytics import (CAUSE_MIN_SHARE, K_CLIPFRAC, K_CLIPFRAC_HIGHER, K_CLIPFRAC_LOWER, K_GRAD_NORM, K_PPO_KL,
                         K_RATIO_MEAN, K_RATIO_STD, K_REWARD_MEAN, K_REWARD_STD_MEAN)
from ..core.signals import ZERO_STD
from ..alerting.records import (REC_AGE, REC_GRAD_NONFINITE, REC_MFU_MEDIAN, REC_MFU_VS_BASELINE, REC_REWARD_BOUND_MIN,
                                REC_RS_MASKED_MIN, REC_STALL_CRITICAL, REC_STALL_INFO, REC_STALL_WARNING, REC_STEP_MEDIAN,
                                REC_STAGE_SHARE, REC_STEP_VS_BASELINE,
                                REC_ZERO_STD_MIN)
from .panels import by_run, AGE_STEPS, ALERT_STATE_MAPPINGS, alerts_sel, Dashboard, EXP, PHASES, Panel, RUN_BY, RUN_LEGEND, Row, Step, STALL_STAGE_MAPPINGS, Target, age_steps_by_stage, alert_states_by_run, cfg_step, default_tags, firing_by_run, gpu_hours_panel, idle_evidence, in_order, per_typical_step, phase_colors, run_max, sel, stage_colors, stall_stage, verl

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

def latest_phases() -> str:
    """Seconds of each timed phase of the run's latest step, in step order, while the run steps: a stall past
    TrainingStalled's info threshold leaves a gap (issue 32 item 7: the stack was held flat through a hang)."""
    phases = in_order(run_max(sel(n.STAGE_DURATION, phase='=~' + '|'.join(PHASES)), n.L_PHASE), n.L_PHASE, PHASES)
    return f"{phases} unless on ({RUN_BY}) ({run_max(sel(REC_AGE))} > on ({RUN_BY}) {run_max(sel(REC_STALL_INFO))})"


def xy_phase_colors() -> tuple[tuple[str, str], ...]:
    """The XY chart's phase columns in the phase palette (a merged column takes its first phase's colour)."""
    import re
    return tuple((f".* {re.escape(ph.replace('|', ' + '))}", palette.color(ph.split("|")[0])) for ph in XY_PHASES)


def stall_steps(cfg: Config) -> tuple[Step, ...]:
    return (Step(None, "green"), cfg_step(cfg, "stall.notice_steps", "yellow"))


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
            keyed: str = "", fixed_colors: tuple = ()) -> Panel:
    """A learning curve against training step: the first target is the run's step (x), the others y.
    ``keyed``: the single y target has several series per run told apart by its ``key`` label; the step is
    then given once per key (x_by_key) so the merge pairs every key with its step (issue 26 item 6)."""
    x = Target(x_by_key(keyed) if keyed else run_max(sel(n.STEP)), "step", table=True)
    x_axis = " X axis: training step (omniwatch_step), one line per run."
    return Panel(title, (lambda c: description(c) + x_axis) if callable(description) else description + x_axis,
                 (x, *targets), unit=unit, kind="xychart", w=w, h=h, runbook=runbook, repeat=repeat,
                 log_scale=log, min=minimum, max=maximum, thresholds=thresholds,
                 xy_labels=(n.L_KEY,) if keyed else (), fixed_colors=fixed_colors)


def x_by_key(y_expr: str) -> str:
    """The run's step once per series of ``y_expr`` (labels project, experiment, key): Grafana's merge joins
    table rows on their common fields, so a step row without ``key`` would pair with one key only and drop the
    others (val-core lost to val-aux)."""
    return f"{run_max(sel(n.STEP))} + on ({RUN_BY}) group_right () (0 * {y_expr})"


def step_vs_start() -> str:
    """Median of the run's last k normal steps / its anchored step-time reference (the median of the trainer
    incarnation's first 20 normal steps, omniwatch_step_duration_baseline_seconds): what StepTimeRegression's creep
    condition judges,
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


# --- Why slow: the costliest cause first (issue 32 item 1) -------------------------------------------------------------
def _top(expr: str, label: str) -> str:
    """Per run, the series of ``expr`` (labelled ``label``) with the highest value; a run without one shows
    ``label="none"`` at 0, so every run has its row."""
    return (f"topk by ({RUN_BY}) (1, {expr}) or on ({RUN_BY}) "
            f'label_replace(0 * {run_max(sel(n.STEP))}, "{label}", "none", "", "")')


def largest_phase() -> str:
    """Per run, the timed phase with the largest share of the latest step (label ``phase``)."""
    return _top(run_max(sel(REC_STAGE_SHARE), n.L_PHASE), n.L_PHASE)


PART = "part"            # what a row's cost is the cost of (a ledger bucket, the cause that grew, "stalled", ...)
ANCHOR = "anchor"        # the alert's runbook section (its name lower-cased: config.runbook_url)
CASE = ("cause", "role", "engine", "mode")  # the alert labels a remedy may branch on (remedy_info.CASE_LABELS)
FINDING = "no GPU-time cost"
NOTHING_GREW = "nothing grew"
# added to a firing alert's cost to break ties by severity: under 0.004 GPU-hours per day (binary fractions, so a
# cost plus its tie-break is exact)
SEVERITY_TIEBREAK = (("critical", 2 ** -8), ("warning", 2 ** -9), ("info", 2 ** -10))


def _firing(alertname: str, *labels: str, **extra: str) -> str:
    return (f"max by ({by_run('alertname', 'severity', *labels)}) "
            f"({alerts_sel(alertstate='firing', alertname=alertname, **extra)})")


def _priced(alertname: str, cost: str, part: str, by: tuple[str, ...] = (), **extra: str) -> str:
    """The firing alert's series valued at what it costs now (``cost``, GPU-hours per day, one series per run and
    ``by``; 0 while absent), labelled ``part`` (a literal, or ``$1`` of the ``cause`` label)."""
    a = _firing(alertname, *by, **extra)
    valued = f"({a} * 0 + on ({by_run(*by)}) group_left () ({cost})) or ({a} * 0)"
    if part.startswith("$"):
        return f'label_replace({valued}, "{PART}", "{part}", "cause", "(.*)")'
    return f'label_replace({valued}, "{PART}", "{part}", "", "")'


def _bucket_per_day(bucket: str) -> str:
    """The exporter's rate of a ledger bucket (a stall is TrainingStalled's cost: the run's GPUs x 24)."""
    return run_max(sel(n.GPU_HOURS_PER_DAY, **{n.L_BUCKET: bucket}))


def _growth_per_day(*labels: str, **extra: str) -> str:
    return run_max(sel(n.STEP_REGRESSION_GPU_HOURS_PER_DAY, **extra), *labels)


# Each alert that costs GPU time, what it costs now (GPU-hours per day at the current rate, the series the other
# columns and the alert descriptions quote) and the part of the step it names. Every other firing alert is a
# finding without a GPU-time cost of its own (valued 0).
def priced_alerts() -> list[str]:
    return [
        # past its warning every GPU of the run waits; at info it may be planned work (a checkpoint, a validation):
        # no cost of its own yet, so a slow scrape never puts a notice above what the run really loses
        _priced(n.ALERT_STALLED, f"24 * {run_max(sel(n.RUN_GPUS))}", ledger.STALLED, severity="=~warning|critical"),
        _priced(n.ALERT_STALLED, "vector(0)", "perhaps planned work", severity="info"),
        # a failed Ray job holds every GPU of the run until someone restarts it
        _priced(n.ALERT_CRASHED, f"24 * {run_max(sel(n.RUN_GPUS))}", ledger.STALLED),
        _priced(n.ALERT_REWARD_BOUND, _bucket_per_day(ledger.REWARD), ledger.REWARD),
        _priced(n.ALERT_IDLE, _bucket_per_day(ledger.IDLE), ledger.IDLE),
        _priced(n.ALERT_OUTSIDE_STEP, _bucket_per_day(ledger.OUTSIDE), ledger.OUTSIDE),
        _priced(n.ALERT_STEP_REGRESSION, _growth_per_day("cause"), "$1", ("cause",)),
        _priced(n.ALERT_MFU_DROP, _growth_per_day(cause="actor"), "actor"),
    ]


PRICED = (n.ALERT_STALLED, n.ALERT_REWARD_BOUND, n.ALERT_IDLE, n.ALERT_OUTSIDE_STEP, n.ALERT_STEP_REGRESSION,
          n.ALERT_MFU_DROP, n.ALERT_CRASHED)


def firing_costs() -> str:
    """Every firing alert of every selected run, valued at what it costs now (GPU-hours per day) plus a tie-break of
    under 0.004 by severity (critical before warning before info), labelled ``part``. The alert labels its remedy
    branches on are kept (``cause`` of StepTimeRegression; ``role`` / ``engine`` of RolloutQueueSaturated, ``mode``
    of RolloutRejectionHigh), every other label aggregated away."""
    # the role label matters to RolloutQueueSaturated's remedy only (RankStraggler's and the MFU alerts' role names a
    # worker group or an MFU key): aggregated away for the others, so two roles of one finding are one row that joins
    # its remedy's (a label_replace blanking it made duplicate series: a query error with every run selected)
    def finding(names_: str, *labels: str) -> str:
        return (f'label_replace(max by ({by_run("alertname", "severity", *labels)}) '
                f'({alerts_sel(alertstate="firing", alertname=names_)}) * 0, "{PART}", "{FINDING}", "", "")')
    others = (f"{finding(n.ALERT_ROLLOUT_SATURATED, 'role', 'engine')} or "
              f"{finding('!~' + '|'.join((*PRICED, n.ALERT_WATCHDOG, n.ALERT_ROLLOUT_SATURATED)), 'mode')}")
    union = " or ".join(f"({t})" for t in (*priced_alerts(), others))
    tiebreak = " or ".join(f"{v!r} * {run_max(alerts_sel(alertstate='firing', severity=sev), 'alertname', 'severity')}"
                           for sev, v in SEVERITY_TIEBREAK)
    return f"({union}) + on ({by_run('alertname', 'severity')}) group_left () ({tiebreak})"


def with_action(expr: str, *labels: str) -> str:
    """``expr`` (series of firing alerts: run, alertname, severity and the labels a remedy branches on) with the
    remedy's one-line ``action`` (and ``labels``: ``remedy``, its full text) for that run's layout and trainer config
    (omniwatch_run_remedy -> omniwatch_remedy_info, the one join not on the run: a text is keyed by its variant);
    a series without one keeps its row without them."""
    keys = by_run("alertname", "severity", *CASE)
    texts = ", ".join(("action", *labels))
    joined = (f"({expr}) * on ({keys}) group_left (variant) max by ({keys}, variant) ({sel(n.RUN_REMEDY)}) "
              f"{REMEDY_JOIN.format(texts=texts)}")
    return f"({joined}) or on ({keys}) ({expr})"


REMEDY_JOIN = f"* on (variant) group_left ({{texts}}) max by (variant, {{texts}}) ({n.REMEDY_INFO})"


def runbook_anchor(expr: str) -> str:
    """``expr`` with label ``anchor`` = its alert's runbook section (the name lower-cased, as config.runbook_url
    links it; PromQL cannot lower-case, so each known alert is one label_replace)."""
    for a in sorted({getattr(n, x) for x in dir(n) if x.startswith("ALERT_")}):
        expr = f'label_replace({expr}, "{ANCHOR}", "{a.lower()}", "alertname", "{a}")'
    return expr


def nothing_firing() -> str:
    """A run without a firing alert: the part of its step that grew (the exporter's kept cause,
    omniwatch_step_regression_top == 1, and only while it grew by CAUSE_MIN_SHARE of the reference step: the
    exporter names the largest growth even when it is noise) with what that costs now, else "nothing grew" at 0
    (issue 32: a healthy run named a growth cause)."""
    grown = (f"{_growth_per_day('cause')} and on ({RUN_BY}, cause) "
             f"({run_max(sel(n.STEP_REGRESSION_TOP), 'cause')} == 1) and on ({RUN_BY}, cause) "
             f"({run_max(sel(n.STEP_REGRESSION), 'cause')} > on ({RUN_BY}) group_left () "
             f"{CAUSE_MIN_SHARE:g} * {run_max(sel(n.STEP_DURATION_BASELINE))})")
    grew = f'label_replace(label_replace({grown}, "{PART}", "$1", "cause", "(.*)"), "alertname", "none", "", "")'
    nothing = (f'label_replace(label_replace(0 * {run_max(sel(n.STEP))}, "alertname", "none", "", ""), '
               f'"{PART}", "{NOTHING_GREW}", "", "")')
    return f"max by ({RUN_BY}, alertname, {PART}) ({grew}) or on ({RUN_BY}) {nothing}"


def quiet_run() -> str:
    """A run with nothing firing: one row that says so (every run's copy of the full-remedy panel has its row)."""
    return (f'label_replace(label_replace(0 * {run_max(sel(n.STEP))}, "alertname", "none", "", ""), "action", '
            f'"nothing is firing for this run", "", "")')


def costliest() -> str:
    """Per run one row: the firing alert that costs most now (ties by severity), what it costs (``part``, value in
    GPU-hours per day) and its one-line action; a run with nothing firing: ``nothing_firing``. The alert, its part
    and its cost come from one series, so they always agree."""
    top = f"topk by ({RUN_BY}) (1, {firing_costs()})"
    return runbook_anchor(f"{with_action(top)} or on ({RUN_BY}) ({nothing_firing()})")


def why_slow_row(cfg: Config) -> Row:
    runbooks = (n.ALERT_REWARD_BOUND, n.ALERT_IDLE, n.ALERT_STEP_REGRESSION, n.ALERT_MFU_DROP,
                n.ALERT_OUTSIDE_STEP, n.ALERT_STALLED, n.ALERT_CRASHED)
    return Row("Why slow", (
        Panel("Why slow",
              f"One row per run, the costliest on top: the firing alert that costs most GPU time now (GPU-hours per "
              "day at the current rate: reward on the critical path, idle between phases, outside the step timer, the "
              "part of the step that grew over the run's anchored reference, or every GPU of a run stalled past its "
              "warning; ties broken by severity), the "
              "part of the step it is the cost of, and its one-line fix for this run's layout and trainer config "
              "(omniwatch_run_remedy -> omniwatch_remedy_info). Alert, part and cost come from one series. A run with "
              "nothing firing shows the part of its step that grew over its reference (the median of its first "
              f"{cfg.window.reference} normal steps) and its cost, or 'nothing grew'. Click a row for the alert's "
              "runbook section; 'Why slow: the full remedy' below holds the whole text for each run; the largest "
              "phase share is the latest step's.",
              (Target(costliest(), "GPU-h/day now", instant=True, table=True, unit="none"),
               Target(largest_phase(), "largest phase share", instant=True, table=True, unit="percentunit")),
              unit="none", kind="table", w=24, h=10, decimals=1, runbook=runbooks,
              columns=(("experiment", "run", None), ("alertname", "costliest firing alert", None),
                       (PART, "cost of", None), ("Value #A", "GPU-h/day now", None),
                       ("action", "what to do", "wrap"), ("severity", "severity", None),
                       (n.L_PHASE, "largest phase", None), ("Value #B", "its share", None)),
              hide_columns=("project", "variant", ANCHOR, *CASE), sort_desc="GPU-h/day now",
              row_links=(("Runbook: ${__data.fields.alertname}", f"{cfg.runbook_base}#${{__data.fields.{ANCHOR}}}"),)),
    ))


def remedy_row(cfg: Config) -> Row:
    return Row("Why slow: the full remedy", (
        Panel("Remedy: $experiment",
              "Every alert firing for this run, the costliest first (GPU-hours per day now), with its one-line action "
              "and the full remedy for this run's layout and trainer config, as the alert notification says it "
              "(values the notification quotes from other live series, e.g. the device peak, read the layout "
              "default here). Click a row for the alert's runbook section.",
              (Target(runbook_anchor(f"{with_action(firing_costs(), 'remedy')} or on ({RUN_BY}) {quiet_run()}"),
                      "GPU-h/day now", instant=True, table=True, unit="none"),),
              unit="none", kind="table", w=24, h=8, decimals=1, repeat=True,
              columns=(("alertname", "alert", None), (PART, "cost of", None), ("Value", "GPU-h/day now", None),
                       ("action", "what to do", "wrap"), ("remedy", "the full remedy", "wrap")),
              hide_columns=("project", "experiment", "variant", ANCHOR, "severity", *CASE), sort_desc="GPU-h/day now",
              row_links=(("Runbook: ${__data.fields.alertname}", f"{cfg.runbook_base}#${{__data.fields.{ANCHOR}}}"),)),
    ), collapsed=True)


def dashboard(cfg: Config) -> Dashboard:
    """This dashboard drawn with ``cfg`` (thresholds, windows, selectors, the words of its descriptions)."""
    STALL_STEPS = stall_steps(cfg)
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
              "Is data reaching Prometheus at all? 'exporter' is up{job=\"" + cfg.selectors.job + "\"} (Prometheus scrapes the exporter; "
              "DOWN pages as OmniwatchSourceDown); each source is omniwatch_source_up (a log tail, the GPU sampler, "
              "discovery). A stalled run with every source up is a real stall; a source down explains missing steps.",
              (Target(f'min(up{{job="{cfg.selectors.job}"}}) or on () vector(0)', "exporter"),
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
               # no colour of its own: the stage it reached depends on the run's planned work (the next column says it;
               # a fixed info-threshold colour stayed yellow while the run was critical)
               Target(AGE_STEPS, "age / typical step", instant=True, table=True, unit="none"),
               Target(stall_stage(), "stall stage", instant=True, table=True, unit="none", mappings=STALL_STAGE_MAPPINGS),
               Target(per_typical_step(run_max(sel(REC_STALL_WARNING))), "warning at (typical steps)", instant=True,
                      table=True, unit="none"),
               Target(per_typical_step(run_max(sel(REC_STALL_CRITICAL))), "critical at (typical steps)", instant=True,
                      table=True, unit="none"),
               Target(f"{run_max(sel(n.RUN_LOG_OPEN))} or on ({RUN_BY}) 0 * {run_max(sel(n.STEP))} - 1", "log writer",
                      instant=True, table=True, unit="none", mappings=LOG_WRITER_MAPPINGS),
               Target(run_max(sel(REC_STEP_VS_BASELINE)),
                      "step / baseline", instant=True, table=True, unit="none",
                      thresholds=(Step(None, "green"), cfg_step(cfg, "step_time.regression_ratio", "red"))),
               Target(step_vs_start(), "step time vs run start", instant=True, table=True, unit="none",
                      thresholds=(Step(None, "green"), cfg_step(cfg, "step_drift.ratio", "red"))),
               Target(run_max(sel(REC_REWARD_BOUND_MIN)),
                      "reward-bound min", instant=True, table=True, unit="percentunit",
                      thresholds=(Step(None, "green"), cfg_step(cfg, "reward_bound.ratio", "red"))),
               Target(run_max(idle_evidence()),
                      "idle min", instant=True, table=True, unit="percentunit",
                      thresholds=(Step(None, "green"), cfg_step(cfg, "inter_stage_idle.ratio", "red"))),
               Target(f"min by ({RUN_BY}) ({sel(REC_MFU_VS_BASELINE)})", "MFU / baseline", instant=True, table=True, unit="percentunit",
                      thresholds=(Step(None, "red"), cfg_step(cfg, "mfu.drop_ratio", "green"))),
               Target(mfu_vs_reference(), "MFU vs reference", instant=True, table=True, unit="percentunit",
                      thresholds=(Step(None, "red"), cfg_step(cfg, "mfu.drop_ratio", "green"))),
               Target(run_max(sel(n.RUN_GPUS)), "GPUs", instant=True, table=True, unit="none"),
               Target(gpu_hours_accounted(), "GPU-hours", instant=True, table=True,
                      unit="suffix: GPU-h"),
               Target(firing_by_run(), "alerts firing", instant=True, table=True, unit="none",
                      thresholds=(Step(None, "green"), Step(1, "red", note="any firing alert of the run")))),
              unit="none", kind="table", w=24, h=8,
              runbook=(n.ALERT_STALLED, n.ALERT_STEP_REGRESSION, n.ALERT_REWARD_BOUND, n.ALERT_IDLE,
                       n.ALERT_MFU_DROP)),
    ))

    WHY_SLOW = why_slow_row(cfg)
    REMEDY_ROW = remedy_row(cfg)

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
               Target(f"{cfg.step_time.regression_ratio:g} * {run_max(sel(n.STEP_DURATION_BASELINE))}",
                      EXP + f" {cfg.step_time.regression_ratio:g} x baseline", dashed=True)),
              unit="s", w=24, h=8, runbook=n.ALERT_STEP_REGRESSION),
        Panel("Step time by phase: $experiment",
              "Seconds of the latest step per timed phase, stacked in step order (the exporter's phase list: "
              + ", ".join(PHASES) + "), one panel per run (a stack never mixes runs); 'untracked' is the step minus all "
              "timed phases (transfers, barriers, waiting). A growing 'reward' band is a reward-bound rollout; a growing "
              "'untracked' band is inter-stage idle GPU time; a single tall step is a validation or checkpoint step "
              "(annotated; save_checkpoint is its own band, drawn for the step that saved only: a phase a step did not "
              "time is a gap, never a line from the previous time it was timed). While the run has no step for longer "
              "than TrainingStalled's info threshold the stack stops: a stall is a gap, not the last step held flat.",
              (Target(latest_phases(), EXP + " {{phase}}"),),
              unit="s", stack=True, w=24, h=9, repeat=True, fixed_colors=phase_colors(PHASES),
              runbook=(n.ALERT_REWARD_BOUND, n.ALERT_IDLE)),
        step_xy("Seconds per phase by step: $experiment",
                "Seconds of each timed phase (and untracked) at each training step of this run (0 for a phase the run "
                "does not time).",
                *(Target(f"sum by ({RUN_BY}) ({run_max(sel(n.STAGE_DURATION, phase='=~' + ph), n.L_PHASE)}) "
                         f"or on ({RUN_BY}) 0 * {run_max(sel(n.STEP))}",
                         f"{EXP} {ph.replace('|', ' + ')}", table=True) for ph in XY_PHASES),
                unit="s", w=24, h=9, repeat=True, fixed_colors=xy_phase_colors()),
    ))

    GPU_HOURS = Row("GPU-hours", (gpu_hours_panel(cfg),))

    CURVES = Row("Learning curves by step", (
        step_xy("Reward mean", "critic/rewards/mean. Flat or falling for many steps means the policy is not improving on "
                "the reward model.", key_y(K_REWARD_MEAN, f"{EXP} reward mean")),
        step_xy("Reward spread within groups", "critic/rewards/std_mean: mean per-prompt reward std. Near zero means all "
                "samples of a prompt score alike and GRPO advantages vanish.", key_y(K_REWARD_STD_MEAN, f"{EXP} reward std")),
        step_xy("Zero-std groups", lambda CONFIG: ("critic/rewards/zero_std_ratio: share of prompt groups whose rewards are all equal (no "
                f"learning signal). RewardSaturation fires when the window minimum stays above "
                f"{CONFIG.reward_saturation.zero_std_ratio:g} (see 'Zero-std groups, window min')."),
                key_y(ZERO_STD.key, f"{EXP} zero-std ratio"), unit="percentunit", minimum=0, maximum=1,
                thresholds=(Step(None, "green"), cfg_step(cfg, "reward_saturation.zero_std_ratio", "red")),
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
               Target(run_max(verl(ZERO_STD.key)), EXP + " latest step", dashed=True)),
              unit="percentunit", min=0, max=1,
              thresholds=(Step(None, "green"), cfg_step(cfg, "reward_saturation.zero_std_ratio", "red")),
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
              unit="none", min=0, max=cfg.window.baseline, decimals=0,
              thresholds=(Step(None, "green"), cfg_step(cfg, "grad_norm.nonfinite_steps", "red")),
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
              thresholds=(Step(None, "green"), cfg_step(cfg, "rollout_rejection.seq_masked_fraction", "red")),
              show_thresholds="dashed+area", w=8, runbook=n.ALERT_RS_REJECTION),
    ))

    return Dashboard(
        config=cfg,
        uid="omniwatch-run-overview",
        title="omniwatch / Run overview",
        description="Each VeRL-Omni run at a glance: alive, stalling (by stage) or finished, step and speed against its "
                    "own baseline, alerts, step time by phase, where its GPU-hours went, and the learning curves against "
                    "training step.",
        rows=(NOW, WHY_SLOW, REMEDY_ROW, ALERT_ROW, STEP_TIME, GPU_HOURS, CURVES, POLICY),
        tags=default_tags("overview"),
        variable_metrics=(n.STEP,),
    )
