"""Per-worker phase lanes in ``omniwatch report`` (live reports, ``--prometheus``): a Gantt of the last K
steps, and one of the K slowest steps (each from the previous step's arrival to its own, lanes prefixed with
the step, times from that step's start), drawn from ``omniwatch_ray_worker_phase`` as Prometheus scraped it (the exporter's Ray task-event
source, ``--ray-tasks``): one lane per (role, rank), one bar per span of the same phase. Bars are as fine as
the query resolution (a phase shorter than it may not show, as in Grafana). Absent when the run's
exporter did not read task events."""
from __future__ import annotations

from dataclasses import dataclass

from .. import names as n, palette
from ..discovery.phases import PHASES

CODE_PHASE = {i + 1: p for i, p in enumerate(PHASES)}
LAST_STEPS = 5
SLOWEST_STEPS = 3


@dataclass(frozen=True)
class Bar:
    lane: str      # "actor_rollout rank 3"
    phase: str
    start: float
    end: float


def segments(series: dict[str, dict[float, float]], res: float) -> list[Bar]:
    """{lane: {t: phase code}} -> bars: consecutive samples of one non-zero code are one bar, from its first
    sample to one resolution after its last."""
    out: list[Bar] = []
    for lane, pts in series.items():
        cur, t0, last = None, 0.0, 0.0
        for t in sorted(pts) + [None]:
            code = int(pts[t]) if t is not None else None
            if t is not None and code == cur and t - last <= 1.5 * res:
                last = t
                continue
            if cur:  # close the open bar
                out.append(Bar(lane, CODE_PHASE.get(cur, "other"), t0, last + res))
            if t is not None:
                cur, t0, last = code, t, t
    return sorted(out, key=lambda b: (b.lane, b.start))


def query(prom, sel: str, start: float, until: float, res: float) -> list[Bar]:
    """Bars of the run's lanes between ``start`` and ``until``; [] when Prometheus has none."""
    series: dict[str, dict[float, float]] = {}
    for s in prom.query_range(f"max by (role, rank) ({n.RAY_WORKER_PHASE}{{{sel}}})", start, until, res):
        m = s["metric"]
        series[f"{m.get('role', '?')} rank {int(m.get('rank', '0') or 0):03d}"] = {float(t): float(v) for t, v in s["values"]}
    return segments(series, res)


def slowest(marks: list[tuple[float, int]], durations: dict[int, float], k: int = SLOWEST_STEPS
            ) -> list[tuple[int, float, float]]:
    """The ``k`` steps with the longest step time: [(step, previous arrival, arrival)] in step order. ``marks`` are
    (first time Prometheus saw the step, step); the first step has no window."""
    wins = [(s, marks[i - 1][0], t) for i, (t, s) in enumerate(marks) if i and durations.get(s)]
    top = sorted(wins, key=lambda w: -durations[w[0]])[:k]
    return sorted(top)


def query_steps(prom, sel: str, windows: list[tuple[int, float, float]], res: float) -> list[Bar]:
    """Bars of each window, lanes named ``step N · <lane>``, times relative to the window's start."""
    out: list[Bar] = []
    for step, a, b in windows:
        out += [Bar(f"step {step} · {x.lane}", x.phase, x.start - a, x.end - a) for x in query(prom, sel, a, b, res)]
    return out


def chart(bars: list[Bar], width: int = 1000, title: str = "Worker lanes (Ray task events), seconds from the first bar"):
    """A Bokeh Gantt (None without bars): lanes top to bottom, bars coloured by phase."""
    if not bars:
        return None
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.palettes import Category20
    from bokeh.plotting import figure
    lanes = sorted({b.lane for b in bars}, reverse=True)
    phases = sorted({b.phase for b in bars})
    colour = {p: palette.color(p, Category20[20][i % 20]) for i, p in enumerate(phases)}  # one palette
    t0 = min(b.start for b in bars)
    src = ColumnDataSource({"lane": [b.lane for b in bars], "left": [b.start - t0 for b in bars],
                            "right": [b.end - t0 for b in bars], "phase": [b.phase for b in bars],
                            "color": [colour[b.phase] for b in bars], "secs": [round(b.end - b.start, 1) for b in bars]})
    f = figure(title=title, y_range=lanes, width=width,
               height=80 + 18 * len(lanes), tools="xpan,xwheel_zoom,box_zoom,reset,save", toolbar_location="right")
    f.hbar(y="lane", left="left", right="right", height=0.8, color="color", legend_field="phase", source=src)
    f.add_tools(HoverTool(tooltips=[("lane", "@lane"), ("phase", "@phase"), ("seconds", "@secs")]))
    f.add_layout(f.legend[0], "right")  # beside the lanes, never over them
    return f
