"""A FlowGRPO-shaped run simulator that writes exactly what verl's Tracking writes.

Used by ``omniwatch demo`` (and by tests and benchmarks) so they need no recorded file. The key set,
the order of keys and the timer structure follow the VeRL-Omni trainers (reference §2, §4): legacy
colocated reward, legacy async reward pool (streamed scoring: reward≈0, ``agent_loop/compute_score``
> 0) and V1 (``feed``, TransferQueue, no agent-loop keys). Timers are scaled so ``timing_s/step`` equals
the requested pace, which keeps the exporter's typical step time equal to the real arrival interval.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

# Share of a step per phase on the published Qwen-Image FlowGRPO run (≈250 s/step, gen ≈108 s).
LEGACY_SHARES = {"gen": 0.43, "reward": 0.12, "old_log_prob": 0.18, "adv": 0.0016, "update_actor": 0.24,
                 "update_weights": 0.024}
V1_SHARES = {"feed": 0.005, "gen": 0.49, "old_log_prob": 0.20, "adv": 0.0018, "update_actor": 0.27,
             "update_weights": 0.027}
IMAGES = 512
GPUS = 4


@dataclass
class Fault:
    kind: str                 # reward_slow | idle_gap | mfu_value | actor_slow
    start: int
    factor: float = 1.0       # reward_slow / actor_slow
    value: float = 0.0        # mfu_value
    seconds_share: float = 0.0  # idle_gap: untimed seconds as a share of the healthy step


@dataclass
class RunSpec:
    trainer: str = "legacy"   # legacy | legacy_async | v1
    pace: float = 250.0       # healthy timing_s/step in seconds
    faults: list[Fault] = field(default_factory=list)
    seed: int = 0
    validation_every: int = 0  # timing_s/testing + val-core keys on these steps
    checkpoint_every: int = 0  # timing_s/save_checkpoint on these steps
    mfu: float = 0.31
    extra_keys: int = 0        # pad with extra critic/<x>/mean keys (benchmarks: 80-120 keys per line)


def _fault(spec: RunSpec, kind: str, step: int) -> Fault | None:
    for f in spec.faults:
        if f.kind == kind and step >= f.start:
            return f
    return None


def step_dict(spec: RunSpec, step: int, rng: random.Random | None = None) -> dict:
    """The metrics dict a VeRL-Omni trainer logs for global step ``step`` (1-based)."""
    rng = rng or random.Random(spec.seed * 100_003 + step)
    j = lambda x, s=0.04: x * (1 + rng.uniform(-s, s))  # noqa: E731 - jitter
    shares = V1_SHARES if spec.trainer == "v1" else LEGACY_SHARES
    t = {ph: j(spec.pace * sh) for ph, sh in shares.items()}
    if step == 1:
        t["gen"] *= 1.6  # first step: compile + cache warm-up
    if spec.trainer == "legacy_async":
        t["reward"] = j(0.00002 * spec.pace, 0.5)
    mfu = j(spec.mfu, 0.03)
    mfu_infer = j(spec.mfu * 0.8, 0.03)
    if (f := _fault(spec, "reward_slow", step)):
        if spec.trainer == "legacy_async":
            score_tail = j(spec.pace * 0.04) * f.factor
        else:
            t["reward"] *= f.factor
    else:
        score_tail = j(spec.pace * 0.04)
    if (f := _fault(spec, "actor_slow", step)):
        t["update_actor"] *= f.factor
        mfu /= f.factor
    if (f := _fault(spec, "mfu_value", step)):
        mfu = j(f.value, 0.02)
        mfu_infer = j(f.value * 0.8, 0.02)
    untimed = j(spec.pace * 0.006, 0.2)
    if (f := _fault(spec, "idle_gap", step)):
        untimed += j(spec.pace * f.seconds_share, 0.1)
    gen_seq_max = t["gen"] * 0.93
    if spec.trainer == "legacy_async":
        gen_seq_max = t["gen"] * 0.98
        t["gen"] = gen_seq_max + score_tail
    if spec.checkpoint_every and step % spec.checkpoint_every == 0:
        t["save_checkpoint"] = j(spec.pace * 0.3)
    step_s = sum(t.values()) + untimed
    ordered = {}
    order = ["feed", "gen", "reward", "old_log_prob", "adv", "update_actor", "save_checkpoint", "update_weights"]
    for ph in order:
        if ph in t:
            ordered[ph] = t[ph]

    d: dict = {"training/global_step": step, "training/epoch": (step - 1) // 100}
    rmean = min(0.95, 0.25 + 0.004 * step + rng.uniform(-0.01, 0.01))
    d.update({
        "critic/rewards/mean": rmean, "critic/rewards/max": min(1.0, rmean + 0.3), "critic/rewards/min": 0.0,
        "critic/rewards/zero_std_ratio": j(0.1, 0.2), "critic/rewards/std_mean": j(0.11, 0.1),
        "critic/rewards/group_size": 16.0, "critic/advantages/mean": rng.uniform(-1e-3, 1e-3),
        "critic/advantages/max": j(2.5), "critic/advantages/min": -j(2.4), "critic/returns/mean": rng.uniform(-1e-3, 1e-3),
        "critic/returns/max": 2.4, "critic/returns/min": -2.3, "critic/acc/mean": rmean,
    })
    for i in range(spec.extra_keys):
        d[f"critic/extra_{i}/mean"] = rng.random()
    d.update({
        "actor/loss": rng.uniform(-0.02, 0.02), "actor/ppo_kl": j(2e-4, 0.5), "actor/pg_clipfrac": j(0.012, 0.3),
        "actor/pg_clipfrac_higher": j(0.006, 0.3), "actor/pg_clipfrac_lower": j(0.005, 0.3),
        "actor/ratio_mean": 1 + rng.uniform(-1e-3, 1e-3), "actor/ratio_std": j(0.011, 0.2),
        "actor/grad_norm": j(0.6, 0.2), "actor/lr": 3e-4, "perf/mfu/actor": mfu,
    })
    if spec.trainer == "v1":
        d["training/off_policy/trajectory_staleness/mean"] = -1.0
    else:
        d["perf/mfu/actor_infer"] = mfu_infer
    for ph, v in ordered.items():
        d[f"timing_s/{ph}"] = v
    if spec.trainer != "v1":
        cs = score_tail if spec.trainer == "legacy_async" else 0.0
        d.update({
            "timing_s/agent_loop/generate_sequences/min": gen_seq_max * 0.4,
            "timing_s/agent_loop/generate_sequences/max": gen_seq_max,
            "timing_s/agent_loop/generate_sequences/mean": gen_seq_max * 0.7,
            "timing_s/agent_loop/compute_score/min": cs * 0.6, "timing_s/agent_loop/compute_score/max": cs,
            "timing_s/agent_loop/compute_score/mean": cs * 0.83,
            "timing_s/agent_loop/slowest/generate_sequences": gen_seq_max,
            "timing_s/agent_loop/slowest/compute_score": cs,
            "timing_s/agent_loop/slowest/prompt_length": 23, "timing_s/agent_loop/slowest/response_length": 0,
        })
    d["timing_s/step"] = step_s
    if spec.trainer != "v1":
        d["timing_s/start_profile"] = 3e-6
        d["timing_s/stop_profile"] = 2e-6
    for ph in ("gen", "old_log_prob", "adv", "update_actor"):
        if ph in ordered:
            d[f"timing_per_image_ms/{ph}"] = ordered[ph] * 1000 / IMAGES
    d.update({"perf/total_num_images": IMAGES, "perf/time_per_step": step_s,
              "perf/throughput": IMAGES / (step_s * GPUS)})
    if spec.validation_every and step % spec.validation_every == 0:
        d["timing_s/testing"] = j(spec.pace * 0.5)
        d["val-core/ocr/reward/mean@1"] = rmean + 0.02
        d["val-aux/ocr/reward/combined/mean@1"] = rmean
    return d


def run_dicts(spec: RunSpec, steps: int, first: int = 1):
    for s in range(first, first + steps):
        yield s, step_dict(spec, s)
