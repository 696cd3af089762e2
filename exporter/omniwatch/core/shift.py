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


@dataclass(frozen=True)
class Shift:
    """A level shift inside a reference: the stable segment is ``index`` steps long, the shift begins at
    step ``step``; ``signal`` moved by ``ratio`` (after / before, medians)."""
    index: int
    step: int
    signal: str
    ratio: float


Criteria = tuple[float, float, float, float]  # least move (units), least move (share of the earlier median), gap, noise


def _passes(xs: list[float], i: int, worse_up: bool, c: Criteria) -> float | None:
    """How far the later segment's median moved past the earlier one's (as a multiple of its margin) when it passes
    ``c``, else None."""
    least, rel, min_gap, noise = c
    before, after = xs[:i], xs[i:]
    mb, ma = statistics.median(before), statistics.median(after)
    move = (ma - mb) if worse_up else (mb - ma)
    margin = max(least, rel * abs(mb))
    if margin <= 0 or move <= margin:
        return None
    clear = (ma - max(before)) if worse_up else (min(before) - ma)
    sigma = 1.4826 * statistics.median([abs(x - mb) for x in before] + [abs(x - ma) for x in after])
    stderr = sigma * (1 / len(before) + 1 / len(after)) ** 0.5
    return move / margin if clear > min_gap and move > noise * stderr else None


def reference_shift(steps: list[int], series: dict[str, tuple[list[float], bool, Criteria | None, Criteria]],
                    max_split: int | None = None) -> Shift | None:
    """The first split of the reference (by step order) after which some series is worse than before it: ``series``
    maps a name to (values in step order, ``worse_up`` — larger is worse, as a part's share of the step; smaller is
    worse, as MFU —, its criteria alone (None: never alone), its criteria when another series moves at the same
    split too). Criteria: the least move of the medians in the series' units and as a share of the earlier median
    (both must be met), the least gap by which the later median must clear the earlier segment's worst step, and how
    many robust standard errors (the segments' spread around their own medians) the move must stand above the noise
    (a median-based two-sample test), so 15 % jitter cannot fake it. Only degradations count: a run that gets faster
    after its first steps (a warm-up tail) keeps its reference as it is. ``max_split``: the split is at most this
    index (the reference's own steps; the steps after it only add evidence to the later segment)."""
    n = len(steps)
    last = n - SHIFT_MIN_STEPS if max_split is None else min(n - SHIFT_MIN_STEPS, max_split)
    for i in range(SHIFT_MIN_STEPS, last + 1):
        alone: list[tuple[float, str]] = []
        together: list[tuple[float, str]] = []
        for name, (xs, worse_up, strong, weak) in series.items():
            if strong is not None and (r := _passes(xs, i, worse_up, strong)) is not None:
                alone.append((r, name))
            elif (r := _passes(xs, i, worse_up, weak)) is not None:
                together.append((r, name))
        if not alone and len(together) >= 2:
            alone = together
        if alone:
            _, name = max(alone)
            xs = series[name][0]
            mb, ma = statistics.median(xs[:i]), statistics.median(xs[i:])
            return Shift(i, steps[i], name, ma / mb if mb else float("inf"))
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
