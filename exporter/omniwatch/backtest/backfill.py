"""Backfill: a finished run, scraped in simulated time, written into TSDB blocks.

The exporter's own code does the work: a :class:`~omniwatch.core.model.RunStore` (its clock set to the
simulated time) ingests each step at its reconstructed arrival, and the exporter's registry is rendered
for every scrape timestamp until the next step. The OpenMetrics text becomes blocks through ``promtool
tsdb create-blocks-from openmetrics``; recording rules are then backfilled level by level with
``promtool tsdb create-blocks-from rules`` against a temporary Prometheus over those blocks.
"""
from __future__ import annotations

import bisect
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import names
from ..core.model import RunStore
from .openmetrics import DEFAULT_INSTANCE, DEFAULT_JOB, FamilyRender, SampleGrid
from ..rules import Record
from .ruleset import levels, write_rule_file
from .runfile import RecordedRun
from .timeline import Timeline
from .tsdb import TempPrometheus, create_blocks_from_openmetrics, create_blocks_from_rules

DEFAULT_SCRAPE_INTERVAL = 15.0
DEFAULT_TAIL = 300.0  # keep scraping the finished run this long (Prometheus' default lookback)


class NullProgress:
    """Progress hooks used when nobody watches (tests, --json, no terminal)."""

    def phase(self, name: str, total: int | None = None) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def __enter__(self): return self
    def __exit__(self, *exc) -> None: ...


@dataclass
class Backfill:
    run: RecordedRun
    timeline: Timeline
    times_ms: list[int]
    data_dir: str
    om_file: str
    samples: int = 0
    recorded_levels: list[list[str]] = field(default_factory=list)
    grid: SampleGrid | None = None  # what was scraped (the backtest renders annotations from it)

    @property
    def first(self) -> float:
        return self.times_ms[0] / 1000

    @property
    def last(self) -> float:
        return self.times_ms[-1] / 1000


def scrape_grid(timeline: Timeline, interval: float, tail: float) -> list[int]:
    """Scrape timestamps (ms) on the interval grid from the first step's arrival to the last + tail."""
    iv = max(1, round(interval * 1000))
    first = math.ceil(timeline.arrivals[0] * 1000 / iv) * iv
    last = math.floor((timeline.end + tail) * 1000 / iv) * iv
    return list(range(first, max(first, last) + 1, iv))


# Families a backfill does not export: the time outside the step timer is measured on live arrivals, and a
# backfill rebuilds arrivals from the timers, so it would be a flat 0 on the dashboards (issue 26 item 9).
LIVE_ONLY_FAMILIES = frozenset({names.OUTSIDE_STEP_SECONDS, names.OUTSIDE_STEP_WINDOW})


def replay(run: RecordedRun, timeline: Timeline, grid: SampleGrid | None, *, lo: int = 0, hi: int | None = None,
           families: set[str] | None = None, observe=None, store_kwargs: dict | None = None, progress=None) -> None:
    """The one replay loop (backfill and backtest): feed the run to its own RunStore in simulated time,
    line by line at its reconstructed arrival (calling ``trainer_restarted`` before each line of
    ``run.truncated_before``, as the file source does), and add to ``grid`` what each scrape of
    ``grid.times_ms[lo:hi]`` would have seen, ``LIVE_ONLY_FAMILIES`` left out. ``families``: only those
    (None: all); ``observe(i, store, record)`` after every line; ``grid`` None: the replay only."""
    progress = progress or NullProgress()
    now = [timeline.arrivals[0]]
    store = RunStore(clock=lambda: now[0], **(store_kwargs or {}))
    store.set_source_up(run.kind, run.path, True)  # as the live file source reports its watch spec
    truncated = set(run.truncated_before)
    if run.trainer_config is not None:
        store.set_trainer_config(run.trainer_config, labels=(run.project, run.experiment))
    render = FamilyRender(store, families)  # the registry's text, without prometheus_client's per-character escaping
    times = grid.times_ms if grid is not None else []
    hi = len(times) if hi is None else hi
    arrivals_ms = [round(a * 1000) for a in timeline.arrivals]
    n = len(run.entries)
    for i, entry in enumerate(run.entries):
        now[0] = timeline.arrivals[i]
        if i in truncated:  # the file source saw the log truncated here: verl reopened it ("wb") on a resume
            store.trainer_restarted(run.project, run.experiment, run.kind)
        rec = store.ingest(run.project, run.experiment, entry.parsed, run.kind, arrival=now[0], feed=run.feed)
        if observe is not None:
            observe(i, store, rec)
        if grid is not None:
            a = max(lo, bisect.bisect_left(times, arrivals_ms[i]))
            b = min(hi, bisect.bisect_left(times, arrivals_ms[i + 1])) if i + 1 < n else hi
            if b > a:  # a step overtaken before the next scrape is never seen
                grid.add_families([f for f in render.families() if f[0] not in LIVE_ONLY_FAMILIES], a, b)
        progress.advance()


def render_run(run: RecordedRun, timeline: Timeline, times_ms: list[int], *, job: str = DEFAULT_JOB,
               instance: str = DEFAULT_INSTANCE, progress=None, store_kwargs: dict | None = None) -> SampleGrid:
    """What each scrape of the grid would have seen of the run (``replay``)."""
    progress = progress or NullProgress()
    grid = SampleGrid(times_ms, job, instance)
    progress.phase("ingest + render", len(run.entries))
    replay(run, timeline, grid, store_kwargs=store_kwargs, progress=progress)
    return grid


def backfill(run: RecordedRun, timeline: Timeline, data_dir: str, *, scrape_interval: float = DEFAULT_SCRAPE_INTERVAL,
             tail: float = DEFAULT_TAIL, recordings: list[Record] | None = None,
             eval_interval: float = DEFAULT_SCRAPE_INTERVAL, om_file: str | None = None, job: str = DEFAULT_JOB,
             instance: str = DEFAULT_INSTANCE, progress=None) -> Backfill:
    """Blocks are built in a private staging directory (the temporary Prometheus writes its WAL there,
    never into ``data_dir``, which may belong to a running Prometheus) and then moved into
    ``data_dir`` one finished block at a time."""
    progress = progress or NullProgress()
    os.makedirs(data_dir, exist_ok=True)
    times = scrape_grid(timeline, scrape_interval, tail)
    grid = render_run(run, timeline, times, job=job, instance=instance, progress=progress)
    own_om = om_file is None
    with _staging(data_dir) as stage:
        om_file = om_file or str(Path(stage) / "run.om.txt")
        progress.phase("write OpenMetrics")
        with open(om_file, "w", encoding="utf-8") as f:
            samples = grid.write(f)
        progress.phase("promtool create-blocks-from openmetrics")
        blocks = str(Path(stage) / "data")
        create_blocks_from_openmetrics(om_file, blocks)
        bf = Backfill(run, timeline, times, blocks, "" if own_om else om_file, samples, grid=grid)
        if recordings:
            backfill_recordings(bf, recordings, eval_interval, progress)
        _move_blocks(blocks, data_dir)
    bf.data_dir = data_dir
    return bf


def _staging(data_dir: str):
    """A temporary directory next to ``data_dir`` (same filesystem: moving blocks is a rename), or in
    the system temp directory when that parent is not writable."""
    try:
        return tempfile.TemporaryDirectory(prefix=".omniwatch-backfill-", dir=Path(data_dir).resolve().parent)
    except OSError:
        return tempfile.TemporaryDirectory(prefix="omniwatch-backfill-")


def _move_blocks(src: str, dst: str) -> None:
    """Move finished blocks (directories with a meta.json) into ``dst``: copied under a
    ``.tmp-for-creation`` name first (Prometheus ignores those), then renamed in place."""
    for d in sorted(Path(src).iterdir()):
        if d.is_dir() and (d / "meta.json").is_file():
            tmp = Path(dst) / f"{d.name}.tmp-for-creation"
            shutil.move(str(d), str(tmp))
            os.rename(tmp, Path(dst) / d.name)


def backfill_recordings(bf: Backfill, recordings: list[Record], eval_interval: float, progress=None) -> None:
    """Recording rules over the backfilled range, one dependency level per temporary Prometheus."""
    progress = progress or NullProgress()
    lv = levels(recordings)
    with tempfile.TemporaryDirectory(prefix="omniwatch-rules-") as tmp:
        for n, level in enumerate(lv, 1):
            progress.phase(f"recording rules, level {n}/{len(lv)}")
            rule_file = str(Path(tmp) / f"level{n}.rules.yml")
            write_rule_file(level, rule_file)
            with TempPrometheus(bf.data_dir) as prom:
                create_blocks_from_rules(rule_file, prom.url, bf.first, bf.last, eval_interval, bf.data_dir)
            bf.recorded_levels.append(sorted({r.record for r in level}))
