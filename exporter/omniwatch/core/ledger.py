"""Where a run's GPU-hours went: every second between two step arrivals, times the run's GPUs, in exactly
one bucket, so the buckets sum to the total.

One step's interval (from the previous step's arrival to this one's) splits into:

- the step timer (``timing_s/step``): each timed phase in its own bucket (``gen``, ``old_log_prob``,
  ``update_actor``, ``update_weights``, ...), except: reward on the critical path is
  ``reward_critical_path`` (the colocated ``timing_s/reward``, or the streamed tail that sits inside
  ``gen``), ``save_checkpoint`` is ``checkpoint``, and the untimed rest is ``inter_stage_idle``. Timers
  that add up to more than the step (a nested timer) are scaled to fit it;
- ``validation``: ``timing_s/testing`` (outside the step timer, before the line is logged);
- ``outside_step_timer``: what is left of the interval (dataloader, metrics, logging; V1's second
  TransferQueue fetch and kv_clear), up to the stall tolerance;
- ``stalled``: the part of that outside time beyond ``(stall.notice_steps - 1)`` typical steps (the
  gap TrainingStalled's first stage reports).

The interval is known when both arrivals were observed live (or rebuilt by the backtest); for a step
read from a file's backlog, or the first step, it is the step plus its validation. GPUs come from the
run's own keys (``perf/throughput = perf/total_num_images / (perf/time_per_step x n_gpus)``, all resource
pools; V1 separate_async's standalone rollout GPUs are not counted, docs/verl-source.md E14) or from
``--gpus``. The live exporter (``omniwatch_gpu_seconds_total{bucket}``) and ``omniwatch report`` call
:func:`split`; nothing else computes the ledger.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import names
from ..config import Config
from .analytics import K_IMAGES, K_TESTING, K_THROUGHPUT, K_TIME_PER_STEP, StepRecord
from .phasetable import CHECKPOINT, IDLE, PHASES, REWARD

VALIDATION = "validation"
OUTSIDE = "outside_step_timer"
STALLED = "stalled"
NON_PHASE = (REWARD, IDLE, CHECKPOINT, VALIDATION, OUTSIDE, STALLED)
# Phase buckets, in step order (phasetable.PHASES less the ones with a bucket of their own); any other
# timed phase keeps its own name.
PHASE_BUCKETS = tuple(p.name for p in PHASES if not p.bucket)


def stall_tolerance_steps(cfg: Config) -> float:
    """Typical steps of outside time a step's interval may hold before the rest is ``stalled``: the gap
    TrainingStalled's first stage reports (``stall.notice_steps`` of the alert config the rules were made with)."""
    return cfg.stall.notice_steps - 1


_BUCKET_OF = {p.name: p.bucket for p in PHASES if p.bucket}


def bucket_of(phase: str) -> str:
    return _BUCKET_OF.get(phase, phase)


@dataclass(frozen=True)
class Gpus:
    count: int
    source: str  # "log" (derived from the run's own keys) or "flag" (--gpus)


def gpus_from_keys(values: dict[str, float]) -> int | None:
    """n_gpus VeRL-Omni divided by: total_num_images / (throughput x time_per_step), when it is an integer."""
    imgs, thr, t = values.get(K_IMAGES), values.get(K_THROUGHPUT), values.get(K_TIME_PER_STEP)
    if not imgs or not thr or not t or thr <= 0 or t <= 0:
        return None
    n = imgs / (thr * t)
    r = round(n)
    return r if r >= 1 and abs(n - r) <= 0.02 * r else None


def split(rec: StepRecord, interval: float | None, typical: float | None, tolerance_steps: float) -> dict[str, float]:
    """Wall seconds of one step's interval by bucket (they sum to the interval, or to step + validation
    when the interval is unknown). ``typical`` is the run's typical step and ``tolerance_steps``
    (:func:`stall_tolerance_steps` of the alert config) how many of them the outside time may hold before
    the rest is stalled; both are read only when the interval has time beyond the step and its validation."""
    out: dict[str, float] = {}
    duration = rec.duration
    if duration is None:
        return out
    untracked = names.UNTRACKED_PHASE
    bucket = _BUCKET_OF.get
    total_timed = 0.0
    for p, s in rec.phases.items():  # one pass: each timed phase in its bucket
        if s > 0 and p != untracked:
            total_timed += s
            b = bucket(p, p)
            out[b] = out.get(b, 0.0) + s
    scale = 1.0
    if total_timed > duration:  # a nested timer: the timers are scaled to fit the step
        scale = duration / total_timed
        out = {b: s * scale for b, s in out.items()}
    tail = rec.reward_critical.get("streamed", 0.0)
    if tail > 0:  # the streamed reward tail is the end of gen
        tail = min(tail * scale, out.get("gen", 0.0))
        if tail > 0:
            out["gen"] -= tail
            out[REWARD] = out.get(REWARD, 0.0) + tail
    idle = duration - total_timed * scale
    if idle > 0:
        out[IDLE] = idle
    testing = rec.values.get(K_TESTING, 0.0)
    if testing > 0:
        out[VALIDATION] = testing
    else:
        testing = 0.0
    if interval is not None:
        rest = interval - duration - testing
        if rest > 0:
            allowed = tolerance_steps * typical if typical else rest
            if allowed > 0:
                out[OUTSIDE] = min(rest, allowed)
            if rest > allowed:
                out[STALLED] = rest - allowed
    if out.get("gen", 1.0) <= 0:  # all of gen was the streamed tail
        del out["gen"]
    return out


def open_stall(gap: float, typical: float | None, tolerance_steps: float, allowance: float = 0.0) -> float:
    """Wall seconds of a stall still open (issue 31 item 3): ``gap`` = the time since the run's last step (to now,
    to a report's end, or to its job's end), less the stall tolerance (``tolerance_steps`` typical steps, as
    :func:`split` and the dashboards' open-stall panels: TrainingStalled's info threshold less one typical step) and
    the planned work that may come before the next step (``allowance``). The ledger books the same kind of seconds
    as ``stalled`` when the next step arrives; until then nothing is booked, so the reports add this (x GPUs) to the
    stalled bucket."""
    if typical is None or typical <= 0 or gap <= 0:
        return 0.0
    return max(0.0, gap - tolerance_steps * typical - max(0.0, allowance))


def rate_per_day(recs, gpus: int) -> dict[str, float]:
    """GPU-hours per day by bucket at the pace of ``recs`` (the alert window's normal steps): each
    bucket's share of their step time x GPUs x 24 h — what a bottleneck costs at the current rate
    (``omniwatch_gpu_hours_per_day``; the alert annotations quote it)."""
    total: dict[str, float] = {}
    wall = 0.0
    for r in recs:
        for b, s in split(r, None, None, 0).items():  # no interval: no outside time, no tolerance
            total[b] = total.get(b, 0.0) + s
            wall += s
    if wall <= 0 or gpus <= 0:
        return {}
    return {b: s / wall * gpus * 24.0 for b, s in total.items()}


def ordered(buckets) -> list[str]:
    """Buckets in reading order: phases in step order, then the rest."""
    names_ = set(buckets)
    head = [b for b in PHASE_BUCKETS if b in names_]
    tail = [b for b in NON_PHASE if b in names_]
    return head + sorted(names_ - set(head) - set(tail)) + tail
