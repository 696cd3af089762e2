"""Level shifts in a run's own history, counted in steps (pure, no I/O, no thresholds of the alert rules).

Two questions the step analytics ask of a series of normal steps (step time per unit of work, MFU, the
seconds of one part of the step):

- :func:`reference_shift`: does the anchored reference itself hold a level shift — a fault that began
  inside it (the reference is the median of an incarnation's first normal steps, so a fault from its 6th
  step would otherwise *be* the reference)? Then the stable segment before the shift is the reference.
- :func:`shape`: what did the series do since the reference: one **step change** at step N, or a
  **creep** that began at step N and has grown steadily since? Alert texts say which ("a step change at
  step 25", "a creep of 18 % over 40 steps"); the rules never read it, so it cannot change what fires.

Both least-squares fits are O(n) with prefix sums, so they cost microseconds per scrape.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import accumulate

# A shift inside the reference needs a stable segment of at least this many normal steps before it (the
# design's "at least 3 normal steps") and as many after it (fewer is noise, and the median of 10 holds it).
SHIFT_MIN_STEPS = 3
# ... and the segments must be apart by more than NOISE_FACTOR times their own spread (median absolute deviation),
# besides each series' own margins (reference_shift's caller: analytics._reference_shift).
NOISE_FACTOR = 4.0


@dataclass(frozen=True)
class Shift:
    """A level shift inside a reference: the stable segment is ``index`` steps long, the shift begins at
    step ``step``; ``signal`` moved by ``ratio`` (after / before, medians)."""
    index: int
    step: int
    signal: str
    ratio: float


def _mad(xs: list[float]) -> float:
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


def reference_shift(steps: list[int], series: dict[str, tuple[list[float], bool, float, float]]) -> Shift | None:
    """The first split of the reference (by step order) after which some series is worse than before it at
    every step, by margins: ``series`` maps a name to (values in step order, ``worse_up`` — larger is worse, as step
    time; smaller is worse, as MFU —, the least move of the medians and the least gap between the two segments
    (after's best step to before's worst), both in the series' units). Complete separation by that gap, a move of
    the medians by that margin and by NOISE_FACTOR times the segments' own spread is what makes it a shift, not
    jitter. Only degradations count: a run that gets faster after its first steps (a warm-up tail) keeps its
    reference as it is."""
    n = len(steps)
    for i in range(SHIFT_MIN_STEPS, n - SHIFT_MIN_STEPS + 1):
        best: tuple[float, Shift] | None = None
        for name, (xs, worse_up, margin, min_gap) in series.items():
            before, after = xs[:i], xs[i:]
            mb, ma = statistics.median(before), statistics.median(after)
            move = (ma - mb) if worse_up else (mb - ma)
            gap = (min(after) - max(before)) if worse_up else (min(before) - max(after))
            noise = max(_mad(before), _mad(after))
            if gap > min_gap and move > margin and move > NOISE_FACTOR * noise:
                rel = move / margin
                if best is None or rel > best[0]:
                    best = (rel, Shift(i, steps[i], name, ma / mb if mb else float("inf")))
        if best is not None:
            return best[1]
    return None


@dataclass(frozen=True)
class Shape:
    """What a series did after its reference level ``base``: ``kind`` "step" (one change at ``onset``, flat
    since) or "creep" (flat until ``onset``, then growing steadily); ``ratio`` is the level now over ``base``
    (the fitted level at the last step), ``steps`` the normal steps from ``onset`` to now."""
    kind: str
    onset: int
    ratio: float
    steps: int


def shape(steps: list[int], xs: list[float], base: float) -> Shape | None:
    """Fit two models to ``xs`` (normal steps after the reference, in step order) against the known level
    ``base``: a step (``base`` until some index, a constant after it) and a hinge (``base`` until some index,
    a straight line rising or falling from there); the one with the smaller squared error names the shape
    (a tie is a step). None when there are fewer than 2 points or ``base`` is not positive."""
    n = len(xs)
    if n < 2 or not base or base <= 0:
        return None
    d = [x - base for x in xs]
    sq = list(accumulate((v * v for v in d), initial=0.0))             # sq[i]: sum of d^2 over [0, i)
    s1 = list(accumulate(reversed(d), initial=0.0))[::-1]              # s1[i]: sum of d over [i, n)
    st = list(accumulate((v * t for t, v in zip(range(n - 1, -1, -1), reversed(d))), initial=0.0))[::-1]  # d*t
    total = sq[n]
    # step at i: head at base, tail at its mean -> sse = total - m * mean^2
    sse_step = [total - s1[i] * s1[i] / (n - i) for i in range(n)]
    # hinge at i: d_t = slope * (t - i + 1) for t >= i -> sse = total - su^2 / uu
    su = [st[i] - (i - 1) * s1[i] for i in range(n)]
    uu = [(n - i) * (n - i + 1) * (2 * (n - i) + 1) / 6.0 for i in range(n)]
    sse_hinge = [total - su[i] * su[i] / uu[i] for i in range(n)]
    i_s = min(range(n), key=sse_step.__getitem__)
    i_h = min(range(n), key=sse_hinge.__getitem__)
    if sse_step[i_s] <= sse_hinge[i_h] + 1e-12:
        return Shape("step", steps[i_s], (base + s1[i_s] / (n - i_s)) / base, n - i_s)
    slope = su[i_h] / uu[i_h]
    return Shape("creep", steps[i_h], (base + slope * (n - i_h)) / base, n - i_h)
