"""Turn NVML utilization samples into busy/idle *intervals* and second counters.

What a sample means (NVML docs): ``nvmlUtilization_t.gpu`` is the percent of time over the past
sample period during which one or more kernels ran. So the sample stamped ``t`` describes the period
``(t_prev, t]`` that *ends* at its timestamp; attributing it forward (``[t, t_next)``) shifts every
busy/idle edge by one period (~0.2 s on an H200) and over-counts gap idle — that is the 7.6 s vs 7.4 s
error the H200 fixture's provenance note mentions (tests/fixtures/README.md). This module uses ``(t_prev, t]``.

A sample is *busy* when its utilization is above ``threshold`` percent (default 50, configurable):
a period that ran kernels more than half of the time. One refinement: a *transition* sample — partial
utilization (strictly between 10 and 90 %) right after a full busy (>= 90 %) or full idle (<= 10 %)
sample — holds a phase edge, so it is split at the edge instead of being classified whole: ``u`` % of
its period is busy, placed first after a busy period (busy -> idle edge) and last after an idle one.
Whole-sample classification is off by up to one period per edge and, measured on the H200 traces, under-
counts gap idle by 3-10 %; the split lands within 0.3 % (docs/benchmarks.md). Sustained partial
utilization (several partial samples in a row) is classified by the threshold.

Edge cases, all counted in ``events`` (exposed as ``omniwatch_ingest_errors_total{source="nvml"}``):

- first sample after start or re-open: it only sets the origin (its period began before we looked);
- duplicate timestamp (``t == t_prev``) or a slightly older one (out of order): skipped;
- a gap (``t - t_prev > max_gap_s``: the drain was late and the driver ring overwrote samples, or the
  GPU stopped sampling): only one nominal period is credited to the sample, the rest is unknown;
- the wall clock jumping back (``t`` older than ``t_prev`` by more than ``jump_s``): the origin is reset
  to the new sample, nothing is credited; a forward jump is a gap.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .devices import Sample

DEFAULT_THRESHOLD = 50.0
DEFAULT_MAX_GAP_S = 2.0
DEFAULT_PERIOD_S = 0.2  # the H200's NVML sample period; replaced by the observed spacing
JUMP_S = 1.0
DEFAULT_EDGE_BAND = (5.0, 95.0)  # utilization strictly inside this band is a partial period


@dataclass(frozen=True)
class Interval:
    start: float  # unix seconds
    end: float
    busy: bool


@dataclass
class SampleAccountant:
    threshold: float = DEFAULT_THRESHOLD
    max_gap_s: float = DEFAULT_MAX_GAP_S
    jump_s: float = JUMP_S
    last_us: int | None = None
    last_util: int | None = None
    prev_util: int | None = None
    edge: bool | None = None   # the state the last (split) transition period ended in, for the one after it
    edge_band: tuple[float, float] = DEFAULT_EDGE_BAND
    period_s: float = DEFAULT_PERIOD_S
    busy_s: float = 0.0
    idle_s: float = 0.0
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def restart(self) -> None:
        """Forget the origin (device re-opened): the next sample is a first sample again."""
        self.last_us = None

    def feed(self, samples: list[Sample]) -> list[Interval]:
        out: list[Interval] = []
        for ts, util in sorted(samples):
            out.extend(self._one(ts, util))
        return out

    def _one(self, ts: int, util: int) -> list[Interval]:
        if not (0 <= util <= 100):
            self.events["bad_sample"] += 1
            return []
        last = self.last_us
        if last is None:
            self.last_us, self.last_util, self.prev_util = ts, util, util
            return []
        dt = (ts - last) / 1e6
        if dt <= 0:
            if -dt > self.jump_s:
                self.events["clock_jump"] += 1
                self.last_us, self.last_util, self.prev_util = ts, util, util
            else:
                self.events["duplicate_sample"] += 1
            return []
        self.last_us, self.last_util = ts, util
        end = ts / 1e6
        start = last / 1e6
        if dt > self.max_gap_s:
            self.events["sample_gap"] += 1
            dt = self.period_s
            start = end - dt
        else:
            self.period_s = 0.9 * self.period_s + 0.1 * dt  # smoothed spacing, used for gaps only
        prev, self.prev_util = self.prev_util, util
        edge, self.edge = self.edge, None
        if prev is not None and self._partial(util) and (not self._partial(prev) or edge is not None):
            # A transition period: the previous period was fully busy (or idle), this one partly.
            # Split it at the edge: busy first after a busy period, idle first after an idle one.
            # The period right after a split one continues from where that one ended (a busy burst or an
            # idle gap of 1-2 periods straddles two partial samples); a third partial one in a row is load.
            busy_part = dt * util / 100.0
            self.busy_s += busy_part
            self.idle_s += dt - busy_part
            busy_first = edge if edge is not None else prev > self.threshold
            if edge is None:
                self.edge = not busy_first   # this period ends the other way: the next may continue it
            if busy_first:
                mid = start + (end - start) * util / 100.0
                return [Interval(start, mid, True), Interval(mid, end, False)]
            mid = end - (end - start) * util / 100.0
            return [Interval(start, mid, False), Interval(mid, end, True)]
        busy = util > self.threshold
        if busy:
            self.busy_s += dt
        else:
            self.idle_s += dt
        return [Interval(start, end, busy)]

    def _partial(self, util: int) -> bool:
        return self.edge_band[0] < util < self.edge_band[1]

    def resync(self, samples: list[Sample]) -> list[Interval]:
        """Samples read with ``last_us=0`` after the device returned nothing for a while: when all of
        them are older than our origin the wall clock went back, so re-origin at the newest one."""
        if not samples:
            return []
        newest = max(samples)
        if self.last_us is not None and newest[0] < self.last_us - self.jump_s * 1e6:
            self.events["clock_jump"] += 1
            self.last_us, self.last_util = newest
            self.prev_util = newest[1]
            return []
        return self.feed(samples)


def overlap_seconds(intervals, start: float, end: float) -> tuple[float, float]:
    """(busy, idle) seconds of ``intervals`` (sorted by end, non-overlapping) inside [start, end]."""
    import bisect
    busy = idle = 0.0
    i = bisect.bisect_right(intervals, start, key=lambda iv: iv.end)
    n = len(intervals)
    while i < n:
        iv = intervals[i]
        if iv.start >= end:
            break
        o = min(end, iv.end) - max(start, iv.start)
        if o > 0:
            if iv.busy:
                busy += o
            else:
                idle += o
        i += 1
    return busy, idle

