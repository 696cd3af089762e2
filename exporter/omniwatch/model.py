"""The one in-memory model of runs that every source feeds and the collector renders.

``RunStore.ingest(project, experiment, parsed_step, source)`` is the single entry point. It is
thread-safe (one lock; sources run in their own threads, the collector takes a snapshot under the
lock), bounded (runs, keys per run, steps kept), and idempotent per step: a step number seen again is
a re-run after a trainer restart — it replaces the stored step but never increments a counter.
"""
from __future__ import annotations

import logging
from functools import lru_cache
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from . import names
from .analytics import (
    CONTRACT_KEYS, DEFAULT_BASELINE_STEPS, DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS,
    RunWindow, StepRecord, WindowStats, analyze_step,
)
from .parse import ParsedStep

DEFAULT_MAX_RUNS = 64
DEFAULT_RUN_EXPIRY = 6 * 3600.0  # a run without a step for this long leaves /metrics (a finished run)
DEFAULT_MAX_KEYS = 512
MAX_LABEL_CHARS = 128
_NAME_OK = re.compile(r"[^a-zA-Z0-9_]")


@lru_cache(maxsize=1 << 16)
def passthrough_name(key: str) -> str:
    """verl key -> ``verl_`` metric family name. ``@`` becomes ``_at_`` (as verl's MLflow backend
    does), every other character outside ``[a-zA-Z0-9_]`` becomes ``_``. Two keys that map to one
    family stay distinct series: the original key is the ``key`` label, so the mapping can never
    merge two verl keys."""
    return names.PASSTHROUGH_PREFIX + _NAME_OK.sub("_", key.replace("@", "_at_"))


class SeenSteps:
    """Set of step numbers as sorted disjoint [lo, hi] ranges (a run of 100k steps is one range)."""

    def __init__(self) -> None:
        self.ranges: list[list[int]] = []

    def __contains__(self, s: int) -> bool:
        import bisect
        i = bisect.bisect_right(self.ranges, [s, float("inf")]) - 1
        return i >= 0 and self.ranges[i][0] <= s <= self.ranges[i][1]

    def add(self, s: int) -> None:
        import bisect
        if s in self:
            return
        i = bisect.bisect_right(self.ranges, [s, float("inf")])
        left = i > 0 and self.ranges[i - 1][1] == s - 1
        right = i < len(self.ranges) and self.ranges[i][0] == s + 1
        if left and right:
            self.ranges[i - 1][1] = self.ranges[i][1]
            del self.ranges[i]
        elif left:
            self.ranges[i - 1][1] = s
        elif right:
            self.ranges[i][0] = s
        else:
            self.ranges.insert(i, [s, s])


@dataclass
class Run:
    project: str
    experiment: str
    window: RunWindow
    warmup_steps: int
    last: StepRecord | None = None
    _stats: WindowStats = field(default_factory=WindowStats)
    stats_dirty: bool = False
    seen: SeenSteps = field(default_factory=SeenSteps)
    steps_total: int = 0
    replayed_total: int = 0
    restarts_total: int = 0
    steps_in_incarnation: int = 0
    stage_seconds_total: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    flagged_total: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    keys: dict[str, float] = field(default_factory=dict)  # verl key -> latest value (contract keys too)
    feeds: dict[str, int] = field(default_factory=dict)  # feed (source:target) -> last step it sent
    replaying: bool = False  # after a restart, steps already seen are re-runs, not duplicates
    # False for a run restored from a checkpoint until a current source produces it (a step arrives,
    # or one of its files is watched now): an old exporter's runs (the demo's) never reach /metrics.
    visible: bool = True

    def passthrough_count(self) -> int:
        """Keys exported under verl_* (the contract keys have their own series)."""
        return len(self.keys) - len(self.keys.keys() & CONTRACT_KEYS)

    @property
    def stats(self) -> WindowStats:
        """Window statistics, computed when read (at scrape), not on every ingested step."""
        if self.stats_dirty:
            self._stats = self.window.stats()
            self.stats_dirty = False
        return self._stats

    @stats.setter
    def stats(self, value: WindowStats) -> None:
        self._stats, self.stats_dirty = value, False

    def restart(self, at_step: int | None) -> None:
        self.restarts_total += 1
        self.steps_in_incarnation = 0
        self.replaying = True
        self.feeds.clear()
        if at_step is not None:
            self.window.drop_after(at_step)


class RunStore:
    def __init__(self, *, window: int = DEFAULT_WINDOW_STEPS, baseline: int = DEFAULT_BASELINE_STEPS,
                 warmup: int = DEFAULT_WARMUP_STEPS, max_runs: int = DEFAULT_MAX_RUNS,
                 max_keys: int = DEFAULT_MAX_KEYS, run_expiry: float = DEFAULT_RUN_EXPIRY, clock=time.time):
        self.window, self.baseline, self.warmup = window, baseline, warmup
        self.max_runs, self.max_keys, self.run_expiry = max_runs, max_keys, run_expiry
        self.clock = clock
        self.lock = threading.RLock()
        self.runs: dict[tuple[str, str], Run] = {}
        self.errors: dict[tuple[str, str], int] = defaultdict(int)  # (source, reason) -> count
        self.sources: dict[tuple[str, str], int] = {}  # (source, target) -> up
        self.notifications: dict[str, int] = defaultdict(int)
        # Called as fn(run, record) after every applied step, outside the lock (GPU attribution, ...).
        self.listeners: list = []

    # -- bookkeeping used by sources ---------------------------------------------------------------
    def count_error(self, source: str, reason: str, n: int = 1) -> None:
        with self.lock:
            self.errors[(source, reason)] += n

    def set_source_up(self, source: str, target: str, up: bool) -> None:
        with self.lock:
            self.sources[(source, target[:MAX_LABEL_CHARS])] = 1 if up else 0

    def remove_source(self, source: str, target: str) -> None:
        with self.lock:
            self.sources.pop((source, target[:MAX_LABEL_CHARS]), None)

    def _run(self, project: str, experiment: str, source: str) -> Run | None:
        key = (project[:MAX_LABEL_CHARS], experiment[:MAX_LABEL_CHARS])
        run = self.runs.get(key)
        if run is None:
            if len(self.runs) >= self.max_runs and not self._evict_expired():
                self.errors[(source, "too_many_runs")] += 1
                return None
            run = Run(key[0], key[1], RunWindow(self.window, self.baseline), self.warmup)
            self.runs[key] = run
        return run

    def expired(self, run: Run, now: float | None = None) -> bool:
        """No step for ``run_expiry`` seconds: the run finished (or died long ago) — not exported, so its
        alerts resolve instead of firing for weeks; it comes back with its next step."""
        if run.last is None or not self.run_expiry:
            return False
        return (self.clock() if now is None else now) - run.last.arrival > self.run_expiry

    def hidden(self, run: Run, now: float | None = None) -> bool:
        """Not exported: expired (finished), or restored from a checkpoint and not produced by any
        current source yet."""
        return not run.visible or self.expired(run, now)

    def _evict_expired(self) -> bool:
        now = self.clock()
        stale = [k for k, r in self.runs.items() if self.expired(r, now)]
        stale.sort(key=lambda k: self.runs[k].last.arrival)
        if not stale:
            return False
        del self.runs[stale[0]]
        return True

    def reveal(self, project: str, experiment: str) -> None:
        """A current source produces this restored run (its file is watched now)."""
        with self.lock:
            run = self.runs.get((project[:MAX_LABEL_CHARS], experiment[:MAX_LABEL_CHARS]))
            if run is not None:
                run.visible = True

    def trainer_restarted(self, project: str, experiment: str, source: str) -> None:
        """A source saw the log truncated or rotated."""
        with self.lock:
            run = self._run(project, experiment, source)
            if run is not None:
                run.restart(None)

    # -- the entry point -------------------------------------------------------------------------
    def ingest(self, project: str, experiment: str, parsed: ParsedStep, source: str,
               arrival: float | None = None, feed: str | None = None) -> StepRecord | None:
        """Add one step. ``feed`` names the stream it came from (a file, a pusher); a feed whose step
        goes back is a resumed trainer. A step already seen that arrives from another feed (the console
        twin of a JSONL file, say), or again from the same feed (a push retried), is a duplicate: counted
        as a skip, not applied twice."""
        rec = self._ingest(project, experiment, parsed, source, arrival, feed)
        if rec is not None:
            run = self.runs.get((project[:MAX_LABEL_CHARS], experiment[:MAX_LABEL_CHARS]))
            for fn in list(self.listeners):
                try:
                    fn(run, rec)
                except Exception:  # a listener must never break ingestion
                    logging.getLogger(__name__).exception("step listener failed")
        return rec

    def _ingest(self, project, experiment, parsed, source, arrival, feed):
        arrival = self.clock() if arrival is None else arrival
        feed = feed or source
        with self.lock:
            for reason, n in parsed.dropped.items():
                self.errors[(source, reason)] += n
            run = self._run(project, experiment, source)
            if run is None:
                return None
            run.visible = True
            step = parsed.step
            prev = run.feeds.get(feed)
            if prev is not None and step < prev:
                run.restart(step)  # the step counter of this feed went back: a resumed trainer
            elif step in run.seen and not run.replaying:
                self.errors[(source, "duplicate_step")] += 1
                run.feeds[feed] = step
                return None
            if run.steps_in_incarnation == 0 and run.last is not None:
                run.window.drop_after(step)
            run.feeds[feed] = step
            warm = run.steps_in_incarnation < run.warmup_steps
            rec = analyze_step(step, parsed.values, arrival, warmup=warm)
            run.steps_in_incarnation += 1
            if step in run.seen:
                run.replayed_total += 1
            else:
                run.replaying = False
                run.seen.add(step)
                run.steps_total += 1
                for ph, sec in rec.phases.items():
                    run.stage_seconds_total[ph] += sec
                for flag in rec.flags:
                    run.flagged_total[flag] += 1
            run.window.add(rec)
            run.stats_dirty = True
            run.last = rec
            vals = parsed.values
            new = vals.keys() - run.keys.keys()
            if new and not new <= CONTRACT_KEYS:  # a key this run never had: apply the cap
                vals = dict(vals)
                count = run.passthrough_count()
                for key in new - CONTRACT_KEYS:
                    if count >= self.max_keys:
                        del vals[key]
                        self.errors[(source, "cardinality_cap")] += 1
                    else:
                        count += 1
            run.keys.update(vals)  # the usual step: no new key, one C-level update
            return rec

    def count_notification(self, status: str) -> None:
        with self.lock:
            self.notifications[status] += 1
