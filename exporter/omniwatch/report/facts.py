"""What a run report says, as data: the facts every output (terminal, ``--json``, HTML, comparison,
index) is made from.

Nothing here computes a signal of its own. Per step it keeps what the exporter's RunStore held right
after ingesting that step (the ledger's GPU-seconds, the step record's ratios, the window statistics
and baselines the alert rules threshold) — gathered by :mod:`.gather` from the very store that the
backtest scrapes, or by :mod:`.live` from the series a live exporter exposed.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from ..core import ledger

HOUR = 3600.0
MIN_SECONDS = 1.0
K_IMAGES = ledger.K_IMAGES


@dataclass
class StepPoint:
    index: int                     # line index in the run (file order); alert hits refer to it
    step: int
    duration: float | None
    flags: list[str]
    gpu_seconds: dict[str, float]  # this step's ledger, GPU-seconds by bucket (the live counters' increments)
    wall: dict[str, float]         # the same, wall seconds (GPU-seconds / GPUs)
    reward_bound: float | None = None
    reward_share: float | None = None
    idle: float | None = None
    mfu: dict[str, float] = field(default_factory=dict)
    mfu_baseline: dict[str, float] = field(default_factory=dict)
    duration_baseline: float | None = None
    regression: dict[str, float] = field(default_factory=dict)  # cause -> window median - reference (s)
    causes: dict[str, float] = field(default_factory=dict)      # cause -> this step's seconds
    cause_reference: dict[str, float] = field(default_factory=dict)  # cause -> the anchored reference's median (s)
    reward_bound_min: float | None = None   # window min (what RewardBoundRollout thresholds)
    idle_min: float | None = None           # window min (InterStageIdleGPU)
    mfu_max: dict[str, float] = field(default_factory=dict)  # window max (MFUDrop, MFUImplausiblyLow)
    images: float | None = None
    throughput: float | None = None
    per_day: dict[str, float] = field(default_factory=dict)  # omniwatch_gpu_hours_per_day{bucket}

    @property
    def normal(self) -> bool:
        return not self.flags


@dataclass
class AlertSpan:
    alertname: str
    severity: str
    first_step: int
    last_step: int
    labels: dict[str, str]
    first_index: int
    last_index: int
    annotations: dict[str, str] = field(default_factory=dict)  # as Prometheus rendered them when it fired

    def as_json(self) -> dict:
        return {"alertname": self.alertname, "severity": self.severity, "first_step": self.first_step,
                "last_step": self.last_step, "labels": self.labels, "annotations": self.annotations}


@dataclass
class RunFacts:
    run: str                       # the file, or prometheus URL + run
    project: str
    experiment: str
    source: str                    # jsonl | console | prometheus
    steps: list[StepPoint]
    gpu_seconds: dict[str, float]  # the ledger at the end (the counters' final values)
    gpus: int | None
    gpus_source: str               # log | flag | unknown
    modes: dict[str, str]
    alerts: list[AlertSpan] = field(default_factory=list)
    not_evaluated: dict[str, str] = field(default_factory=dict)
    alerts_source: str = "backtest"  # backtest (rules evaluated over the replay) | prometheus (ALERTS)
    gpu_phases: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> {busy, idle} GPU-seconds
    series: dict[str, float] = field(default_factory=dict)  # run series for the remedy prose (device peak)
    skipped: dict[str, int] = field(default_factory=dict)
    label_note: str = ""             # how the names on disk became the run's labels (shortened, renamed)
    source_name: str = ""            # the file as a shared page names it (relative to the root; never absolute)

    @property
    def shown_source(self) -> str:
        """The run's source for a page that is shared: a file by its path under the log root (or its
        name), never by the absolute path of the machine that built the page; a Prometheus run as is."""
        if self.source not in ("jsonl", "console"):
            return self.run
        return self.source_name or os.path.basename(self.run)
    trainer_config: dict | None = None  # what the run's trainer config says (trainer_config.describe)
    assumed: list[str] = field(default_factory=list)  # what omniwatch assumed where no config said
    lines: int = 0  # lines read as steps or skipped (blank lines and console non-step output not counted)

    @property
    def skipped_text(self) -> str:
        """``5 of 8 lines skipped (malformed_json 5)``, or '' when none was."""
        n = sum(self.skipped.values())
        if not n:
            return ""
        why = ", ".join(f"{r} {c}" for r, c in sorted(self.skipped.items(), key=lambda x: (-x[1], x[0])))
        return f"{n} of {self.lines} lines skipped ({why})"
    # How the run ended (issue 31): finished (its planned last step, its config's total, or its Ray job succeeded),
    # crashed (its Ray job failed: crash_error), stopped, or unfinished (no finish seen: hung or cut short); and the
    # stall still open at the report's end (wall seconds past the last step beyond the tolerance and the planned
    # work, ledger.open_stall), which the verdict prices as TrainingStalled.
    end_state: str = ""
    open_stall_s: float = 0.0
    stall_end: float | None = None   # when the open stall was measured to (the report's --until, now, a job's end)
    last_step_at: float | None = None
    crash_error: str = ""
    lanes: list = field(default_factory=list)  # report/gantt.Bar: per-worker phase lanes (live reports with task events)
    slow_lanes: list = field(default_factory=list)  # report/gantt.Bar of the slowest steps (lanes "step N · ...")
    pools: dict[str, int] = field(default_factory=dict)   # GPUs per pool (trainer, reward, rollout, teacher, other)
    pools_source: str = ""                                # config | ray ("": unknown)
    fleet_nodes: dict[str, dict[str, float]] = field(default_factory=dict)  # node -> fleet bucket -> GPU-seconds

    # -- header -------------------------------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        return len({p.step for p in self.steps})

    def _normal(self) -> list[StepPoint]:
        normal = [p for p in self.steps if p.normal]
        return normal or self.steps

    @property
    def median_step_seconds(self) -> float | None:
        xs = [p.duration for p in self._normal() if p.duration is not None]
        return statistics.median(xs) if xs else None

    @property
    def images_per_gpu_second(self) -> float | None:
        """verl's perf/throughput (images / (time_per_step x GPUs)), median over normal steps; else
        images / GPU-seconds of the ledger."""
        xs = [p.throughput for p in self._normal() if p.throughput is not None]
        if xs:
            return statistics.median(xs)
        imgs, gsec = self.images, self.total_gpu_seconds
        return imgs / gsec if imgs and gsec and self.gpus else None

    @property
    def images(self) -> float:
        return sum(p.images or 0.0 for p in self.steps)

    @property
    def total_gpu_seconds(self) -> float:
        return sum(self.gpu_seconds.values())

    def gpu_hours(self) -> dict[str, float]:
        """GPU-hours by bucket, in reading order; buckets under a GPU-second (the float residue of
        reconstructed arrivals in ``outside_step_timer``) are left out."""
        return {b: self.gpu_seconds[b] / HOUR for b in ledger.ordered(self.gpu_seconds) if self.gpu_seconds[b] >= MIN_SECONDS}

    def wall_hours(self) -> dict[str, float]:
        n = self.gpus or 1
        return {b: v / n for b, v in self.gpu_hours().items()}

    def pool_gpu_hours(self) -> dict[str, float]:
        """GPU-hours per pool: each pool's GPUs x the ledger's wall time. They add up to the run's GPUs x wall time
        (the ledger's total) when the pools are the run's GPUs (the config's or Ray's pools are the ledger's GPUs)."""
        n = sum(self.pools.values())
        if not n or not self.gpus:
            return {}
        wall_h = self.total_gpu_seconds / HOUR / self.gpus
        return {p: g * wall_h for p, g in self.pools.items()}

    def gpu_hours_per_1k_images(self) -> dict[str, float] | None:
        imgs = self.images
        if not imgs or not self.gpus:
            return None
        return {b: h / (imgs / 1000) for b, h in self.gpu_hours().items()}

    def phase_medians(self) -> dict[str, float]:
        """Median wall seconds per ledger bucket over the normal steps (0 where a step had none)."""
        pts = self._normal()
        kept = self.gpu_hours()  # buckets with at least a GPU-second over the run
        buckets = ledger.ordered({b for p in pts for b in p.wall if b in kept})
        return {b: statistics.median([p.wall.get(b, 0.0) for p in pts]) for b in buckets}

    def index_of(self) -> dict[int, StepPoint]:
        return {p.index: p for p in self.steps}
