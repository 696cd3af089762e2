"""The one retry schedule: exponential backoff, capped, optionally jittered.

Used by the relay (a receiver that fails: jittered so many rows do not retry in lockstep), the Ray
discovery probe (a child that died or stopped answering) and the GPU sampler (NVML that would not open).
"""
from __future__ import annotations

import random


def delay(failures: int, initial: float, maximum: float, jitter: bool = False) -> float:
    """Seconds to wait after ``failures`` consecutive failures (0: the first retry waits ``initial``):
    ``initial x 2^failures`` capped at ``maximum``; with ``jitter``, uniform in [half, all] of it."""
    d = min(maximum, initial * 2 ** min(max(failures, 0), 30))
    return d * random.uniform(0.5, 1.0) if jitter else d
