"""Self-contained HTML pages (run report, comparison, index) drawn with Bokeh.

Why Bokeh (docs/report.md): a maintained BSD library on PyPI whose JavaScript (BokehJS) is inlined into
the page with ``Resources(mode="inline", components=["bokeh"])`` — 1.27 MB for the core bundle (the
widgets, tables, GL and MathJax bundles are not needed) — so a page opens offline in any browser,
makes no network request and is ~1.5 MB with 500 steps of data: small enough to attach to a chat
message. Hover shows step and value; step charts share one x range (pan/zoom one, all follow).
Plotly inlines 4.8 MB of plotly.js per page; Vega-Lite needs three bundles and a converter.
"""
from __future__ import annotations

import html
import re
import time
from typing import Sequence

import numpy as np
from bokeh.embed import components
from bokeh.models import ColumnDataSource, HoverTool, NumeralTickFormatter, Range1d, Span
from bokeh.plotting import figure
from bokeh.resources import Resources

from .. import __version__, palette
from ..core import ledger
from ..config import DEFAULT, Config
from . import gantt as lanes
from .facts import HOUR, RunFacts
from .verdict import Bottleneck
from .compare import name

RESOURCES = Resources(mode="inline", components=["bokeh"])
WIDTH = 1000
TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
THRESHOLD = "#d62728"


def bucket_color(bucket: str) -> str:
    """The ledger bucket's colour: the phase palette the dashboards use (palette.PHASE_COLORS)."""
    return palette.color(bucket)


def _arr(xs) -> np.ndarray:
    """Numeric columns as float arrays: Bokeh sends them base64-encoded (smaller, faster than JSON lists)."""
    return np.asarray(xs, dtype=float)


def _nan(v) -> float:
    return float("nan") if v is None else float(v)


def _fig(title: str, y_label: str, x_range=None, height: int = 260, **kw):
    f = figure(title=title, height=height, width=WIDTH, tools=TOOLS, toolbar_location="right",
               x_range=x_range, **kw)
    f.yaxis.axis_label = y_label
    if x_range is not None:
        f.xaxis.axis_label = "step"
    f.title.text_font_size = "13px"
    return f


def _threshold(f, y: float, text: str) -> None:
    f.add_layout(Span(location=y, dimension="width", line_color=THRESHOLD, line_dash="dashed", line_width=1.5))
    from bokeh.models import Label
    f.add_layout(Label(x=5, y=y, x_units="screen", text=text, text_font_size="11px", text_color=THRESHOLD,
                       y_offset=3))


# --- charts --------------------------------------------------------------------------------------------
def ledger_chart(f: RunFacts, title: str = "Where the GPU-hours went"):
    hours = f.gpu_hours()
    buckets = list(reversed(list(hours)))
    total = sum(hours.values()) or 1.0
    unit = "GPU-hours" if f.gpus else "GPU-hours per GPU (GPUs unknown)"
    src = ColumnDataSource(dict(bucket=buckets, hours=[hours[b] for b in buckets],
                                share=[hours[b] / total * 100 for b in buckets],
                                color=[bucket_color(b) for b in buckets]))
    p = figure(title=f"{title}: {total:.1f} {unit}", y_range=buckets, height=60 + 24 * max(1, len(buckets)),
               width=WIDTH, tools="save", toolbar_location="right")
    p.hbar(y="bucket", right="hours", height=0.7, color="color", source=src)
    p.add_tools(HoverTool(tooltips=[("bucket", "@bucket"), (unit, "@hours{0,0.00}"), ("share", "@share{0.0}%")]))
    p.xaxis.axis_label = unit
    p.x_range.start = 0
    return p


MAX_BARS = 600  # a longer run's stacked chart shows the mean step of each bin of consecutive steps


def phase_chart(f: RunFacts, x_range, cfg: Config = DEFAULT):
    """Stacked wall seconds per step by ledger bucket (one renderer), with StepTimeRegression's threshold.
    Runs longer than MAX_BARS steps are binned (mean seconds per step of each bin), so pages stay small."""
    kept = f.gpu_hours()  # buckets with at least a GPU-second over the run
    buckets = ledger.ordered({b for p in f.steps for b in p.wall if b in kept})
    per = max(1, -(-len(f.steps) // MAX_BARS))
    left, right, bottom, top, bucket, secs, step, color = [], [], [], [], [], [], [], []
    for k in range(0, len(f.steps), per):
        grp = f.steps[k:k + per]
        lo, hi = grp[0].step, grp[-1].step
        half = 0.42 if per == 1 else (hi - lo + 1) / 2 * 0.9
        mid = (lo + hi) / 2
        y = 0.0
        for b in buckets:
            v = sum(p.wall.get(b, 0.0) for p in grp) / len(grp)
            if v <= 0:
                continue
            left.append(mid - half)
            right.append(mid + half)
            bottom.append(y)
            top.append(y + v)
            y += v
            bucket.append(b)
            secs.append(v)
            step.append(f"{lo}" if lo == hi else f"{lo}-{hi}")
            color.append(bucket_color(b))
    src = ColumnDataSource(dict(left=_arr(left), right=_arr(right), bottom=_arr(bottom), top=_arr(top), bucket=bucket,
                                seconds=_arr(secs), step=step, color=color))
    title = "Where each step went (wall seconds by ledger bucket)" + (
        f"; mean of every {per} steps" if per > 1 else "")
    fig = _fig(title, "seconds", x_range, height=320)
    r = fig.quad(left="left", right="right", bottom="bottom", top="top", color="color", source=src,
                 legend_field="bucket", line_color=None)
    fig.add_tools(HoverTool(renderers=[r], tooltips=[("step", "@step"), ("bucket", "@bucket"),
                                                     ("seconds", "@seconds{0,0.0}")]))
    ratio = cfg.step_time.regression_ratio
    th = ColumnDataSource(dict(step=_arr([p.step for p in f.steps]),
                               v=_arr([_nan(p.duration_baseline and p.duration_baseline * ratio) for p in f.steps])))
    fig.line("step", "v", source=th, line_color=THRESHOLD, line_dash="dashed", line_width=1.5,
             legend_label=f"StepTimeRegression: {ratio:g} x baseline")
    fig.legend.location = "top_left"
    fig.legend.label_text_font_size = "10px"
    fig.legend.background_fill_alpha = 0.6
    fig.add_layout(fig.legend[0], "right")
    return fig


def _ratio_chart(f: RunFacts, x_range, title: str, y_label: str, attr: str, win_attr: str, threshold: float,
                 th_text: str):
    pts = [p for p in f.steps if getattr(p, attr) is not None]
    if not pts:
        return None
    src = ColumnDataSource(dict(step=_arr([p.step for p in pts]), v=_arr([getattr(p, attr) for p in pts]),
                                w=_arr([_nan(getattr(p, win_attr)) for p in pts])))
    fig = _fig(title, y_label, x_range)
    r = fig.line("step", "v", source=src, line_width=1.5, legend_label="per step")
    fig.scatter("step", "v", source=src, size=3)
    fig.line("step", "w", source=src, line_width=2, line_color="#ff7f0e", legend_label="window min (last k normal steps)")
    _threshold(fig, threshold, th_text)
    fig.add_tools(HoverTool(renderers=[r], mode="vline", tooltips=[("step", "@step"), ("value", "@v{0.000}"),
                                                                   ("window min", "@w{0.000}")]))
    fig.legend.label_text_font_size = "10px"
    fig.add_layout(fig.legend[0], "right")
    top = max([threshold] + [float(x) for x in src.data["v"] if x == x])
    fig.y_range = Range1d(0, top * 1.15)
    fig.yaxis.formatter = NumeralTickFormatter(format="0.00[0]")
    return fig


def reward_chart(f: RunFacts, x_range, cfg: Config = DEFAULT):
    c = cfg.reward_bound
    return _ratio_chart(f, x_range, "Reward-bound ratio: reward seconds on the critical path / (gen + reward)",
                        "ratio", "reward_bound", "reward_bound_min", c.ratio,
                        f"RewardBoundRollout: window min > {c.ratio:g} (and reward > {c.step_share:g} of the step)")


def idle_chart(f: RunFacts, x_range, cfg: Config = DEFAULT):
    c = cfg.inter_stage_idle
    return _ratio_chart(f, x_range, "Inter-stage idle ratio: untimed seconds / step", "ratio", "idle", "idle_min",
                        c.ratio, f"InterStageIdleGPU: window min > {c.ratio:g}")


def mfu_chart(f: RunFacts, x_range, cfg: Config = DEFAULT):
    roles = sorted({r for p in f.steps for r in p.mfu})
    if not roles:
        return None
    fig = _fig("MFU against the run's own baseline", "MFU", x_range)
    colors = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]
    drop = cfg.mfu.drop_ratio
    for k, role in enumerate(roles):
        pts = [p for p in f.steps if role in p.mfu]
        src = ColumnDataSource(dict(step=_arr([p.step for p in pts]), v=_arr([p.mfu[role] for p in pts]),
                                    b=_arr([_nan(p.mfu_baseline.get(role)) for p in pts]),
                                    t=_arr([_nan(p.mfu_baseline.get(role) and p.mfu_baseline[role] * drop) for p in pts])))
        c = colors[k % len(colors)]
        r = fig.line("step", "v", source=src, line_color=c, line_width=1.5, legend_label=f"{role}")
        fig.line("step", "b", source=src, line_color=c, line_dash="dashed", legend_label=f"{role} baseline")
        fig.line("step", "t", source=src, line_color=THRESHOLD, line_dash="dotted",
                 legend_label=f"{role} MFUDrop: {drop:g} x baseline")
        fig.add_tools(HoverTool(renderers=[r], mode="vline", tooltips=[("step", "@step"), (role, "@v{0.000}"),
                                                                       ("baseline", "@b{0.000}")]))
    _threshold(fig, cfg.mfu.impossible, f"MFUImpossible: > {cfg.mfu.impossible:g}")
    fig.legend.label_text_font_size = "10px"
    fig.add_layout(fig.legend[0], "right")
    top = max([cfg.mfu.impossible] + [v for p in f.steps for v in p.mfu.values()])
    fig.y_range = Range1d(0, top * 1.1)
    return fig


def alert_chart(f: RunFacts, x_range):
    if not f.alerts:
        return None
    rows = []
    for a in f.alerts:
        extra = ", ".join(f"{k}={v}" for k, v in a.labels.items()
                          if k not in ("severity", "persistence", "project", "experiment"))
        rows.append((f"{a.alertname} ({extra})" if extra else a.alertname, a))
    cats = list(dict.fromkeys(r[0] for r in rows))
    src = ColumnDataSource(dict(alert=[r[0] for r in rows], left=[r[1].first_step - 0.5 for r in rows],
                                right=[r[1].last_step + 0.5 for r in rows], first=[r[1].first_step for r in rows],
                                last=[r[1].last_step for r in rows], severity=[r[1].severity for r in rows]))
    fig = _fig("Alert timeline (firing, by step)", "", x_range, height=70 + 34 * len(cats), y_range=list(reversed(cats)))
    fig.hbar(y="alert", left="left", right="right", height=0.6, source=src, color=THRESHOLD)
    fig.add_tools(HoverTool(tooltips=[("alert", "@alert"), ("steps", "@first .. @last"), ("severity", "@severity")]))
    return fig


def gpu_phase_chart(f: RunFacts):
    if not f.gpu_phases:
        return None
    phases = sorted(f.gpu_phases)
    src = ColumnDataSource(dict(phase=phases, busy=[f.gpu_phases[p].get("busy", 0.0) / HOUR for p in phases],
                                idle=[f.gpu_phases[p].get("idle", 0.0) / HOUR for p in phases]))
    fig = figure(title="GPU busy / idle by phase (NVML, GPU-hours)", y_range=phases, height=60 + 26 * len(phases),
                 width=WIDTH, tools="save")
    fig.hbar_stack(["busy", "idle"], y="phase", height=0.7, color=["#2ca02c", "#c7c7c7"], source=src,
                   legend_label=["busy", "idle"])
    fig.add_tools(HoverTool(tooltips=[("phase", "@phase"), ("busy GPU-h", "@busy{0.00}"), ("idle GPU-h", "@idle{0.00}")]))
    return fig


# --- pages -------------------------------------------------------------------------------------------
CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1060px;color:#222}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
th{background:#f6f6f6} td.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#777;font-size:12px} code{background:#f3f3f3;padding:0 3px;border-radius:3px;font-size:12px}
.verdict li{margin:8px 0} .ok{color:#2a7a2a} .bad{color:#b00} .chart{margin:10px 0}
"""


def esc(text: str) -> str:
    """HTML-escaped text with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def _page(title: str, body: list[str], figs: Sequence, marker: str) -> str:
    figs = [f for f in figs if f is not None]
    script, divs = components(figs) if figs else ("", ())
    parts = []
    di = iter(divs)
    for b in body:
        parts.append(next(di) if b == "\x00chart" else b)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title>"
            f"<meta name=\"omniwatch-page\" content=\"{marker}\"><meta name=\"omniwatch-charts\" content=\"{len(figs)}\">"
            f"<style>{CSS}</style>{RESOURCES.render_js()}{script}</head><body>"
            + "\n".join(parts)
            + f"<p class=\"muted\">omniwatch {__version__} report, generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            "works offline (BokehJS inlined).</p></body></html>\n")


def _fmt(v, nd: int = 2, unit: str = "") -> str:
    return "–" if v is None else f"{v:,.{nd}f}{unit}"


def header_rows(f: RunFacts) -> list[tuple[str, str]]:
    modes = f.modes
    why = {"log": "derived from the run: perf/total_num_images / (perf/throughput x perf/time_per_step)",
           "config": "every GPU pool the trainer config names", "ray": "the GPU bundles of the run's Ray placement groups"}
    gpus = f"{f.gpus} ({why.get(f.gpus_source, 'from --gpus')})" \
        if f.gpus else "unknown (the log cannot tell; pass --gpus N): GPU-hours are per GPU"
    named = [("run label", f.label_note)] if f.label_note else []
    extra = []
    ph = f.pool_gpu_hours()
    if ph:
        extra.append(("GPU pools", ", ".join(f"{p} {f.pools[p]} GPUs = {h:,.2f} GPU-h" for p, h in ph.items())
                      + f" (from the {'trainer config' if f.pools_source == 'config' else 'Ray placement groups'}; "
                      f"together {sum(ph.values()):,.2f} GPU-h = GPUs x wall time)"))
    if f.fleet_nodes:
        cluster: dict[str, float] = {}
        for node, bs_ in sorted(f.fleet_nodes.items()):
            extra.append((f"GPU time, node {node}", ", ".join(f"{b} {v / HOUR:,.2f} GPU-h" for b, v in sorted(bs_.items()))))
            for b, v in bs_.items():
                cluster[b] = cluster.get(b, 0.0) + v
        extra.append(("GPU time, cluster", ", ".join(f"{b} {v / HOUR:,.2f} GPU-h" for b, v in sorted(cluster.items()))))
    return [("run", f"{f.project}/{f.experiment}"), *named, ("source", f"{f.source}: {f.shown_source}"),
            ("trainer", modes.get("trainer", "unknown")), ("reward", modes.get("reward", "unknown")),
            ("async mode", modes.get("async_mode", "unknown")), ("GPUs", gpus), ("steps", str(f.n_steps)),
            ("median step time", _fmt(f.median_step_seconds, 1, " s")),
            ("images / GPU / s", _fmt(f.images_per_gpu_second, 3)),
            ("GPU-hours", _fmt(f.total_gpu_seconds / HOUR, 2)), *extra]


def _table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows) + "</table>"


def verdict_html(f: RunFacts, bs: list[Bottleneck]) -> str:
    if "*" in f.not_evaluated:
        return f"<p class=\"muted\">No verdict: {html.escape(f.not_evaluated['*'])}.</p>"
    if not bs:
        hours = {b: h for b, h in f.gpu_hours().items() if b not in ledger.PHASE_BUCKETS}
        top = max(hours, key=hours.get) if hours else None
        extra = f" The largest non-phase bucket is {top} ({hours[top]:.2f} GPU-h)." if top else ""
        return f"<p class=\"ok\">No bottleneck alert fired over the run.{html.escape(extra)}</p>"
    total = f.total_gpu_seconds / HOUR or 1.0
    items = []
    for b in bs:
        spans = ", ".join(f"{a}–{z}" if a != z else str(a) for a, z in b.steps) or "live"
        cost = (f"<b>{b.gpu_hours:,.2f} GPU-h</b> ({b.gpu_hours / total * 100:.1f}% of the run)" if b.gpu_seconds
                else f"<b>no GPU-time cost</b> ({html.escape(b.note)})" if b.note else "<b>0 GPU-h</b>")
        if b.firing_at_end:
            cost += f"; <b>firing at the last step, ≈ {b.now_per_day:,.1f} GPU-h per day now</b>"
        elif b.per_day:
            cost += f", ≈ {b.per_day:,.1f} GPU-h per day at the rate of its last firing step"
        priced = ", ".join(f"{a}–{z}" if a != z else str(a) for a, z in b.priced)
        how = (f"<br><span class=\"muted\">How it is priced: {html.escape(b.rule)}"
               + (f"; priced steps {priced}" if priced else "") + ".</span>") if b.rule else ""
        items.append(f"<li><b class=\"bad\">{html.escape(b.alertname)}</b> — {cost}, steps {spans}"
                     + (f" <span class=\"muted\">[{', '.join(b.buckets)}]</span>" if b.buckets else "")
                     + how + (f"<br><b>Do:</b> {esc(b.action)}" if b.action else "")
                     + f"<br><details><summary>the full remedy</summary>{esc(b.remedy)}</details></li>")
    return "<ol class=\"verdict\">" + "".join(items) + "</ol>"


def _config_html(f: RunFacts) -> list[str]:
    """What the run's trainer config said, and what was assumed where none said (docs/sources.md)."""
    out = []
    c = f.trainer_config
    if c:
        out.append("<p class=\"muted\">Trainer config (" + html.escape(str(c.get("source"))) + "): "
                   + ", ".join(f"{html.escape(k)} {html.escape(str(c.get(k)))}" for k in
                               ("total_steps", "save_freq", "test_freq", "sp", "engine", "lora", "gpus")) + ".</p>")
    if f.assumed:
        out.append("<p>Assumed: " + "; ".join(html.escape(a) for a in f.assumed) + ".</p>")
    return out


def run_page(f: RunFacts, bs: list[Bottleneck], back_link: str | None = None, cfg: Config = DEFAULT) -> str:
    """The run's page; ``cfg``: the alert config its rules were made with (threshold lines)."""
    x_range = Range1d(min((p.step for p in f.steps), default=0) - 1, max((p.step for p in f.steps), default=1) + 1)
    charts = [("Where the GPU-hours went", ledger_chart(f), ""),
              ("Per step", phase_chart(f, x_range, cfg), ""),
              ("", reward_chart(f, x_range, cfg), "no reward critical-path timer in this run (V1 streamed reward logs "
                                             "none): the ratio is absent, not 0"),
              ("", idle_chart(f, x_range, cfg), "no step timer in this run"),
              ("", mfu_chart(f, x_range, cfg), "no perf/mfu/* keys in this run"),
              ("Alert timeline", alert_chart(f, x_range), "no alert fired"),
              ("GPU busy / idle by phase", gpu_phase_chart(f), "no GPU data: omniwatch's NVML sampler did not watch "
                                                                "this run's GPUs (a log file has none)"),
              ("Worker lanes", lanes.chart(f.lanes, WIDTH), "no Ray task events for this run (a live report of an "
                                                            "exporter run with --ray-tasks draws them)"),
              ("", lanes.chart(f.slow_lanes, WIDTH, f"Worker lanes of the {lanes.SLOWEST_STEPS} slowest steps, "
                                                   "seconds from each step's start"), "")]
    body = []
    if back_link:
        body.append(f"<p><a href=\"{html.escape(back_link)}\">← all runs</a></p>")
    body += [f"<h1>{html.escape(f.project)}/{html.escape(f.experiment)}</h1>", _table(header_rows(f))]
    body += _config_html(f)
    body += ["<h2>Verdict: the costliest cause first (what fires at the last step by what it costs now, then the "
             "rest by GPU-hours)</h2>", verdict_html(f, bs)]
    figs = []
    for head, fig, missing in charts:
        if head:
            body.append(f"<h2>{html.escape(head)}</h2>")
        if fig is None:
            if missing:
                body.append(f"<p class=\"muted\">{html.escape(missing)}</p>")
        else:
            body.append("\x00chart")
            figs.append(fig)
    src = "alert rules evaluated by Prometheus over the replayed run (omniwatch backtest)" \
        if f.alerts_source == "backtest" else "Prometheus' ALERTS series of the live run"
    body.append(f"<p class=\"muted\">Alerts: {src}."
                + "".join(f" Not evaluated: {html.escape(k)} ({html.escape(v)})." for k, v in f.not_evaluated.items())
                + "</p>")
    return _page(f"omniwatch report: {f.project}/{f.experiment}", body, figs, "run")


def _grouped(title: str, rows: list[dict], unit: str, la: str, lb: str):
    from bokeh.transform import dodge
    cats = [r["bucket"] for r in rows]
    src = ColumnDataSource(dict(bucket=cats, a=[r["a"] or 0.0 for r in rows], b=[r["b"] or 0.0 for r in rows],
                                change=[("–" if r["change"] is None else f"{r['change'] * 100:+.1f}%") for r in rows]))
    fig = figure(title=title, x_range=cats, height=320, width=WIDTH, tools="save", toolbar_location="right")
    fig.vbar(x=dodge("bucket", -0.18, range=fig.x_range), top="a", width=0.34, source=src, color="#9ecae1",
             legend_label=f"A: {la}")
    fig.vbar(x=dodge("bucket", 0.18, range=fig.x_range), top="b", width=0.34, source=src, color="#08519c",
             legend_label=f"B: {lb}")
    fig.add_tools(HoverTool(tooltips=[("bucket", "@bucket"), ("A", "@a{0,0.000}"), ("B", "@b{0,0.000}"),
                                      ("change", "@change")]))
    fig.yaxis.axis_label = unit
    fig.xaxis.major_label_orientation = 0.6
    fig.y_range.start = 0
    fig.legend.label_text_font_size = "10px"
    fig.add_layout(fig.legend[0], "below")
    fig.legend.orientation = "horizontal"
    return fig


def _change_text(c) -> str:
    return "–" if c is None else f"{c * 100:+.1f}%"


def compare_page(c) -> str:
    la, lb = name(c.a), name(c.b)

    def table(rows, fmt):
        head = "<tr><th>bucket</th><th>A</th><th>B</th><th>change</th></tr>"
        body = "".join(f"<tr><td>{html.escape(r['bucket'])}</td><td class=\"n\">{fmt(r['a'])}</td>"
                       f"<td class=\"n\">{fmt(r['b'])}</td><td class=\"n\">"
                       f"{_change_text(r['change'])}</td></tr>"
                       for r in rows)
        return f"<table>{head}{body}</table>"
    al = c.alerts()
    body = ["<h1>Run comparison</h1>",
            _table([("A", f"{la} ({c.a.source}: {c.a.shown_source})"), ("B", f"{lb} ({c.b.source}: {c.b.shown_source})"),
                    ("GPUs", f"A {c.a.gpus or 'unknown'} ({c.a.gpus_source}), B {c.b.gpus or 'unknown'} ({c.b.gpus_source})"),
                    ("steps", f"A {c.a.n_steps}, B {c.b.n_steps}")]),
            f"<h2>Did it pay off?</h2><p><b>{html.escape(c.headline())}</b></p>",
            f"<p>Alerts resolved: {html.escape(', '.join(al['resolved']) or '–')}; new: "
            f"{html.escape(', '.join(al['new']) or '–')}; still firing: {html.escape(', '.join(al['kept']) or '–')}.</p>",
            f"<h2>{html.escape(c.unit)}</h2>", "\x00chart",
            table(c.buckets(), lambda v: f"{v:,.3f}"),
            "<h2>Median seconds per normal step</h2>", "\x00chart",
            table(c.phases(), lambda v: "–" if v is None else f"{v:,.1f}")]
    figs = [_grouped(c.unit + " by ledger bucket", c.buckets(), c.unit, la, lb),
            _grouped("Median wall seconds per normal step", c.phases(), "seconds", la, lb)]
    return _page(f"omniwatch compare: {la} vs {lb}", body, figs, "compare")


def index_page(rows: list[dict], root: str) -> str:
    """``rows``: {"name", "href", "state", "steps", "gpus", "gpu_hours", "lost", "top", "alerts"}, ranked."""
    body = [f"<h1>omniwatch: {len(rows)} runs under {html.escape(root)}</h1>",
            "<p>Ranked by GPU-hours lost to bottlenecks (the verdict of each run: the alert rules evaluated over "
            "its replay, costed from the GPU-hours ledger).</p>"]
    figs = []
    top = [r for r in rows if r["lost"] > 0][:40]
    if top:
        names_ = [r["name"] for r in reversed(top)]
        src = ColumnDataSource(dict(name=names_, lost=[r["lost"] for r in reversed(top)],
                                    top=[r["top"] for r in reversed(top)]))
        fig = figure(title="GPU-hours lost to bottlenecks", y_range=names_, height=60 + 20 * len(top), width=WIDTH,
                     tools="save")
        fig.hbar(y="name", right="lost", height=0.7, source=src, color=THRESHOLD)
        fig.add_tools(HoverTool(tooltips=[("run", "@name"), ("lost GPU-h", "@lost{0,0.00}"), ("top bottleneck", "@top")]))
        fig.x_range.start = 0
        figs.append(fig)
        body.append("\x00chart")
    head = ("<tr><th>#</th><th>run</th><th>end</th><th>steps</th><th>GPUs</th><th>GPU-h</th><th>lost GPU-h</th>"
            "<th>lost</th><th>top bottleneck</th><th>alerts</th></tr>")
    trs = []
    for k, r in enumerate(rows, 1):
        share = f"{r['lost'] / r['gpu_hours'] * 100:.1f}%" if r["gpu_hours"] else "–"
        note = f" <small class=\"muted\">({html.escape(r['note'])})</small>" if r.get("note") else ""
        trs.append(f"<tr><td>{k}</td><td><a href=\"{html.escape(r['href'])}\">{html.escape(r['name'])}</a>{note}</td>"
                   f"<td>{html.escape(r.get('state') or '–')}</td><td class=\"n\">{r['steps']}</td><td class=\"n\">{r['gpus'] or '?'}</td>"
                   f"<td class=\"n\">{r['gpu_hours']:,.2f}</td><td class=\"n\">{r['lost']:,.2f}</td><td class=\"n\">{share}</td>"
                   f"<td>{html.escape(r['top'] or '–')}</td><td>{html.escape(', '.join(r['alerts']) or '–')}</td></tr>")
    body.append(f"<table>{head}{''.join(trs)}</table>")
    return _page(f"omniwatch: runs under {root}", body, figs, "index")
