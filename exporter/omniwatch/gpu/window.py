"""GPU inter-stage idle over the last k normal steps: the GPU evidence for ``InterStageIdleGPU``.

Why a window of its own: the alert's timer path thresholds ``omniwatch_inter_stage_idle_ratio_window``
(untimed seconds / step seconds over the last k normal steps, ``analytics.RunWindow``). Untimed is
not idle: a step whose untimed work keeps the GPUs busy (a GPU-side transfer, a device-to-device
weight copy) is fine. Where the sampler measured the GPUs, the same statistic is computed from GPU
idle seconds attributed to ``inter_stage`` instead, over the same k (the store's window setting) and
the same normal steps (warm-up, validation and checkpoint steps, ``StepRecord.flags``, left out), so
the rule can prefer it.

A step enters once the attributor has closed it (every span attributed or given up). Its ratio is
``attribution.StepWindow.inter_stage_ratio`` (pushed spans: GPU idle in the gaps between them;
timing layout: ``min(untimed seconds, GPU idle over the step)``), GPU-seconds averaged over the GPUs
that measured each span, / step seconds.
A normal step that could not be measured (a span no GPU measured: samples arrived too late, the ring
no longer covered it; unknown step seconds; nothing to attribute: no timings, pushed spans not there
yet, a timing layout clipped by a catch-up burst) clears the run's window: the window always describes
the latest k normal steps, never older ones with a hole in between, and the alert falls back to the
timer evidence until k measured steps exist again.

Staleness is bounded in steps: while ``k`` or more of a run's steps await GPU samples (sampler down,
a GPU lost until its spans expire), the window is withheld rather than showing values of steps long
past. Memory is bounded: k entries per run and at most ``MAX_RUNS`` runs (least recently stepped
dropped first).
"""
from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

from ..config import DEFAULT_WINDOW_STEPS

MAX_RUNS = 256


@dataclass
class _RunState:
    steps: deque  # (step, ratio), oldest first, at most k
    waiting: int = 0  # steps closed by on_step whose spans are not all attributed yet


class InterStageWindows:
    def __init__(self, k: int = DEFAULT_WINDOW_STEPS, max_runs: int = MAX_RUNS):
        if k < 1:
            raise ValueError("window must be >= 1 step")
        self.k, self.max_runs = k, max_runs
        self.runs: OrderedDict[tuple[str, str], _RunState] = OrderedDict()
        # fn(run, step, ratio) after each normal step is closed (ratio None: unmeasured); replays, tests
        self.listeners: list[Callable] = []

    def _state(self, run: tuple[str, str]) -> _RunState:
        st = self.runs.get(run)
        if st is None:
            st = self.runs[run] = _RunState(deque(maxlen=self.k))
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        self.runs.move_to_end(run)
        return st

    def opened(self, run: tuple[str, str]) -> None:
        """A step of ``run`` now awaits attribution."""
        self._state(run).waiting += 1

    def closed(self, run: tuple[str, str], step: int, normal: bool, ratio: float | None) -> bool:
        """A step left the queue, in step order (attributed, or unmeasurable with ``ratio=None``).
        Returns False when a normal step could not be measured."""
        st = self._state(run)
        st.waiting = max(0, st.waiting - 1)
        if st.steps and step <= st.steps[-1][0]:
            # The trainer resumed at an earlier step: forget the abandoned timeline (as RunWindow does).
            kept = [e for e in st.steps if e[0] < step]
            st.steps.clear()
            st.steps.extend(kept)
        if not normal:
            return True
        if ratio is None:
            st.steps.clear()
        else:
            st.steps.append((step, ratio))
        for fn in self.listeners:
            fn(run, step, ratio)
        return ratio is not None

    def stats(self, run: tuple[str, str]) -> dict[str, float] | None:
        """min/median/max over the last k measured normal steps, or None (not k yet, or lagging)."""
        st = self.runs.get(run)
        if st is None or len(st.steps) < self.k or st.waiting >= self.k:
            return None
        xs = [r for _, r in st.steps]
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}

    def all_stats(self) -> dict[tuple[str, str], dict[str, float]]:
        out = {}
        for run in list(self.runs):
            s = self.stats(run)
            if s is not None:
                out[run] = s
        return out
