"""A FlowGRPO-shaped run simulator that writes exactly what verl's Tracking writes.

Used by ``omniwatch demo`` (and by tests and benchmarks) so they need no recorded file. The key set,
the order of keys and the timer structure follow the VeRL-Omni trainers (reference §2, §4,
docs/verl-source.md) for every layout they run:

- ``trainer``: ``legacy`` (``main_diffusion``; agent-loop keys) or ``v1`` (``main_diffusion_v1``: ``feed``,
  TransferQueue, ``training/off_policy/*``, no agent-loop keys, no ``perf/mfu/actor_infer``);
- ``reward``: ``colocated`` (a reward model inside the step: a real ``timing_s/reward``, compute_score 0),
  ``pool`` (a disaggregated reward pool: scored while generating, ``timing_s/reward`` ~0 in legacy and
  absent in V1, legacy ``agent_loop/compute_score`` > 0) or ``function`` (a rule / HTTP reward function, no
  reward model: streamed the same way, cheap);
- ``async_mode``: ``sync`` or ``separate_async`` (V1 only: generation overlaps training, trajectories are
  one version stale, ``timing_s/gen`` is the trainer's wait for samples).

``trainer="legacy_async"`` is the old spelling of ``trainer="legacy", reward="pool"``. Timers are scaled
so ``timing_s/step`` equals the requested pace, which keeps the exporter's typical step time equal to
the real arrival interval.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .core import analytics as A
from .core.signals import ZERO_STD

# Share of a step per phase on the published Qwen-Image FlowGRPO run (≈250 s/step, gen ≈108 s).
LEGACY_SHARES = {"gen": 0.43, "reward": 0.12, "old_log_prob": 0.18, "adv": 0.0016, "update_actor": 0.24,
                 "update_weights": 0.024}
V1_SHARES = {"feed": 0.005, "gen": 0.49, "old_log_prob": 0.20, "adv": 0.0018, "update_actor": 0.27,
             "update_weights": 0.027}
IMAGES = 512
GPUS = 4


@dataclass
class Fault:
    kind: str                 # reward_slow | idle_gap | mfu_value | actor_slow | gen_slow | creep | straggler |
    #                           grad_nonfinite | rs_drift | nested_timer | outside_gap | hang | phase_slow | mfu_drop |
    #                           workload (not a fault: the images per step change, each image costs the same)
    start: int
    factor: float = 1.0       # reward_slow / actor_slow; straggler: slowest sample / mean sample
    value: float = 0.0        # mfu_value; rs_drift: RS sequence-level rejection share; hang: seconds step
    #                           `start` (only) waits inside the step timer
    seconds_share: float = 0.0  # idle_gap: untimed seconds as a share of the healthy step; nested_timer: seconds
    #                             of a timer nested in gen; outside_gap: seconds outside the step timer
    end: int | None = None    # the last step the fault lasts (None: to the end of the run)
    phase: str = ""           # creep: the phase that grows by `value` (a share of itself) per step from `start`
    #                           (gen, update_actor, ...; "" = every in-step phase); update_actor lowers MFU with it;
    #                           phase_slow: the phase `factor` times slower (update_weights, ...; MFU unchanged)
    ramp: int = 0             # 0: the fault is at full strength from `start` (a step change); N: it grows linearly
    #                           to full strength over its first N steps (a creep of any kind: factor 1 -> factor,
    #                           seconds_share 0 -> seconds_share); mfu_drop: MFU / factor with step time unchanged;
    #                           workload: perf/total_num_images x factor, every phase that scales with images too


@dataclass
class RunSpec:
    trainer: str = "legacy"   # legacy | v1  (legacy_async = legacy with reward="pool")
    pace: float = 250.0       # healthy timing_s/step in seconds
    faults: list[Fault] = field(default_factory=list)
    seed: int = 0
    validation_every: int = 0  # timing_s/testing + val-core keys on these steps
    checkpoint_every: int = 0  # timing_s/save_checkpoint on these steps
    mfu: float = 0.31
    extra_keys: int = 0        # pad with extra critic/<x>/mean keys (benchmarks: 80-120 keys per line)
    reward: str | None = None  # colocated | pool | function (default: colocated for legacy, function for V1,
    #                            as VeRL-Omni's defaults: reward.reward_model.enable=False)
    async_mode: str = "sync"   # sync | separate_async (V1)
    checkpoint_factor: float = 0.3  # save_checkpoint seconds / healthy step
    validation_factor: float = 0.5  # testing seconds / healthy step
    rollout_corr: str = "off"  # off | decoupled (rollout_corr/*, timing_s/rollout_corr) | bypass (actor/rollout_corr/*,
    #                            no old_log_prob recompute): algorithm.rollout_correction with rollout_rs set
    total_steps: int = 0       # the run's last step: verl forces a checkpoint and a validation on it when
    #                            save_freq / test_freq > 0 (docs/verl-source.md D9)
    jitter: float = 0.04       # each phase's time varies uniformly by +-jitter (independently)
    step_jitter: float = 0.0   # and every phase of a step together by +-step_jitter (node contention, a noisy
    #                            neighbour: what makes healthy step times vary 8-10 % from step to step)
    images: int = IMAGES       # perf/total_num_images of a step (a video run generates far fewer)
    first_step: int = 1        # the trainer incarnation's first step: it carries the warm-up (a resumed trainer
    #                            starts after its checkpoint's step)
    warmup_factor: float = 1.6  # gen of the first step: compile + cache warm-up

    def __post_init__(self):
        if self.trainer == "legacy_async":
            self.trainer, self.reward = "legacy", "pool"
        if self.reward is None:
            self.reward = "colocated" if self.trainer == "legacy" else "function"
        if self.trainer not in ("legacy", "v1") or self.reward not in ("colocated", "pool", "function") \
                or self.async_mode not in ("sync", "separate_async") or (self.async_mode != "sync" and self.trainer != "v1") \
                or self.rollout_corr not in ("off", "decoupled", "bypass"):
            raise ValueError(f"unsupported layout {self.trainer}/{self.reward}/{self.async_mode}")

    @property
    def streamed(self) -> bool:
        """Reward scored while samples generate (a reward pool or a reward function)."""
        return self.reward != "colocated"


def _fault(spec: RunSpec, kind: str, step: int) -> Fault | None:
    for f in spec.faults:
        if f.kind == kind and step >= f.start and (f.end is None or step <= f.end):
            return f
    return None


def _strength(f: Fault, step: int) -> float:
    """1 for a step change; a fault with ``ramp`` N reaches full strength over its first N steps."""
    return 1.0 if f.ramp <= 0 else max(0.0, min(1.0, (step - f.start + 1) / f.ramp))


def _factor(f: Fault, step: int) -> float:
    return 1.0 + (f.factor - 1.0) * _strength(f, step)


# Phases whose seconds grow with the images of a step (weight sync, checkpoint and validation do not).
PER_IMAGE_PHASES = ("feed", "gen", "reward", "old_log_prob", "rollout_corr", "adv", "update_actor")


def step_dict(spec: RunSpec, step: int, rng: random.Random | None = None) -> dict:
    """The metrics dict a VeRL-Omni trainer logs for global step ``step`` (1-based)."""
    rng = rng or random.Random(spec.seed * 100_003 + step)
    j = lambda x, s=0.04: x * (1 + rng.uniform(-s, s))  # noqa: E731 - jitter
    legacy = spec.trainer == "legacy"
    shares = V1_SHARES if not legacy else LEGACY_SHARES
    t = {ph: j(spec.pace * sh, spec.jitter) for ph, sh in shares.items()}
    work = _fault(spec, "workload", step)
    load_w = _factor(work, step) if work else 1.0
    images = round(spec.images * load_w)
    if work:
        t = {ph: v * load_w if ph in PER_IMAGE_PHASES else v for ph, v in t.items()}
    if spec.step_jitter:  # its own generator: the default runs keep their values
        load = 1 + random.Random(spec.seed * 50_021 + step * 7 + 3).uniform(-spec.step_jitter, spec.step_jitter)
        t = {ph: v * load for ph, v in t.items()}
    if step == spec.first_step:
        t["gen"] *= spec.warmup_factor  # first step: compile + cache warm-up
    if legacy and spec.streamed:
        t["reward"] = j(0.00002 * spec.pace, 0.5)  # extract_reward only: scoring happened during gen
    elif not legacy and not spec.streamed:
        # V1 colocated reward model: its timer holds sleep_replicas + scoring + update_weights
        t = {**{k: v for k, v in t.items() if k in ("feed", "gen")}, "reward": j(spec.pace * 0.12),
             **{k: v for k, v in t.items() if k not in ("feed", "gen")}}
    if spec.async_mode == "separate_async":
        t["gen"] = j(spec.pace * 0.05)  # generation overlaps training: the trainer only waits for the tail
    if spec.rollout_corr == "bypass":
        del t["old_log_prob"]  # the rollout's log-probs are the old ones: no recompute
    elif spec.rollout_corr == "decoupled":
        t = {**{k: v for k, v in t.items() if k != "adv" and k != "update_actor" and k != "update_weights"},
             "rollout_corr": j(spec.pace * 0.002), **{k: t[k] for k in ("adv", "update_actor", "update_weights")}}
    mfu = j(spec.mfu, 0.03)
    mfu_infer = j(spec.mfu * 0.8, 0.03)
    tail_share = 0.04 if spec.reward == "pool" else 0.008  # a reward function is cheaper than a model
    if (slow := _fault(spec, "reward_slow", step)):
        if spec.streamed:
            score_tail = j(spec.pace * tail_share) * load_w * _factor(slow, step)
        else:
            t["reward"] *= _factor(slow, step)
    else:
        score_tail = j(spec.pace * tail_share) * load_w
    if (f := _fault(spec, "actor_slow", step)):
        t["update_actor"] *= _factor(f, step)
        mfu /= _factor(f, step)
    if (f := _fault(spec, "gen_slow", step)):
        t["gen"] *= _factor(f, step)
    if (f := _fault(spec, "phase_slow", step)) and f.phase in t:
        t[f.phase] *= _factor(f, step)
    if (f := _fault(spec, "creep", step)):
        grow = 1 + f.value * (step - f.start + 1)
        for ph in ([f.phase] if f.phase else list(t)):
            if ph in t:
                t[ph] *= grow
        if f.phase in ("", "update_actor"):
            mfu /= grow
    if (f := _fault(spec, "mfu_value", step)):
        mfu = j(f.value, 0.02)
        mfu_infer = j(f.value * 0.8, 0.02)
    if (f := _fault(spec, "mfu_drop", step)):  # fewer useful FLOPs in the same time (the step does not move)
        mfu /= _factor(f, step)
    untimed = j(spec.pace * 0.006, 0.2)
    if (f := _fault(spec, "idle_gap", step)):
        untimed += j(spec.pace * f.seconds_share, 0.1) * _strength(f, step)
    for f in spec.faults:  # a collective that hung this long inside the step, then went on
        if f.kind == "hang" and step == f.start:
            untimed += f.value
    gen_seq_max = t["gen"] * 0.93
    if spec.streamed and (legacy or slow):
        gen_seq_max = t["gen"] * 0.98
        t["gen"] = gen_seq_max + score_tail  # V1 too: a slow reward's tail hides in gen (no agent-loop keys)
    gen_seq_min, gen_seq_mean = gen_seq_max * 0.4, gen_seq_max * 0.7
    if legacy and (f := _fault(spec, "straggler", step)) and gen_seq_mean * _factor(f, step) > gen_seq_max:
        # one sample (a preempted request, a slow replica) finishes long after the others: gen waits for it
        t["gen"] += gen_seq_mean * _factor(f, step) - gen_seq_max
        gen_seq_max = gen_seq_mean * _factor(f, step)
    last = spec.total_steps and step == spec.total_steps
    if spec.checkpoint_every and (step % spec.checkpoint_every == 0 or last):
        t["save_checkpoint"] = j(spec.pace * spec.checkpoint_factor)
    step_s = sum(t.values()) + untimed
    ordered = {}
    for ph in A.PHASE_ORDER:
        if ph in t:
            ordered[ph] = t[ph]

    d: dict = {A.K_GLOBAL_STEP: step, "training/epoch": (step - 1) // 100}
    rmean = min(0.95, 0.25 + 0.004 * step + rng.uniform(-0.01, 0.01))
    d.update({
        A.K_REWARD_MEAN: rmean, "critic/rewards/max": min(1.0, rmean + 0.3), "critic/rewards/min": 0.0,
        ZERO_STD.key: j(0.1, 0.2), A.K_REWARD_STD_MEAN: j(0.11, 0.1),
        "critic/rewards/group_size": 16.0, "critic/advantages/mean": rng.uniform(-1e-3, 1e-3),
        "critic/advantages/max": j(2.5), "critic/advantages/min": -j(2.4), "critic/returns/mean": rng.uniform(-1e-3, 1e-3),
        "critic/returns/max": 2.4, "critic/returns/min": -2.3, "critic/acc/mean": rmean,
    })
    for i in range(spec.extra_keys):
        d[f"critic/extra_{i}/mean"] = rng.random()
    d.update({
        "actor/loss": rng.uniform(-0.02, 0.02), A.K_PPO_KL: j(2e-4, 0.5), A.K_CLIPFRAC: j(0.012, 0.3),
        A.K_CLIPFRAC_HIGHER: j(0.006, 0.3), A.K_CLIPFRAC_LOWER: j(0.005, 0.3),
        A.K_RATIO_MEAN: 1 + rng.uniform(-1e-3, 1e-3), A.K_RATIO_STD: j(0.011, 0.2),
        A.K_GRAD_NORM: j(0.6, 0.2), "actor/lr": 3e-4, "perf/mfu/actor": mfu,
    })
    if _fault(spec, "grad_nonfinite", step):
        d[A.K_GRAD_NORM] = float("nan")  # VeRL-Omni skipped the update; orjson writes NaN as null
    if spec.rollout_corr != "off":
        drift = _fault(spec, "rs_drift", step)
        prefix = "actor/rollout_corr/" if spec.rollout_corr == "bypass" else "rollout_corr/"
        seq = min(1.0, j(drift.value, 0.2) if drift else j(0.01, 0.5))
        d.update({prefix + "rollout_is_mean": 1 + rng.uniform(-2e-3, 2e-3), prefix + "kl": j(2e-5, 0.5),
                  prefix + "rollout_rs_masked_fraction": seq * 0.8, prefix + "rollout_rs_seq_masked_fraction": seq})
    if not legacy:
        stale = 0.0 if spec.async_mode == "separate_async" else -1.0
        d[A.K_STALENESS_MEAN] = stale
        if spec.async_mode == "separate_async":
            d[A.K_STALENESS_MAX] = 1.0
            d["training/off_policy/trajectory_staleness/min"] = 0.0
    elif spec.rollout_corr != "bypass":
        d["perf/mfu/actor_infer"] = mfu_infer
    for ph, v in ordered.items():
        d[A.TIMING + ph] = v
        if ph == "gen" and (f := _fault(spec, "nested_timer", step)):
            # a timer added inside gen (around sleep_replicas, say): gen already holds its seconds
            d["timing_s/sleep_replicas"] = spec.pace * f.seconds_share
    if legacy:
        cs = score_tail if spec.streamed else 0.0
        d.update({
            "timing_s/agent_loop/generate_sequences/min": gen_seq_min,
            A.K_GEN_SEQ_MAX: gen_seq_max,
            A.K_GEN_SEQ_MEAN: gen_seq_mean,
            "timing_s/agent_loop/compute_score/min": cs * 0.6, A.K_SCORE_MAX: cs,
            "timing_s/agent_loop/compute_score/mean": cs * 0.83,
            "timing_s/agent_loop/slowest/generate_sequences": gen_seq_max,
            A.K_SLOWEST_SCORE: cs,
            "timing_s/agent_loop/slowest/prompt_length": 23, "timing_s/agent_loop/slowest/response_length": 0,
        })
    d[A.K_STEP] = step_s
    if legacy:
        d["timing_s/start_profile"] = 3e-6
        d["timing_s/stop_profile"] = 2e-6
    for ph in ("gen", "old_log_prob", "adv", "update_actor"):
        if ph in ordered:
            d[f"timing_per_image_ms/{ph}"] = ordered[ph] * 1000 / images
    d.update({A.K_IMAGES: images, A.K_TIME_PER_STEP: step_s,
              A.K_THROUGHPUT: images / (step_s * GPUS)})
    if spec.validation_every and (step % spec.validation_every == 0 or last):
        d[A.K_TESTING] = j(spec.pace * spec.validation_factor)
        d["val-core/ocr/reward/mean@1"] = rmean + 0.02
        d["val-aux/ocr/reward/combined/mean@1"] = rmean
    return d


def run_dicts(spec: RunSpec, steps: int, first: int = 1):
    for s in range(first, first + steps):
        yield s, step_dict(spec, s)


def outside_seconds(spec: RunSpec, step: int) -> float:
    """Wall seconds of step ``step`` outside every verl timer (not in the logged dict: they show only as
    the gap between two lines). Legacy: the next dataloader batch, metric computation and logging, ~0.2 %
    of the step; V1: also ``_compute_metrics``' second TransferQueue fetch of the batch and ``kv_clear``
    (docs/verl-source.md C7), ~1 %. These healthy levels are assumptions (no recorded run carries
    arrival times); ``outside_gap`` adds ``seconds_share`` of the step."""
    rng = random.Random(spec.seed * 7_919 + step * 31 + 1)
    share = 0.002 if spec.trainer == "legacy" else 0.01
    out = spec.pace * share * (1 + rng.uniform(-0.5, 0.5))
    if (f := _fault(spec, "outside_gap", step)):
        out += spec.pace * f.seconds_share * (1 + rng.uniform(-0.1, 0.1))
    return out


def wall_seconds(spec: RunSpec, step: int, d: dict | None = None) -> float:
    """Seconds between the lines of step - 1 and ``step``: the step, validation and profiler timers and
    the time outside them (what a live exporter sees as the arrival gap)."""
    d = step_dict(spec, step) if d is None else d
    timed = d[A.K_STEP] + sum(d.get(A.TIMING + k, 0.0) for k in A.OUTSIDE_STEP_PHASES)
    return timed + outside_seconds(spec, step)
