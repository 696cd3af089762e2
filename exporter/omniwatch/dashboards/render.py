"""Draw each dashboard as a PNG from the specs' grid layout and REAL range queries, so a person can see
what a dashboard shows without Grafana (docs/img/*.png are produced this way from the live test setup).

Not a Grafana clone: time series are lines (stacked when the panel stacks, dashed where Grafana draws
dashed), stat panels print the last value, bar gauges draw one bar per series; thresholds are drawn as
dashed horizontal lines. Legends use the panel's legend templates.
"""
from __future__ import annotations

import math
import re
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import spec as s  # noqa: E402
from .catalog import DASHBOARDS  # noqa: E402
from .factory import GRID_COLUMNS, layout  # noqa: E402
from .verify import Prom, substitute  # noqa: E402

ROW_UNIT_IN = 0.32  # inches per Grafana grid row (30 px)
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def _legend(template: str, labels: dict) -> str:
    if template == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template).strip()


def _fmt(v: float, unit: str) -> str:
    if not math.isfinite(v):
        return "NaN"
    if unit == "percentunit":
        return f"{100 * v:.1f}%"
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(v) < 1024:
                return f"{v:.1f} {suffix}"
            v /= 1024
        return f"{v:.1f} PiB"
    if unit == "s":
        return f"{v:.2f} s" if v < 120 else f"{v / 60:.1f} min"
    return f"{v:.3g}"


def _series(prom: Prom, expr: str, start: float, end: float, step: float):
    data = prom.query_range(expr, start, end, step)
    for item in data.get("result", []):
        xs, ys = [], []
        for t, val in item.get("values", []):
            xs.append(float(t) - end)
            ys.append(float(val))
        yield item.get("metric", {}), xs, ys


def _draw_panel(ax, p: s.Panel, prom: Prom, start: float, end: float, step: float, subst) -> None:
    ax.set_title(p.title, fontsize=8, loc="left")
    ax.tick_params(labelsize=6)
    drawn = []
    for t in p.targets:
        try:
            for labels, xs, ys in _series(prom, subst(t.expr), start, end, step):
                drawn.append((t, _legend(t.legend, labels), xs, ys))
        except Exception as e:  # noqa: BLE001 - a failing query shows in the picture, it does not stop it
            ax.text(0.5, 0.5, f"query error: {e}"[:80], ha="center", va="center", fontsize=6, transform=ax.transAxes)
    if not drawn:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", fontsize=9, color="grey", transform=ax.transAxes)
        ax.set_xticks([]), ax.set_yticks([])
        return
    if p.kind == "stat":
        ax.axis("off")
        lines = [f"{_fmt(ys[-1], p.unit)}" + (f"  {name}" if len(drawn) > 1 else "") for _, name, _, ys in drawn[:4]]
        ax.text(0.5, 0.45, "\n".join(lines), ha="center", va="center", transform=ax.transAxes,
                fontsize=14 if len(lines) == 1 else 8, weight="bold", color="#1f77b4")
        return
    if p.kind == "bargauge":
        names = [name for _, name, _, _ in drawn]
        vals = [ys[-1] for _, _, _, ys in drawn]
        ax.barh(names, vals, color="#2ca02c")
        if p.max is not None:
            ax.set_xlim(p.min or 0, p.max)
        ax.tick_params(labelsize=6)
    else:
        if p.stack:
            base = {}
            for t, name, xs, ys in drawn:
                lo = [base.get(x, 0.0) for x in xs]
                hi = [a + (b if math.isfinite(b) else 0.0) for a, b in zip(lo, ys)]
                ax.fill_between(xs, lo, hi, alpha=0.5, label=name, step="post")
                base.update(zip(xs, hi))
        else:
            for t, name, xs, ys in drawn:
                ax.plot(xs, ys, lw=1, ls="--" if t.dashed else "-", label=name)
        ax.set_xlabel("seconds before now", fontsize=6)
        if p.min is not None:
            ax.set_ylim(bottom=p.min)
        if p.max is not None:
            ax.set_ylim(top=p.max)
        ax.legend(fontsize=5, loc="upper left", ncol=2, framealpha=0.6)
    for st in p.thresholds:
        if st.value is not None and p.show_thresholds:
            ax.axhline(st.value, color=st.color if st.color != "transparent" else "grey", ls="--", lw=0.8)


def render_dashboard(d: s.Dashboard, prom: Prom, out: Path, minutes: float = 30.0, project: str = ".*",
                     experiment: str = ".*") -> Path:
    placed = layout(d)
    rows = max(pl.y + pl.h for pl in placed)
    fig = plt.figure(figsize=(16, rows * ROW_UNIT_IN + 0.6))
    fig.suptitle(f"{d.title}   ({project} / {experiment}, last {minutes:g} min)", fontsize=11, x=0.01, ha="left")
    end = time.time()
    start = end - minutes * 60
    step = max(1.0, (end - start) / 300)
    rate_interval = f"{max(4 * int(step), 15)}s"

    def subst(expr):
        return substitute(expr, project, experiment, rate_interval, f"{int(step)}s")

    top = 1 - 0.6 / (rows * ROW_UNIT_IN + 0.6)
    for pl in placed:
        left, width = pl.x / GRID_COLUMNS, pl.w / GRID_COLUMNS
        bottom = top * (1 - (pl.y + pl.h) / rows)
        height = top * pl.h / rows
        if pl.row is not None:
            fig.text(0.005, bottom + height / 2, pl.row.title, fontsize=9, weight="bold", va="center")
            continue
        ax = fig.add_axes([left + 0.03 * width, bottom + 0.18 * height, 0.92 * width, 0.66 * height])
        _draw_panel(ax, pl.panel, prom, start, end, step, subst)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{d.uid}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def render_all(prometheus_url: str, out: Path, minutes: float = 30.0, project: str = ".*", experiment: str = ".*",
               dashboards=DASHBOARDS) -> list[Path]:
    prom = Prom(prometheus_url)
    try:
        return [render_dashboard(d, prom, out, minutes, project, experiment) for d in dashboards]
    finally:
        prom.close()
