"""Run overview: where the run is, how fast it goes, where each step's time goes, and whether the
policy is still learning (reward spread, clipping, importance ratios)."""
from __future__ import annotations

from .. import names as n
from ..analytics import K_ZERO_STD
from ..model import passthrough_name
from .spec import ALERTS, Dashboard, Panel, Row, Step, Target, default_tags, sel

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


def verl(key: str) -> str:
    """Selector of one passed-through verl key (family name derived exactly as the exporter does)."""
    return sel(passthrough_name(key), **{n.L_KEY: key})


def verl_target(key: str) -> Target:
    return Target(verl(key), legend="{{experiment}} " + key)


# Stacking order of the step-time chart: the FlowGRPO step in execution order, untracked last.
PHASES = ("feed", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", n.UNTRACKED_PHASE)

RUN_LEGEND = "{{project}}/{{experiment}}"

NOW = Row("Now", (
    Panel("Current step", "Latest verl global step. Not moving while the exporter is up means the trainer "
          "stopped logging (hung collective, dead worker).",
          (Target(sel(n.STEP), RUN_LEGEND),), unit="none", kind="stat", w=4, h=5, runbook=n.ALERT_STALLED),
    Panel("Step time", "Wall time of the latest step. Growing against the typical step means a phase "
          "slowed down: see the stacked chart below.",
          (Target(sel(n.STEP_DURATION), RUN_LEGEND),), unit="s", kind="stat", w=4, h=5),
    Panel("Throughput", "Images per GPU per second of the latest step (perf/throughput). Falling while the "
          "step time is flat means fewer images per step.",
          (Target(sel(n.THROUGHPUT), RUN_LEGEND),), unit="short", kind="stat", w=4, h=5),
    Panel("MFU / baseline", "Reported MFU divided by its own baseline (median of the previous normal steps). "
          "Below 0.7 is the MFUDrop condition; above 1.0 MFU itself may be impossible (check the Bottlenecks "
          "dashboard).",
          (Target(f"{sel(n.MFU)} / {sel(n.MFU_BASELINE)}", RUN_LEGEND + " {{role}}"),),
          unit="percentunit", kind="stat", w=4, h=5,
          thresholds=(Step(None, "red"), Step(0.7, "green")), runbook=n.ALERT_MFU_DROP),
    Panel("Active alerts", "omniwatch alerts firing for the selected runs (0 = none). Each alert's runbook is "
          "linked from its annotation.",
          (Target(f'sum({sel(ALERTS, alertstate="firing")}) or vector(0)', "firing"),),
          unit="none", kind="stat", w=4, h=5, thresholds=(Step(None, "green"), Step(1, "red"))),
    Panel("Window steps", "Normal steps in the current statistics window (warm-up, validation and checkpoint "
          "steps are left out). The window alerts can fire only once this reaches k.",
          (Target(sel(n.WINDOW_STEPS), RUN_LEGEND),), unit="none", kind="stat", w=4, h=5),
))

STEP_TIME = Row("Where the step goes", (
    Panel("Step time by phase (stacked)", "Seconds of the latest step per timed phase; 'untracked' is the step "
          "minus all timed phases (transfers, barriers, waiting). A growing 'reward' band is a reward-bound "
          "rollout; a growing 'untracked' band is inter-stage idle GPU time.",
          (Target(f"sum by (experiment, phase) ({sel(n.STAGE_DURATION, phase='=~' + '|'.join(PHASES))})",
                  "{{experiment}} {{phase}}"),),
          unit="s", stack=True, w=16, h=9, runbook=n.ALERT_REWARD_BOUND),
    Panel("Step time vs baseline", "Latest step time against the run's typical step and its baseline. A "
          "latest step well above the dashed baseline that persists is a slowdown, a single spike is a "
          "validation or checkpoint step.",
          (Target(sel(n.STEP_DURATION), "{{experiment}} step"),
           Target(sel(n.TYPICAL_STEP), "{{experiment}} typical"),
           Target(sel(n.STEP_DURATION_BASELINE), "{{experiment}} baseline", dashed=True)),
          unit="s", w=8, h=9, runbook=n.ALERT_STALLED),
))

REWARD = Row("Reward", (
    Panel("Reward mean", "critic/rewards/mean. Flat or falling for many steps means the policy is not "
          "improving on the reward model.",
          (verl_target(K_REWARD_MEAN),), unit="short", w=8),
    Panel("Reward spread within groups", "critic/rewards/std_mean: mean per-prompt reward std. Near zero means "
          "all samples of a prompt score alike and GRPO advantages vanish.",
          (verl_target(K_REWARD_STD_MEAN),), unit="short", w=8),
    Panel("Zero-std groups", "critic/rewards/zero_std_ratio: share of prompt groups whose rewards are all equal "
          "(no learning signal), with the window median. Rising towards 1 is reward saturation.",
          (verl_target(K_ZERO_STD),
           Target(sel(n.ZERO_STD_WINDOW, stat="median"), "{{experiment}} window median", dashed=True)),
          unit="percentunit", min=0, max=1, thresholds=(Step(None, "green"), Step(0.5, "orange")),
          show_thresholds="dashed", w=8),
))

POLICY = Row("Policy update", (
    Panel("Clip fractions", "actor/pg_clipfrac (+ higher/lower). A jump means the update moved the policy far "
          "from the rollout policy (stale samples, too high a learning rate).",
          (verl_target(K_CLIPFRAC), verl_target(K_CLIPFRAC_HIGHER), verl_target(K_CLIPFRAC_LOWER)),
          unit="percentunit", w=8),
    Panel("Importance ratio", "actor/ratio_mean and ratio_std. Mean away from 1 or a growing std means rollout "
          "and training policies diverge (weights not synced, off-policy drift).",
          (verl_target(K_RATIO_MEAN), verl_target(K_RATIO_STD)), unit="short", w=8),
    Panel("KL and gradient norm", "actor/ppo_kl and actor/grad_norm. Spikes precede divergence.",
          (verl_target(K_PPO_KL), verl_target(K_GRAD_NORM)), unit="short", w=8),
))

DASHBOARD = Dashboard(
    uid="omniwatch-run-overview",
    title="omniwatch / Run overview",
    description="One VeRL-Omni run at a glance: step, speed, MFU against its baseline, alerts, step time by "
                "phase, reward and policy-update health.",
    rows=(NOW, STEP_TIME, REWARD, POLICY),
    tags=default_tags("overview"),
    variable_metrics=(n.STEP,),
)
