"""Backtest: which alerts would have fired on a finished run, at which steps.

Backfill into a private temporary directory (blocks + the recording rules the alerts read), start a
temporary real Prometheus over it, evaluate every alerting rule of the rule files at each evaluation
timestamp, replay Prometheus' ``for``/``keep_firing_for`` state machine, and map each firing interval
to verl steps (the latest step whose reconstructed arrival is at or before the timestamp). Everything
it starts is removed on return, on error and on Ctrl-C; concurrent backtests share nothing.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .annotations import Request, render as render_annotations
from .backfill import DEFAULT_SCRAPE_INTERVAL, NullProgress, backfill
from .evaluate import evaluate_rule
from .ruleset import GAPS_ONLY, RuleSet, load
from .runfile import RecordedRun
from .timeline import Timeline
from .tsdb import TempPrometheus


@dataclass
class AlertHit:
    alertname: str
    severity: str
    first_step: int
    last_step: int
    labels: dict[str, str]
    first_index: int  # entry indices (file order), for the timeline
    last_index: int
    first_t: float = 0.0  # the evaluation at which it first fired (unix seconds, simulated clock)
    hold: float = 0.0     # its rule's for:
    annotations: dict[str, str] = field(default_factory=dict)  # as Prometheus rendered them at first_t

    def as_json(self) -> dict:
        return {"alertname": self.alertname, "severity": self.severity, "first_step": self.first_step,
                "last_step": self.last_step, "labels": self.labels, "annotations": self.annotations}


@dataclass
class BacktestResult:
    run: RecordedRun
    timeline: Timeline
    alerts: list[AlertHit]
    not_evaluated: dict[str, str]
    evaluated: list[str]
    eval_points: int = 0
    samples: int = 0

    @property
    def steps(self) -> int:
        return len(set(self.timeline.steps))

    def as_json(self) -> dict:
        return {"run": self.run.path, "steps": self.steps, "alerts": [a.as_json() for a in self.alerts],
                "not_evaluated": self.not_evaluated,
                "gaps_only": {k: v for k, v in GAPS_ONLY.items() if k in self.evaluated}}


def eval_times(first: float, last: float, interval: float) -> list[float]:
    return [k * interval for k in range(math.ceil(first / interval), math.floor(last / interval) + 1)]


def tail_for(rules: RuleSet, eval_interval: float, scrape_interval: float) -> float:
    """How long the finished run keeps being scraped: long enough for an alert that became true at
    the last step to sit out its ``for:`` (and be seen firing) — not so long that a live-only
    condition could start."""
    hold = max((a.hold + a.keep_firing_for for a in rules.evaluated()), default=0.0)
    return hold + 3 * eval_interval + scrape_interval


def backtest(run: RecordedRun, *, rules_dir: str | Path | None = None, eval_interval: float = 15.0,
             scrape_interval: float = DEFAULT_SCRAPE_INTERVAL, start: float | None = None,
             pace: float | None = None, progress=None, annotations: bool = True,
             silence: float = 0.0) -> BacktestResult:
    """``pace``: one line every ``pace`` seconds instead of the run's timers — the clock of a live
    ``replay --pace`` (with the live profile's intervals, the backtest fires at the replay's steps).
    ``silence``: judge TrainingStalled as if the log stayed silent this many seconds after its last line
    (what a live exporter would do at the end of the file: a finished run must stay quiet, a hang must
    page); the other rules are judged as without it.
    ``annotations``: render each alert's annotations at its first firing (one ``promtool test rules``
    run, see annotations.py)."""
    progress = progress or NullProgress()
    rules = load(rules_dir)
    alerts = rules.evaluated()
    timeline = Timeline.of(run, start, pace)
    with tempfile.TemporaryDirectory(prefix="omniwatch-backtest-") as tmp:
        tail = tail_for(rules, eval_interval, scrape_interval)
        bf = backfill(run, timeline, str(Path(tmp) / "data"), scrape_interval=scrape_interval,
                      tail=tail + max(0.0, silence),
                      recordings=rules.needed_recordings(alerts, inlined=True), eval_interval=eval_interval,
                      om_file=str(Path(tmp) / "run.om.txt"), progress=progress)
        times = eval_times(bf.first, bf.last, eval_interval)
        hits: list[AlertHit] = []
        with TempPrometheus(bf.data_dir) as prom:
            progress.phase("evaluate alerting rules", len(alerts))
            # a finished file is no stall after its end (unless a silence after it is asked for)
            gap_times = [t for t in times if t <= timeline.end + max(0.0, silence)]
            rest = [t for t in times if t <= timeline.end + tail]
            for rule in alerts:
                for f in evaluate_rule(prom, rule, gap_times if rule.gaps_only else rest):
                    hits.append(_hit(f, timeline))
                progress.advance()
        if annotations and hits:
            progress.phase("render annotations (promtool)")
            _annotate(hits, bf, rules, scrape_interval, eval_interval)
    hits.sort(key=lambda h: (h.first_index, h.alertname, sorted(h.labels.items())))
    return BacktestResult(run, timeline, hits, rules.skipped(), [a.name for a in alerts], len(times), bf.samples)


def _hit(f, timeline: Timeline) -> AlertHit:
    i = timeline.index_at(f.first_t)
    j = timeline.index_at(f.last_t)
    i = 0 if i is None else i  # an alert true before the first step (no run series yet) starts at it
    j = i if j is None else j
    labels = {k: v for k, v in sorted(f.labels.items()) if k != "alertname"}
    return AlertHit(f.rule.name, f.rule.severity, timeline.steps[i], timeline.steps[j], labels, i, j,
                    f.first_t, f.rule.hold)


def _annotate(hits: list[AlertHit], bf, rules: RuleSet, scrape_interval: float, eval_interval: float) -> None:
    """Each hit's annotations as Prometheus rendered them when it first fired (annotations.py)."""
    holds: dict[tuple[str, float], float] = {}
    for h in hits:
        holds[(h.alertname, h.first_t)] = max(holds.get((h.alertname, h.first_t), 0.0), h.hold)
    keys = sorted(holds)
    index = {k: i for i, k in enumerate(keys)}
    got = render_annotations(bf.grid, [Request(name, t, holds[(name, t)]) for name, t in keys], scrape_interval,
                             eval_interval, rules.files)
    for h in hits:
        for labels, ann in got.get(index[(h.alertname, h.first_t)], []):
            if {k: v for k, v in labels.items() if k != "alertname"} == h.labels:
                h.annotations = ann
                break
