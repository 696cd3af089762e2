"""Bottlenecks: each alert's own recording rule against its threshold (from omniwatch.config.DEFAULT),
then the decompositions that say *why* (reward on the critical path, untracked seconds, timers against the
step, time outside the step timer, GPU idle time by phase, stragglers, the GPU-hours ledger and its cost per
day, MFU checks), the pipeline alerts that have no other home (rollout saturation, TransferQueue backlog,
sources down), the alert timeline (TrainingStalled per stage), the stall stage per run and the planned work
its warning waits for.

Per-step counters (stage seconds, GPU phase seconds, ledger GPU-seconds) are read as ratios of ``increase``
over ``$window`` (three typical steps by default), never over ``$__rate_interval``.
"""
from __future__ import annotations

from .. import names as n
from ..core import planned
from ..config import Config
from ..core.analytics import K_GEN_SEQ
from ..alerting.records import (REC_MFU_DRIFT, REC_MFU_MAX, REC_MFU_MIN, REC_MFU_VS_BASELINE, REC_OUTSIDE_MIN,
                                REC_REWARD_BOUND_MIN, REC_REWARD_QUEUE_SHARE, REC_REWARD_STEP_SHARE_MIN,
                                REC_ROLLOUT_SATURATED, REC_STEP_DRIFT, REC_STEP_VS_BASELINE, REC_WORKLOAD, REC_STRAGGLER_MIN,
                                REC_TIMER_RESIDUAL_MAX, REC_TQ_UTILIZATION)
from .panels import saturation_rule, ALERT_ROLLOUT_SATURATED, ALERT_STATE_MAPPINGS, ALERT_TQ_BACKLOG, Dashboard, EXP, LEDGER_HEAD, LEDGER_TAIL, Panel, RUN_BY, Row, STALL_STAGE_MAPPINGS, Step, Target, alert_states_by_run, by_run, cfg_step, default_tags, gpu_hours_panel, gpu_hours_per_day, idle_evidence, in_order, increase_w, phase_colors, run_max, sel, stall_stage, verl, window_default

W = EXP


def phase_seconds(phases: str) -> str:
    """Seconds the run spent in ``phases`` (regex) over $window, from the per-step counter."""
    return f"sum by ({RUN_BY}) ({increase_w(sel(n.STAGE_SECONDS_TOTAL, phase='=~' + phases))})"


STEP_SECONDS = f"sum by ({RUN_BY}) ({increase_w(sel(n.STAGE_SECONDS_TOTAL))})"  # every phase incl. untracked
GPU_SECONDS = (f"sum by ({RUN_BY}) ({increase_w(sel(n.GPU_PHASE_IDLE_SECONDS_TOTAL))}) + "
               f"sum by ({RUN_BY}) ({increase_w(sel(n.GPU_PHASE_BUSY_SECONDS_TOTAL))})")

def dashboard(cfg: Config) -> Dashboard:
    """This dashboard drawn with ``cfg`` (thresholds, windows, selectors, the words of its descriptions)."""
    C = cfg
    WINDOW_DEFAULT = window_default(cfg)  # noqa: F841
    SIGNALS = Row("Signals vs alert thresholds", (
        Panel("Reward-bound ratio (window min)",
              lambda C: ("The series RewardBoundRollout thresholds: the lowest share of the generation window (gen + reward) that "
              "reward scoring held on the critical path over the last k normal steps, and the latest step dashed. Above "
              f"{C.reward_bound.ratio:g} AND reward above {C.reward_bound.step_share:g} of the step (next panel) fires: "
              "rollout GPUs wait for the reward model."),
              (Target(sel(REC_REWARD_BOUND_MIN), W + " window min"),
               Target(run_max(sel(n.REWARD_BOUND_RATIO)), W + " latest step", dashed=True)),
              unit="percentunit", min=0, max=1, thresholds=(Step(None, "green"), cfg_step(cfg, "reward_bound.ratio", "red")),
              show_thresholds="dashed+area", w=6, runbook=n.ALERT_REWARD_BOUND),
        Panel("Reward share of the step (window min)",
              lambda C: ("The second condition of RewardBoundRollout: the lowest share of the step that reward seconds on the "
              f"critical path took over the last k normal steps. Below {C.reward_bound.step_share:g} the step is "
              "dominated by other phases and a separate reward pool buys little."),
              (Target(sel(REC_REWARD_STEP_SHARE_MIN), W + " window min"),),
              unit="percentunit", min=0, max=1,
              thresholds=(Step(None, "green"), cfg_step(cfg, "reward_bound.step_share", "red")),
              show_thresholds="dashed+area", w=6, runbook=n.ALERT_REWARD_BOUND),
        Panel("Inter-stage idle ratio (window min)",
              lambda C: ("The series InterStageIdleGPU thresholds, with the evidence the rule prefers: GPU-measured idle between "
              "timed phases / step (omniwatch's NVML sampler) where the run's GPUs are sampled, else untimed seconds / "
              f"step (label evidence). Above {C.inter_stage_idle.ratio:g} in every window step fires."),
              (Target(run_max(idle_evidence(), "evidence"), W + " window min ({{evidence}})"),
               Target(run_max(sel(n.INTER_STAGE_IDLE_RATIO)), W + " latest step (timers)", dashed=True)),
              unit="percentunit", min=0, thresholds=(Step(None, "green"), cfg_step(cfg, "inter_stage_idle.ratio", "red")),
              show_thresholds="dashed+area", w=6, runbook=n.ALERT_IDLE),
        Panel("Step time / baseline (window min)",
              lambda C: ("The series StepTimeRegression thresholds: the fastest of the last k normal steps over the run's reference "
              f"(median of the first {C.window.reference} normal steps of the trainer incarnation). Above "
              f"{C.step_time.regression_ratio:g} fires; the alert names "
              "the part that grew (next row)."),
              (Target(sel(REC_STEP_VS_BASELINE), W + " window min / baseline"),),
              unit="none", min=0, decimals=2,
              thresholds=(Step(None, "green"), cfg_step(cfg, "step_time.regression_ratio", "red")),
              show_thresholds="dashed+area", w=6, runbook=n.ALERT_STEP_REGRESSION),
        Panel("Step growth by cause",
              "Window median minus baseline median of each part of the step (cause = reward, inter_stage_idle, actor, "
              "rollout, weight_sync, other). StepTimeRegression names the largest (kept while it grew at least 0.8x "
              "as much as the largest: omniwatch_step_regression_top); its runbook branches on it.",
              (Target(run_max(sel(n.STEP_REGRESSION), "cause"), W + " {{cause}}"),),
              unit="s", w=6, h=7, runbook=n.ALERT_STEP_REGRESSION),
        Panel("Step time drift vs the run's reference",
              lambda C: (f"StepTimeRegression's creep condition: the median of the last {C.window.drift} normal steps after the "
              f"reference over the run's reference (median of the first {C.window.reference} normal steps of the trainer "
              "incarnation; a restart starts a new "
              f"one, from omniwatch_baseline_first_step). Above {C.step_drift.ratio:g} fires while the last k steps are "
              "over too: a creep over tens of steps."),
              (Target(sel(REC_STEP_DRIFT), W + f" last {C.window.drift} / reference"),),
              unit="none", min=0, decimals=2,
              thresholds=(Step(None, "green"), cfg_step(cfg, "step_drift.ratio", "red")),
              show_thresholds="dashed+area", w=6, h=7, runbook=n.ALERT_STEP_REGRESSION),
        Panel("Images per step vs the reference",
              lambda C: ("perf/total_num_images of the latest step over the reference's (the run's first "
              f"{C.window.reference} normal steps): WorkloadChanged (info) outside {1 - C.workload.change:g}-"
              f"{1 + C.workload.change:g}. omniwatch judges step time per image, so a curriculum or batch change is "
              "told apart from a regression; absent where the run does not log perf/total_num_images."),
              (Target(sel(REC_WORKLOAD), W + " images / reference's"),),
              unit="none", min=0, decimals=2, w=6, h=7, runbook=n.ALERT_WORKLOAD_CHANGED),
        Panel("Step growth cost (GPU-hours per day)",
              "What each cause of the step's growth costs at the current rate (the figure StepTimeRegression quotes): "
              "its growth over the baseline / the window's median step x the run's GPUs x 24 h. A run with a baseline "
              "and no growing part shows cause 'none' at 0.",
              (Target(f"{run_max(sel(n.STEP_REGRESSION_GPU_HOURS_PER_DAY), 'cause')} or on ({RUN_BY}) "
                      f'label_replace(0 * {run_max(sel(n.STEP_DURATION_BASELINE))}, "cause", "none", "", "")',
                      W + " {{cause}}"),),
              unit="suffix: GPU-h/day", min=0, w=6, h=7, runbook=n.ALERT_STEP_REGRESSION),
    ))

    MFU_ROW = Row("MFU", (
        Panel("MFU window vs impossible and floor",
              lambda C: ("Per run and role: the lowest MFU of the last k normal steps (above "
              f"{C.mfu.impossible:g} is MFUImpossible: the estimator's peak FLOPs do not match the GPU) and the highest "
              f"(below {C.mfu.floor:g} is MFUImplausiblyLow). Zeros (estimator unsupported) are left out of both."),
              (Target(run_max(sel(REC_MFU_MIN), n.L_ROLE), W + " {{role}} window min"),
               Target(run_max(sel(REC_MFU_MAX), n.L_ROLE), W + " {{role}} window max", dashed=True)),
              unit="percentunit", min=0,
              thresholds=(Step(None, "red"), cfg_step(cfg, "mfu.floor", "green"), cfg_step(cfg, "mfu.impossible", "red")),
              show_thresholds="line+area", w=8, runbook=(n.ALERT_MFU_IMPOSSIBLE, n.ALERT_MFU_LOW)),
        Panel("MFU window max / baseline",
              lambda C: ("The series MFUDrop thresholds: the best MFU of the last k normal steps over the run's baseline, per role. "
              f"Below {C.mfu.drop_ratio:g} fires (even the best window step lost {1 - C.mfu.drop_ratio:.0%})."),
              (Target(run_max(sel(REC_MFU_VS_BASELINE), n.L_ROLE), W + " {{role}}"),),
              unit="percentunit", min=0, thresholds=(Step(None, "red"), cfg_step(cfg, "mfu.drop_ratio", "green")),
              show_thresholds="dashed+area", w=8, runbook=n.ALERT_MFU_DROP),
        Panel("MFU drift vs the run's reference",
              lambda C: (f"MFUDrop's creep condition: the median MFU of the last {C.window.drift} normal steps after the "
              f"reference over the run's reference (median of the first {C.window.reference} normal steps of the "
              f"trainer incarnation), per role. Below {C.mfu.drift_ratio:g} fires while the window median is below it "
              "too: a slow slide with flat step time (e.g. an update_actor creep) that no single window step shows."),
              (Target(run_max(sel(REC_MFU_DRIFT), n.L_ROLE), W + f" {{{{role}}}} last {C.window.drift} / reference"),),
              unit="percentunit", min=0, thresholds=(Step(None, "red"), cfg_step(cfg, "mfu.drift_ratio", "green")),
              show_thresholds="dashed+area", w=8, runbook=n.ALERT_MFU_DROP),
        Panel("MFU implied vs device peak",
              "The peak (TFLOP/s) the reported MFU implies against the bf16 peak of the silicon the GPU check found "
              "(dashed). Implied far above the device: the MFU is computed against the wrong peak (pin "
              "VERL_OMNI_DEVICE_FLOPS_TFLOPS to the dashed value).",
              (Target(run_max(sel(n.MFU_IMPLIED_PEAK), n.L_ROLE), W + " {{role}} implied"),
               Target(run_max(sel(n.MFU_DEVICE_PEAK), n.L_ROLE), W + " {{role}} device", dashed=True)),
              unit="suffix: TFLOP/s", min=0, w=8, runbook=n.ALERT_MFU_IMPOSSIBLE),
        Panel("MFU suspected cause",
              "While MFUImpossible's evidence holds, the cause the MFU check suspects per run and role: relabeled_sku "
              "(the GPU is another part than verl matched), peak_mismatch (wrong peak table entry) or flops_overcount "
              "(a FLOPs field misses the DP gather); cause none (0) when nothing is suspected.",
              (Target(f"({run_max(sel(n.MFU_SUSPECTED_CAUSE), n.L_ROLE, 'cause')} == 1) or on ({by_run(n.L_ROLE)}) "
                      f'label_replace(0 * {run_max(sel(n.MFU), n.L_ROLE)}, "cause", "none", "", "")', "suspected",
                      instant=True, table=True),),
              unit="none", kind="table", w=8, runbook=n.ALERT_MFU_IMPOSSIBLE),
        Panel("MFU estimator unsupported",
              "1 when every window step of the run and role reported MFU exactly 0 (MFUEstimatorUnsupported, info): "
              "VeRL-Omni has no FLOPs estimator for the pipeline; read throughput instead.",
              (Target(f"{run_max(sel(n.MFU_UNSUPPORTED), n.L_ROLE)} or on ({by_run(n.L_ROLE)}) "
                      f"0 * {run_max(sel(n.MFU), n.L_ROLE)}", W + " {{role}}"),),
              unit="none", kind="statetimeline", w=8, runbook=n.ALERT_MFU_UNSUPPORTED,
              mappings=((0, "estimated", "green"), (1, "unsupported", "blue"))),
    ))

    REWARD = Row("Reward on the critical path", (
        Panel("Reward seconds by mode",
              "Reward seconds the latest step waited for: mode=colocated is timing_s/reward (scoring after "
              "generation), mode=streamed is the tail of gen after the last sample finished generating (async scoring "
              "that did not keep up), with gen dashed. Either growing against gen is reward-bound.",
              (Target(run_max(sel(n.REWARD_CRITICAL_PATH), n.L_MODE), W + " {{mode}}"),
               Target(run_max(sel(n.STAGE_DURATION, phase="gen")), W + " gen", dashed=True)),
              unit="s", w=8, runbook=n.ALERT_REWARD_BOUND),
        Panel("Reward share of gen + reward seconds",
              lambda C: (f"Over the last {WINDOW_DEFAULT}, timed reward seconds / (gen + reward) seconds "
              "from the per-step counters: a ratio of seconds, read over whole steps. Colocated runs only (streamed "
              f"scoring hides inside gen; the window-min panel above covers both). {C.reward_bound.ratio:g} is "
              "RewardBoundRollout's line."),
              (Target(f"{phase_seconds('reward')} / ({phase_seconds('gen|reward')} > 0)", W + " reward / (gen + reward)"),
               Target(f"{phase_seconds('reward')} / ({STEP_SECONDS} > 0)", W + " reward / step", dashed=True)),
              unit="percentunit", min=0, max=1, thresholds=(Step(None, "green"), cfg_step(cfg, "reward_bound.ratio", "red")),
              show_thresholds="dashed", w=8, runbook=n.ALERT_REWARD_BOUND),
        Panel("Reward-bound share queued at the reward servers",
              "Reward-bound ratio x the share of a reward request's latency spent queued in the reward vLLM servers. "
              "High: scoring waits for a free server (add reward replicas); low while reward-bound: the scorer itself "
              "is slow (smaller model, shorter prompts).",
              (Target(run_max(sel(REC_REWARD_QUEUE_SHARE)), W),),
              unit="percentunit", min=0, max=1, w=8, runbook=n.ALERT_REWARD_BOUND),
    ))

    IDLE = Row("Idle GPU time", (
        Panel("Untracked seconds",
              "Seconds of the latest step outside every timed phase. A step-shaped rise is a new gap (a transfer or "
              "barrier added between stages).",
              (Target(run_max(sel(n.STAGE_DURATION, phase=n.UNTRACKED_PHASE)), W + " latest step"),),
              unit="s", w=8, runbook=n.ALERT_IDLE),
        Panel("Timers vs step (window max)",
              lambda C: ("The series TimersExceedStep thresholds: (timing_s/step - the sum of the in-step timers) / step, NOT "
              "clamped, the highest of the last k normal steps, with the latest step dashed. Healthy runs sit a little "
              f"above 0 (untimed gaps); below -{C.timer_overlap.tolerance:g} in every window step the timers add up to "
              "more than the step: a timer nested inside another phase is counted twice and hides the untimed time, so "
              "'Untracked seconds' and InterStageIdleGPU's timer evidence read too low."),
              (Target(sel(REC_TIMER_RESIDUAL_MAX), W + " window max"),
               Target(f"{run_max(sel(n.TIMER_RESIDUAL))} / on ({RUN_BY}) ({run_max(sel(n.STEP_DURATION))} > 0)",
                      W + " latest step", dashed=True)),
              unit="percentunit",
              thresholds=(Step(None, "red"), cfg_step(cfg, "timer_overlap.tolerance", "green", negate=True)),
              show_thresholds="dashed+area", w=8, runbook=(n.ALERT_TIMERS_EXCEED, n.ALERT_IDLE)),
        Panel("Outside the step timer (window min)",
              lambda C: ("The series TimeOutsideStep thresholds: wall time between two steps' log lines that no verl timer covers "
              "(dataloader, metric computation, logging; V1's second TransferQueue fetch of the batch after the step) / "
              "that gap, the lowest of the last k normal steps, with the window median dashed. Above "
              f"{C.outside_step.ratio:g} in every window step fires: the GPUs wait between steps. Measured on live "
              "arrivals only (absent for a backlog read, a replay or a backfill: their arrivals are rebuilt from the timers)."),
              (Target(sel(REC_OUTSIDE_MIN), W + " window min"),
               Target(run_max(sel(n.OUTSIDE_STEP_WINDOW, stat="median")), W + " window median", dashed=True)),
              unit="percentunit", min=0,
              thresholds=(Step(None, "green"), cfg_step(cfg, "outside_step.ratio", "red")),
              show_thresholds="dashed+area", w=8, runbook=n.ALERT_OUTSIDE_STEP),
        Panel("GPU idle share of each phase",
              "Idle share within each phase of the latest attributed step, averaged over the run's GPUs. High idle in "
              "gen on a colocated run is the reward model holding the rollout; in inter_stage it is the inter-stage gap.",
              (Target(run_max(sel(n.GPU_IDLE_RATIO), n.L_PHASE), W + " {{phase}}"),),
              unit="percentunit", min=0, max=1,
              thresholds=(Step(None, "green"), Step(0.5, "orange", note="half of a phase idle: worth a look, no alert")),
              w=24, h=7, runbook=n.ALERT_IDLE),
        Panel("GPU idle share by phase: $experiment",
              "Over the last $window typical steps of each run: GPU idle seconds attributed to each phase / all GPU seconds attributed to "
              "the run's steps (5 Hz NVML sampler). Stacked, the bands add up to the run's idle share of GPU time; "
              "phase=inter_stage is the gap between timed phases.",
              (Target(f"sum by ({by_run(n.L_PHASE)}) ({increase_w(sel(n.GPU_PHASE_IDLE_SECONDS_TOTAL))}) "
                      f"/ on ({RUN_BY}) group_left () (({GPU_SECONDS}) > 0)", W + " {{phase}}"),),
              unit="percentunit", min=0, max=1, stack=True, w=24, repeat=True, fixed_colors=phase_colors(),
              runbook=n.ALERT_IDLE),
    ))

    STRAGGLERS = Row("Stragglers", (
        Panel("Rollout straggler ratio (window min)",
              lambda C: ("The series RolloutStraggler thresholds: the slowest sample's generation time over the mean sample's "
              "(timing_s/agent_loop/generate_sequences/max / mean; server queueing included), the lowest of the last k "
              "normal steps, with the latest step dashed. W equal waves of requests give 2W/(W+1), under 2 however "
              f"unevenly replicas of equal speed share them; above {C.straggler.ratio:g} in every window step fires: one "
              "sample (a preempted request, a slow replica) holds gen. Legacy trainer only (V1 logs no agent-loop "
              "keys). Per replica: the rollout dashboard's latency panels."),
              (Target(sel(REC_STRAGGLER_MIN), W + " window min"),
               Target(run_max(sel(n.ROLLOUT_STRAGGLER)), W + " latest step", dashed=True)),
              unit="none", min=0, decimals=2,
              thresholds=(Step(None, "green"), cfg_step(cfg, "straggler.ratio", "red")),
              show_thresholds="dashed+area", w=12, runbook=n.ALERT_STRAGGLER),
        Panel("Sample generation seconds (slowest, mean, fastest)",
              "Per-sample generation seconds of the latest step as verl logs them (timing_s/agent_loop/"
              "generate_sequences/max, mean, min), with gen dashed: gen waits for the slowest sample, so a max far "
              "above the mean is time every other sample's GPUs sit idle.",
              (Target(run_max(verl(K_GEN_SEQ + "max")), W + " slowest sample"),
               Target(run_max(verl(K_GEN_SEQ + "mean")), W + " mean sample"),
               Target(run_max(verl(K_GEN_SEQ + "min")), W + " fastest sample"),
               Target(run_max(sel(n.STAGE_DURATION, phase="gen")), W + " gen", dashed=True)),
              unit="s", min=0, w=12, runbook=n.ALERT_STRAGGLER),
    ))

    GPU_HOURS = Row("GPU-hours", (
        gpu_hours_panel(cfg),
        Panel("GPU-hours per day by bucket: $experiment",
              "What each ledger bucket costs at the current rate (the figure the alerts quote): its median share of the "
              "last k normal steps x the run's GPUs x 24 h, buckets in ledger order. The buckets add up to the run's "
              "GPUs x 24; reward_critical_path and inter_stage_idle are what RewardBoundRollout and InterStageIdleGPU "
              "would win back. While a stall goes on the run costs its GPUs x 24, all 'stalled' (the exporter's rate moves "
              "with steps and would keep the pre-stall figure).",
              (Target(in_order(gpu_hours_per_day(), n.L_BUCKET, LEDGER_HEAD, LEDGER_TAIL),
                      W + " {{bucket}}"),),
              unit="suffix: GPU-h/day", min=0, kind="bargauge", w=24, h=8, repeat=True,
              runbook=(n.ALERT_REWARD_BOUND, n.ALERT_IDLE)),
    ))

    PIPELINE = Row("Pipeline alerts", (
        Panel("Rollout replicas saturated (10 min share)",
              lambda C: ("Per rollout / reward server replica: share of the last 10 minutes during which requests waited while "
              "every slot ran. " + saturation_rule(C)),
              (Target(run_max(sel(REC_ROLLOUT_SATURATED), "role", "replica"), W + " {{role}} {{replica}}"),),
              unit="percentunit", min=0, max=1,
              thresholds=(Step(None, "green"), cfg_step(cfg, "rollout_queue.saturated_share", "red")),
              show_thresholds="dashed+area", w=8, runbook=ALERT_ROLLOUT_SATURATED),
        Panel("TransferQueue storage filling",
              lambda C: ("Utilisation of the fullest TransferQueue storage unit (live samples / capacity). TransferQueueBacklog "
              f"fires when it is over {C.transferqueue.full_utilization:g}, or past {C.transferqueue.min_utilization:g} "
              f"and full within {C.transferqueue.ttf_seconds:g} s at the net rate of the last "
              f"{C.transferqueue.net_rate_window} (the time to full is on the TransferQueue dashboard)."),
              (Target(run_max(sel(REC_TQ_UTILIZATION)), W + " fullest unit"),),
              unit="percentunit", min=0, max=1,
              thresholds=(Step(None, "green"), cfg_step(cfg, "transferqueue.full_utilization", "red")),
              show_thresholds="dashed", w=8, runbook=ALERT_TQ_BACKLOG),
        Panel("Sources up",
              lambda C: ("Every omniwatch source (log tails, GPU sampler, discovery, agents; 0 = failing) and whether Prometheus "
              "scrapes the exporter (up). OmniwatchSourceDown fires after "
              f"{C.source_down.for_} at 0 (critical for the exporter itself)."),
              (Target(f"min by ({n.L_SOURCE}, {n.L_TARGET}) ({n.SOURCE_UP})", "{{source}} {{target}}"),
               Target(f'min(up{{job="{C.selectors.job}"}})', "exporter scraped")),
              unit="none", min=0, max=1, kind="statetimeline", w=8, scope="global", runbook=n.ALERT_SOURCE_DOWN,
              mappings=((1, "up", "green"), (0, "down", "red"))),
        Panel("Runs dropped at the run cap",
              lambda C: ("Runs the exporter dropped at its run cap (--max-runs; omniwatch_runs_evicted_total, since it started), "
              "next to the runs it holds (omniwatch_runs) and the cap (omniwatch_max_runs). RunCapReached fires while "
              f"'dropped' rose within the last {C.run_cap.window}: a dropped run's series ended and its alerts resolved."),
              (Target(f"sum({n.RUNS_EVICTED_TOTAL})", "dropped"),
               Target(f"sum({n.RUNS})", "runs held"),
               Target(f"max({n.MAX_RUNS})", "cap", dashed=True)),
              unit="none", min=0, w=8, scope="global", runbook=n.ALERT_RUN_CAP),
    ))

    ALERT_ROW = Row("Alerts", (
        Panel("Pending and firing alerts",
              "omniwatch alerts of the selected runs over time, one row per run and alert (Watchdog left out; "
              "TrainingStalled one row per stage): orange pending (the condition holds, the short 'for' still absorbs "
              "scrape jitter), red firing.",
              (Target(alert_states_by_run(), W + " {{alertname}}"),),
              unit="none", kind="statetimeline", w=24, h=8,
              mappings=ALERT_STATE_MAPPINGS),
        Panel("Stall stage",
              lambda C: ("Per run, the TrainingStalled stage its time since the last step has reached, against the rules' own "
              f"thresholds: info after {C.stall.notice_steps:g} typical steps; warning after that plus the planned work "
              f"that may come before the next step (plus {C.stall.unseen_planned_steps:g} typical steps while a first "
              f"checkpoint or validation has not been seen); critical {C.stall.critical_extra_steps:g} typical steps "
              "later; finished: the run's last step was its planned last (the rules never stall it). The alerts also "
              "wait for 'for' and for a checkpoint still being written (--checkpoint-root); crashed: the run's Ray job "
              "failed (TrainingCrashed pages at once, TrainingStalled stays quiet)."),
              (Target(stall_stage(), W),),
              unit="none", kind="statetimeline", w=12, h=7, mappings=STALL_STAGE_MAPPINGS,
              runbook=(n.ALERT_STALLED, n.ALERT_CRASHED)),
        Panel("Planned work before the next step",
              f"What TrainingStalled's warning waits for: the longest of the run's last {planned.RECENT} checkpoints and "
              "validations "
              "(omniwatch_planned_work_seconds by kind; absent until the kind was seen) and the allowance the warning "
              "adds (dashed: the planned work that may come before the next step's line: every kind due by its cadence, "
              "and while the run's total is unknown every kind seen, since any step may be the last).",
              (Target(run_max(sel(n.PLANNED_WORK), n.L_KIND), W + f" {{{{kind}}}} (longest of last {planned.RECENT})"),
               Target(run_max(sel(n.PLANNED_ALLOWANCE)), W + " allowance", dashed=True)),
              unit="s", min=0, w=12, h=7, runbook=n.ALERT_STALLED),
    ))

    return Dashboard(
        config=cfg,
        uid="omniwatch-bottlenecks",
        title="omniwatch / Bottlenecks",
        description="Each alert's own series against its threshold, and why: reward on the critical path, idle GPU time "
                    "by phase and outside the step, stragglers, where the GPU-hours go and what each bucket costs, MFU "
                    "checks, rollout saturation, TransferQueue backlog, sources, stall stages.",
        rows=(SIGNALS, MFU_ROW, REWARD, IDLE, STRAGGLERS, GPU_HOURS, PIPELINE, ALERT_ROW),
        tags=default_tags("bottlenecks", "alerts"),
        variable_metrics=(n.STEP,),
    )
