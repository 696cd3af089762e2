"""The metric catalogue: every series omniwatch exports is named here, once.

Dashboards, rule tests and docs import these constants; ``tests/test_catalogue.py`` checks that
every metric name used in ``alerts/`` and ``dashboards/`` exists here and that ``docs/metrics.md``
(generated from this module by ``omniwatch docs``) lists them all.
"""
from __future__ import annotations

from dataclasses import dataclass

PREFIX = "omniwatch_"
PASSTHROUGH_PREFIX = "verl_"

# Label names.
L_PROJECT = "project"
L_EXPERIMENT = "experiment"
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
STATS = ("min", "median", "max")
MFU_ROLES = {"perf/mfu/actor": "actor", "perf/mfu/actor_infer": "actor_infer"}
UNTRACKED_PHASE = "untracked"
FLAGS = ("warmup", "validation", "checkpoint")
REWARD_MODES = ("colocated", "streamed")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # gauge | counter | info
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""

    @property
    def exposed(self) -> str:
        """Name as it appears in the exposition (counters end in ``_total``)."""
        return self.name


CATALOGUE: dict[str, Metric] = {}


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
                  "Median MFU over the baseline steps before the current window (normal steps only, zeros ignored).", R + (L_ROLE,), "ratio")
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
                            "Median step seconds over the baseline steps before the current window.", R, "seconds")
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
                      "Distinct verl keys exported under the verl_ prefix for the run (capped by --max-keys).", R)
RUNS = _m("omniwatch_runs", "gauge", "Runs (project, experiment) held in memory.")
BUILD_INFO = _m("omniwatch_build_info", "gauge", "Always 1; the omniwatch version as a label.", ("version",))
SCRAPE_DURATION = _m("omniwatch_scrape_duration_seconds", "gauge", "Seconds the previous /metrics render took.", (), "seconds")

RUN_INFO = _m("omniwatch_run_info", "gauge",
              "Always 1; the run's layout as detected from the keys it logs: trainer (legacy | v1 | unknown), reward "
              "(colocated: the reward model runs inside the step; streamed: scored while samples generate, by a reward "
              "pool or a reward function; unknown) and async_mode (sync | separate_async | unknown). Alerts pick their "
              "remedy by it.", R + ("trainer", "reward", "async_mode"))
REWARD_STEP_SHARE_WINDOW = _m("omniwatch_reward_step_share_window", "gauge",
                              "min/median/max over the last k normal steps of reward seconds on the critical path / step "
                              "seconds (how much reward matters to the step).", R + (L_STAT,), "ratio")
STEP_REGRESSION = _m("omniwatch_step_regression_seconds", "gauge",
                     "Growth of each part of the step (cause = reward, inter_stage_idle, actor, rollout, weight_sync, "
                     "other): window median minus baseline median, seconds; present with the step-time baseline. "
                     "StepTimeRegression names the largest.", R + ("cause",), "seconds")
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
RUN_GPUS = _m("omniwatch_run_gpus", "gauge",
              "GPUs the ledger multiplies by: source=\"log\" derived from the run's keys (perf/total_num_images / "
              "(perf/throughput x perf/time_per_step)), source=\"flag\" from --gpus.", R + (L_SOURCE,))

GPU_HOURS_PER_DAY = _m("omniwatch_gpu_hours_per_day", "gauge",
                       "What each ledger bucket costs at the current rate: its share of the last k normal steps' "
                       "time x the run's GPUs x 24 h (GPU-hours per day; absent until the window is full and the "
                       "GPUs are known). Alert annotations quote it for the bottleneck's bucket.",
                       R + (L_BUCKET,))

ZERO_STD_WINDOW = _m("omniwatch_reward_zero_std_ratio_window", "gauge",
                     "min/median/max of critic/rewards/zero_std_ratio over the last k normal steps (reward saturation).",
                     R + (L_STAT,), "ratio")

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
DISCOVERY_UP = SOURCE_UP  # discovery reports through omniwatch_source_up{source="ray"|"transferqueue"|...}

# --- alert relay ------------------------------------------------------------------------------
ALERT_NOTIFICATIONS_TOTAL = _m("omniwatch_alert_notifications_total", "counter",
                               "Alertmanager webhook notifications received, by status (firing, resolved).", ("status",))
RELAY_DELIVERIES_TOTAL = _m("omniwatch_relay_deliveries_total", "counter",
                            "Relay deliveries to configured receivers, by receiver and result (ok, retry, failed).",
                            ("receiver", "result"))
RELAY_PENDING = _m("omniwatch_relay_pending", "gauge", "Notifications stored but not yet delivered, by receiver.", ("receiver",))



# Alert names (the rule files define them; tests check both sides agree).
ALERT_REWARD_BOUND = "RewardBoundRollout"
ALERT_IDLE = "InterStageIdleGPU"
ALERT_MFU_IMPOSSIBLE = "MFUImpossible"
ALERT_MFU_DROP = "MFUDrop"
ALERT_STALLED = "TrainingStalled"
ALERT_MFU_LOW = "MFUImplausiblyLow"
ALERT_MFU_UNSUPPORTED = "MFUEstimatorUnsupported"
ALERT_STEP_REGRESSION = "StepTimeRegression"
ALERT_REWARD_SATURATION = "RewardSaturation"
ALERT_SOURCE_DOWN = "OmniwatchSourceDown"
CORE_ALERTS = (ALERT_REWARD_BOUND, ALERT_IDLE, ALERT_MFU_IMPOSSIBLE, ALERT_MFU_DROP, ALERT_STALLED)

# Fault kinds of tests/fixtures/verl/*.truth.json -> the alert each must raise.
FAULT_TO_ALERT = {
    "reward_slow": ALERT_REWARD_BOUND,
    "idle_gap": ALERT_IDLE,
    "mfu_value": ALERT_MFU_IMPOSSIBLE,
    "actor_slow": ALERT_MFU_DROP,
    "stalled_after_step": ALERT_STALLED,
}
