"""Attribute GPU busy/idle seconds to training phases.

Phase spans come from two places; pushed spans win:

(a) **Step timings** (``store.listeners`` callback): a step's ``timing_s/<phase>`` values are laid out
    back to back in the trainer's order (``analytics.PHASE_ORDER``) so that the step ends at the time
    omniwatch observed it (``StepRecord.arrival``). The untracked residual (step minus all timed
    phases) becomes one ``inter_stage`` span placed **after the generation block (feed, gen, reward)
    and before the actor block (old_log_prob ... update_weights)**: that is where VeRL-Omni's untimed
    work sits (V1: TransferQueue -> DataProto fetch, barriers; legacy: batch assembly). Phases verl
    adds that omniwatch does not know go at the end of the actor block. The layout is approximate:
    the arrival lags the step end by the source's poll interval, and idle that really lies between
    other phases is charged to ``inter_stage``.
(b) **Exact spans** a trainer pushes (``omniwatch.client.phase(...)`` -> ``POST /api/v1/phases``).
    When a run has pushed spans, its steps are not laid out from timings; at each step the time
    between consecutive pushed spans (and since the previous step's last span) becomes ``inter_stage``.

A span is attributed per GPU once the GPU's sampled intervals reach its end (the sampler's
watermark); spans that the sample ring no longer covers are skipped and counted. Every span is
attributed once, so the phase counters are exact sums; ``omniwatch_gpu_idle_ratio`` is the idle share
of each phase of the latest step whose spans are all attributed, over the GPUs attributed. Each such
step also feeds ``window.InterStageWindows`` (GPU inter-stage idle / step seconds over the last k
normal steps: the GPU evidence of ``InterStageIdleGPU``).

Memory is bounded: pending spans, step windows and pushed spans per run are capped deques (the oldest
is dropped and counted), and the sample ring is the sampler's few minutes.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

from .. import names
from ..config import DEFAULT_WINDOW_STEPS
from ..core.analytics import PHASE_ORDER
from .accounting import overlap_seconds
from .window import InterStageWindows
from ..runlabel import fit_label

log = logging.getLogger(__name__)

INTER_STAGE = "inter_stage"
SOURCE = "gpu_attribution"
GEN_BLOCK = ("feed", "gen", "reward")
MAX_PENDING_SPANS = 20000
MAX_WINDOWS = 1000
MAX_OPEN_SPANS_PER_RUN = 512
EXPIRE_S = 600.0           # a span some GPU cannot attribute this long (in sample time) after its end is given up
CONTINUITY_S = 600.0       # a pushed-span gap longer than this between steps is not inter_stage
CLIP_TOLERANCE_S = 2.0     # a timing layout clipped by more than this is not GPU inter-stage evidence


@dataclass(eq=False)
class Span:
    run: tuple[str, str]
    phase: str
    start: float
    end: float
    gpus: frozenset[str] | None = None  # restrict to these GPU indices/UUIDs (None = all on the node)
    done: set = field(default_factory=set)  # uuids attributed
    busy: float = 0.0  # summed over GPUs
    idle: float = 0.0
    measured: int = 0  # GPUs whose samples covered the span (busy/idle above sum over these)
    complete: bool = False


@dataclass(eq=False)
class StepWindow:
    run: tuple[str, str]
    step: int
    spans: list[Span]
    normal: bool = True  # StepRecord.normal: no warm-up, validation or checkpoint flag
    seconds: float | None = None  # step seconds; None = unknown (the step cannot be measured)
    untracked: float | None = None  # timing layout only: the step's untimed seconds

    def inter_stage_ratio(self) -> float | None:
        """The step's GPU inter-stage idle / step seconds, GPU seconds averaged over the GPUs that
        measured each span; None when step seconds are unknown or some span no GPU measured.

        Pushed spans: the GPU idle inside the ``inter_stage`` gaps between them (exact). Timing
        layout: ``min(untimed seconds, GPU idle over the whole step)``. The layout only guesses where
        the untimed seconds sit; GPU idle inside that guess under-reads whenever the real gaps lie
        elsewhere (the H200 traces, gaps spread over three places: 0.03 measured for 0.23 true), which
        would silence the timer evidence wrongly. The bound cannot under-read: it is low only when
        the GPUs were busy for most of the untimed time wherever it was (a GPU-side transfer)."""
        if not self.seconds or self.seconds <= 0 or any(s.measured == 0 for s in self.spans):
            return None
        if self.untracked is not None:
            idle = min(self.untracked, sum(s.idle / s.measured for s in self.spans))
        else:
            idle = sum(s.idle / s.measured for s in self.spans if s.phase == INTER_STAGE)
        return min(1.0, idle / self.seconds)


class Attributor:
    def __init__(self, sampler, store=None, *, clock=time.time, evidence: bool = True):
        self.sampler = sampler
        self.store = store
        self.clock = clock
        self.evidence = evidence  # publish the inter-stage window (off: the GPUs do not run the runs)
        self.lock = threading.RLock()
        self.pending: deque[Span] = deque()
        self.windows: deque[StepWindow] = deque()
        self.open_spans: dict[tuple[str, str], deque[Span]] = defaultdict(deque)
        self.pushed_until: dict[tuple[str, str], float] = {}  # run -> end of its last pushed span
        self.covered_until: dict[tuple[str, str], float] = {}  # run -> end of its last laid-out window
        # (project, experiment, node, gpu, uuid, phase) -> [busy, idle]
        self.totals: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.ratios: dict[tuple[str, str], tuple[int, dict[str, float]]] = {}  # run -> (step, phase -> idle ratio)
        self.inter_stage = InterStageWindows(getattr(store, "window", None) or DEFAULT_WINDOW_STEPS)
        sampler.listeners.append(self.process)

    def _skip(self, reason: str, n: int = 1) -> None:
        if self.store is not None:
            self.store.count_error(SOURCE, reason, n)

    def _queue(self, span: Span) -> None:
        if len(self.pending) >= MAX_PENDING_SPANS:
            self.pending.popleft()
            self._skip("span_dropped")
        self.pending.append(span)

    # -- inputs --------------------------------------------------------------------------------------
    def add_span(self, project: str, experiment: str, phase: str, start: float, end: float,
                 gpus: frozenset[str] | None = None) -> Span:
        """An exact span pushed by the trainer (validated by the caller)."""
        run = (fit_label(project), fit_label(experiment))  # the RunStore's key of the run
        span = Span(run, phase, start, end, gpus)
        with self.lock:
            q = self.open_spans[run]
            if len(q) >= MAX_OPEN_SPANS_PER_RUN:
                q.popleft()
                self._skip("open_span_dropped")
            q.append(span)
            self.pushed_until[run] = max(self.pushed_until.get(run, end), end)
            self._queue(span)
        return span

    def on_step(self, run, rec) -> None:
        """``store.listeners`` callback: close the step's window from pushed spans or from timings."""
        key = (run.project, run.experiment)
        with self.lock:
            opened = self.open_spans.get(key)
            recent = rec.arrival - max(rec.duration or 0.0, 60.0)
            if opened or self.pushed_until.get(key, -1.0) > recent:
                made = self._close_pushed(key, rec)
            else:
                made = self._layout(key, rec)
            if not made:  # nothing to attribute: queued empty, so the GPU window learns of the hole in order
                self._window(key, rec, [], None)

    def _close_pushed(self, key, rec) -> bool:
        q = self.open_spans.get(key) or deque()
        spans = sorted((s for s in q if s.end <= rec.arrival + 1.0), key=lambda s: s.start)
        if not spans:
            return False
        for s in spans:
            q.remove(s)
        gaps: list[Span] = []
        edge = self.covered_until.get(key)
        if edge is None or spans[0].start - edge > CONTINUITY_S:
            edge = spans[0].start
        for s in spans:
            if s.start > edge:
                gaps.append(Span(key, INTER_STAGE, edge, s.start, s.gpus))
            edge = max(edge, s.end)
        self.covered_until[key] = edge
        for g in gaps:
            self._queue(g)
        first = min(s.start for s in spans + gaps)
        self._window(key, rec, spans + gaps, rec.duration or (edge - first))
        return True

    def _layout(self, key, rec) -> bool:
        phases = {p: s for p, s in rec.phases.items() if s > 0 and p != names.UNTRACKED_PHASE}
        if not phases:
            return False
        order = [p for p in PHASE_ORDER if p in phases] + sorted(p for p in phases if p not in PHASE_ORDER)
        untracked = rec.phases.get(names.UNTRACKED_PHASE, 0.0)
        seq: list[tuple[str, float]] = []
        gen_done = False
        for p in order:
            if not gen_done and p not in GEN_BLOCK:
                gen_done = True
                if untracked > 0:
                    seq.append((INTER_STAGE, untracked))
            seq.append((p, phases[p]))
        if not gen_done and untracked > 0:
            seq.append((INTER_STAGE, untracked))
        t = rec.arrival - sum(d for _, d in seq)
        floor = self.covered_until.get(key)
        # Arrival jitter (the source's poll) overlaps consecutive layouts by up to a poll interval; a
        # larger overlap is a burst read while catching up, whose layout says nothing about the GPUs.
        clipped = floor is not None and floor - t > CLIP_TOLERANCE_S
        spans: list[Span] = []
        for p, d in seq:
            a, b = t, t + d
            t = b
            if floor is not None:
                a = max(a, floor)  # steps read in a burst (catch-up) must not claim the same time twice
            if b - a > 1e-6:
                spans.append(Span(key, p, a, b))
        if not spans:
            self._skip("overlapping_step")
            return False
        self.covered_until[key] = max(floor or 0.0, rec.arrival)
        for s in spans:
            self._queue(s)
        # A layout clipped by a burst no longer says where the step's untimed time was: not GPU evidence.
        self._window(key, rec, spans, None if clipped else rec.duration, untracked)
        return True

    def _window(self, key, rec, spans: list[Span], seconds: float | None, untracked: float | None = None) -> None:
        if len(self.windows) >= MAX_WINDOWS:
            old = self.windows.popleft()
            self._skip("window_dropped")
            self._close_inter_stage(old, measured=False)
        self.windows.append(StepWindow(key, rec.step, spans, rec.normal, seconds, untracked))
        self.inter_stage.opened(key)

    def _close_inter_stage(self, w: StepWindow, measured: bool = True) -> None:
        ratio = w.inter_stage_ratio() if measured else None
        if not self.inter_stage.closed(w.run, w.step, w.normal, ratio) and w.spans:
            self._skip("step_unmeasured")

    # -- attribution (after every sampler poll) -----------------------------------------------------
    def process(self) -> None:
        gpus = self.sampler.snapshot()
        with self.lock, self.sampler.lock:
            # "Now" in the samples' own time base, so replays of recorded traces behave like live runs.
            marks = [g.watermark for g in gpus if g.watermark is not None]
            now = max(marks) if marks else self.clock()
            still: deque[Span] = deque()
            for span in self.pending:
                self._attribute(span, gpus, now)
                if not span.complete:
                    still.append(span)
            self.pending = still
            while self.windows and all(s.complete for s in self.windows[0].spans):
                w = self.windows.popleft()
                self._ratio(w)
                self._close_inter_stage(w)

    def _attribute(self, span: Span, gpus, now: float) -> None:
        todo = [g for g in gpus if g.uuid not in span.done and
                (span.gpus is None or g.uuid in span.gpus or str(g.index) in span.gpus)]
        for g in todo:
            wm = g.watermark
            if wm is None or wm < span.end:
                continue
            ring = g.ring
            if ring[0].start > span.start + 0.5:  # the ring no longer (or never) covered this span
                self._skip("span_before_samples")
                span.done.add(g.uuid)
                continue
            busy, idle = overlap_seconds(ring, span.start, span.end)
            t = self.totals[(span.run[0], span.run[1], g.node, str(g.index), g.uuid, span.phase)]
            t[0] += busy
            t[1] += idle
            span.busy += busy
            span.idle += idle
            span.measured += 1
            span.done.add(g.uuid)
        remaining = [g for g in gpus if g.uuid not in span.done and
                     (span.gpus is None or g.uuid in span.gpus or str(g.index) in span.gpus)]
        if not remaining or now - span.end > EXPIRE_S:
            if remaining:
                self._skip("span_expired")
            span.complete = True

    def _ratio(self, w: StepWindow) -> None:
        acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for s in w.spans:
            acc[s.phase][0] += s.busy
            acc[s.phase][1] += s.idle
        ratios = {p: idle / (busy + idle) for p, (busy, idle) in acc.items() if busy + idle > 0}
        if ratios:
            self.ratios[w.run] = (w.step, ratios)

    # -- reads ------------------------------------------------------------------------------------------
    def inter_stage_windows(self) -> dict[tuple[str, str], dict[str, float]]:
        """run -> min/median/max of the GPU inter-stage idle ratio over its last k measured normal steps."""
        if not self.evidence:
            return {}
        with self.lock:
            return self.inter_stage.all_stats()

    def phase_totals(self, project: str, experiment: str) -> dict[str, tuple[float, float]]:
        """phase -> (busy, idle) seconds summed over GPUs (for reports and tests)."""
        out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        with self.lock:
            for (p, e, _n, _g, _u, ph), (b, i) in self.totals.items():
                if (p, e) == (project, experiment):
                    out[ph][0] += b
                    out[ph][1] += i
        return {k: (v[0], v[1]) for k, v in out.items()}

