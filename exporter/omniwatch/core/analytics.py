"""Step analytics: what one verl step dict says about where the step went, and rolling statistics
over the run's recent *normal* steps (warm-up, validation and checkpoint steps left out).

Pure Python, no I/O, no clocks: :func:`analyze_step` maps one step's values to a :class:`StepRecord`;
:class:`RunWindow` keeps the last steps of one run and computes the step-window statistics and
baselines the alert rules threshold (design note "time is counted in steps").
"""
from __future__ import annotations

import statistics
from functools import lru_cache
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field

from .. import names
from ..config import DEFAULT_BASELINE_STEPS, DEFAULT_WINDOW_STEPS, DRIFT_STEPS, REFERENCE_STEPS
from .phasetable import CAUSES, PHASE, PHASES, TIMING
from .shift import Shape, Shift, reference_shift, shape
from . import signals

# timing_s/<name> keys that time work *inside* timing_s/step, in the order the legacy and V1 trainers
# run them (phasetable.PHASES; reference: verl_omni_metrics.md §2.1, §4). Unknown single-segment timing_s/<x>
# keys are treated as in-step phases too; the keys below are outside the step or not phases.
PHASE_ORDER = tuple(p.name for p in PHASES if p.timed)
OUTSIDE_STEP_TIMERS = frozenset({"step", "testing", "start_profile", "stop_profile"})

K_STEP = TIMING + "step"
K_TIME_PER_STEP = "perf/time_per_step"
K_GEN = PHASE["gen"].key
K_REWARD = PHASE["reward"].key
K_GEN_SEQ = TIMING + "agent_loop/generate_sequences/"  # + max / mean / min
K_GEN_SEQ_MAX = K_GEN_SEQ + "max"
K_SCORE_MAX = "timing_s/agent_loop/compute_score/max"
K_SLOWEST_SCORE = "timing_s/agent_loop/slowest/compute_score"
K_THROUGHPUT = "perf/throughput"
K_TESTING = "timing_s/testing"
K_SAVE = PHASE["save_checkpoint"].key
# The raw keys of a step (StepRecord.values) that anything computed over the window reads: the declared window
# signals (signals.SIGNALS), the ledger's split of a step (testing time; the GPU-hours-per-day rate reads the
# window). The exporter's checkpoint keeps exactly these of each window step (state.py); a statistic that
# reads another key must add it here (tests/test_state.py watches the reads).
K_IMAGES = "perf/total_num_images"  # train_batch_size x rollout.n: the unit of work a step's time is judged per
WINDOW_VALUE_KEYS = frozenset({K_TESTING, K_IMAGES, *(sig.key for sig in signals.SIGNALS)})
K_FEED = PHASE["feed"].key
K_STALENESS_MAX = "training/off_policy/trajectory_staleness/max"
K_STALENESS_MEAN = "training/off_policy/trajectory_staleness/mean"
K_DROPPED = "training/off_policy/dropped_samples"
K_GEN_SEQ_MEAN = K_GEN_SEQ + "mean"
K_GRAD_NORM = "actor/grad_norm"
# RS sequence-level rejection: decoupled mode logs it once per batch under rollout_corr/, bypass mode per
# SDE step under actor/rollout_corr/ (VeRL-Omni docs/algo/rollout_correction.md, workers/utils/losses.py)
K_RS_SEQ_MASKED = "rollout_corr/rollout_rs_seq_masked_fraction"
K_RS_SEQ_MASKED_BYPASS = "actor/rollout_corr/rollout_rs_seq_masked_fraction"
# The learning curves the overview plots (dashboards/overview.py; passed through as verl_<key>, label key=<key>).
K_REWARD_MEAN, K_REWARD_STD_MEAN, K_PPO_KL = "critic/rewards/mean", "critic/rewards/std_mean", "actor/ppo_kl"
K_CLIPFRAC, K_CLIPFRAC_HIGHER, K_CLIPFRAC_LOWER = "actor/pg_clipfrac", "actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"
K_RATIO_MEAN, K_RATIO_STD, K_GLOBAL_STEP = "actor/ratio_mean", "actor/ratio_std", "training/global_step"
# Timers verl runs outside timing_s/step but inside the wall time between two logged steps.
OUTSIDE_STEP_PHASES = ("testing", "start_profile", "stop_profile")
# Arrival stamps carry the source's jitter (files are polled every 0.5 s; console lines pass Ray's log
# monitor): an arrival gap may fall short of the step's own timers by this much and still be a live
# measurement (the time outside the step is then 0). Shorter by more, the gap was not observed when
# the lines were written (backlog read at start-up, a batched push, an accelerated replay).
ARRIVAL_JITTER_SECONDS = 2.0
# Timers summing to more than timing_s/step by this share of the step are logged once per run (the
# default tolerance of the TimersExceedStep rule, config.py timer_overlap.tolerance).
TIMER_OVERLAP_LOG_SHARE = 0.01

# Where each in-step phase's time goes when the step gets slower (StepTimeRegression's `cause`, phasetable.PHASES);
# the streamed reward tail inside `gen` counts as reward. Phases not listed are "other"; NO_CAUSE's time is none.
CAUSE_OF_PHASE = {p.name: p.cause for p in PHASES if p.cause not in (None, "other")}
NO_CAUSE = frozenset(p.name for p in PHASES if p.cause is None)
# A colocated reward timer shorter than this (and no streamed scoring) says nothing about the layout:
# the legacy trainer always times extract_reward, ~0 s when reward was streamed.
COLOCATED_MIN_SECONDS = 0.5

# Keys represented by contract series; everything else numeric is passed through as verl_*.
CONTRACT_KEYS = frozenset({K_STEP, K_TIME_PER_STEP, K_THROUGHPUT, K_GLOBAL_STEP, *names.MFU_ROLES})

MIN_BASELINE_STEPS = 3
# The creep series (StepTimeRegression's, MFUDrop's) judge the normal steps after the reference's DRIFT_AFTER-th step:
# a creep must not wait for the reference's later steps.
DRIFT_AFTER = 10
# Normal steps of the incarnation kept (compactly) for the shape of a shift: "a step change at step N" or "a creep
# of X % over N steps" (shift.shape). Older steps are summarised as "over more than N steps".
HISTORY_STEPS = 128
# After a trainer restart the previous incarnation's reference is kept (the same workload resumed from a
# checkpoint, still slow, must still be judged against its healthy start) unless the new incarnation is this much
# faster per unit of work than it, over its first k normal steps (a fix applied through the restart: judge the run
# after the fix against itself), or its images per step or its config changed (a new workload).
RESTART_FASTER = 0.92
# ... or one of its MFU roles rose by this factor (a fix of the actor), or the kept MFU reference was impossible (above
# 1: a device peak pinned through the restart lowers it to the truth). MFU that fell at a restart is a fault resumed.
RESTART_MFU_MOVED = 1.5
# The shape of a shift is fitted only for a signal this far off its reference (the window median or the 10-step
# median): the alert texts quote it far beyond (1.13 and more), and a healthy run costs no fit.
SHAPE_DEADBAND = 0.05


@lru_cache(maxsize=1 << 16)
def phase_of(key: str) -> str | None:
    """``timing_s/gen`` -> ``gen``; None for keys that are not in-step phase timers. Cached: the same
    keys come every step."""
    if not key.startswith(TIMING):
        return None
    name = key[len(TIMING):]
    if "/" in name or name in OUTSIDE_STEP_TIMERS or not name:
        return None
    return name


_VALIDATION = "\x00validation"
_OFF_POLICY = "\x00off_policy"  # training/off_policy/*: only the V1 trainer logs these
_KEY_KIND: dict[str, str] = {}  # key -> phase name, _VALIDATION, _OFF_POLICY, or "" (none); bounded


def is_validation_key(key: str) -> bool:
    """``val-core/...``, ``val-aux/...``, ``val/...``: logged only on validation steps."""
    return key.startswith(("val-", "val/"))


def _classify(key: str) -> str:
    k = phase_of(key) or (_VALIDATION if key == K_TESTING or key.startswith(("val-", "val/")) else
                          _OFF_POLICY if key.startswith("training/off_policy/") else "")
    if len(_KEY_KIND) < 1 << 16:
        _KEY_KIND[key] = k
    return k


class KeyLayout:
    """What one key set says, worked out once: a run logs the same keys step after step, so its steps share
    a layout (``key_layout``) and the per-step work touches only the keys that matter. Holds the in-step
    phase timers (key, phase), whether the set marks a validation step or V1's off-policy keys, and the keys
    in sorted order (the step digest, model.step_digest)."""

    __slots__ = ("keys", "keyset", "phase_keys", "validation", "off_policy", "sorted_keys", "digest_prefix")

    def __init__(self, values: dict[str, float]) -> None:
        self.keys = tuple(values)  # in the order seen: the same key objects step after step (orjson caches keys)
        self.keyset = frozenset(values)
        phase_keys = []
        validation = off_policy = False
        kind = _KEY_KIND.get
        for key in values:  # phase timers in the step's order
            k = kind(key)
            if k is None:
                k = _classify(key)
            if k is _VALIDATION:
                validation = True
            elif k is _OFF_POLICY:
                off_policy = True
            elif k:  # (key, phase, its StepTimeRegression cause; none for checkpoint time)
                phase_keys.append((key, k, None if k in NO_CAUSE else CAUSE_OF_PHASE.get(k, "other")))
        self.phase_keys = tuple(phase_keys)
        self.validation, self.off_policy = validation, off_policy
        self.sorted_keys = tuple(sorted(self.keyset))
        self.digest_prefix = None  # set by model.step_digest on first use


def key_layout(values: dict[str, float], known: list[KeyLayout]) -> KeyLayout:
    """The layout of ``values``: one of ``known`` (a run's last four key sets, the latest first: the usual step, a
    validation step, a checkpoint step) when it fits, else a new one, which replaces the oldest of ``known``."""
    keys = tuple(values)
    for i, lay in enumerate(known):
        if keys == lay.keys or values.keys() == lay.keyset:  # C-level: pointer compares, else a set compare
            if i:
                known.insert(0, known.pop(i))
            return lay
    lay = KeyLayout(values)
    known.insert(0, lay)
    del known[4:]
    return lay


@dataclass(slots=True)
class StepRecord:
    step: int
    arrival: float  # unix seconds the step was observed
    duration: float | None
    phases: dict[str, float]  # includes "untracked" when duration is known
    reward_bound_ratio: float | None
    reward_critical: dict[str, float]  # mode -> seconds
    idle_ratio: float | None
    mfu: dict[str, float]  # role -> value as reported
    throughput: float | None
    flags: frozenset[str] = frozenset()
    values: dict[str, float] = field(default_factory=dict, repr=False)
    modes: dict[str, str] = field(default_factory=dict)       # what this step's keys say (trainer, reward, async_mode)
    reward_step_share: float | None = None                    # reward critical-path seconds / step seconds
    causes: dict[str, float] = field(default_factory=dict)    # seconds per StepTimeRegression cause
    # --- signals of issue 13 (None: the step does not say) ---
    straggler_ratio: float | None = None    # agent_loop generate_sequences max / mean (legacy)
    grad_norm_nonfinite: bool | None = None  # actor/grad_norm logged NaN/Inf (null): the update was skipped
    rs_seq_masked: float | None = None       # rollout_corr rollout_rs_seq_masked_fraction (either mode)
    rs_mode: str | None = None               # where it came from: decoupled (rollout_corr/) | bypass (actor/rollout_corr/)
    timer_residual: float | None = None      # timing_s/step - sum of in-step timers, seconds, NOT clamped
    timed_wall: float | None = None          # step + timers outside it (testing, profiler): wall time verl timed
    outside_seconds: float | None = None     # arrival gap - timed_wall (live arrivals of consecutive steps)
    outside_ratio: float | None = None       # outside_seconds / arrival gap

    @property
    def normal(self) -> bool:
        return not self.flags


def step_modes(values: dict[str, float], off_policy: bool | None = None) -> dict[str, str]:
    """The layout one step's keys reveal (reference verl_omni_metrics.md 2.3, 2.8, 2.11; docs/verl-source.md):
    V1 logs ``timing_s/feed`` and ``training/off_policy/*`` and no agent-loop keys; streamed reward shows as
    ``agent_loop/compute_score`` > 0 (legacy), a colocated reward model as a real ``timing_s/reward``
    (in V1 that timer exists only for a colocated reward model); separate_async trajectories are stale
    (staleness >= 0; on-policy sync is -1) or dropped. ``off_policy``: whether a ``training/off_policy/*`` key
    is present, when the caller already knows (the key pass of ``analyze_step``)."""
    modes: dict[str, str] = {}
    if off_policy is None:
        off_policy = any(k.startswith("training/off_policy/") for k in values)
    v1 = K_FEED in values or off_policy
    legacy = not v1 and (K_GEN_SEQ_MAX in values or "perf/mfu/actor_infer" in values)
    if v1 or legacy:
        modes["trainer"] = "v1" if v1 else "legacy"
    score = values.get(K_SCORE_MAX, values.get(K_SLOWEST_SCORE))
    reward = values.get(K_REWARD)
    step = values.get(K_STEP, 0.0)
    if score is not None and score > 0:
        modes["reward"] = "streamed"
    elif reward is not None and reward >= max(COLOCATED_MIN_SECONDS, 0.01 * step):
        modes["reward"] = "colocated"
    elif v1 and reward is None:
        modes["reward"] = "streamed"  # V1 scores inside the agent loop, hidden in gen
    if v1:
        stale = max(values.get(K_STALENESS_MAX, -1.0), values.get(K_STALENESS_MEAN, -1.0))
        modes["async_mode"] = "separate_async" if stale > -1 or K_DROPPED in values else "sync"
    elif legacy:
        modes["async_mode"] = "sync"
    return modes


def analyze_step(step: int, values: dict[str, float], arrival: float, warmup: bool = False,
                 non_finite: tuple[str, ...] | frozenset[str] = (), layout: KeyLayout | None = None) -> StepRecord:
    """``layout``: the layout of ``values``' keys when the caller has it (``key_layout``), else worked out here."""
    duration = values.get(K_STEP, values.get(K_TIME_PER_STEP))
    if duration is not None and duration <= 0:
        duration = None
    if layout is None:
        layout = KeyLayout(values)
    phases: dict[str, float] = {}
    causes: dict[str, float] = {}
    if duration is not None:
        causes = dict.fromkeys(CAUSES, 0.0)  # seconds per StepTimeRegression cause (checkpoint time is none)
        for key, k, cause in layout.phase_keys:
            v = values[key]
            if v >= 0:
                phases[k] = v
                if cause:
                    causes[cause] += v
    else:
        for key, k, _ in layout.phase_keys:
            v = values[key]
            if v >= 0:
                phases[k] = v
    validation, off_policy = layout.validation, layout.off_policy
    residual = None
    if duration is not None:
        residual = duration - sum(phases.values())
        phases[names.UNTRACKED_PHASE] = untracked = max(0.0, residual)
        causes[_UNTRACKED_CAUSE] += untracked

    # Reward on the critical path of the generation window.
    gen = values.get(K_GEN)
    reward = values.get(K_REWARD)
    critical: dict[str, float] = {}
    if reward is not None:
        critical["colocated"] = max(0.0, reward)
    score_max = values.get(K_SCORE_MAX, values.get(K_SLOWEST_SCORE))
    gen_seq_max = values.get(K_GEN_SEQ_MAX)
    if gen is not None and score_max is not None and gen_seq_max is not None:
        # Streamed/async reward: samples are scored while others still generate; what is left of
        # gen after the last sample finished generating is reward (bounded by the longest scoring).
        critical["streamed"] = min(max(0.0, gen - gen_seq_max), max(0.0, score_max))
    rb = None
    if gen is not None and critical:
        window = gen + (reward or 0.0)
        if window > 0:
            rb = min(1.0, sum(critical.values()) / window)

    idle = None
    if duration is not None:
        idle = phases[names.UNTRACKED_PHASE] / duration

    mfu = {role: values[k] for k, role in names.MFU_ROLES.items() if k in values}
    share = sum(critical.values()) / duration if critical and duration else None
    checkpoint = values.get(K_SAVE, 0) > 0
    flags = _NO_FLAGS
    if warmup or validation or checkpoint:
        flags = frozenset(f for f, on in (("warmup", warmup), ("validation", validation), ("checkpoint", checkpoint))
                          if on)
    tail = critical.get("streamed", 0.0)
    if tail and causes:  # the streamed reward tail is inside gen (as _causes)
        causes["rollout"] -= tail
        causes["reward"] += tail
    rec = StepRecord(step, arrival, duration, phases, rb, critical, idle, mfu,
                     values.get(K_THROUGHPUT), flags, values, step_modes(values, off_policy), share, causes)
    _signals(rec, values, non_finite, residual)
    return rec


_NO_FLAGS: frozenset[str] = frozenset()
_UNTRACKED_CAUSE = CAUSE_OF_PHASE[names.UNTRACKED_PHASE]
_OUTSIDE_KEYS = tuple(TIMING + ph for ph in OUTSIDE_STEP_PHASES)


def _signals(rec: StepRecord, values: dict[str, float], non_finite, residual: float | None) -> None:
    """Straggler tail, skipped update, RS rejection, the unclamped timer residual, the timed wall time."""
    get = values.get
    mx, mean = get(K_GEN_SEQ_MAX), get(K_GEN_SEQ_MEAN)
    if mx is not None and mean is not None and mean > 0 and mx >= 0:
        rec.straggler_ratio = mx / mean
    if K_GRAD_NORM in values:
        rec.grad_norm_nonfinite = False
    elif non_finite and K_GRAD_NORM in non_finite:
        rec.grad_norm_nonfinite = True
    rs = get(K_RS_SEQ_MASKED)
    if rs is not None and 0 <= rs <= 1:
        rec.rs_seq_masked, rec.rs_mode = rs, "decoupled"
    else:
        rs = get(K_RS_SEQ_MASKED_BYPASS)
        if rs is not None and 0 <= rs <= 1:
            rec.rs_seq_masked, rec.rs_mode = rs, "bypass"
    rec.timer_residual = residual
    if rec.duration is not None:
        extra = 0
        for key in _OUTSIDE_KEYS:
            v = get(key)
            if v is not None and v > 0:
                extra += v
        rec.timed_wall = rec.duration + extra


def time_outside(gap: float, rec: StepRecord) -> tuple[float, float] | None:
    """Seconds of the wall time between two consecutive steps' arrivals that no verl timer covers
    (dataloader, metric computation, logging; V1: the post-step TransferQueue re-fetch, kv_clear), and
    their share of the gap: ``gap - (timing_s/step + timing_s/testing + profiler timers)``. None when
    the gap cannot be a live measurement of this step (shorter than the step's own timers by more than
    the arrival jitter); within the jitter it is 0."""
    if rec.timed_wall is None or gap <= 0:
        return None
    out = gap - rec.timed_wall
    if out < -ARRIVAL_JITTER_SECONDS:
        return None
    out = max(0.0, out)
    return out, out / gap


def _stats(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


# StepTimeRegression names one cause. When two parts of the step grow alike (a creep that slows generation and the
# actor update together) the largest changes with each step's jitter, and every change is a new alert instance
# (a "resolved" and a "firing" notification). The named cause therefore keeps its name while it grew at least
# CAUSE_HOLD x as much as the largest; a cause that grew more than 1 / CAUSE_HOLD times the named one takes over.
CAUSE_HOLD = 0.8
# ... once something grew materially: while no cause grew by this share of the reference step, the largest is named.
CAUSE_MIN_SHARE = 0.03


def regression_leader(windows: list[dict[str, float]], hold: float = CAUSE_HOLD, leader: str | None = None) -> str | None:
    """The cause to name after a sequence of windows' growth per cause (oldest first), starting from ``leader``
    (none: the first window's largest): kept while its growth is positive and at least ``hold`` x the largest,
    else the largest."""
    for g in windows:
        if not g:
            continue
        top = max(g, key=lambda c: (g[c], c))
        if leader is None or g[leader] <= 0 or g[leader] < hold * g[top]:
            leader = top
    return leader


def _windows_after(recs: list["StepRecord"], k: int, after: int) -> list[list["StepRecord"]]:
    """Every window of ``k`` normal steps with causes that ``recs`` holds after step ``after`` (the anchored
    reference's last step), oldest first; the newest is the current window."""
    rc = [r for r in recs if r.causes and r.step > after]
    return [rc[i - k:i] for i in range(k, len(rc) + 1)]


@dataclass
class WindowStats:
    steps: int = 0
    reward_bound: dict[str, float] | None = None
    idle: dict[str, float] | None = None
    mfu: dict[str, dict[str, float]] = field(default_factory=dict)
    duration: dict[str, float] | None = None
    signals: dict[str, dict[str, float]] = field(default_factory=dict)  # signals.SIGNALS' name -> window stats
    signal_reference: dict[str, float] = field(default_factory=dict)  # name -> median over the reference steps
    reward_step_share: dict[str, float] | None = None
    mfu_unsupported: list[str] = field(default_factory=list)   # roles that reported exactly 0 in every window step
    regression: dict[str, float] = field(default_factory=dict)  # cause -> window median - baseline median (s)
    regression_top: str | None = None  # the cause StepTimeRegression names (regression_leader over recent windows)
    mfu_baseline: dict[str, float] = field(default_factory=dict)
    duration_baseline: float | None = None  # the reference step time at the latest step's workload (images)
    typical_step: float | None = None
    straggler: dict[str, float] | None = None        # generate_sequences max / mean
    rs_seq_masked: dict[str, float] | None = None     # RS sequence-level rejection share
    rs_mode: str | None = None                        # decoupled | bypass (the latest window step's)
    outside: dict[str, float] | None = None           # time outside the step timer / arrival gap
    timer_residual: dict[str, float] | None = None    # unclamped residual / step (negative: timers > step)
    grad_nonfinite_recent: int | None = None          # recent normal steps whose actor/grad_norm was non-finite
    # The anchored reference (REFERENCE_STEPS): its first and last step, how many normal steps it holds, the
    # median seconds per StepTimeRegression cause (the report prices each step's excess over it).
    reference_first: int | None = None
    reference_last: int | None = None
    reference_steps: int = 0
    cause_reference: dict[str, float] = field(default_factory=dict)
    # Where the reference comes from: "incarnation" (this trainer incarnation's first normal steps), "before_shift"
    # (the stable steps before a level shift inside them: reference_shift), "kept" (the incarnation before a
    # restart: the same workload resumed). reference_reason: why a restart started anew (REFERENCE_REASONS).
    reference_origin: str | None = None
    reference_reason: str = ""
    reference_shift: Shift | None = None
    # Step time per unit of work (perf/total_num_images where every step logs it, else seconds): each window
    # step's over the reference's; what StepTimeRegression thresholds.
    duration_ratio: dict[str, float] | None = None
    workload_ratio: float | None = None               # images per step now / in the reference
    # each part's (cause's) share of the step minus its share in the reference, min/median/max over the window: a part
    # that grew while the rest jittered down (its growth hidden in the step total)
    part_growth: dict[str, dict[str, float]] = field(default_factory=dict)  # cause -> min/median/max
    drift: float | None = None                        # median of the last DRIFT_STEPS normal steps / reference
    drift_regression: dict[str, float] = field(default_factory=dict)  # cause -> their median - reference (s)
    mfu_drift: dict[str, float] = field(default_factory=dict)  # role -> median MFU of the last DRIFT_STEPS / reference
    # The shape of each shift since the reference (shift.shape): ("step_time", "") and ("mfu", role).
    shapes: dict[tuple[str, str], Shape] = field(default_factory=dict)


# Why a trainer restart started a new reference instead of keeping the old one (omniwatch_reference_info's reason).
REFERENCE_REASONS = {
    "workload_changed": "images per step changed at the restart",
    "config_changed": "the trainer's configuration changed at the restart",
    "faster_after_restart": "the restarted run is faster than the old reference (a fix applied through the restart)",
    "mfu_changed": "MFU moved at the restart (a pinned device peak or another fix)",
}


def _images(r: StepRecord) -> float | None:
    v = r.values.get(K_IMAGES)
    return v if v is not None and v > 0 else None


class RunWindow:
    """The last ``window + baseline`` normal steps of one trainer incarnation, in step order, the
    incarnation's first ``reference`` normal steps (the anchored reference) and a compact history of its last
    HISTORY_STEPS normal steps (the shape of a shift).

    Steps may arrive out of order (concurrent pushes): a late step is placed by its number. A trainer
    restart (:meth:`reset`) starts a new incarnation: the window starts over; the old reference is kept for the
    new incarnation (the same workload resumed) unless its first k normal steps say the workload or the run
    changed (:meth:`_settle_prior`), so a run resumed after a fix (a pinned device peak, a reward pool) is
    compared with itself after the fix, and a run resumed still slow is still compared with its healthy start."""

    def __init__(self, window: int = DEFAULT_WINDOW_STEPS, baseline: int = DEFAULT_BASELINE_STEPS,
                 reference: int = REFERENCE_STEPS, drift: int = DRIFT_STEPS):
        if window < 1 or baseline < 1 or reference < 1 or drift < 1:
            raise ValueError("window, baseline, reference and drift must be >= 1")
        self.k = window
        self.n = baseline
        self.r = reference
        self.d = drift
        self.normal: deque[StepRecord] = deque(maxlen=window + max(baseline, drift))
        self.reference: list[StepRecord] = []  # the incarnation's first `r` normal steps, in step order
        # (step, seconds, images, {role: mfu}) of the last HISTORY_STEPS normal steps, in step order
        self.history: deque[tuple] = deque(maxlen=HISTORY_STEPS)
        self._typical: float | None = None  # typical_step(), cached until the window changes
        self._typical_valid = False
        self._leader: str | None = None  # the cause StepTimeRegression names (_leader_for), and its window's end
        self._leader_at = -1
        self._carry: str | None = None  # the cause named before a restart whose reference was kept
        self._shift_key: tuple | None = None  # reference_shift() of the reference steps it was computed for
        self._shift: Shift | None = None
        # A previous incarnation's reference, kept across a restart: `prior` while its first k normal steps are
        # not in yet (pending), `kept` once adopted; `reason` says why it was dropped instead.
        self.prior: list[StepRecord] | None = None
        self.prior_leader: str | None = None
        self.kept: list[StepRecord] | None = None
        # The previous incarnation's last normal steps and history, while its reference is pending or kept: the
        # window goes on across the restart (a resume of the same workload, still slow, stays one alert).
        self.carried: list[StepRecord] = []
        self.carried_hist: list[tuple] = []
        self.reason = ""

    def add(self, rec: StepRecord) -> None:
        if rec.flags:  # not a normal step
            return
        self._typical_valid = False
        ref = self.reference
        if len(ref) < self.r or rec.step <= ref[-1].step:  # else: past the reference, nothing to do there
            self._add_reference(rec)
        self._add_history(rec)
        q = self.normal
        if not q or rec.step > q[-1].step:
            q.append(rec)
        else:
            steps = [r.step for r in q]
            i = bisect_left(steps, rec.step)
            if i < len(q) and q[i].step == rec.step:
                q[i] = rec  # the step again (a re-run): the newer record counts
            elif i == 0 and len(q) == q.maxlen:
                return  # older than everything kept: beyond the baseline's reach
            else:
                if len(q) == q.maxlen:  # full: the oldest step leaves, everything before i moves down one
                    q.popleft()
                    i -= 1
                q.insert(i, rec)
        if self.prior is not None and len(q) >= self.k:
            self._settle_prior(list(q)[: self.k])

    def _add_history(self, rec: StepRecord) -> None:
        row = (rec.step, rec.duration, _images(rec), dict(rec.mfu))
        h = self.history
        if not h or rec.step > h[-1][0]:
            h.append(row)
            return
        steps = [x[0] for x in h]
        i = bisect_left(steps, rec.step)
        if i < len(h) and h[i][0] == rec.step:
            h[i] = row
        elif not (i == 0 and len(h) == h.maxlen):
            if len(h) == h.maxlen:
                h.popleft()
                i -= 1
            h.insert(i, row)

    def _add_reference(self, rec: StepRecord) -> None:
        """Keep the incarnation's first ``r`` normal steps by step number (a re-run step replaces its record,
        a late lower step pushes the highest one out)."""
        ref = self.reference
        if len(ref) >= self.r and rec.step > ref[-1].step:
            return
        i = bisect_left([r.step for r in ref], rec.step)
        if i < len(ref) and ref[i].step == rec.step:
            ref[i] = rec
            return
        ref.insert(i, rec)
        del ref[self.r:]

    def reset(self) -> None:
        """A new trainer incarnation: the window starts over; the reference in force is kept as ``prior`` until
        the new incarnation's first k normal steps settle whether it still applies (:meth:`_settle_prior`)."""
        current = self.kept if self.kept is not None else self._stable(self.reference)
        if current and len(current) >= MIN_BASELINE_STEPS:
            self.prior, self.prior_leader = list(current), self._leader
            self.carried = (self.carried + list(self.normal))[-self.normal.maxlen:]
            self.carried_hist = (self.carried_hist + list(self.history))[-HISTORY_STEPS:]
        elif self.prior is None:
            self.prior_leader = None
            self.carried, self.carried_hist = [], []
        self.kept = None
        self.reason = ""
        self.normal.clear()
        self.history.clear()
        self._typical_valid = False
        self.reference.clear()
        self._leader, self._leader_at, self._carry = None, -1, None
        self._shift_key, self._shift = None, None

    def drop_prior(self, reason: str) -> None:
        """The previous incarnation's reference no longer applies (the trainer's configuration changed at the restart):
        this incarnation's own reference from now on, and ``reason`` says why."""
        if self.prior is None and self.kept is None:
            return
        self.prior = self.kept = self.prior_leader = self._carry = None
        self.carried, self.carried_hist = [], []
        self.reason = reason
        self._leader, self._leader_at = None, -1

    @property
    def borrowed(self) -> bool:
        """The reference is the previous incarnation's (kept, or pending until the first k normal steps settle it)."""
        return self.kept is not None or self.prior is not None

    def forget(self) -> None:
        """A new trainer incarnation that shares nothing with the old one (a level shift the log did not show)."""
        self.reset()
        self.prior = self.prior_leader = None
        self.carried, self.carried_hist = [], []

    def _settle_prior(self, first: list[StepRecord]) -> None:
        """Keep the previous incarnation's reference for this one, or drop it and say why, from the new
        incarnation's first k normal steps: a new workload (images per step, config) or a run that got faster or
        whose MFU moved (a fix applied through the restart) starts a new reference."""
        prior, self.prior = self.prior, None
        reason = ""
        old_img = [x for x in map(_images, prior) if x is not None]
        new_img = [x for x in map(_images, first) if x is not None]
        if (old_img or new_img) and (len(old_img) != len(prior) or len(new_img) != len(first)
                                       or statistics.median(old_img) != statistics.median(new_img)):
            reason = "workload_changed"
        else:
            old_d = [r.duration for r in prior if r.duration]
            new_d = [r.duration for r in first if r.duration]
            if old_d and new_d and statistics.median(new_d) < RESTART_FASTER * statistics.median(old_d):
                reason = "faster_after_restart"
            for role in {role for r in prior for role in r.mfu}:
                a = [r.mfu[role] for r in prior if r.mfu.get(role, 0) > 0]
                b = [r.mfu[role] for r in first if r.mfu.get(role, 0) > 0]
                if a and b:
                    ma, mb = statistics.median(a), statistics.median(b)
                    if ma > 1.0 or mb / ma > RESTART_MFU_MOVED:  # an impossible old MFU, or one the restart raised
                        reason = reason or "mfu_changed"
        if reason:
            self.reason, self.kept = reason, None
            self.carried, self.carried_hist = [], []
        else:
            self.kept, self._carry = prior, self.prior_leader
        self.prior_leader = None

    def typical_step(self) -> float | None:
        """The median duration of the last ``n`` normal steps. Read on every ingested step (the ledger's
        stall tolerance, the level-shift check), so it is cached until :meth:`add` or :meth:`reset`
        changes the window."""
        if not self._typical_valid:
            durs = sorted([r.duration for r in self.normal if r.duration is not None][-self.n:])
            h = len(durs) // 2
            self._typical = (durs[h] if len(durs) % 2 else (durs[h - 1] + durs[h]) / 2) if durs else None
            self._typical_valid = True
        return self._typical

    def _stable(self, cand: list[StepRecord], tail: list[StepRecord] = ()) -> list[StepRecord]:
        """``cand`` (reference steps), cut before a level shift inside it (shift.reference_shift): the steps
        before a fault that began inside the reference are the reference. ``tail``: the normal steps after ``cand``
        while the reference is not complete (the window): more evidence of the later segment, so a fault from the
        incarnation's 4th normal step is seen at its 3rd step, not only once the reference holds 3 steps of it.
        Cached per set of steps."""
        key = tuple((r.step, id(r)) for r in cand), tuple((r.step, id(r)) for r in tail)
        if key != self._shift_key:
            self._shift_key = key
            self._shift = _reference_shift(cand, list(tail)) if len(cand) + len(tail) >= 2 * MIN_BASELINE_STEPS \
                and len(cand) >= MIN_BASELINE_STEPS else None
        return cand[: self._shift.index] if self._shift is not None else cand

    def stats(self) -> WindowStats:
        recs = list(self.normal)
        if self.carried:
            recs = (self.carried + recs)[-self.normal.maxlen:]
        out = WindowStats(steps=min(len(recs), self.k))
        out.typical_step = self.typical_step()
        if len(recs) < self.k:
            return out
        win = recs[-self.k:]
        # The reference: the previous incarnation's where it was kept across the restart; else this incarnation's
        # first r normal steps that precede the window, cut before a level shift inside them.
        if self.kept is not None or self.prior is not None:  # kept, or pending: judged as kept until settled
            base, out.reference_origin = (self.kept if self.kept is not None else self.prior), "kept"
        else:
            cand = [r for r in self.reference if r.step < win[0].step]
            tail = [r for r in recs if r.step > cand[-1].step] if cand and len(self.reference) < self.r else []
            base = self._stable(cand, tail)
            out.reference_shift = self._shift if self._shift is not None and base else None
            out.reference_origin = "before_shift" if out.reference_shift else "incarnation"
        out.reference_reason = self.reason
        if base:
            out.reference_first, out.reference_last, out.reference_steps = base[0].step, base[-1].step, len(base)
        rb = [r.reward_bound_ratio for r in win if r.reward_bound_ratio is not None]
        if len(rb) == self.k:
            out.reward_bound = _stats(rb)
        share = [r.reward_step_share for r in win if r.reward_step_share is not None]
        if len(share) == self.k:
            out.reward_step_share = _stats(share)
        idle = [r.idle_ratio for r in win if r.idle_ratio is not None]
        if len(idle) == self.k:
            out.idle = _stats(idle)
        for sig in signals.SIGNALS:
            xs = [r.values[sig.key] for r in win if sig.key in r.values]
            if len(xs) == self.k:
                out.signals[sig.name] = _stats(xs)
            bs = [r.values[sig.key] for r in base if sig.key in r.values] if sig.reference else []
            if len(bs) >= MIN_BASELINE_STEPS:
                out.signal_reference[sig.name] = statistics.median(bs)
        durs = [r.duration for r in win if r.duration is not None]
        if len(durs) == self.k:
            out.duration = _stats(durs)
        roles = {role for r in win for role in r.mfu}
        for role in sorted(roles):
            xs = [r.mfu[role] for r in win if r.mfu.get(role, 0) > 0]
            if len(xs) == self.k:
                out.mfu[role] = _stats(xs)
            elif sum(1 for r in win if r.mfu.get(role) == 0) == self.k:
                out.mfu_unsupported.append(role)
            bs = [r.mfu[role] for r in base if r.mfu.get(role, 0) > 0]
            if len(bs) >= MIN_BASELINE_STEPS:
                out.mfu_baseline[role] = statistics.median(bs)
        self._signal_stats(out, recs, win)
        unit = _unit(base, recs)  # per image where every step says, else per step
        ref = None
        bd = [r.duration / unit(r) for r in base if r.duration is not None]
        if len(bd) >= MIN_BASELINE_STEPS:
            ref = statistics.median(bd)
            now = unit(win[-1])
            out.duration_baseline = ref * now
            if unit is _images:  # the window's images per step over the reference's (a window fact, as the rest)
                out.workload_ratio = statistics.median(map(unit, win)) / statistics.median(map(unit, base))
            ratios = [r.duration / unit(r) / ref for r in win if r.duration is not None]
            if len(ratios) == self.k:
                out.duration_ratio = _stats(ratios)
            wc = [_scaled(r, unit, now) for r in win if r.causes]
            bc = [_scaled(r, unit, now) for r in base if r.causes]
            if len(wc) == self.k and len(bc) >= MIN_BASELINE_STEPS:
                out.cause_reference = {c: statistics.median(x[c] for x in bc) for c in CAUSES}
                out.regression = {c: statistics.median(x[c] for x in wc) - out.cause_reference[c] for c in CAUSES}
                out.regression_top = self._leader_for(out, recs, win, base[-1].step if not self.borrowed else -1, unit, now)
                # each part's share of the step over its share in the reference, lowest over the window
                ws = [r for r in win if r.causes and r.duration]
                bs_ = [r for r in base if r.causes and r.duration]
                if len(ws) == self.k and len(bs_) >= MIN_BASELINE_STEPS:
                    ref_share = {c: statistics.median(r.causes[c] / r.duration for r in bs_) for c in CAUSES}
                    out.part_growth = {c: _stats([r.causes[c] / r.duration - ref_share[c] for r in ws]) for c in CAUSES}
            self._drift(out, recs, win, unit, now, ref)
        self._mfu_drift(out, recs, base)
        self._shapes(out, ref if out.duration_baseline else None, unit is _images)
        return out

    def _leader_for(self, out: WindowStats, recs: list[StepRecord], win: list[StepRecord], after: int,
                    unit, now: float) -> str | None:
        """The cause StepTimeRegression names (:func:`regression_leader`). Until the anchored reference is complete
        (its growths still move) and while no cause grew by CAUSE_MIN_SHARE of the reference step, the largest;
        after that the named cause is carried from window to window, every window in step order, so the name
        depends on the steps only, not on when the exporter was scraped or a backfill sampled it. A late step
        that rewrites an older window, a gap longer than the run window holds, a restarted exporter or a new
        incarnation start over from the windows the run window holds (a kept reference carries the cause it
        named before the restart)."""
        end = win[-1].step
        if self._leader is not None and end == self._leader_at:
            return self._leader
        ref = out.cause_reference
        floor = CAUSE_MIN_SHARE * (out.duration_baseline or 0.0)

        def growth(w: list[StepRecord]) -> dict[str, float]:
            scaled = [_scaled(x, unit, now) for x in w]
            return {c: statistics.median(x[c] for x in scaled) - ref[c] for c in CAUSES}

        if not self.borrowed and len(self.reference) < self.r:  # the reference still fills: nothing to carry yet
            self._leader, self._leader_at = None, -1
            return max(out.regression, key=lambda c: (out.regression[c], c))
        windows = _windows_after(recs, self.k, after)
        pending = [w for w in windows if w[-1].step > self._leader_at]
        leader = self._leader
        if leader is None or end < self._leader_at or len(pending) == len(windows):
            pending, leader = windows, self._carry  # start over from every window the run window holds
        for w in pending:
            g = growth(w)
            leader = regression_leader([g], leader=leader if max(g.values()) >= floor else None)
        self._leader, self._leader_at = leader, end
        return leader

    def _drift(self, out: WindowStats, recs: list[StepRecord], win: list[StepRecord], unit, now: float,
               ref: float) -> None:
        """StepTimeRegression's creep series: the median of the last ``d`` normal steps (per unit of work) over the
        reference, once that many normal steps follow the reference (a creep is judged over tens of steps, never
        over the reference itself), and the cause medians' growth over the reference's."""
        last = self._drift_after(out)
        recent = [r for r in recs[-self.d:] if r.step > last and r.duration is not None]
        if len(recent) < self.d or not ref:
            return
        out.drift = statistics.median(r.duration / unit(r) for r in recent) / ref
        rc = [_scaled(r, unit, now) for r in recent if r.causes]
        if out.cause_reference and len(rc) == self.d:
            out.drift_regression = {c: statistics.median(x[c] for x in rc) - out.cause_reference[c] for c in CAUSES}

    def _drift_after(self, out: WindowStats) -> int | None:
        """The creep series judge the normal steps after this step: the reference's DRIFT_AFTER-th step (the median
        of 10 steps is already a level; its later steps make it steadier, and a creep must not wait for them), or
        its last step where it holds fewer; every kept step where the reference is borrowed from before a restart."""
        if self.borrowed:
            return -1
        if out.reference_last is None:
            return None
        ref = [r for r in self.reference if out.reference_first <= r.step <= out.reference_last]
        return ref[min(len(ref), DRIFT_AFTER) - 1].step if ref else out.reference_last

    def _mfu_drift(self, out: WindowStats, recs: list[StepRecord], base: list[StepRecord]) -> None:
        """MFUDrop's creep series: per role, the median MFU of the last ``d`` normal steps after the reference over
        the reference's (zeros, the unsupported estimator, left out)."""
        last = self._drift_after(out)
        if last is None:
            return
        recent = [r for r in recs[-self.d:] if r.step > last]
        if len(recent) < self.d:
            return
        for role, b in out.mfu_baseline.items():
            xs = [r.mfu[role] for r in recent if r.mfu.get(role, 0) > 0]
            if len(xs) == self.d and b > 0:
                out.mfu_drift[role] = statistics.median(xs) / b

    def _shapes(self, out: WindowStats, ref: float | None, per_work: bool) -> None:
        """The shape of each shift since the reference (shift.shape): step time per unit of work against ``ref``
        (the reference's), MFU per role against its reference. Only for a signal that moved off its reference
        (SHAPE_DEADBAND): the texts quote it when an alert fires, far beyond that."""
        last = out.reference_last if not self.borrowed else -1
        if last is None:
            return
        moved_up = max((out.duration_ratio or {}).get("median", 0.0), out.drift or 0.0) > 1 + SHAPE_DEADBAND
        roles = [role for role, b in out.mfu_baseline.items()
                 if min(out.mfu.get(role, {}).get("median", b), out.mfu_drift.get(role, b) * b) < (1 - SHAPE_DEADBAND) * b]
        if not (ref and moved_up) and not roles:
            return
        rows = self.carried_hist + [h for h in self.history if h[0] > last] if self.borrowed else \
            [h for h in self.history if h[0] > last]
        if len(rows) < 2:
            return
        if ref and moved_up:
            pts = [(h[0], h[1] / (h[2] if per_work else 1.0)) for h in rows if h[1] is not None and (h[2] or not per_work)]
            if len(pts) >= 2 and (sh := shape([s for s, _ in pts], [v for _, v in pts], ref)) is not None:
                out.shapes[("step_time", "")] = sh
        for role in roles:
            b = out.mfu_baseline[role]
            pts = [(h[0], v) for h in rows if (v := h[3].get(role, 0.0)) > 0]
            if len(pts) >= 2 and (sh := shape([s for s, _ in pts], [v for _, v in pts], b)) is not None:
                out.shapes[("mfu", role)] = sh

    def _signal_stats(self, out: WindowStats, recs: list[StepRecord], win: list[StepRecord]) -> None:
        """Window statistics of the issue-13 signals (every one of the k window steps must carry the
        value, as for the other window series); the skipped-update count runs over the last ``n``
        normal steps (the baseline length): one skip is noise, a few in 20 steps is a pattern."""
        for attr, get in (("straggler", lambda r: r.straggler_ratio), ("rs_seq_masked", lambda r: r.rs_seq_masked),
                          ("outside", lambda r: r.outside_ratio),
                          ("timer_residual", lambda r: r.timer_residual / r.duration
                           if r.timer_residual is not None and r.duration else None)):
            xs = [v for v in map(get, win) if v is not None]
            if len(xs) == self.k:
                setattr(out, attr, _stats(xs))
        if out.rs_seq_masked:
            out.rs_mode = win[-1].rs_mode
        recent = [r.grad_norm_nonfinite for r in recs[-self.n:] if r.grad_norm_nonfinite is not None]
        if recent:
            out.grad_nonfinite_recent = sum(recent)


def _per_step(r: StepRecord) -> float:
    return 1.0


def _scaled(r: StepRecord, unit, now: float) -> dict[str, float]:
    """``r``'s seconds per cause at the workload ``now`` (``unit``: per image or per step)."""
    if unit is _per_step:
        return r.causes
    f = now / unit(r)
    return {c: v * f for c, v in r.causes.items()}


def _unit(base: list[StepRecord], recs: list[StepRecord]):
    """The unit of work step times are judged per: images (perf/total_num_images) when the reference and every
    kept step log it, else one step (seconds as they are)."""
    if base and all(_images(r) for r in base) and all(_images(r) for r in recs):
        return _images
    return _per_step


# A level shift inside the reference (shift.reference_shift), per series: the least move of the medians (in the
# series' units, and as a share of the earlier level: both), and the least gap between the later median and the
# earlier segment's worst step. A part's share of the step does not move with the whole node (contention, clocks
# slow every part alike: healthy step times vary 8-15 % from step to step), so 5 points of the step and a fifth of
# the part's own share is already a fault inside that part (update_actor 1.4x on a step it holds 24 % of: +7
# points, +29 %; generation 1.55x: +11 points, +25 %). The step time itself is not a signal here: at 15 % step
# jitter its first 3 normal steps are all the fastest of 10 once in ~120 runs, and a slowdown of every part alike
# (throttling) shows in MFU. MFU must move by 15 %. Calibrated in tests/test_one_voice.py: 3000 healthy references
# at 4-15 % phase and 8-15 % step jitter are never cut; faults from step 6-8 are.
# Criteria (shift.Criteria): least move in the series' units, least move as a share of its earlier level, least gap
# past the earlier segment's worst step, robust standard errors of noise. "Alone": one series is enough; "together":
# two series must move at the same split (a part that slowed moves its share *and* the step time; node-wide jitter
# moves the step alone, one part's jitter its share alone).
SHIFT_SHARE = ((0.05, 0.20, 0.02, 4.0), (0.03, 0.12, 0.0, 3.0))  # a part's share of the step: points of the step
SHIFT_MFU = ((0.0, 0.15, 0.0, 4.0), (0.0, 0.10, 0.0, 3.0))       # MFU
SHIFT_STEP = (None, (0.0, 0.10, 0.0, 3.0))                       # step time per unit of work: never alone


def _reference_shift(cand: list[StepRecord], tail: list[StepRecord] = ()) -> Shift | None:
    """A level shift inside the reference steps ``cand`` (shift.reference_shift) in step time per unit of work (only
    together with another series), in each part's share of the step (cause seconds / step seconds) and in MFU per
    role; ``tail``: later normal steps that only add evidence to the later segment."""
    split = len(cand)
    cand = list(cand) + list(tail)
    steps = [r.step for r in cand]
    series: dict[str, tuple] = {}
    if all(r.duration for r in cand):
        unit = _unit(cand, cand)
        series["step_time"] = ([r.duration / unit(r) for r in cand], True, *SHIFT_STEP)
    if all(r.duration and r.causes for r in cand):
        for c in CAUSES:
            series["cause:" + c] = ([r.causes[c] / r.duration for r in cand], True, *SHIFT_SHARE)
    for role in sorted({role for r in cand for role in r.mfu}):
        xs = [r.mfu.get(role, 0.0) for r in cand]
        if all(x > 0 for x in xs):
            series["mfu:" + role] = (xs, False, *SHIFT_MFU)
    return reference_shift(steps, series, max_split=split) if series else None
