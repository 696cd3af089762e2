"""The metric catalogue: every series omniwatch exports is named here, once.

Dashboards, rule tests and docs import these constants; ``tests/test_catalogue.py`` checks that
every metric name used in ``alerts/`` and ``dashboards/`` exists here and that ``docs/metrics.md``
(generated from this module by ``omniwatch docs``) lists them all.
"""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "omniwatch_"
PASSTHROUGH_PREFIX = "verl_"

# Label names.
L_PROJECT = "project"
L_EXPERIMENT = "experiment"
# What identifies one run in PromQL aggregations (`by (...)`, `on (...)`): rules and dashboards take it from here.
RUN_BY = f"{L_PROJECT}, {L_EXPERIMENT}"
RUN_LABELS = (L_PROJECT, L_EXPERIMENT)
L_PHASE = "phase"
L_ROLE = "role"
L_STAT = "stat"
L_SOURCE = "source"
L_TARGET = "target"
L_REASON = "reason"
L_FLAG = "flag"
L_MODE = "mode"
L_KEY = "key"

# Label values.
MFU_ROLES = {"perf/mfu/actor": "actor", "perf/mfu/actor_infer": "actor_infer"}
UNTRACKED_PHASE = "untracked"
FLAGS = ("warmup", "validation", "checkpoint")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # gauge | counter | info
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""



CATALOGUE: dict[str, Metric] = {}


def family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    """The empty metric family of a catalogue entry: the one place a collector builds its families
    (client_python adds ``_total`` back to a counter's samples)."""
    m = CATALOGUE[name]
    if m.type == "counter":
        return CounterMetricFamily(name[: -len("_total")], m.help, labels=list(m.labels))
    return GaugeMetricFamily(name, m.help, labels=list(m.labels))


def describe(owned) -> list:
    """What a collector's ``describe()`` returns: its families, empty, so the registry knows the names
    each collector owns and refuses a second collector that registers one of them."""
    return [family(name) for name in owned]


def _m(name: str, type_: str, help_: str, labels: tuple[str, ...] = (), unit: str = "") -> str:
    if name in CATALOGUE:
        raise ValueError(f"duplicate metric {name}")
    if type_ == "counter" and not name.endswith("_total"):
        raise ValueError(f"counter {name} must end in _total")
    CATALOGUE[name] = Metric(name, type_, help_, labels, unit)
    return name


R = RUN_LABELS

# --- the spine contract ------------------------------------------------------------------------
STEP = _m("omniwatch_step", "gauge", "Latest verl global step seen for the run.", R)
STEPS_TOTAL = _m("omniwatch_steps_total", "counter",
                 "Distinct training steps ingested (a step re-run after a trainer restart is not counted again).", R)
LAST_STEP_TS = _m("omniwatch_last_step_timestamp_seconds", "gauge",
                  "Unix time at which the latest step was observed (file mtime for lines read while catching up).", R, "seconds")
STEP_DURATION = _m("omniwatch_step_duration_seconds", "gauge",
                   "Wall time of the latest step (timing_s/step, else perf/time_per_step).", R, "seconds")
STAGE_DURATION = _m("omniwatch_stage_duration_seconds", "gauge",
                    "Seconds of the latest step spent in each timed phase (timing_s/<phase>); phase=\"untracked\" is the step minus all timed phases.",
                    R + (L_PHASE,), "seconds")
STAGE_SECONDS_TOTAL = _m("omniwatch_stage_seconds_total", "counter",
                         "Seconds spent per phase, summed over distinct steps (phase=\"untracked\" included).", R + (L_PHASE,), "seconds")
REWARD_BOUND_RATIO = _m("omniwatch_reward_bound_ratio", "gauge",
                        "Share of the generation window (gen + reward) that reward scoring holds on the critical path, latest step.", R, "ratio")
INTER_STAGE_IDLE_RATIO = _m("omniwatch_inter_stage_idle_ratio", "gauge",
                            "Untracked seconds / step seconds of the latest step (work between timed phases: transfers, barriers).", R, "ratio")
MFU = _m("omniwatch_mfu_ratio", "gauge",
         "MFU as the trainer reported it (perf/mfu/<role>); 0 means the estimator is unsupported, not idle.", R + (L_ROLE,), "ratio")
MFU_BASELINE = _m("omniwatch_mfu_baseline_ratio", "gauge",
                  "The run's MFU reference, anchored to the trainer incarnation: median MFU over its first 20 normal "
                  "steps (zeros ignored; fewer, all before the window, until the window has moved past them; re-chosen "
                  "after a shift inside them). MFUDrop judges against it.", R + (L_ROLE,), "ratio")
TYPICAL_STEP = _m("omniwatch_typical_step_seconds", "gauge",
                  "Median step duration over the recent normal steps (the run's own pace, used by TrainingStalled).", R, "seconds")
THROUGHPUT = _m("omniwatch_throughput_images_per_gpu_second", "gauge",
                "perf/throughput of the latest step: images / (step seconds x GPUs of all pools).", R)
SOURCE_UP = _m("omniwatch_source_up", "gauge",
               "1 when the source works (a watched file that does not exist yet is waited for and counts as up).",
               (L_SOURCE, L_TARGET))
INGEST_ERRORS = _m("omniwatch_ingest_errors_total", "counter",
                   "Inputs skipped by a source, by reason (malformed_json, non_numeric, non_finite, line_too_long, ...).",
                   (L_SOURCE, L_REASON))

HTTP_CONNECTIONS = _m("omniwatch_http_connections", "gauge",
                      "HTTP connections the exporter holds open now (at most --max-connections).")
HTTP_CONNECTIONS_CLOSED = _m("omniwatch_http_connections_closed_total", "counter",
                             "HTTP connections the exporter closed or refused to protect itself, by reason: "
                             "header_timeout / body_timeout (request head or body not received in time), evicted "
                             "(the oldest connection still waiting for a request head, closed for a new one at "
                             "--max-connections), over_capacity (refused with a 503: every connection was inside a "
                             "request), accept_error (accept() failed: out of descriptors).", (L_REASON,))
WATCHED_FILES = _m("omniwatch_watched_files", "gauge", "Files a file source follows, by source (jsonl, console).",
                   (L_SOURCE,))
OPEN_FILES = _m("omniwatch_open_files", "gauge",
                "Descriptors a file source holds open now (at most --max-open-files: an unchanged file is checked "
                "with stat() and opened only when it changed).", (L_SOURCE,))

# --- step-window statistics and baselines (persistence counted in steps) -----------------------
REWARD_BOUND_WINDOW = _m("omniwatch_reward_bound_ratio_window", "gauge",
                         "min/median/max of omniwatch_reward_bound_ratio over the last k normal steps (absent until k exist).",
                         R + (L_STAT,), "ratio")
IDLE_WINDOW = _m("omniwatch_inter_stage_idle_ratio_window", "gauge",
                 "min/median/max of omniwatch_inter_stage_idle_ratio over the last k normal steps.", R + (L_STAT,), "ratio")
MFU_WINDOW = _m("omniwatch_mfu_ratio_window", "gauge",
                "min/median/max of reported MFU over the last k normal steps (zeros ignored).", R + (L_ROLE, L_STAT), "ratio")
STEP_DURATION_WINDOW = _m("omniwatch_step_duration_seconds_window", "gauge",
                          "min/median/max step seconds over the last k normal steps.", R + (L_STAT,), "seconds")
STEP_DURATION_BASELINE = _m("omniwatch_step_duration_baseline_seconds", "gauge",
                            "The run's step-time reference, anchored to the trainer incarnation: median step seconds "
                            "over its first 20 normal steps (fewer, all before the window, until the window has moved "
                            "past them; re-chosen after a shift inside them). StepTimeRegression judges against it.", R, "seconds")
BASELINE_FIRST_STEP = _m("omniwatch_baseline_first_step", "gauge",
                         "First step of the anchored reference (omniwatch_step_duration_baseline_seconds, "
                         "omniwatch_mfu_baseline_ratio): a trainer restart starts a new one, so it moves to the new "
                         "incarnation's first normal step.", R)
BASELINE_LAST_STEP = _m("omniwatch_baseline_last_step", "gauge",
                        "Last step of the anchored reference; it stops moving once the reference holds its 20 steps.", R)
STEP_DURATION_DRIFT = _m("omniwatch_step_duration_drift_ratio", "gauge",
                         "Median step time per unit of work (perf/total_num_images where logged) of the last 10 normal "
                         "steps after the anchored reference / the reference's (StepTimeRegression's creep condition: "
                         "a creep over tens of steps). Absent until 10 normal steps follow the reference.", R, "ratio")
STEP_DRIFT = _m("omniwatch_step_drift_seconds", "gauge",
                "Growth of each part of the step (cause, as omniwatch_step_regression_seconds) over the last 10 normal "
                "steps: their median minus the anchored reference's median, seconds at the current workload.",
                R + ("cause",), "seconds")
STEP_DURATION_RATIO_WINDOW = _m(
    "omniwatch_step_duration_ratio_window", "gauge",
    "min/median/max over the last k normal steps of step time per unit of work (perf/total_num_images where every "
    "step logs it, else per step) / the anchored reference's: what StepTimeRegression thresholds. A workload change "
    "(more images per step) moves omniwatch_workload_ratio, not this.", R + (L_STAT,), "ratio")
STEP_PART_GROWTH = _m("omniwatch_step_part_growth_ratio_window", "gauge",
                      "Each part of the step (cause, as omniwatch_step_regression_seconds): its share of the step minus "
                      "its share in the anchored reference, min/median/max over the last k normal steps (min 0.10: every "
                      "window step spent 10 points more of itself on that part). StepTimeRegression's part condition.",
                      R + ("cause", L_STAT), "ratio")
WORKLOAD_RATIO = _m("omniwatch_workload_ratio", "gauge",
                    "Median images per step (perf/total_num_images) of the last k normal steps / the anchored "
                    "reference's (WorkloadChanged); absent where the run does not log it.", R, "ratio")
MFU_DRIFT = _m("omniwatch_mfu_drift_ratio", "gauge",
               "Median MFU of the last 10 normal steps after the anchored reference / the reference (MFUDrop's creep "
               "condition). Absent until 10 normal steps follow the reference.", R + (L_ROLE,), "ratio")
REFERENCE_INFO = _m("omniwatch_reference_info", "gauge",
                    "Always 1; where the run's anchored reference comes from: origin=incarnation (the first normal "
                    "steps of this trainer incarnation), before_shift (the stable steps before a level shift inside "
                    "them: a fault that began there), kept (the incarnation before a trainer restart: the same "
                    "workload resumed); reason: why a restart started a new one instead (workload_changed, "
                    "config_changed, faster_after_restart, mfu_changed; empty otherwise).", R + ("origin", "reason"))
REFERENCE_SHIFT_STEP = _m("omniwatch_reference_shift_step", "gauge",
                          "The step where a level shift inside the reference steps began (origin=before_shift): the "
                          "reference is the steps before it.", R)
L_SIGNAL = "signal"
SHIFT_ONSET_STEP = _m("omniwatch_shift_onset_step", "gauge",
                      "Where the current shift of a signal (signal=step_time: per unit of work; signal=mfu, by role) "
                      "against its reference began: the step of a step change, or the first step of a creep "
                      "(omniwatch_shift_shape). Alert texts quote it.", R + (L_SIGNAL, L_ROLE))
SHIFT_SHAPE = _m("omniwatch_shift_shape", "gauge",
                 "1 for the shape that fits a signal since its reference best, 0 for the other: shape=step (one change, "
                 "flat since) or creep (growing steadily since its onset); least squares over the last 128 normal steps.",
                 R + (L_SIGNAL, L_ROLE, "shape"))
SHIFT_SIZE = _m("omniwatch_shift_size_ratio", "gauge",
                "How far a signal has moved from its reference: |fitted level at the latest normal step / reference - 1| "
                "(0.18: step time 18 % over it, or MFU 18 % under it).", R + (L_SIGNAL, L_ROLE), "ratio")
SHIFT_STEPS = _m("omniwatch_shift_steps", "gauge",
                 "Normal steps from the onset of a signal's shift to the latest one.", R + (L_SIGNAL, L_ROLE))
WINDOW_STEPS = _m("omniwatch_window_steps", "gauge",
                  "Normal steps currently in the window (the window statistics exist once this reaches k).", R)
REWARD_CRITICAL_PATH = _m("omniwatch_reward_critical_path_seconds", "gauge",
                          "Reward seconds on the critical path of the latest step: mode=colocated (timing_s/reward) or "
                          "mode=streamed (tail of gen after the last sample finished generating).", R + (L_MODE,), "seconds")
STEP_FLAG = _m("omniwatch_step_flag", "gauge",
               "1 when the latest step carries the flag (warmup, validation, checkpoint); such steps are left out of windows.",
               R + (L_FLAG,))
FLAGGED_STEPS_TOTAL = _m("omniwatch_flagged_steps_total", "counter", "Steps that carried each flag.", R + (L_FLAG,))
STEPS_REPLAYED_TOTAL = _m("omniwatch_steps_replayed_total", "counter",
                          "Steps seen again after a trainer restart (re-run work; not counted in omniwatch_steps_total).", R)
TRAINER_RESTARTS_TOTAL = _m("omniwatch_trainer_restarts_total", "counter",
                            "Trainer restarts detected (log truncated or rotated, or the step counter went back).", R)
PASSTHROUGH_KEYS = _m("omniwatch_passthrough_keys", "gauge",
                      "Distinct verl keys the run has logged that omniwatch holds for the verl_ prefix (capped by "
                      "--max-keys); of those, the keys the latest step carried and the validation keys are exported.", R)
RUNS = _m("omniwatch_runs", "gauge", "Runs (project, experiment) held in memory.")
MAX_RUNS = _m("omniwatch_max_runs", "gauge", "The run cap (--max-runs): runs held in memory at most.")
RUNS_EVICTED_TOTAL = _m("omniwatch_runs_evicted_total", "counter",
                        "Runs dropped at the run cap (--max-runs) to make room for a new run: the least recently active "
                        "goes (alert RunCapReached).")
BUILD_INFO = _m("omniwatch_build_info", "gauge", "Always 1; the omniwatch version as a label.", ("version",))
SCRAPE_DURATION = _m("omniwatch_scrape_duration_seconds", "gauge", "Seconds the previous /metrics render took.", (), "seconds")

RUN_INFO = _m("omniwatch_run_info", "gauge",
              "Always 1; the run's layout as detected from the keys it logs: trainer (legacy | v1 | unknown), reward "
              "(colocated: the reward model runs inside the step; streamed: scored while samples generate, by a reward "
              "pool or a reward function; unknown) and async_mode (sync | separate_async | unknown). Alerts pick their "
              "remedy by it.", R + ("trainer", "reward", "async_mode"))
REMEDY_INFO = _m("omniwatch_remedy_info", "gauge",
                 "Always 1; one remedy as the exported runs need it (remedy_info.py): its one-line action (label "
                 "action, at most 120 characters) and full text (label remedy, one line), keyed by variant (a short "
                 "hash of the two texts: runs whose layout, trainer config and break-even render the same text share "
                 "it). omniwatch_run_remedy says which variant each run's alert gets.", ("variant", "action", "remedy"))
RUN_REMEDY = _m("omniwatch_run_remedy", "gauge",
                "Always 1; for each run, each alert (and severity, and the alert label its remedy branches on: cause "
                "of StepTimeRegression, role / engine of RolloutQueueSaturated, mode of RolloutRejectionHigh) the "
                "omniwatch_remedy_info variant it renders for this run's layout and trainer config: the overview's "
                "'Why slow' row joins a firing alert to its action through it.",
                R + ("alertname", "severity", "cause", "role", "engine", "mode", "variant"))
REWARD_POOL_BREAK_EVEN = _m("omniwatch_reward_pool_break_even_gpus", "gauge",
                            "The largest dedicated reward pool (GPUs) that still pays for this run: the largest P with "
                            "P / (N + P) below reward's share of the step on the critical path (window min over the "
                            "last k normal steps; N = the run's trainer GPUs), at most N. 0: no pool pays at this "
                            "share. Quoted by RewardBoundRollout's remedy.", R)
REWARD_STEP_SHARE_WINDOW = _m("omniwatch_reward_step_share_window", "gauge",
                              "min/median/max over the last k normal steps of reward seconds on the critical path / step "
                              "seconds (how much reward matters to the step).", R + (L_STAT,), "ratio")
STEP_REGRESSION = _m("omniwatch_step_regression_seconds", "gauge",
                     "Growth of each part of the step (cause = reward, inter_stage_idle, actor, rollout, weight_sync, "
                     "other): window median minus the anchored reference's median, seconds; present with the "
                     "step-time reference. "
                     "StepTimeRegression names the cause of omniwatch_step_regression_top.", R + ("cause",), "seconds")
STEP_REGRESSION_TOP = _m("omniwatch_step_regression_top", "gauge",
                         "1 for the cause StepTimeRegression names, 0 for the others: the part of the step that grew "
                         "most, kept while it grew at least 0.8x as much as the largest (two parts growing alike do not "
                         "swap the name with each step's jitter); present with omniwatch_step_regression_seconds.",
                         R + ("cause",))
MFU_UNSUPPORTED = _m("omniwatch_mfu_unsupported", "gauge",
                     "1 when every one of the last k normal steps reported MFU exactly 0 (VeRL-Omni has no FLOPs estimator "
                     "for the pipeline, or did not know the GPU).", R + (L_ROLE,))
MFU_DEVICE_PEAK = _m("omniwatch_mfu_device_peak_tflops", "gauge",
                     "bf16 dense peak (TFLOP/s) of the silicon the GPU check found on this node (NVML name and memory, "
                     "or --peak-tflops), for the runs reporting MFU: the value to pin with VERL_OMNI_DEVICE_FLOPS_TFLOPS.",
                     R + (L_ROLE,))

L_BUCKET = "bucket"
GPU_SECONDS_TOTAL = _m("omniwatch_gpu_seconds_total", "counter",
                       "The run's GPU-seconds by where they went (bucket = a phase such as gen or update_actor, "
                       "reward_critical_path, inter_stage_idle, checkpoint, validation, outside_step_timer, stalled); "
                       "the buckets sum to the run's GPUs x wall time between steps (docs/report.md).",
                       R + (L_BUCKET,), "seconds")
STEP_REGRESSION_GPU_HOURS_PER_DAY = _m(
    "omniwatch_step_regression_gpu_hours_per_day", "gauge",
    "What each cause of a step-time regression costs at the current rate: its growth over the anchored reference / the window's "
    "median step x the run's GPUs x 24 h (GPU-hours per day).", R + ("cause",))
RUN_GPUS = _m("omniwatch_run_gpus", "gauge",
              "GPUs the ledger multiplies by: origin=\"log\" derived from the run's keys (perf/total_num_images / "
              "(perf/throughput x perf/time_per_step)), origin=\"config\" every GPU pool the trainer config names, "
              "origin=\"ray\" the GPU bundles of the run's placement groups (no config read), origin=\"flag\" from --gpus.",
              R + ("origin",))
RUN_POOL_GPUS = _m("omniwatch_run_pool_gpus", "gauge",
                   "The run's GPUs per pool (trainer, reward, rollout: standalone, teacher: distillation, other) from "
                   "its config (origin=\"config\") or Ray's placement groups (origin=\"ray\"); they sum to "
                   "omniwatch_run_gpus when it has that origin. Per-pool GPU-hours: a pool's share of "
                   "omniwatch_gpu_seconds_total.", R + ("pool", "origin"))

GPU_HOURS_PER_DAY = _m("omniwatch_gpu_hours_per_day", "gauge",
                       "What each ledger bucket costs at the current rate: its share of the last k normal steps' "
                       "time x the run's GPUs x 24 h (GPU-hours per day; absent until the window is full and the "
                       "GPUs are known). Alert annotations quote it for the bottleneck's bucket.",
                       R + (L_BUCKET,))

ZERO_STD_WINDOW = _m("omniwatch_reward_zero_std_ratio_window", "gauge",
                     "min/median/max of critic/rewards/zero_std_ratio over the last k normal steps (reward saturation).",
                     R + (L_STAT,), "ratio")

# --- signals the seeds name (issue 13 item 11) and the passthrough's step (item 9) ----------------
ROLLOUT_STRAGGLER = _m("omniwatch_rollout_straggler_ratio", "gauge",
                       "timing_s/agent_loop/generate_sequences/max / .../mean of the latest step: the slowest sample's "
                       "generation time (server queueing included) against the mean sample's. Equal waves of requests "
                       "give 2W/(W+1) < 2; above is a straggler. Legacy trainer only (V1 logs no agent-loop keys).", R, "ratio")
ROLLOUT_STRAGGLER_WINDOW = _m("omniwatch_rollout_straggler_ratio_window", "gauge",
                              "min/median/max of omniwatch_rollout_straggler_ratio over the last k normal steps.",
                              R + (L_STAT,), "ratio")
GRAD_NORM_NONFINITE = _m("omniwatch_grad_norm_nonfinite", "gauge",
                         "1 when the latest step logged actor/grad_norm non-finite (NaN/Inf, written as null): VeRL-Omni "
                         "skipped the optimizer step of at least one mini-batch (the norm is their mean); 0 when finite; "
                         "absent when the step did not log it.", R)
GRAD_NORM_NONFINITE_RECENT = _m("omniwatch_grad_norm_nonfinite_recent_steps", "gauge",
                                "How many of the last N normal steps (N = --baseline-steps, 20; fewer early in a trainer "
                                "incarnation) logged actor/grad_norm non-finite, i.e. skipped an update. Present once k "
                                "normal steps exist and one of the last N logged actor/grad_norm.", R)
GRAD_NORM_NONFINITE_TOTAL = _m("omniwatch_grad_norm_nonfinite_steps_total", "counter",
                               "Distinct steps (any kind) whose actor/grad_norm was logged non-finite.", R)
RS_SEQ_MASKED_WINDOW = _m("omniwatch_rollout_rs_seq_masked_ratio_window", "gauge",
                          "min/median/max over the last k normal steps of the sequence-level share rejection sampling "
                          "masked: mode=\"decoupled\" from rollout_corr/rollout_rs_seq_masked_fraction, mode=\"bypass\" "
                          "from actor/rollout_corr/rollout_rs_seq_masked_fraction.", R + (L_MODE, L_STAT), "ratio")
OUTSIDE_STEP_SECONDS = _m("omniwatch_outside_step_seconds", "gauge",
                          "Wall seconds between the previous step's line and the latest one that no verl timer covers: the "
                          "arrival gap minus timing_s/step, timing_s/testing and the profiler timers (dataloader, metric "
                          "computation, logging; V1: the post-step TransferQueue re-fetch and kv_clear). Live arrivals of "
                          "consecutive steps only: absent for lines read from a backlog, batched pushes and "
                          "accelerated replays.",
                          R, "seconds")
OUTSIDE_STEP_WINDOW = _m("omniwatch_outside_step_ratio_window", "gauge",
                         "min/median/max over the last k normal steps of omniwatch_outside_step_seconds / the arrival gap "
                         "(absent unless all k were measured live).", R + (L_STAT,), "ratio")
TIMER_RESIDUAL = _m("omniwatch_step_timer_residual_seconds", "gauge",
                    "timing_s/step minus the sum of the in-step timers of the latest step, NOT clamped: negative when the "
                    "timers add up to more than the step (a timer nested inside another phase is counted twice, which "
                    "hides untimed time; phase=\"untracked\" is this clamped at 0).", R, "seconds")
TIMER_RESIDUAL_WINDOW = _m("omniwatch_step_timer_residual_ratio_window", "gauge",
                           "min/median/max over the last k normal steps of omniwatch_step_timer_residual_seconds / step "
                           "seconds (signed).", R + (L_STAT,), "ratio")
VALIDATION_STEP = _m("omniwatch_validation_step", "gauge",
                     "For each validation key (val-*, val/*) exported as verl_<key>: the step whose line carried its "
                     "value. Validation runs every test_freq steps, so its verl_ series keep their last value between "
                     "validations; join on (project, experiment, key) to see how old it is.", R + (L_KEY,))

# --- GPU sampler (NVML) and phase attribution --------------------------------------------------
L_GPU, L_UUID, L_NODE = "gpu", "uuid", "node"
GPU_LABELS = (L_NODE, L_GPU, L_UUID)
GPU_BUSY_SECONDS_TOTAL = _m("omniwatch_gpu_busy_seconds_total", "counter",
                            "Seconds the GPU had a kernel running (NVML utilization samples above the busy threshold).",
                            GPU_LABELS, "seconds")
GPU_IDLE_SECONDS_TOTAL = _m("omniwatch_gpu_idle_seconds_total", "counter",
                            "Seconds the GPU was idle (NVML utilization samples at or below the busy threshold).",
                            GPU_LABELS, "seconds")
GPU_PHASE_IDLE_SECONDS_TOTAL = _m("omniwatch_gpu_phase_idle_seconds_total", "counter",
                                  "GPU idle seconds attributed to training phases (phase=\"inter_stage\" is time between timed phases).",
                                  R + GPU_LABELS + (L_PHASE,), "seconds")
GPU_PHASE_BUSY_SECONDS_TOTAL = _m("omniwatch_gpu_phase_busy_seconds_total", "counter",
                                  "GPU busy seconds attributed to training phases.", R + GPU_LABELS + (L_PHASE,), "seconds")
GPU_IDLE_RATIO = _m("omniwatch_gpu_idle_ratio", "gauge",
                    "Idle share of each phase of the latest attributed step, averaged over the run's GPUs.",
                    R + (L_PHASE,), "ratio")
GPU_UTILIZATION = _m("omniwatch_gpu_utilization_ratio", "gauge", "Latest NVML utilization sample (0-1).", GPU_LABELS, "ratio")
GPU_MEMORY_USED = _m("omniwatch_gpu_memory_used_bytes", "gauge", "GPU memory used.", GPU_LABELS, "bytes")
GPU_MEMORY_TOTAL = _m("omniwatch_gpu_memory_total_bytes", "gauge", "GPU memory total.", GPU_LABELS, "bytes")
GPU_POWER = _m("omniwatch_gpu_power_watts", "gauge", "GPU power draw.", GPU_LABELS, "watts")
GPU_SM_CLOCK = _m("omniwatch_gpu_sm_clock_hertz", "gauge", "GPU SM clock.", GPU_LABELS, "hertz")
GPU_INFO = _m("omniwatch_gpu_info", "gauge", "Always 1; GPU name and the bf16 peak omniwatch knows for it.",
              GPU_LABELS + ("name", "peak_tflops"))
MFU_IMPLIED_PEAK = _m("omniwatch_mfu_implied_peak_tflops", "gauge",
                      "Device peak (TFLOP/s) the reported MFU implies if the run ran at the GPU's real peak-relative rate; "
                      "compared with the NVML device name by the MFU cause check.", R + (L_ROLE,))
MFU_SUSPECTED_CAUSE = _m("omniwatch_mfu_suspected_cause", "gauge",
                         "1 for the cause the MFU cause check suspects while reported MFU > 1 (cause=relabeled_sku, "
                         "peak_mismatch or flops_overcount); the full sentence is at /api/v1/gpu.", R + (L_ROLE, "cause"))
GPU_INTER_STAGE_IDLE_WINDOW = _m(
    "omniwatch_gpu_inter_stage_idle_ratio_window", "gauge",
    "min/median/max over the last k normal steps of the GPU inter-stage idle ratio: NVML-sampled GPU idle seconds "
    "attributed to phase=\"inter_stage\" during the step, averaged over the run's GPUs on this node, / step seconds "
    "(the GPU evidence of InterStageIdleGPU). Absent until k normal steps are attributed in a row, and while k or "
    "more of the run's steps await GPU samples.", R + (L_STAT,), "ratio")

# --- discovered endpoints (Ray, TransferQueue, vLLM-Omni) ------------------------------------------
L_ROLE_T, L_REPLICA = "role", "replica"
ROLLOUT_MAX_NUM_SEQS = _m("omniwatch_rollout_max_num_seqs", "gauge",
                          "max_num_seqs of each rollout/reward server replica (from discovery or --max-num-seqs).",
                          R + (L_ROLE_T, L_REPLICA))
SD_TARGETS = _m("omniwatch_sd_targets", "gauge", "Targets served to Prometheus by HTTP service discovery, by kind.", ("kind",))

# --- alert relay ------------------------------------------------------------------------------
ALERT_NOTIFICATIONS_TOTAL = _m("omniwatch_alert_notifications_total", "counter",
                               "Alertmanager webhook notifications received, by status (firing, resolved).", ("status",))
RELAY_DELIVERIES_TOTAL = _m("omniwatch_relay_deliveries_total", "counter",
                            "Relay deliveries to configured receivers, by receiver and result (ok, retry, failed).",
                            ("receiver", "result"))
RELAY_PENDING = _m("omniwatch_relay_pending", "gauge", "Notifications stored but not yet delivered, by receiver.", ("receiver",))


# --- planned work and the end of a run (TrainingStalled's staging, run expiry; core/planned.py) -------
L_KIND = "kind"
PLANNED_WORK = _m("omniwatch_planned_work_seconds", "gauge",
                  "Longest of the run's last 3 occurrences of each kind of planned work: kind=\"checkpoint\" "
                  "(timing_s/save_checkpoint, inside the step) or kind=\"validation\" (timing_s/testing, after the "
                  "step, before its log line). Absent until the kind was seen.", R + (L_KIND,), "seconds")
PLANNED_EVERY = _m("omniwatch_planned_work_every_steps", "gauge",
                   "Cadence of each kind of planned work (save_freq / test_freq as the steps that carried it "
                   "imply: multiples of it, none skipped since the lowest step seen). Absent while unknown.",
                   R + (L_KIND,))
PLANNED_ALLOWANCE = _m("omniwatch_planned_allowance_seconds", "gauge",
                       "Planned work that may come before the next step's line: the durations of every kind seen "
                       "that is due on the next step by its cadence, has no known cadence, or is forced because "
                       "the next step may be the last (always, while the total is unknown). TrainingStalled's "
                       "warning and critical thresholds add it.", R, "seconds")
PLANNED_UNSEEN = _m("omniwatch_planned_unseen_kinds", "gauge",
                    "Kinds of planned work (checkpoint, validation) the run has not shown yet: their first "
                    "occurrence cannot be announced, so TrainingStalled's warning waits a reserve of typical "
                    "steps while this is above 0.", R)
PLANNED_UNSEEN_CONFIGURED = _m("omniwatch_planned_unseen_configured_kinds", "gauge",
                               "Kinds of planned work not seen yet that the trainer's config says may come before "
                               "the next step (save_freq / test_freq due on it, or the next step may be the last): "
                               "with no normal step yet, TrainingStalled's early stages wait a reserve of warm-up "
                               "steps while this is above 0 (without a config it is 0: nothing is known).", R)
RUN_TOTAL_STEPS = _m("omniwatch_run_total_steps", "gauge",
                     "Total training steps the trainer announced (console: \"Total training steps: N\"); absent "
                     "for JSONL-only runs.", R)
RUN_FINISHED = _m("omniwatch_run_finished", "gauge",
                  "1 when the latest step was the run's planned last (the announced total reached, or a "
                  "checkpoint / validation off its cadence: verl forces both on the last step), else 0. "
                  "TrainingStalled ignores finished runs; they leave /metrics after --run-expiry.", R)
RUN_LOG_OPEN = _m("omniwatch_run_log_open", "gauge",
                  "1 while a process other than omniwatch holds the run's log file open for writing (a live "
                  "trainer: a stall never expires), 0 once it was seen open and is no longer (the trainer "
                  "process ended: the run expires after --run-expiry); absent when never seen (a log written "
                  "on another node, another user's process, push: expires after --stalled-run-expiry).", R)
CHECKPOINT_WRITE_TS = _m("omniwatch_checkpoint_write_timestamp_seconds", "gauge",
                         "Newest modification time under <--checkpoint-root>/<project>/<experiment>/global_step_<N> "
                         "for N = the step after the latest one: the next step is saving a checkpoint. "
                         "TrainingStalled's warning and critical wait while it keeps being written. Absent without "
                         "--checkpoint-root or such a directory.", R, "seconds")

# The trainer's configuration (trainer_config.py; docs/sources.md#trainer-configuration).
L_POOL = "pool"
TRAINER_CONFIG_INFO = _m("omniwatch_trainer_config_info", "gauge",
                         "1 per run: where its trainer configuration was read (source=\"console\": VeRL-Omni's "
                         "pprint in a followed console log, \"pprint\" or \"yaml\": a --trainer-config file such "
                         "as Hydra's .hydra/config.yaml, \"none\": no config, omniwatch assumes) and what it says: "
                         "engine (fsdp | veomni), trainer (legacy | v1), async_mode, lora (true | false); "
                         "\"unknown\" where it does not say.", R + (L_SOURCE, "engine", "trainer", "async_mode", "lora"))
TRAINER_CONFIG_TOTAL_STEPS = _m("omniwatch_trainer_config_total_steps", "gauge",
                                "trainer.total_training_steps from the run's config (absent when null: the trainer "
                                "derives it from the epochs).", R)
TRAINER_CONFIG_EVERY = _m("omniwatch_trainer_config_every_steps", "gauge",
                          "trainer.save_freq (kind=\"checkpoint\") and trainer.test_freq (kind=\"validation\") "
                          "from the run's config; <= 0 means never (no TrainingStalled reserve for that kind).",
                          R + (L_KIND,))
TRAINER_CONFIG_SP = _m("omniwatch_trainer_config_sequence_parallel_size", "gauge",
                       "Ulysses sequence-parallel size of the actor engine from the run's config: VeRL-Omni's "
                       "reported MFU is this many times the per-GPU MFU (MFUImpossible judges MFU / SP).", R)
TRAINER_CONFIG_GPUS = _m("omniwatch_trainer_config_gpus", "gauge",
                         "GPUs per pool from the run's config: pool=\"trainer\" (trainer.nnodes x n_gpus_per_node), "
                         "\"reward\" (a reward-model resource pool), \"rollout\" (V1 separate_async standalone "
                         "rollout); the ledger counts their sum.", R + (L_POOL,))
L_SETTING, L_VALUE = "setting", "value"
TRAINER_CONFIG_SETTING = _m("omniwatch_trainer_config_setting", "gauge",
                            "One series per setting the remedies branch on that the run's config states "
                            "(trainer_config.SETTINGS: setting = param_offload, optimizer_offload, lora_rank, "
                            "layered_summon, checkpoint_backend, bucket_megabytes, reward_model, reward_pool, "
                            "parameter_sync_step, resume_mode, ...): value = its word (true | false, the integer, "
                            "the enum word), the sample = the number (booleans 1 / 0, enums 1). Absent: the config "
                            "does not say, or none was read.", R + (L_SETTING, L_VALUE))
WARMUP_STEP = _m("omniwatch_warmup_step_seconds", "gauge",
                 "Longest warm-up step (timing_s/step) of the run's current trainer incarnation: until a typical "
                 "step exists TrainingStalled counts in it (info after stall.provisional_factor, warning after "
                 "stall.early_warning_warmups, critical after stall.early_critical_warmups of them), so a hang in "
                 "step 2 or 3 pages.", R, "seconds")
RUN_STALE = _m("omniwatch_run_stale", "gauge",
               "1 for a run whose last line, when omniwatch first saw it (a file's backlog), was already older than "
               "stall.history_steps of its typical steps plus its planned allowance, or than --stale-horizon (history, "
               "not news: reported once at info, TrainingStalled never escalates); its next step, a live writer of "
               "its log or its Ray job still running clear it.", R)
STALE_RUNS = _m("omniwatch_stale_runs", "gauge",
                "Runs omniwatch first saw as history (omniwatch_run_stale 1) and still holds "
                "(`omniwatch status` prints the count).")

# Alert names (the rule files define them; tests check both sides agree).
ALERT_REWARD_BOUND = "RewardBoundRollout"
ALERT_IDLE = "InterStageIdleGPU"
ALERT_CRASHED = "TrainingCrashed"
ALERT_MFU_IMPOSSIBLE = "MFUImpossible"
ALERT_MFU_DROP = "MFUDrop"
ALERT_STALLED = "TrainingStalled"
ALERT_MFU_LOW = "MFUImplausiblyLow"
ALERT_MFU_UNSUPPORTED = "MFUEstimatorUnsupported"
ALERT_STEP_REGRESSION = "StepTimeRegression"
ALERT_WORKLOAD_CHANGED = "WorkloadChanged"
ALERT_REWARD_SATURATION = "RewardSaturation"
ALERT_SOURCE_DOWN = "OmniwatchSourceDown"
ALERT_GPU_MEMORY = "GPUMemoryNearFull"
ALERT_WATCHDOG = "Watchdog"
ALERT_ROLLOUT_SATURATED = "RolloutQueueSaturated"
ALERT_TQ_BACKLOG = "TransferQueueBacklog"
ALERT_TQ_SLOW_LEAK = "TransferQueueSlowLeak"
ALERT_STRAGGLER = "RolloutStraggler"
ALERT_RANK_STRAGGLER = "RankStraggler"
ALERT_GRAD_NONFINITE = "GradNormNonFinite"
ALERT_RS_REJECTION = "RolloutRejectionHigh"
ALERT_OUTSIDE_STEP = "TimeOutsideStep"
ALERT_TIMERS_EXCEED = "TimersExceedStep"
ALERT_RUN_CAP = "RunCapReached"
ALERT_RAY_TASK_EVENTS_LOST = "RayTaskEventsLost"
CORE_ALERTS = (ALERT_REWARD_BOUND, ALERT_IDLE, ALERT_MFU_IMPOSSIBLE, ALERT_MFU_DROP, ALERT_STALLED)

# Fault kinds of tests/fixtures/verl/*.truth.json -> the alert each must raise.
FAULT_TO_ALERT = {
    "reward_slow": ALERT_REWARD_BOUND,
    "idle_gap": ALERT_IDLE,
    "mfu_value": ALERT_MFU_IMPOSSIBLE,
    "actor_slow": ALERT_MFU_DROP,
    "stalled_after_step": ALERT_STALLED,
}

# --- Ray task events: who holds the step (discovery/taskwatch.py, taskmetrics.py) -------------------
L_PHASE_T, L_RANK, L_NODE, L_HOLDER = "phase", "rank", "node", "holder"
RAY_TASK_POLLS_TOTAL = _m("omniwatch_ray_task_polls_total", "counter", "Polls of Ray's state API for task events.")
RAY_TASK_POLL_SECONDS = _m("omniwatch_ray_task_poll_seconds", "gauge",
                           "Cost of the latest task-event poll: wall seconds and exporter CPU seconds (kind).", ("kind",),
                           "seconds")
RAY_STATE_API_CALLS_TOTAL = _m("omniwatch_ray_state_api_calls_total", "counter",
                               "HTTP calls to Ray's state API made by the task-event source.")
RAY_TASK_EVENTS_DROPPED = _m("omniwatch_ray_task_events_dropped", "gauge",
                             "Task events Ray's GCS reports it dropped (it keeps a bounded number): lanes drawn "
                             "while this grows are incomplete.")
RAY_TASK_EVENTS_LOSSY = _m("omniwatch_ray_task_events_lossy", "gauge",
                           "1 while the latest task-event poll lost events (Ray dropped some, or the page size cut "
                           "the answer): no call is closed on such a poll.")
STEP_HOLDER_INFO = _m("omniwatch_step_holder_info", "gauge",
                      "Who holds the step now, from Ray's task events: the one-line answer as label holder "
                      "(no ages in it, so it changes only when the situation does), the phase and role. Value 1.",
                      R + (L_ROLE_T, L_PHASE_T, L_HOLDER))
STEP_HOLDER_SECONDS = _m("omniwatch_step_holder_seconds", "gauge",
                         "How long the holder named by omniwatch_step_holder_info has held the step.", R, "seconds")
L_STACK, L_STACK_OF = "stack", "of"
RAY_STACK_INFO = _m("omniwatch_ray_stack_info", "gauge",
                    "Where a held call is stuck, from Ray's /task/traceback (py-spy): label stack = the innermost "
                    "frames of the training code (function (file:line), innermost first, bounded, redacted) of the "
                    "worker running the call, or why no stack could be had (and the fix); of=\"holder\" for the call "
                    "holding the step, \"straggler\" for the rank RankStraggler names while it runs. Value: the "
                    "unix time of the dump.", R + (L_STACK_OF, L_ROLE_T, L_PHASE_T, L_RANK, L_STACK), "seconds")
L_JOB, L_JOB_TYPE, L_JOB_STATUS, L_ERROR = "ray_job", "type", "status", "error"
RAY_JOB_INFO = _m("omniwatch_ray_job_info", "gauge",
                  "The Ray job matched to the run (--ray-job, the job whose driver or TaskRunner writes the run's "
                  "log, or the only training job): its id, type (SUBMISSION / DRIVER), status as omniwatch reads it "
                  "(RUNNING, SUCCEEDED, FAILED, STOPPED; a driver job that ended is SUCCEEDED unless its TaskRunner "
                  "or another call failed) and, when it failed, Ray's error message (one line, bounded, redacted). "
                  "Value 1.", R + (L_JOB, L_JOB_TYPE, L_JOB_STATUS, L_ERROR))
RUN_CRASHED = _m("omniwatch_run_crashed", "gauge",
                 "1 when the run's Ray job failed (the crash, not a hang: TrainingCrashed pages at once and "
                 "TrainingStalled stays quiet); 0 while it runs or after it finished. Absent without a matched job.", R)
RAY_WORKERS_RUNNING = _m("omniwatch_ray_workers_running", "gauge",
                         "Worker calls running now, by role and phase (Ray task events).", R + (L_ROLE_T, L_PHASE_T))
RAY_WORKER_PHASE = _m("omniwatch_ray_worker_phase", "gauge",
                      "One lane per worker rank: the code of the phase it runs now (0 idle; the dashboard maps codes "
                      "to phase names). Absent for a role with more workers than --ray-lanes-max (then "
                      "omniwatch_ray_workers_running counts them).", R + (L_ROLE_T, L_RANK))
RAY_DISPATCH_SPREAD = _m("omniwatch_ray_dispatch_spread_ratio", "gauge",
                         "Latest finished dispatch of a role's phase: the slowest worker's duration / the median "
                         "worker's.", R + (L_ROLE_T, L_PHASE_T), "ratio")
RAY_STRAGGLER_STREAK = _m("omniwatch_ray_straggler_dispatches", "gauge",
                          "Finished dispatches in a row (most recent first) whose last worker to finish was this rank.",
                          R + (L_ROLE_T, L_PHASE_T, L_RANK, L_NODE))
RAY_STRAGGLER_SPREAD_MIN = _m("omniwatch_ray_straggler_spread_ratio_min", "gauge",
                              "Smallest spread (slowest / median duration) over the dispatches of that streak.",
                              R + (L_ROLE_T, L_PHASE_T, L_RANK, L_NODE), "ratio")
# --- Per-fleet GPU time: GPU seconds by the fleet / phase of the worker holding the GPU (gpu/fleet.py) ----
L_FLEET, L_BUCKET, L_MAPPING = "fleet", "bucket", "mapping"
GPU_FLEET_SECONDS_TOTAL = _m("omniwatch_gpu_fleet_seconds_total", "counter",
                             "GPU seconds of each node's sampled GPUs (the exporter's own and every node agent's) by "
                             "the fleet (actor / rollout / reward / other) and phase of the Ray worker call holding "
                             "the GPU (phase none: no call), in goodput buckets (productive: busy in a compute call; "
                             "overhead: any second of a weight-sync / checkpoint / init / wake-sleep call, or busy "
                             "outside any call; idle; unmeasured: the node's agent was down, its GPUs' seconds are "
                             "unknown), and how the GPU was mapped to the worker (nvml_pid, placement, node, "
                             "unmapped, agent_down). Cluster totals: sum without (node).",
                             R + (L_NODE, L_FLEET, L_PHASE_T, L_BUCKET, L_MAPPING), "seconds")
GPU_FLEET_GPUS = _m("omniwatch_gpu_fleet_gpus", "gauge",
                    "Each node's sampled GPUs by how the per-fleet GPU time maps each to the worker holding it "
                    "(nvml_pid, placement, node, unmapped; agent_down: the node's agent is down) and that worker's "
                    "fleet.", R + (L_NODE, L_FLEET, L_MAPPING))
