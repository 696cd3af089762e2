"""Bottlenecks: the three signals omniwatch alerts on, side by side with the alert thresholds drawn in,
plus the decompositions that say *why* (reward on the critical path by mode, untracked seconds, GPU
idle time by phase)."""
from __future__ import annotations

from .. import names as n
from .spec import ALERTS, Dashboard, Panel, Row, Step, Target, default_tags, rate, sel

# The thresholds of alerts/*.rules.yml, drawn as lines (tests/test_dashboards.py checks the rule files
# still use these numbers when they exist; the rule files stay the place to tune them).
REWARD_BOUND_THRESHOLD = 0.4
IDLE_THRESHOLD = 0.10
MFU_IMPOSSIBLE_THRESHOLD = 1.0
MFU_DROP_FACTOR = 0.7

W = "{{experiment}}"

SIGNALS = Row("Signals vs alert thresholds", (
    Panel("Reward-bound ratio", "Share of the generation window (gen + reward) that reward scoring holds on the "
          f"critical path: latest step and the min over the last k normal steps. The window min above "
          f"{REWARD_BOUND_THRESHOLD} (dashed) is RewardBoundRollout: rollout GPUs wait for the reward model.",
          (Target(sel(n.REWARD_BOUND_RATIO), W + " latest"),
           Target(sel(n.REWARD_BOUND_WINDOW, stat="min"), W + " window min")),
          unit="percentunit", min=0, max=1, thresholds=(Step(None, "green"), Step(REWARD_BOUND_THRESHOLD, "red")),
          show_thresholds="dashed+area", w=8, runbook=n.ALERT_REWARD_BOUND),
    Panel("Inter-stage idle ratio", "Untracked seconds / step seconds (time between timed phases: transfers, "
          f"barriers, weight sync). The window min above {IDLE_THRESHOLD:.2f} (dashed) is InterStageIdleGPU.",
          (Target(sel(n.INTER_STAGE_IDLE_RATIO), W + " latest"),
           Target(sel(n.IDLE_WINDOW, stat="min"), W + " window min")),
          unit="percentunit", min=0, thresholds=(Step(None, "green"), Step(IDLE_THRESHOLD, "red")),
          show_thresholds="dashed+area", w=8, runbook=n.ALERT_IDLE),
    Panel("MFU vs baseline", f"Reported MFU by role, {MFU_DROP_FACTOR} x its baseline (dashed: below it is "
          f"MFUDrop) and the impossible band above {MFU_IMPOSSIBLE_THRESHOLD} (red: MFUImpossible, the "
          "estimator's peak FLOPs do not match the GPU). 0 means the estimator is unsupported, not idle.",
          (Target(sel(n.MFU), W + " {{role}}"),
           Target(f"{MFU_DROP_FACTOR} * {sel(n.MFU_BASELINE)}", W + " {{role}} 0.7 x baseline", dashed=True)),
          unit="percentunit", min=0, thresholds=(Step(None, "transparent"), Step(MFU_IMPOSSIBLE_THRESHOLD, "red")),
          show_thresholds="line+area", w=8, runbook=n.ALERT_MFU_IMPOSSIBLE),
))

REWARD = Row("Reward on the critical path", (
    Panel("Reward seconds by mode", "Reward seconds the step waited for: mode=colocated is timing_s/reward "
          "(scoring after generation), mode=streamed is the tail of gen after the last sample finished "
          "generating (async scoring that did not keep up). Either growing against gen is reward-bound.",
          (Target(f"sum by (experiment, mode) ({sel(n.REWARD_CRITICAL_PATH)})", W + " {{mode}}"),
           Target(sel(n.STAGE_DURATION, phase="gen"), W + " gen", dashed=True)),
          unit="s", w=12, runbook=n.ALERT_REWARD_BOUND),
    Panel("Reward share of phase time", "Seconds per second spent in reward vs gen, summed over steps (rate "
          "of omniwatch_stage_seconds_total). The reward share rising while gen is flat is a slower scorer.",
          (Target(f"sum by (experiment, phase) ({rate(sel(n.STAGE_SECONDS_TOTAL, phase='=~gen|reward'))})",
                  W + " {{phase}}"),),
          unit="percentunit", stack=True, w=12, runbook=n.ALERT_REWARD_BOUND),
))

IDLE = Row("Idle GPU time", (
    Panel("Untracked seconds", "Seconds of the latest step outside every timed phase. A step-shaped rise is a new gap (a transfer or barrier added between stages).",
          (Target(sel(n.STAGE_DURATION, phase=n.UNTRACKED_PHASE), W + " latest step"),),
          unit="s", w=8, runbook=n.ALERT_IDLE),
    Panel("GPU idle seconds by phase", "GPU idle seconds per second attributed to training phases from the "
          "5 Hz NVML sampler (phase=inter_stage is between timed phases). A phase with a large idle band "
          "leaves GPUs waiting.",
          (Target(f"sum by (phase) ({rate(sel(n.GPU_PHASE_IDLE_SECONDS_TOTAL))})", "idle {{phase}}"),
           Target(f"sum by (phase) ({rate(sel(n.GPU_PHASE_BUSY_SECONDS_TOTAL))})", "busy {{phase}}", dashed=True)),
          unit="s", w=8, runbook=n.ALERT_IDLE),
    Panel("GPU idle share by phase", "Idle share of each phase of the latest attributed step, averaged over "
          "the run's GPUs. High idle in gen on a colocated run is the reward model holding the rollout; "
          "in inter_stage it is the inter-stage gap.",
          (Target(sel(n.GPU_IDLE_RATIO), W + " {{phase}}"),),
          unit="percentunit", min=0, max=1, thresholds=(Step(None, "green"), Step(0.5, "orange")), w=8,
          runbook=n.ALERT_IDLE),
))

ALERT_ROW = Row("Alerts", (
    Panel("Pending and firing alerts", "omniwatch alerts for the selected runs (1 while active). Pending means "
          "the condition holds and the short 'for' is still absorbing scrape jitter.",
          (Target(sel(ALERTS), "{{alertname}} {{alertstate}} " + W),),
          unit="none", min=0, w=24, h=6),
))

DASHBOARD = Dashboard(
    uid="omniwatch-bottlenecks",
    title="omniwatch / Bottlenecks",
    description="Reward-bound rollouts, inter-stage idle GPU time and MFU anomalies against the alert thresholds.",
    rows=(SIGNALS, REWARD, IDLE, ALERT_ROW),
    tags=default_tags("bottlenecks", "alerts"),
    variable_metrics=(n.STEP,),
)
