"""Backtest: which alerts would have fired on finished runs, at which steps — every run given in ONE
pass: one backfill (every run its own RunStore, its own ``project``/``experiment`` labels), one promtool
conversion, one set of recording-rule levels and one temporary real Prometheus that evaluates every
alerting rule once for all runs; then per run and label set Prometheus' ``for``/``keep_firing_for``
state machine over that run's own evaluation timestamps, each firing interval mapped to verl steps (the
latest step whose reconstructed arrival is at or before the timestamp). ``backtest(run)`` is the same
engine with one run. Everything it starts is removed on return, on error and on Ctrl-C; concurrent
backtests share nothing.

Each run gets exactly what it gets when backtested alone (tested):

- **Same clock phase.** Runs are moved onto one stretch of time (so the evaluation range is the longest
  run, not the calendar span of all of them) by whole multiples of ``lcm(scrape, eval interval)``: each
  run keeps its phase against the scrape and evaluation grids, so its scrapes and evaluations fall at the
  same offsets from its steps as alone.
- **Same window.** A run's series are scraped from its first step to its own last step + tail (+ its
  ``silence``), and its alerts run Prometheus' state machine over its own evaluation timestamps only.
- **Same queries, fewer samples** (what makes 50 runs of 500 steps take seconds, not hours):
  only the metric families the evaluated rules read are written (``rule_families``), rendered by
  :class:`FamilyRender` (prometheus_client's OpenMetrics text for those families, byte for byte; tested),
  and a series that holds one value over many scrapes is written every ``lookback / interval - 1`` scrapes
  and at its last scrape instead of at every one (``sparse``). An instant selector (and a subquery)
  returns the latest sample within the lookback, so every instant query returns what it returns over the
  dense samples. A family a rule reads through a range selector (``rate(x[5m])``, ``max_over_time``) or
  ``timestamp()`` sees how many samples there are and when: it is written at every scrape
  (``dense_families``).

Rule files whose every series comes from scraped endpoints (``ruleset.LIVE_ONLY_FILES``) are not loaded:
their alerts are listed as not evaluated.

``observe(run_index, entry_index, store, record)`` is called after every ingested line: the run report
reads the ledger and window statistics of the very RunStore that renders the scrapes.
"""
from __future__ import annotations

import bisect
import math
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..core.model import RunStore
from .backfill import DEFAULT_SCRAPE_INTERVAL, Backfill, NullProgress, backfill_recordings, replay, _move_blocks, _staging
from .evaluate import Firing, firing_intervals, hysteresis_by, hysteresis_intervals, true_at
from .openmetrics import DEFAULT_INSTANCE, DEFAULT_JOB, OWNED_NAMES, SampleGrid, label_value, stale_points
from .ruleset import GAPS_ONLY, RuleSet, _IDENT, load
from .runfile import RecordedRun
from .timeline import Timeline
from .tsdb import TempPrometheus, create_blocks_from_openmetrics
from .annotations import Request, answers, build_tests, run_tests

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
    last_t: float = 0.0   # the last evaluation at which it fired
    resolved_t: float | None = None  # the first evaluation after last_t (Prometheus resolves it then); None: still
    #                                  firing at the run's last evaluation (the scorecard sends it to Alertmanager)
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
    eval_end: float = 0.0  # the run's last evaluation (simulated clock): last step + tail
    gaps_end: float = 0.0  # the last evaluation of the gaps-only rules (TrainingStalled): last step + silence

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
    """How long a finished run keeps being scraped: long enough for an alert that became true at
    the last step to sit out its ``for:`` (and be seen firing) — not so long that a live-only
    condition could start."""
    hold = max((a.hold + a.keep_firing_for for a in rules.evaluated()), default=0.0)
    return hold + 3 * eval_interval + scrape_interval


def _hit(f: Firing, timeline: Timeline) -> AlertHit:
    i = timeline.index_at(f.first_t)
    j = timeline.index_at(f.last_t)
    i = 0 if i is None else i  # an alert true before the first step (no run series yet) starts at it
    j = i if j is None else j
    labels = {k: v for k, v in sorted(f.labels.items()) if k != "alertname"}
    return AlertHit(f.rule.name, f.rule.severity, timeline.steps[i], timeline.steps[j], labels, i, j,
                    f.first_t, f.rule.hold, f.last_t, f.resolved_t)


EVAL_THREADS = 4
LOOKBACK = 300.0  # TempPrometheus' --query.lookback-delta (5m)
_RANGE = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*+)\s*+(?:\{[^}]*+\})?\s*+\[")   # linear: no give-back


def rule_families(rules: RuleSet, alerts=None) -> set[str]:
    """Metric names the evaluated alerting rules read (their same-group recordings inlined) and the
    recording rules they need read; counters both with and without ``_total``."""
    alerts = rules.evaluated() if alerts is None else alerts
    ids: set[str] = set()
    for a in alerts:
        ids.update(_IDENT.findall(a.eval_expr))
    for r in rules.needed_recordings(alerts, inlined=True):
        ids.update(_IDENT.findall(r.expr))
    return ids | {i[: -len("_total")] for i in ids if i.endswith("_total")}


_PRINTF_METRIC = re.compile(r'printf\s+\\?"([a-zA-Z_:][\w:]*)\{')


def annotation_families(rules: RuleSet) -> set[str]:
    """Metric names the evaluated alerts' annotation templates query (``printf "metric{...}" | query``)."""
    names_: set[str] = set()
    for a in rules.evaluated():
        for v in a.annotations.values():
            names_.update(_PRINTF_METRIC.findall(str(v)))
    for rec in rules.recordings_read(names_):  # a recording rule an annotation queries needs the families it reads
        names_.update(_IDENT.findall(rec.expr))
    return names_


_TIMESTAMP = re.compile(r"timestamp\s*\(\s*([a-zA-Z_:][\w:]*)")


def dense_families(rules: RuleSet, families: set[str], alerts=None) -> set[str]:
    """Written families a rule reads through a range selector (``rate(x[5m])``, ``max_over_time``) or
    ``timestamp()``: those see how many samples there are and when, so they are written at every scrape."""
    alerts = rules.evaluated() if alerts is None else alerts
    exprs = [a.eval_expr for a in alerts] + [r.expr for r in rules.needed_recordings(alerts, inlined=True)]
    written = {f for f in families if f in OWNED_NAMES or f.startswith(("verl_", "omniwatch_"))}
    out = set()
    for e in exprs:
        for m in list(_RANGE.finditer(e)) + list(_TIMESTAMP.finditer(e)):
            name = m[1][: -len("_total")] if m[1].endswith("_total") else m[1]
            if name in written:
                out.add(name)
    return out


def write_sparse(grid: SampleGrid, out, every: int, up_range: tuple[int, int] | None = None,
                 dense: set[str] = frozenset()) -> int:
    """Like ``SampleGrid.write`` but a run of one value over scrapes [lo, hi) is written at lo, every
    ``every`` scrapes after it and at hi - 1 (instant queries see the same value at every time: a
    sample stays visible for the lookback, and ``every`` scrapes are less than that). ``up`` is dense."""
    ts = grid.timestamps()
    n = grid.write_up(out, ts, up_range)
    for name, fam in grid.families.items():
        if not fam.series:
            continue
        out.write("\n".join(fam.meta) + "\n")
        step = 1 if name in dense else every
        gauge = fam.is_gauge
        for prefix, runs in fam.series.items():
            last_hi = -1
            stale = set(stale_points(runs, len(ts))) if gauge else set()  # where live Prometheus marks it stale
            for lo, hi, value in sorted(runs):
                if lo < last_hi:
                    raise ValueError(f"series {prefix} is written twice for one scrape: two runs share its labels")
                last_hi = hi
                idx = list(range(lo, hi, step))
                if idx[-1] != hi - 1:
                    idx.append(hi - 1)
                head = f"{prefix} {value} "
                out.write("".join(head + ts[k] + "\n" for k in idx))
                n += len(idx)
                if hi in stale:  # in time order: before the series' next run
                    out.write(f"{prefix} NaN {ts[hi]}\n")
                    n += 1
    out.write("# EOF\n")
    return n


@dataclass
class RunPlan:
    run: RecordedRun
    timeline: Timeline
    lo: int = 0   # its first scrape (index into the shared grid)
    hi: int = 0   # one past its last scrape
    first_ms: int = 0  # its first and last scrape times: its own evaluation range
    last_ms: int = 0
    silence: float = 0.0  # seconds the log stays silent after its last line (judged by GAPS_ONLY rules)
    judged_ms: int = 0    # the last scrape the other rules are judged at (last step + tail)


def align(timelines: list[Timeline], period_ms: int) -> list[Timeline]:
    """Move every timeline onto the earliest one's stretch by whole multiples of ``period_ms``."""
    base = min(t.arrivals[0] for t in timelines)
    out = []
    for t in timelines:
        shift = math.floor((t.arrivals[0] - base) * 1000 / period_ms) * period_ms / 1000
        out.append(Timeline(t.start - shift, [a - shift for a in t.arrivals], list(t.steps)))
    return out


def backtest_many(runs: list[RecordedRun], *, rules_dir: str | Path | None = None, eval_interval: float = 15.0,
                  scrape_interval: float = DEFAULT_SCRAPE_INTERVAL, starts: list[float | None] | None = None,
                  pace: float | None = None, progress=None,
                  observe: Callable[[int, int, RunStore, object], None] | None = None,
                  store_kwargs: dict | None = None, sparse: bool = True, all_families: bool = False,
                  job: str = DEFAULT_JOB, instance: str = DEFAULT_INSTANCE, evaluate: bool = True,
                  workers: int | None = None, annotations: bool | Callable[[AlertHit], bool] = True,
                  silence: float | list[float] = 0.0) -> list[BacktestResult]:
    """One result per run, in order. Runs must have distinct (project, experiment) labels.
    ``pace``: one line every ``pace`` seconds instead of the runs' timers — the clock of a live
    ``replay --pace`` (with the live profile's intervals, the backtest fires at the replay's steps).
    ``silence`` (one for all runs, or one per run): judge TrainingStalled as if the log stayed silent this
    many seconds after its last line (what a live exporter does at the end of a file: a finished run
    must stay quiet, a hang must page); the other rules are judged as without it.
    ``workers``: processes that replay and render runs (default: one per core, for runs with at least
    ``PARALLEL_MIN_LINES`` lines in all); ``observe`` then also needs ``state(run_index)`` and
    ``restore(run_index, state)`` to bring what it saw in a worker back.
    ``annotations``: each alert's annotations as Prometheus rendered them when it first fired (one
    ``promtool test rules`` run for all runs, each test given its own run's series; annotations.py); a
    function: only the hits it accepts (the others keep ``annotations == {}``).
    ``evaluate=False``: only the replay (``observe`` still sees every step); no scrape, no Prometheus,
    no alerts (``not_evaluated`` says so)."""
    progress = progress or NullProgress()
    if not runs:
        return []
    keys = [(r.project, r.experiment) for r in runs]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"runs share project/experiment labels (give them distinct labels): {dup[:3]}")
    if not evaluate:
        return _replay_only(runs, starts, pace, observe, store_kwargs, progress)
    rules = load(rules_dir)
    alerts = rules.evaluated()
    families = None if all_families else rule_families(rules, alerts) | (annotation_families(rules) if annotations else set())
    if families is None:
        sparse = False
    dense = dense_families(rules, families, alerts) if sparse else set()
    starts = starts or [None] * len(runs)
    iv = max(1, round(scrape_interval * 1000))
    ev = max(1, round(eval_interval * 1000))
    timelines = align([Timeline.of(r, s, pace) for r, s in zip(runs, starts)], math.lcm(iv, ev))
    tail = tail_for(rules, eval_interval, scrape_interval)
    silences = [max(0.0, float(x)) for x in (silence if isinstance(silence, (list, tuple)) else [silence] * len(runs))]
    if len(silences) != len(runs):
        raise ValueError(f"{len(silences)} silences for {len(runs)} runs")
    plans = [RunPlan(r, t, silence=x) for r, t, x in zip(runs, timelines, silences)]
    first = min(math.ceil(t.arrivals[0] * 1000 / iv) * iv for t in timelines)
    last = max(math.floor((p.timeline.end + tail + p.silence) * 1000 / iv) * iv for p in plans)
    times = list(range(first, max(first, last) + 1, iv))
    grid = SampleGrid(times, job, instance)
    progress.phase(f"ingest + render {len(runs)} run(s)", sum(len(r.entries) for r in runs))
    for p in plans:
        p.lo = bisect.bisect_left(times, math.ceil(p.timeline.arrivals[0] * 1000 / iv) * iv)
        p.hi = bisect.bisect_right(times, math.floor((p.timeline.end + tail + p.silence) * 1000 / iv) * iv)
        p.first_ms, p.last_ms = times[p.lo], times[p.hi - 1]
        p.judged_ms = min(p.last_ms, math.floor((p.timeline.end + tail) * 1000 / iv) * iv)
    _render_all(plans, grid, times, families, observe, store_kwargs, progress, workers)
    with tempfile.TemporaryDirectory(prefix="omniwatch-backtest-") as tmp:
        data_dir = str(Path(tmp) / "data")
        Path(data_dir).mkdir()
        with _staging(data_dir) as stage:
            om_file = str(Path(stage) / "runs.om.txt")
            progress.phase("write OpenMetrics")
            with open(om_file, "w", encoding="utf-8") as f:
                samples = (write_sparse(grid, f, max(1, int(LOOKBACK * 1000 // iv) - 1), dense=dense) if sparse
                           else grid.write(f))
            progress.phase("promtool create-blocks-from openmetrics")
            blocks = str(Path(stage) / "data")
            create_blocks_from_openmetrics(om_file, blocks)
            bf = Backfill(runs[0], timelines[0], times, blocks, "", samples)
            recordings = rules.needed_recordings(alerts, inlined=True)
            if recordings:
                backfill_recordings(bf, recordings, eval_interval, progress)
            _move_blocks(blocks, data_dir)
        etimes = eval_times(times[0] / 1000, times[-1] / 1000, eval_interval)
        hits: list[list[AlertHit]] = [[] for _ in runs]
        with TempPrometheus(data_dir) as prom:
            progress.phase("evaluate alerting rules", len(alerts))
            # Rules are independent queries: Prometheus runs them on all cores at once.
            with ThreadPoolExecutor(EVAL_THREADS) as pool:
                for found in pool.map(lambda rule: list(_evaluate(prom, rule, etimes, plans)), alerts):
                    for ri, h in found:
                        hits[ri].append(h)
                    progress.advance()
    wanted = hits if annotations is True or not annotations else [[h for h in hs if annotations(h)] for hs in hits]
    if annotations and any(wanted):
        progress.phase("render annotations (promtool)")
        _annotate_many(plans, grid, wanted, rules, scrape_interval, eval_interval)
    out = []
    per_run_points = [len(eval_times(p.first_ms / 1000, p.last_ms / 1000, eval_interval)) for p in plans]
    for ri, p in enumerate(plans):
        hs = sorted(hits[ri], key=lambda h: (h.first_index, h.alertname, sorted(h.labels.items())))
        out.append(BacktestResult(p.run, p.timeline, hs, rules.skipped(), [a.name for a in alerts],
                                  per_run_points[ri], samples, p.judged_ms / 1000,
                                  min(p.last_ms / 1000, p.timeline.end + p.silence)))
    return out


def backtest(run: RecordedRun, *, start: float | None = None, **kw) -> BacktestResult:
    """One run through the same engine (``backtest_many([run])``)."""
    return backtest_many([run], starts=[start], **kw)[0]


PARALLEL_MIN_LINES = 5_000
_WORK: tuple = ()  # what forked render workers read (copy-on-write)


def _render_all(plans, grid, times, families, observe, store_kwargs, progress, workers) -> None:
    """Render every run into ``grid``: in this process, or split over forked worker processes whose
    grids are merged (runs never share a series: their labels differ)."""
    import multiprocessing
    import os
    global _WORK
    n_lines = sum(len(p.run.entries) for p in plans)
    workers = min(workers or os.cpu_count() or 1, len(plans))
    parallel = (workers > 1 and n_lines >= PARALLEL_MIN_LINES and "fork" in multiprocessing.get_all_start_methods()
                and (observe is None or hasattr(observe, "state")))
    if not parallel:
        for ri, p in enumerate(plans):
            _render(ri, p, grid, families, observe, store_kwargs, progress)
        return
    _WORK = (plans, times, families, observe, store_kwargs, grid.job, grid.instance)
    try:
        groups = [list(range(w, len(plans), workers)) for w in range(workers)]
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for fams, states, lines in pool.imap_unordered(_render_group, groups):
                for name, fam in fams.items():
                    mine = grid.families.get(name)
                    if mine is None:
                        grid.families[name] = fam
                        continue
                    for prefix, runs in fam.series.items():
                        mine.series.setdefault(prefix, []).extend(runs)
                for ri, st in states.items():
                    observe.restore(ri, st)
                progress.advance(lines)
    finally:
        _WORK = ()


def _render_group(group: list[int]):
    plans, times, families, observe, store_kwargs, job, instance = _WORK
    grid = SampleGrid(times, job, instance)
    for ri in group:
        _render(ri, plans[ri], grid, families, observe, store_kwargs, NullProgress())
    states = {ri: observe.state(ri) for ri in group} if observe is not None else {}
    return grid.families, states, sum(len(plans[ri].run.entries) for ri in group)


NOT_EVALUATED = "alerts not evaluated (--no-alerts): only the replay ran"


def _replay_only(runs, starts, pace, observe, store_kwargs, progress) -> list[BacktestResult]:
    out = []
    progress.phase(f"replay {len(runs)} run(s)", sum(len(r.entries) for r in runs))
    for ri, (r, s) in enumerate(zip(runs, starts or [None] * len(runs))):
        p = RunPlan(r, Timeline.of(r, s, pace))
        _render(ri, p, None, None, observe, store_kwargs, progress)
        out.append(BacktestResult(r, p.timeline, [], {"*": NOT_EVALUATED}, [], 0, 0))
    return out


def _render(ri: int, p: RunPlan, grid: SampleGrid | None, families, observe, store_kwargs,
            progress) -> None:
    """One run through ``backfill.replay`` over its stretch of the grid."""
    seen = None if observe is None else (lambda i, store, rec: observe(ri, i, store, rec))
    replay(p.run, p.timeline, grid, lo=p.lo, hi=p.hi, families=families, observe=seen, store_kwargs=store_kwargs,
           progress=progress)


def _owner(labels: dict[str, str], plans: list[RunPlan], by_key: dict) -> list[int]:
    """Which runs an alert label set belongs to: its project/experiment, else the run whose file is its
    ``target``, else every run (a label-less alert such as the exporter being absent)."""
    k = (labels.get("project"), labels.get("experiment"))
    if k in by_key:
        return [by_key[k]]
    tgt = labels.get("target")
    hit = [i for i, p in enumerate(plans) if tgt and p.run.path == tgt]
    return hit or list(range(len(plans)))


def _evaluate(prom, rule, etimes: list[float], plans: list[RunPlan]) -> Iterable[tuple[int, AlertHit]]:
    """The rule at every timestamp, then per label set and per owning run Prometheus' state machine over
    that run's own evaluation timestamps (as its own backtest evaluates it); an alert with hysteresis runs its
    label sets of one run together (evaluate.hysteresis_intervals)."""
    by_key = {(p.run.project, p.run.experiment): i for i, p in enumerate(plans)}
    per_run: dict[int, list] = {}
    for labels, flags, held in true_at(prom, rule, etimes):
        for ri in _owner(labels, plans, by_key):
            per_run.setdefault(ri, []).append((labels, flags, held))
    by, held_matchers = hysteresis_by(rule)
    for ri, series in per_run.items():
        p = plans[ri]
        k0 = bisect.bisect_left(etimes, p.first_ms / 1000 - 1e-6)
        if rule.name in GAPS_ONLY:  # judged up to the run's last step (+ silence): a finished file is no stall after it
            k1 = min(bisect.bisect_right(etimes, p.last_ms / 1000 + 1e-6),
                     bisect.bisect_right(etimes, p.timeline.end + p.silence))
        else:
            k1 = bisect.bisect_right(etimes, p.judged_ms / 1000 + 1e-6)
        sub_t = etimes[k0:k1]
        if by:
            found = hysteresis_intervals([(lb, f[k0:k1], h[k0:k1]) for lb, f, h in series], sub_t, rule.hold, by,
                                         rule.keep_firing_for, held_matchers)
        else:
            found = [(lb, firing_intervals(f[k0:k1], sub_t, rule.hold, rule.keep_firing_for)) for lb, f, _ in series]
        for labels, ivs in found:
            for iv in ivs:
                resolved = sub_t[iv.last + 1] if iv.last + 1 < len(sub_t) else None
                yield ri, _hit(Firing(rule, labels, sub_t[iv.first], sub_t[iv.last], resolved), p.timeline)


def _run_grid(grid: SampleGrid, run: RecordedRun) -> SampleGrid:
    """The part of the shared grid that is one run's: its labelled series, its file's source series, and
    series of no run."""
    mine = (f'experiment="{label_value(run.experiment)}"', f'project="{label_value(run.project)}"')
    target = f'target="{label_value(run.path)}"'
    sub = SampleGrid(grid.times_ms, grid.job, grid.instance)
    for name, fam in grid.families.items():
        keep = {}
        for prefix, runs in fam.series.items():
            if 'project="' in prefix or 'experiment="' in prefix:
                ok = all(m in prefix for m in mine)
            else:
                ok = 'target="' not in prefix or target in prefix
            if ok:
                keep[prefix] = runs
        if keep:
            sub.families[name] = type(fam)(fam.meta, keep)
    return sub


def _annotate_many(plans: list[RunPlan], grid: SampleGrid, hits: list[list[AlertHit]], rules: RuleSet,
                   scrape_interval: float, eval_interval: float) -> None:
    """Every hit's annotations as Prometheus rendered them when it first fired, in one ``promtool test
    rules`` document (annotations.py): tests per (alert, first firing time) of a run, fed that run's
    series only."""
    tests, owners, doc = [], [], None
    for ri, hs in enumerate(hits):
        if not hs:
            continue
        holds: dict[tuple[str, float], float] = {}
        for h in hs:
            holds[(h.alertname, h.first_t)] = max(holds.get((h.alertname, h.first_t), 0.0), h.hold)
        keys = sorted(holds)
        requests = [Request(n, t, holds[(n, t)]) for n, t in keys]
        doc, groups = build_tests(_run_grid(grid, plans[ri].run), requests, scrape_interval, eval_interval,
                                  rules.files)
        for idxs, test in zip(groups, doc["tests"]):
            test["name"] = f"a{len(owners)}"
            owners.append((ri, idxs, requests, keys))
            tests.append(test)
    if doc is None:
        return
    doc["tests"] = tests
    got = run_tests(doc)
    for k, (ri, idxs, requests, keys) in enumerate(owners):
        for i, alerts in answers(got, f"a{k}", idxs, requests).items():
            for h in hits[ri]:
                if (h.alertname, h.first_t) != keys[i]:
                    continue
                for labels, ann in alerts:
                    if {k2: v for k2, v in labels.items() if k2 != "alertname"} == h.labels:
                        h.annotations = ann
                        break
