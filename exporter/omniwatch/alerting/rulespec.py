"""The omniwatch rules as data, built from one :class:`~.config.Config`.

``rule_files(cfg)`` returns every generated rule file (name -> header + groups); ``omniwatch rules
generate`` writes them to ``alerts/``. Expressions, ``for:``, labels and annotations are all here;
thresholds come from ``cfg``; alert prose is :class:`~.prose.Prose` (one text for the annotation
template; the offline report and docs render remedies from it; the promtool tests
state their expected text literally in alerts/tests/); remedies come from :mod:`.remedies`.

Conventions (kubernetes-mixin): recording rules are ``level:metric:operations`` and fold a run scraped
from several exporters into one series (``max by (project, experiment)``); a recording rule an alert
reads sits in the alert's group, before it (rules of a group run in order at one timestamp, so the
alert sees this evaluation's value); step-based alerts carry ``persistence: steps`` (Alertmanager
inhibits them while TrainingStalled fires for the run).
"""
from __future__ import annotations

import re
from operator import attrgetter

from .. import names as n
from ..core.signals import SIGNALS, Signal
from . import endpoints, rankstraggler, remedies, stalls
from ..config import Config
from .rule import RUN_BY, AlertSpec, Group, Record, RuleFile, hysteresis, pct, sel
from .prose import AT_STEP, K, RUN, Label, LabelIf, P, Part, Query, QueryLabel, SeriesValue, ShiftShape, Value, remedy
from .records import REC_AGE, REC_GPU_IDLE_MIN, REC_GPU_MEMORY, REC_GRAD_NONFINITE, REC_IDLE_MEDIAN, REC_IDLE_MIN, REC_MFU_MAX, REC_MFU_MEDIAN, REC_MFU_MIN, REC_MFU_MIN_PER_GPU, REC_MFU_VS_BASELINE, REC_OUTSIDE_MIN, REC_REGRESSION_CAUSE_TOP, REC_REWARD_BOUND_MEDIAN, REC_REWARD_BOUND_MIN, REC_REWARD_STEP_SHARE_MIN, REC_RS_MASKED_MIN, REC_STAGE_SHARE, REC_MFU_DRIFT, REC_MFU_MEDIAN_VS_BASELINE, REC_STEP_DRIFT, REC_STEP_MEDIAN, REC_STEP_RATIO_MEDIAN, REC_WORKLOAD, REC_PART_GROWTH_MEDIAN, REC_PART_GROWTH_MIN, REC_STEP_MIN, REC_STEP_VS_BASELINE, REC_STRAGGLER_MIN, REC_TIMER_RESIDUAL_MAX

RELABELED = 'cause="relabeled_sku"'


def cost(bucket: str, what: str) -> SeriesValue:
    """" At the current rate <what> costs ≈N GPU-hours per day." from the ledger (exporter: the bucket's share of
    the window's step time x GPUs x 24 h); nothing while the run's GPUs are unknown."""
    return SeriesValue(n.GPU_HOURS_PER_DAY, "f0", f" At the current rate {what} costs about ", " GPU-hours per day.",
                       fixed=(("bucket", bucket),))


def regression_cost(cause: str | None = None) -> Part:
    """What the regression's cause costs per day: the growth over the baseline x GPUs x 24 h."""
    text = (" At the current rate the growth costs about ", " GPU-hours per day.")
    if cause is None:
        return Query(n.STEP_REGRESSION_GPU_HOURS_PER_DAY, "f0", *text, matchers="cause=%q", label_args=("cause",))
    return SeriesValue(n.STEP_REGRESSION_GPU_HOURS_PER_DAY, "f0", *text, fixed=(("cause", cause),))


def _window(cfg: Config, metric: str, stat: str, by: str = RUN_BY) -> str:
    stat_m = f'stat="{stat}"'
    return f"max by ({by}) ({sel(cfg, metric, stat_m)})"


# --- omniwatch.rules.yml ------------------------------------------------------------------------------
def records(cfg: Config) -> Group:
    return Group("omniwatch.records", [
        Record(REC_REWARD_BOUND_MEDIAN, _window(cfg, n.REWARD_BOUND_WINDOW, "median")),
        Record(REC_IDLE_MEDIAN, _window(cfg, n.IDLE_WINDOW, "median")),
        Record(REC_MFU_MEDIAN, _window(cfg, n.MFU_WINDOW, "median", RUN_BY + ", role")),
        Record(REC_STEP_MEDIAN, _window(cfg, n.STEP_DURATION_WINDOW, "median")),
        Record(REC_STAGE_SHARE,
               f"max by ({RUN_BY}, phase) ({sel(cfg, n.STAGE_DURATION)})\n"
               f"  / on ({RUN_BY}) group_left ()\n"
               f"max by ({RUN_BY}) ({sel(cfg, n.STEP_DURATION)} > 0)",
               comment="Stage shares of the latest step (phase=\"untracked\" included)."),
    ], "Dashboard-only aggregates: smoothed (window-median) signals and where the latest step went.")


def _median(cfg: Config, metric: str, by: str = RUN_BY) -> str:
    return _window(cfg, metric, "median", by)


def _held(name: str, fire: str, hold: str, value: str, by: str = RUN_BY, static: dict | None = None,
          sticky: tuple[str, ...] = (), unheld: dict[str, str] | None = None) -> str:
    """Fires on ``fire``; once firing, stays while ``hold`` holds. Held, the alert's value is ``value`` (the statistic
    it fired on: the window's min, say, while ``hold`` judges its median), so its text says the same thing in both."""
    return hysteresis(fire, f"{value}\n  and on ({by})\n{hold}", name, by, static, sticky, unheld)


# StepTimeRegression causes that an alert of their own names (Alertmanager inhibits the regression while it fires):
# the regression is not held for them, so it never outlives that alert at the end of an episode (it would be sent
# the moment the inhibition lifts). A cause no alert of its own covers (rollout, weight_sync, other) is held.
OWNED_CAUSES = {"reward": n.ALERT_REWARD_BOUND, "inter_stage_idle": n.ALERT_IDLE, "actor": n.ALERT_MFU_DROP}


# "— a step change at step N" / "a creep of X% over N steps (from step M)", and where the reference comes from.
STEP_SHAPE = ShiftShape("step_time", prefix="; what was seen: ")
REFERENCE_NOTE = P(
    SeriesValue(n.REFERENCE_SHIFT_STEP, "f0", " (the reference holds a level shift at step ",
                ": it is the steps before it)"),
    SeriesValue(n.REFERENCE_INFO, "f0", " (the reference was kept across the trainer restart: the same workload "
                "resumed)", fixed=(("origin", "kept"),), show=False))


def steps(cfg: Config) -> Group:
    c = cfg
    rules: list = []
    add = rules.append

    # RewardBoundRollout --------------------------------------------------------------------------------
    add(Record(REC_REWARD_BOUND_MIN, _window(c, n.REWARD_BOUND_WINDOW, "min"),
               comment="Reward scoring's share of the generation window, lowest over the window."))
    add(Record(REC_REWARD_STEP_SHARE_MIN, _window(c, n.REWARD_STEP_SHARE_WINDOW, "min"),
               comment="Reward seconds on the critical path / step seconds, lowest over the window."))
    add(AlertSpec(
        n.ALERT_REWARD_BOUND,
        _held(n.ALERT_REWARD_BOUND,
                  f"{REC_REWARD_BOUND_MIN} > {c.reward_bound.ratio:g}\n"
                  f"  and on ({RUN_BY}) {REC_REWARD_STEP_SHARE_MIN} > {c.reward_bound.step_share:g}",
                  f"{_median(c, n.REWARD_BOUND_WINDOW)} > {c.reward_bound.resolve_ratio:g}\n"
                  f"  and on ({RUN_BY}) {_median(c, n.REWARD_STEP_SHARE_WINDOW)} > {c.reward_bound.resolve_step_share:g}",
                  REC_REWARD_BOUND_MIN),
        "warning", "Reward scoring is on the critical path of rollout.",
        P(RUN, ": reward scoring held at least ", Value("pct"), " of the generation window (gen + reward) in every one "
          "of the last ", K, f" normal steps (threshold {pct(c.reward_bound.ratio)}) and at least "
          f"{pct(c.reward_bound.step_share)} of each step", AT_STEP, ". Rollout GPUs wait for the reward model.",
          cost("reward_critical_path", "reward on the critical path"),
          f" It resolves when the window median is back under {pct(c.reward_bound.resolve_ratio)}."),
        c.step_for, {"persistence": "steps"}, remedies.reward_bound(), step=True,
        comment="Reward must both hold the generation window and matter to the step (actor-dominated steps "
                    "gain little from a reward pool). Held while the window medians stay above the resolve thresholds.",
        resolve=f"window medians > {c.reward_bound.resolve_ratio:g} and > {c.reward_bound.resolve_step_share:g}"))

    # InterStageIdleGPU ---------------------------------------------------------------------------------
    add(Record(REC_IDLE_MIN, _window(c, n.IDLE_WINDOW, "min"),
               comment="Untracked (between-phase) share of the step, lowest over the window."))
    add(Record(REC_GPU_IDLE_MIN, _window(c, n.GPU_INTER_STAGE_IDLE_WINDOW, "min"),
               comment="GPU-measured inter-stage idle share of the step (omniwatch's NVML sampler), lowest over the\n"
                       "window; present only where the run's GPUs are sampled (max: the worst node's GPUs)."))
    idle_tail = P(AT_STEP, ".", cost("inter_stage_idle", "the time between phases"),
                  f" It resolves when the window median is back under {pct(c.inter_stage_idle.resolve_ratio)}.")
    idle_resolve = f"window median > {c.inter_stage_idle.resolve_ratio:g}"
    add(AlertSpec(
        n.ALERT_IDLE,
        _held(n.ALERT_IDLE, f"{REC_GPU_IDLE_MIN} > {c.inter_stage_idle.ratio:g}",
                  f"{_median(c, n.GPU_INTER_STAGE_IDLE_WINDOW)} > {c.inter_stage_idle.resolve_ratio:g}",
                  REC_GPU_IDLE_MIN, static={"evidence": "gpu"}),
        "warning", "GPUs idle between training stages.",
        P(RUN, ": the GPUs were idle between timed phases for at least ", Value("pct"), " of every one of the last ", K,
          f" normal steps, as measured by omniwatch's GPU sampler (threshold {pct(c.inter_stage_idle.ratio)})", idle_tail),
        c.step_for, {"persistence": "steps", "evidence": "gpu"}, remedies.inter_stage_idle(), step=True,
        comment="Two rules: GPU evidence where the sampler measured the run's GPUs, the timer residual only where it\n"
                    "did not (untimed is not idle: GPUs busy during the untimed work silence the timer rule).",
        resolve=idle_resolve))
    add(AlertSpec(
        n.ALERT_IDLE,
        _held(n.ALERT_IDLE,
                  f"{REC_IDLE_MIN} > {c.inter_stage_idle.ratio:g}\n"
                  f"  unless on ({RUN_BY}) {REC_GPU_IDLE_MIN}",
                  f"{_median(c, n.IDLE_WINDOW)} > {c.inter_stage_idle.resolve_ratio:g}\n"
                  f"  unless on ({RUN_BY}) {REC_GPU_IDLE_MIN}",
                  REC_IDLE_MIN, static={"evidence": "timers"}),
        "warning", "GPUs idle between training stages.",
        P(RUN, ": at least ", Value("pct"), " of every one of the last ", K,
          f" normal steps was spent outside any timed phase (threshold {pct(c.inter_stage_idle.ratio)})", idle_tail),
        c.step_for, {"persistence": "steps", "evidence": "timers"}, remedies.inter_stage_idle(), step=True,
        resolve=idle_resolve))

    # MFU -----------------------------------------------------------------------------------------------
    role_by = RUN_BY + ", role"
    add(Record(REC_MFU_MIN, _window(c, n.MFU_WINDOW, "min", role_by),
               comment="MFU over the window (zeros = unsupported estimator are left out by the exporter) and the\n"
                       "window's best step against the run's own baseline."))
    add(Record(REC_MFU_MAX, _window(c, n.MFU_WINDOW, "max", role_by)))
    add(Record(REC_MFU_VS_BASELINE,
               f"{REC_MFU_MAX}\n"
               f"  / max by ({role_by}) ({sel(c, n.MFU_BASELINE)} > 0)"))
    add(Record(REC_MFU_MEDIAN_VS_BASELINE,
               f"{_median(c, n.MFU_WINDOW, role_by)}\n"
               f"  / max by ({role_by}) ({sel(c, n.MFU_BASELINE)} > 0)",
               comment="The window's median MFU against the reference: MFUDrop's creep condition and its hold."))
    add(Record(REC_MFU_DRIFT, f"max by ({role_by}) ({sel(c, n.MFU_DRIFT)})",
               comment="Median MFU of the last 10 normal steps after the anchored reference / the reference."))
    mfu_role = P("perf/mfu/", n_label("role"))
    add(Record(REC_MFU_MIN_PER_GPU,
               f"{REC_MFU_MIN}\n  / on ({RUN_BY}) group_left ()\n"
               f"max by ({RUN_BY}) ({sel(c, n.TRAINER_CONFIG_SP)} > 0)\nor\n{REC_MFU_MIN}",
               comment="MFU per GPU: VeRL-Omni divides the FLOPs of the DP-gathered batch by the DP size only, so with\n"
                       "Ulysses sequence parallelism the reported MFU is SP x the per-GPU MFU (the trainer config's SP;\n"
                       "without a config SP=1 is assumed and the annotation says so)."))
    per_gpu_median = (f"{_median(c, n.MFU_WINDOW, role_by)}\n  / on ({RUN_BY}) group_left ()\n"
                      f"max by ({RUN_BY}) ({sel(c, n.TRAINER_CONFIG_SP)} > 0)\nor\n{_median(c, n.MFU_WINDOW, role_by)}")
    add(AlertSpec(
        n.ALERT_MFU_IMPOSSIBLE,
        _held(n.ALERT_MFU_IMPOSSIBLE, f"{REC_MFU_MIN_PER_GPU} > {c.mfu.impossible:g}",
                  f"({per_gpu_median}) > {c.mfu.impossible_resolve:g}", REC_MFU_MIN_PER_GPU, role_by, {"evidence": "value"}),
        "warning", "Reported MFU is above 1.0, which no hardware can reach.",
        P(RUN, ": ", mfu_role, " per GPU was at least ", Value("f2"), " in every one of the last ", K, " normal steps",
          AT_STEP,
          SeriesValue(n.TRAINER_CONFIG_SP, "f0", " (reported MFU / Ulysses SP=", " from the trainer config: VeRL-Omni "
                          "reports SP x the per-GPU MFU)", cond="> 1"),
          ": the device peak is mis-identified or a FLOPs metadata field misses the DP gather; MFU comparisons for "
          "this run are meaningless.",
          SeriesValue(n.TRAINER_CONFIG_INFO, "f0", " No trainer configuration was read for this run: omniwatch "
                          "assumed Ulysses SP=1 (with sequence parallelism VeRL-Omni reports SP x the per-GPU MFU; give "
                          "it the config to judge MFU per GPU).", fixed=(("source", "none"),), show=False),
          QueryLabel(n.MFU_SUSPECTED_CAUSE, "cause", prefix=" Suspected cause: ", suffix=".",
                         matchers="role=%q", label_args=("role",))),
        c.step_for, {"persistence": "steps", "evidence": "value"}, remedies.mfu_impossible(), step=True,
        resolve=f"window median per GPU > {c.mfu.impossible_resolve:g}"))
    add(AlertSpec(
        n.ALERT_MFU_IMPOSSIBLE,
        f"max by ({role_by}) ({sel(c, n.MFU_SUSPECTED_CAUSE, RELABELED)} == 1)\n"
        f"  unless on ({role_by}) {REC_MFU_MIN_PER_GPU} > {c.mfu.impossible:g}",
        "warning", "Reported MFU is computed against the wrong device peak.",
        P(RUN, ": ", mfu_role, " is divided by the peak of the GPU name verl matched, but the GPUs' name and memory "
          "say they are another part (relabeled SKU)", AT_STEP, ": every MFU of this run is off by the peak ratio, "
          "whatever its value."),
        c.step_for, {"persistence": "steps", "evidence": "device"}, remedies.mfu_impossible(), step=True,
        comment="The relabeled-GPU check (NVML name + memory) runs whatever the MFU value: an inflated MFU below 1.0\n"
                    "is still wrong."))
    add(AlertSpec(
        n.ALERT_MFU_LOW,
        _held(n.ALERT_MFU_LOW, f"{REC_MFU_MAX} < {c.mfu.floor:g}",
                  f"{_median(c, n.MFU_WINDOW, role_by)} < {c.mfu.floor_resolve:g}", REC_MFU_MAX, role_by),
        "warning", "Reported MFU is implausibly low.",
        P(RUN, ": the best ", mfu_role, " of the last ", K, " normal steps is ", Value("f2"),
          f", below any plausible value for a diffusion actor update (floor {c.mfu.floor:g}; healthy offloaded "
          "full fine-tuning on H200 reports ~0.17)", AT_STEP, "."),
        c.step_for, {"persistence": "steps"}, remedies.mfu_low(), step=True,
        resolve=f"window median < {c.mfu.floor_resolve:g}"))
    add(AlertSpec(
        n.ALERT_MFU_UNSUPPORTED, f"max by ({role_by}) ({sel(c, n.MFU_UNSUPPORTED)} == 1)",
        "info", "MFU is not estimated for this run.",
        P(RUN, ": ", mfu_role, " was exactly 0 in each of the last ", K, " normal steps", AT_STEP,
          ": VeRL-Omni's estimator does not support this pipeline or GPU, so MFU alerts cannot judge it."),
        c.step_for, {"persistence": "steps"}, remedies.mfu_unsupported(), step=True))
    add(AlertSpec(
        n.ALERT_MFU_DROP,
        _held(n.ALERT_MFU_DROP,
                  f"{REC_MFU_VS_BASELINE} < {c.mfu.drop_ratio:g}\n"
                  f"or on ({role_by})\n"
                  f"(\n  {REC_MFU_DRIFT} < {c.mfu.drift_ratio:g}\n"
                  f"    and on ({role_by}) {REC_MFU_MEDIAN_VS_BASELINE} < {c.mfu.drift_ratio:g}\n)",
                  f"{REC_MFU_MEDIAN_VS_BASELINE} < {c.mfu.drop_resolve:g}", REC_MFU_MEDIAN_VS_BASELINE, role_by),
        "warning", f"MFU dropped by more than {pct(1 - c.mfu.drop_ratio)} against the run's own baseline, or slid "
                       f"more than {pct(1 - c.mfu.drift_ratio)} below it.",
        P(RUN, ": ", n_label("role"), " MFU is at ", Value("pct"), " of the run's reference (median of the first ",
          f"{c.window.reference} normal steps of this trainer incarnation", REFERENCE_NOTE,
          f"; thresholds: the best of the last k steps under {pct(c.mfu.drop_ratio)}, or the median of the last "
          f"{c.window.drift} under {pct(c.mfu.drift_ratio)})",
          ShiftShape("mfu", "slide", prefix="; what was seen: ", role=True), AT_STEP,
          f". It holds until the window median is back above {pct(c.mfu.drop_resolve)} of the reference.",
          regression_cost("actor")),
        c.step_for, {"persistence": "steps"}, remedies.mfu_drop(), step=True,
        comment="A drop (the best of the last k steps under drop_ratio) or a slide (the median of the last 10 steps\n"
                    "after the reference and of the window under drift_ratio): one alert for the MFU lost, held while the\n"
                    "window median stays under drop_resolve.",
        resolve=f"window median / reference < {c.mfu.drop_resolve:g}"))

    # StepTimeRegression: a step change or a creep, one alert ----------------------------------------------
    add(Record(REC_STEP_MIN, _window(c, n.STEP_DURATION_WINDOW, "min"),
               comment="Step time over the window (seconds, dashboards), and per unit of work against the run's reference."))
    add(Record(REC_STEP_VS_BASELINE, _window(c, n.STEP_DURATION_RATIO_WINDOW, "min"),
               comment="Step time per unit of work (perf/total_num_images) / the reference's, lowest over the window."))
    add(Record(REC_STEP_RATIO_MEDIAN, _window(c, n.STEP_DURATION_RATIO_WINDOW, "median")))
    add(Record(REC_STEP_DRIFT, f"max by ({RUN_BY}) ({sel(c, n.STEP_DURATION_DRIFT)})",
               comment="Median step time per unit of work of the last 10 normal steps after the reference / the reference."))
    add(Record(REC_REGRESSION_CAUSE_TOP,
               f"max by ({RUN_BY}, cause) ({sel(c, n.STEP_REGRESSION_TOP)} == 1)\n"
               f"or on ({RUN_BY})\n"
               f"topk by ({RUN_BY}) (1, max by ({RUN_BY}, cause) ({sel(c, n.STEP_REGRESSION)})) * 0 + 1",
               comment="The part of the step that grew most (label `cause`), valued 1: StepTimeRegression carries it so\n"
                       "Alertmanager inhibits the regression only while the alert of that cause fires. The exporter's\n"
                       "choice (omniwatch_step_regression_top, which keeps the named cause while it grew at least\n"
                       "0.8x as much as the largest, so a creep growing two parts alike does not swap it every step);\n"
                       "the largest where an exporter does not export it."))

    def with_cause(cond: str) -> str:
        # the newest top cause only: a backfilled block has no staleness markers, so the cause of a minute ago
        # lingers for the 5 m lookback beside the current one and a plain group_left fails on the duplicate
        return (f"({cond})\n"
                f"  * on ({RUN_BY}) group_left (cause) (topk by ({RUN_BY}) (1, timestamp({REC_REGRESSION_CAUSE_TOP})) * 0 + 1)\n"
                f"or on ({RUN_BY})\n"
                f"({cond})")
    fire = (f"{REC_STEP_VS_BASELINE} > {c.step_time.regression_ratio:g}\n"
            f"or on ({RUN_BY})\n"
            f"(\n  {REC_STEP_RATIO_MEDIAN} > {c.step_time.median_ratio:g}\n"
            f"    unless on ({RUN_BY}) {REC_REGRESSION_CAUSE_TOP}{{cause=~\"{'|'.join(OWNED_CAUSES)}\"}}\n"
            f"    unless on ({RUN_BY}) {_median(c, n.ROLLOUT_STRAGGLER_WINDOW)} > {c.straggler.resolve:g}\n)\n"
            f"or on ({RUN_BY})\n"
            f"(\n  {REC_STEP_DRIFT} > {c.step_drift.ratio:g}\n"
            f"    and on ({RUN_BY}) {REC_STEP_RATIO_MEDIAN} > {c.step_drift.ratio:g}\n)")
    add(Record(REC_PART_GROWTH_MIN, _window(c, n.STEP_PART_GROWTH, "min", RUN_BY + ", cause"),
               comment="Each part's share of the step over its share in the reference, lowest over the window."))
    add(Record(REC_PART_GROWTH_MEDIAN, _window(c, n.STEP_PART_GROWTH, "median"),
               comment="The largest window median of that growth over the parts (StepTimeRegression's hold)."))
    # the part that grew, by its own label (the largest if several did), valued like the step-time conditions; not a
    # part an alert of its own names (RewardBoundRollout, InterStageIdleGPU, MFUDrop judge those: one voice each)
    part = (f"(topk by ({RUN_BY}) (1, {REC_PART_GROWTH_MIN}{{cause!~\"{'|'.join(OWNED_CAUSES)}\"}} > {c.step_time.part_share:g}) * 0 + 1)\n"
            f"  * on ({RUN_BY}) group_left () {REC_STEP_VS_BASELINE}")
    add(AlertSpec(
        n.ALERT_STEP_REGRESSION,
        _held(n.ALERT_STEP_REGRESSION, f"{with_cause(fire)}\nor on ({RUN_BY})\n{part}",
                  f"{REC_STEP_RATIO_MEDIAN} > {c.step_time.resolve_ratio:g}\n"
                  f"  or on ({RUN_BY}) {REC_PART_GROWTH_MEDIAN} > {c.step_time.part_resolve:g}",
                  REC_STEP_VS_BASELINE, sticky=("cause",), unheld={"cause": "|".join(OWNED_CAUSES)}),
        "warning", f"Steps take more than {pct(c.step_time.regression_ratio - 1)} longer than the run's own reference, "
                       f"or have crept more than {pct(c.step_drift.ratio - 1)} over it.",
        P(RUN, ": steps take ", Value("f2"), "x the run's reference step time per unit of work (median of the first "
          f"{c.window.reference} normal steps of this trainer incarnation", REFERENCE_NOTE,
          f"; thresholds: the fastest of the last k steps over {c.step_time.regression_ratio:g}x, their median over "
          f"{c.step_time.median_ratio:g}x, the median of the last {c.window.drift} over {c.step_drift.ratio:g}x, or "
          f"one part {pct(c.step_time.part_share)} more of the step in each of the last k)", STEP_SHAPE,
          LabelIf("cause", "; most of the growth is in "), remedies.gen_includes_scoring(), AT_STEP, ".",
          regression_cost(),
          f" It holds until the window median is back under {c.step_time.resolve_ratio:g}x."),
        c.step_for, {"persistence": "steps"}, remedies.step_regression(), step=True,
        comment="One alert for the step time lost, whatever its shape: a step change (the fastest of the last k steps\n"
                    "over regression_ratio) or a creep (the median of the last 10 steps after the reference and of the\n"
                    "window over step_drift.ratio); held while the window median stays over resolve_ratio. Alertmanager\n"
                    "silences it while the alert of its cause fires for the run.",
        resolve=f"window median / reference > {c.step_time.resolve_ratio:g}"))

    # WorkloadChanged ----------------------------------------------------------------------------------------
    add(Record(REC_WORKLOAD, f"max by ({RUN_BY}) ({sel(c, n.WORKLOAD_RATIO)})",
               comment="Images per step now / in the reference (absent where the run does not log perf/total_num_images)."))
    add(AlertSpec(
        n.ALERT_WORKLOAD_CHANGED,
        f"{REC_WORKLOAD} > {1 + c.workload.change:g}\nor\n{REC_WORKLOAD} < {1 - c.workload.change:g}",
        "info", "The run does a different amount of work per step.",
        P(RUN, ": images per step (perf/total_num_images) are ", Value("f2"), "x the reference's", AT_STEP,
          ": the step does more (or less) work, so it takes longer (or shorter). omniwatch judges step time per image,"
          " so this is not a regression",
          SeriesValue(n.SHIFT_SIZE, "pct", "; the cost per image has moved ", " from the reference",
                          fixed=(("signal", "step_time"),)),
          "."),
        c.step_for, {"persistence": "steps"}, remedies.workload_changed(), step=True,
        comment="A curriculum or batch-size change: a notice, never a page (step time is judged per image)."))

    # Declared signals' alerts (core/signals.py: RewardSaturation, ...) ---------------------------------------------
    for sig in SIGNALS:
        if sig.rule is not None:
            rules.extend(signal_rules(c, sig))
    return Group("omniwatch.steps", rules, "Step-based alerts: thresholds on step-window series (persistence counted in\n"
                 "steps); each resolves below a lower threshold than it fires at (hysteresis, held in steps).")


_SLOTS = {"run": RUN, "k": K, "at_step": AT_STEP}


def signal_rules(c: Config, sig: Signal) -> list:
    """A declared signal's alert (signals.SignalAlert) and the recording rule it reads."""
    a = sig.rule
    stat, op, path = a.fire
    hold_op, hold_path = a.hold
    rec, thr, hold_v = sig.record(stat), attrgetter(path)(c), attrgetter(hold_path)(c)
    write = pct if a.fmt == "pct" and not a.of_reference else (lambda x: f"{x:g}")
    fire, hold = f"{rec} {op} {thr:g}", f"{_median(c, sig.family)} {hold_op} {hold_v:g}"
    if a.of_reference:  # a factor of the run's reference of the signal
        ref = f"max by ({RUN_BY}) ({sel(c, sig.reference)})"
        fire, hold = (f"{rec} {op} on ({RUN_BY}) ({thr:g} * {ref})",
                      f"{_median(c, sig.family)} {hold_op} on ({RUN_BY}) ({hold_v:g} * {ref})")
    slots = {**_SLOTS, "value": Value(a.fmt), "threshold": write(thr)}
    text: list = []
    for i, piece in enumerate(re.split(r"\{(\w+)\}", a.description)):
        part = slots[piece] if i % 2 else piece
        if isinstance(part, str) and text and isinstance(text[-1], str):
            text[-1] += part
        elif part:
            text.append(part)
    rem = getattr(remedies, a.remedy)() if isinstance(a.remedy, str) else remedy(*a.remedy)
    return [Record(rec, _window(c, sig.family, stat), comment=a.record_comment),
            AlertSpec(a.name, _held(a.name, fire, hold, rec), a.severity, a.summary, P(*text), attrgetter(a.for_)(c),
                  {"persistence": "steps"}, rem, step=True, resolve=f"window median {hold_op} {hold_v:g}")]


def signals(cfg: Config) -> Group:
    """Signals the seeds name (issue 13 item 11): a straggler tail in rollout, skipped actor updates, rejection
    sampling masking too many samples, wall time outside every verl timer, timers that exceed the step."""
    c = cfg
    rules: list = []
    add = rules.append
    steps = {"persistence": "steps"}

    # RolloutStraggler ---------------------------------------------------------------------------------------
    add(Record(REC_STRAGGLER_MIN, _window(c, n.ROLLOUT_STRAGGLER_WINDOW, "min"),
               comment="Slowest sample's generation time / the mean sample's (legacy agent-loop keys), lowest over the window."))
    add(AlertSpec(
        n.ALERT_STRAGGLER,
        _held(n.ALERT_STRAGGLER, f"{REC_STRAGGLER_MIN} > {c.straggler.ratio:g}",
                  f"{_median(c, n.ROLLOUT_STRAGGLER_WINDOW)} > {c.straggler.resolve:g}", REC_STRAGGLER_MIN),
        "warning", "A straggler sample holds up rollout.",
        P(RUN, ": in every one of the last ", K, " normal steps the slowest sample took at least ", Value("f2"),
          "x the mean sample's generation time (threshold ", f"{c.straggler.ratio:g}", "x; queueing behind equal "
          "requests explains under 2x)", AT_STEP, ". Generation waits for the slowest sample."),
        c.step_for, steps, remedies.straggler(), step=True,
        comment="Per-sample times include server queueing: W equal waves give max/mean = 2W/(W+1) < 2.",
        resolve=f"window median > {c.straggler.resolve:g}"))

    # GradNormNonFinite ----------------------------------------------------------------------------------------
    add(Record(REC_GRAD_NONFINITE,
               f"max by ({RUN_BY}) ({sel(c, n.GRAD_NORM_NONFINITE_RECENT)})",
               comment="Skipped actor updates (actor/grad_norm non-finite) among the run's recent normal steps."))
    add(AlertSpec(
        n.ALERT_GRAD_NONFINITE,
        f"{REC_GRAD_NONFINITE} >= {c.grad_norm.nonfinite_steps:d}",
        "warning", "Actor updates are skipped: the gradient norm is not finite.",
        P(RUN, ": actor/grad_norm was NaN or Inf in ", Value("f0"), f" of the last {c.window.baseline} (or fewer) "
          f"normal steps (threshold {c.grad_norm.nonfinite_steps:d})", AT_STEP,
          ". VeRL-Omni skipped those optimizer steps: the policy did not learn from them."),
        c.step_for, steps, remedies.grad_nonfinite(), step=True,
        comment="A count over the last N normal steps (N = the baseline length): one skip is noise, a few are a pattern."))

    # RolloutRejectionHigh -------------------------------------------------------------------------------------
    add(Record(REC_RS_MASKED_MIN,
               _window(c, n.RS_SEQ_MASKED_WINDOW, "min", RUN_BY + ", mode"),
               comment="Share of samples rejection sampling masked (sequence level), lowest over the window; mode =\n"
                       "decoupled (rollout_corr/*) or bypass (actor/rollout_corr/*)."))
    add(AlertSpec(
        n.ALERT_RS_REJECTION,
        _held(n.ALERT_RS_REJECTION, f"{REC_RS_MASKED_MIN} > {c.rollout_rejection.seq_masked_fraction:g}",
                  f"{_median(c, n.RS_SEQ_MASKED_WINDOW, RUN_BY + ', mode')} > {c.rollout_rejection.resolve:g}",
                  REC_RS_MASKED_MIN, RUN_BY + ", mode"),
        "warning", "Rollout correction rejects many samples: the rollout backend drifts from the trainer.",
        P(RUN, ": rejection sampling masked at least ", Value("pct"), " of the samples (sequence level, ",
          n_label("mode"), " mode) in every one of the last ", K, " normal steps (VeRL-Omni's warning level: "
          f"consistently above {pct(c.rollout_rejection.seq_masked_fraction)})", AT_STEP,
          ". Masked samples still count in the loss's denominator and dilute the gradient."),
        c.step_for, steps, remedies.rs_rejection(), step=True,
        resolve=f"window median > {c.rollout_rejection.resolve:g}"))

    # TimeOutsideStep ------------------------------------------------------------------------------------------
    add(Record(REC_OUTSIDE_MIN, _window(c, n.OUTSIDE_STEP_WINDOW, "min"),
               comment="Wall time between consecutive steps outside every verl timer / the gap, lowest over the window\n"
                       "(live arrivals only: absent for backlog reads, batched pushes, replays and backfills)."))
    add(AlertSpec(
        n.ALERT_OUTSIDE_STEP,
        _held(n.ALERT_OUTSIDE_STEP, f"{REC_OUTSIDE_MIN} > {c.outside_step.ratio:g}",
                  f"{_median(c, n.OUTSIDE_STEP_WINDOW)} > {c.outside_step.resolve:g}", REC_OUTSIDE_MIN),
        "warning", "Time between steps goes outside every trainer timer.",
        P(RUN, ": at least ", Value("pct"), " of the wall time between consecutive steps was outside timing_s/step, "
          "validation and the profiler in every one of the last ", K,
          f" normal steps (threshold {pct(c.outside_step.ratio)})", AT_STEP, ".",
          Query(n.OUTSIDE_STEP_SECONDS, "dur", prefix=" Latest step: ", suffix=" outside the timers."),
          " The GPUs wait while the trainer loads data, computes metrics or logs."),
        c.step_for, steps, remedies.outside_step(), step=True,
        resolve=f"window median > {c.outside_step.resolve:g}"))

    # TimersExceedStep -----------------------------------------------------------------------------------------
    add(Record(REC_TIMER_RESIDUAL_MAX, _window(c, n.TIMER_RESIDUAL_WINDOW, "max"),
               comment="(timing_s/step - sum of in-step timers) / step, unclamped, highest over the window."))
    add(AlertSpec(
        n.ALERT_TIMERS_EXCEED,
        _held(n.ALERT_TIMERS_EXCEED, f"{REC_TIMER_RESIDUAL_MAX} < -{c.timer_overlap.tolerance:g}",
                  f"{_median(c, n.TIMER_RESIDUAL_WINDOW)} < -{c.timer_overlap.resolve:g}", REC_TIMER_RESIDUAL_MAX),
        "info", "The trainer's timers add up to more than the step.",
        P(RUN, ": in every one of the last ", K, " normal steps the in-step timers summed to more than timing_s/step "
          "(residual ", Value("pct"), " of the step at best; tolerance ", pct(c.timer_overlap.tolerance), ")", AT_STEP,
          ": a timer nested inside another phase is counted twice, which hides untimed time between phases."),
        c.step_for, steps, remedies.timers_exceed(), step=True,
        comment="A monitoring finding, not a training fault: InterStageIdleGPU's timer evidence is blind while it holds.",
        resolve=f"window median < -{c.timer_overlap.resolve:g}"))
    rules += rankstraggler.rules(c)  # RankStraggler, from Ray's task events (alerting/rankstraggler.py)
    return Group("omniwatch.signals", rules,
                 "Signals the VeRL-Omni sources name: rollout stragglers, skipped updates, rollout-correction\n"
                 "rejection, time outside the step timer, nested timers (persistence counted in steps).")


def n_label(name: str) -> Label:
    return Label(name)


def health(cfg: Config) -> Group:
    c = cfg
    rules: list = [
        Record(REC_AGE,
               f"time() - max by ({RUN_BY}) ({sel(c, n.LAST_STEP_TS)})", comment="Seconds since the run's latest step was observed."),
        Record(REC_GPU_MEMORY,
               f"max by (node, gpu) (\n  {sel(c, n.GPU_MEMORY_USED)} / ({sel(c, n.GPU_MEMORY_TOTAL)} > 0)\n)",
               {"source": "omniwatch"},
               comment="GPU memory used / total from whichever source exists, with the same (node, gpu) labels.\n"
                       "DCGM and Ray report MiB; the ratio is unit-free. used / (used + free) ignores DCGM's\n"
                       "reserved memory, so it reads slightly high: the safe side for a headroom alert."),
        Record(REC_GPU_MEMORY,
               'max by (node, gpu) (\n  label_replace(\n    DCGM_FI_DEV_FB_USED / ((DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0),\n'
               '    "node", "$1", "Hostname", "(.*)")\n)', {"source": "dcgm"}),
        Record(REC_GPU_MEMORY,
               'max by (node, gpu) (\n  label_replace(label_replace(\n    ray_node_gram_used / ((ray_node_gram_used + ray_node_gram_available) > 0),\n'
               '    "node", "$1", "ip", "(.*)"), "gpu", "$1", "GpuIndex", "(.*)")\n)', {"source": "ray"}),
        *stalls.rules(c),  # TrainingStalled: info, warning, critical (alerting/stalls.py)
        AlertSpec("GPUMemoryNearFull", f"{REC_GPU_MEMORY} > {c.gpu_memory.ratio:g}", "warning",
                  f"GPU memory has stayed above {pct(c.gpu_memory.ratio)} for {c.gpu_memory.for_}.",
                  P("GPU ", n_label("gpu"), " on ", n_label("node"), " (", n_label("source"), ") uses ", Value("pct"),
                    f" of its memory and has not dropped below {pct(c.gpu_memory.ratio)} for {c.gpu_memory.for_}; the next "
                    "larger batch, longer video or weight sync is likely to OOM."), c.gpu_memory.for_),
        AlertSpec(n.ALERT_SOURCE_DOWN, f"{sel(c, n.SOURCE_UP)} == 0", "warning", "An omniwatch source stopped working.",
                  P("Source ", n_label("source"), " (", n_label("target"), ") on ", n_label("instance"),
                    f" has been failing for {c.source_down.for_}; alerts that depend on it cannot fire."), c.source_down.for_),
        AlertSpec(n.ALERT_SOURCE_DOWN, f'up{{job="{c.selectors.job}"}} == 0 or absent(up{{job="{c.selectors.job}"}})',
                  "critical", "Prometheus cannot scrape the omniwatch exporter.",
                  P("The omniwatch exporter ", LabelIf("instance", "at ", " "), f"has been down or missing from Prometheus' targets for {c.source_down.for_}; "
                    "no training alert can fire until it is back."), c.source_down.for_),
        AlertSpec(n.ALERT_RUN_CAP, f"increase({sel(c, n.RUNS_EVICTED_TOTAL)}[{c.run_cap.window}]) > 0", "warning",
                  "The exporter dropped a run at its run cap (--max-runs).",
                  P("The omniwatch exporter ", LabelIf("instance", "at ", " "), "holds as many runs as --max-runs allows and "
                    f"dropped the least recently active run to make room for a new one within the last {c.run_cap.window}; "
                    "the dropped run's series ended and its alerts resolved. Raise --max-runs or watch fewer runs.")),
        AlertSpec(n.ALERT_RAY_TASK_EVENTS_LOST, f"max by (job, instance) ({sel(c, n.RAY_TASK_EVENTS_LOSSY)}) == 1", "info",
                  "The Ray task-event source is losing events: worker lanes are incomplete.",
                  P("The Ray task-event source of the omniwatch exporter ", LabelIf("instance", "at ", " "),
                    f"lost events at every evaluation for {c.ray_task_events.for_} (Ray's GCS dropped task events, or a "
                    "poll's answer was cut at the page size): the worker lanes, who holds the step and RankStraggler miss "
                    "calls while this holds."), c.ray_task_events.for_,
                  remedy=remedies.ray_events_lost(),
                  comment="From Ray's task events (--ray-tasks): the source's own loss flag, held for "
                          "ray_task_events.for (a monitoring finding, not a training fault)."),
        AlertSpec("Watchdog", "vector(1)", "none", "The alerting pipeline is alive.",
                  P("Always firing. If its notifications stop arriving, Prometheus, Alertmanager or the route to the "
                    "omniwatch receiver is broken.")),
    ]
    return Group("omniwatch.health", rules, "Liveness, resources and the monitoring pipeline itself.")


OMNIWATCH_HEADER = """\
omniwatch alert and recording rules for VeRL-Omni diffusion RL training.

GENERATED by `omniwatch rules generate` from exporter/omniwatch/alerting/ (rulespec.py: expressions and prose,
omniwatch/config.py: every threshold and `for:`, remedies.py: the fix per run layout). Do not edit: change the
config (or render your own copy with `omniwatch rules generate --config my.yml --out DIR`); `make check`
fails when this file and its generator disagree.

Time is counted in steps, not minutes: the exporter publishes, per run (project, experiment), the
min / median / max of each signal over the last k normal steps (warm-up, validation and checkpoint
steps left out; absent until k such steps exist) and references anchored to the trainer incarnation
(median of its first normal steps: a fault that lasts keeps firing to the end of the run, a restart
starts a new reference). "window min > threshold" therefore means "every one of the
last k normal steps was over", and the step-based alerts only need a short `for:` that absorbs scrape
jitter. docs/alerts.md says why each number is what it is.
"""


def rule_files(cfg: Config) -> list[RuleFile]:
    return [RuleFile("omniwatch.rules.yml", OMNIWATCH_HEADER, [records(cfg), steps(cfg), signals(cfg), health(cfg)]),
            endpoints.rule_file(cfg)]


def alerts(cfg: Config) -> list[AlertSpec]:
    return [r for f in rule_files(cfg) for g in f.groups for r in g.rules if isinstance(r, AlertSpec)]
