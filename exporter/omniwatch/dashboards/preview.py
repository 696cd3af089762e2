"""Draw each dashboard as a PNG from the specs' grid layout and REAL range queries, so a person can see
what a dashboard shows without Grafana (docs/img/*.png are produced this way from the live test setup).

Not a Grafana clone, but each panel kind is drawn the way Grafana shows it: time series are lines
(stacked when the panel stacks, in the order Prometheus returns the series, dashed where Grafana draws
dashed) with threshold lines; stat panels print the last value per series coloured by the thresholds (or
by a fixed colour the panel gives series whose name matches); bar gauges one bar per series; tables one row
per run (instant queries joined on their labels, cells coloured by each column's thresholds, coded columns
shown by their value mappings); state
timelines one band per series coloured by the value mappings; XY charts run the step-axis recipe
(join each timestamp's step and value per run, keep the last value per step) and draw value against
training step; heatmaps count the series in value buckets over time. A panel repeated per run is drawn
once per run (two per row), as Grafana repeats it; collapsed rows are drawn folded.
"""
from __future__ import annotations

import math
import re
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..promapi import PromAPI  # noqa: E402
from . import panels as s  # noqa: E402
from .catalog import dashboards as drawn  # noqa: E402
from .factory import GRID_COLUMNS, REPEAT_MAX_PER_ROW, XY_MAX_DATA_POINTS, Placed, layout  # noqa: E402
from .verify import default_window, prom_regex_escape, substitute  # noqa: E402

ROW_UNIT_IN = 0.32  # inches per Grafana grid row (30 px)
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
# Grafana's named colours (packages/grafana-data/src/themes/colors: the classic palette's shades), as hex
_SHADES = {"red": ("#c4162a", "#e02f44", "#f2495c", "#ff7383", "#ffa6b0"),
           "orange": ("#fa6400", "#ff780a", "#ff9830", "#ffb357", "#ffcb7d"),
           "yellow": ("#e0b400", "#f2cc0c", "#fade2a", "#ffee52", "#fff899"),
           "green": ("#37872d", "#56a64b", "#73bf69", "#96d98d", "#c8f2c2"),
           "blue": ("#1f60c4", "#3274d9", "#5794f2", "#8ab8ff", "#c0d8ff"),
           "purple": ("#8f3bb8", "#a352cc", "#b877d9", "#ca95e5", "#deb6f2")}
_COLOURS = {"transparent": "none", "text": "#464c54"}
for _hue, (_dark, _semi, _base, _light, _super) in _SHADES.items():
    _COLOURS.update({f"dark-{_hue}": _dark, f"semi-dark-{_hue}": _semi, _hue: _base, f"light-{_hue}": _light,
                     f"super-light-{_hue}": _super})


def _colour(c: str) -> str:
    """A colour matplotlib draws: Grafana's named colours as hex ("dark-blue" was a query error), any other CSS
    colour or hex as it is, something unknown grey (never an error that blanks the panel)."""
    from matplotlib.colors import is_color_like
    c = _COLOURS.get(c, c)
    return c if c == "none" or is_color_like(c) else "#888888"


def _lines_that_fit(ax, fontsize: float) -> int:
    """How many text lines of ``fontsize`` points the axes' height holds."""
    h_in = ax.get_position().height * ax.figure.get_figheight()
    return max(1, int(h_in * 72 / (fontsize * 1.45)))


def _segments(xs: list[float], ys: list[float], gap: float) -> list[tuple[list[float], list[float]]]:
    """A series cut where samples are missing (more than ``gap`` apart) or not finite: drawn as the gaps they are
    (Grafana's spanNulls off), never bridged (a stall's bucket was filled back over the pre-stall period)."""
    out, cx, cy, last = [], [], [], None
    for x, y in zip(xs, ys):
        if not math.isfinite(y) or (last is not None and x - last > gap):
            if cx:
                out.append((cx, cy))
            cx, cy = [], []
        if math.isfinite(y):
            cx.append(x)
            cy.append(y)
        last = x
    if cx:
        out.append((cx, cy))
    return out


def _legend_that_fits(ax, **kw) -> None:
    """The legend beside the plot, cut to the lines the panel holds with the rest counted ("+12 more"): a legend
    never runs past its panel."""
    handles, labels = ax.get_legend_handles_labels()
    fs = kw.get("fontsize", 5)
    if "bbox_to_anchor" in kw:  # beside the plot: the room the panel leaves right of it (about 0.4 x the plot)
        # what the panel leaves right of the plot, less the next panel's tick labels
        room = 0.38 * ax.get_position().width * ax.figure.get_figwidth() * 72 - 28
        chars = max(8, int(room / (0.6 * fs)))
        labels = [lb if len(lb) <= chars else lb[: chars - 1] + "\u2026" for lb in labels]
    uniq = dict(zip(labels, handles))
    fits = _lines_that_fit(ax, fs)
    if len(uniq) > fits:
        keep = list(uniq.items())[:fits - 1]
        more = len(uniq) - len(keep)
        uniq = dict(keep)
        uniq[f"+{more} more series"] = plt.Line2D([], [], color="none")
    ax.legend(list(uniq.values()), list(uniq.keys()), **kw)


def _legend(template: str, labels: dict) -> str:
    if template == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template).strip()


def _fmt(v: float, unit: str) -> str:
    if not math.isfinite(v):
        return "NaN"
    if unit.startswith("suffix:"):
        return f"{v:.1f}{unit[len('suffix:'):]}"
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
    if unit == "none" and float(v).is_integer():
        return f"{v:.0f}"
    return f"{v:.3g}"


def _step_colour(steps: tuple[s.Step, ...], v: float, default: str = "#1f77b4") -> str:
    colour = default
    for st in steps:
        if st.value is None or v >= st.value:
            colour = _colour(st.color)
    return colour if colour != "none" else default


def _series(prom: PromAPI, expr: str, start: float, end: float, step: float):
    data = prom.query_range_data(expr, start, end, step)
    for item in data.get("result", []):
        xs, ys = [], []
        for t, val in item.get("values", []):
            xs.append(float(t))
            ys.append(float(val))
        yield item.get("metric", {}), xs, ys


def _no_data(ax, text="No data"):
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, color="grey", transform=ax.transAxes)
    ax.set_xticks([]), ax.set_yticks([])


def merge_frames(frames: list[list[dict]]) -> list[dict]:
    """Grafana's ``merge`` transformation (public/app/features/transformers/merge/merge.ts): the fields present
    in every frame are the key; a row joins an earlier row of its key when every field both have is equal,
    else it is a row of its own. ``frames``: one list of rows (field -> value) per query that returned data."""
    frames = [f for f in frames if f]
    if len(frames) < 2:  # nothing to merge (Grafana returns a lone frame as it is)
        return [dict(r) for f in frames for r in f]
    names = [set().union(*(r.keys() for r in f)) for f in frames]
    key_fields = sorted(k for k in set.intersection(*names) if isinstance(k, str))  # value columns are per query
    by_key: dict[tuple, list[dict]] = {}
    order: list[dict] = []
    for f in frames:
        for row in f:
            group = by_key.setdefault(tuple(row.get(k) for k in key_fields), [])
            for existing in group:
                if all(existing[k] == v for k, v in row.items() if k in existing):
                    existing.update(row)
                    break
            else:
                fresh = dict(row)
                group.append(fresh)
                order.append(fresh)
    return order


def _cell_text(text: str, limit: int) -> str:
    """A cell's text cut to its column as Grafana's table does (one line, an ellipsis)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: max(1, limit - 1)] + "\u2026"


def _table(ax, p: s.Panel, prom: PromAPI, subst) -> None:
    """One row per merged label set, the panel's columns in its order under its names (``Panel.columns``; hidden
    labels left out), long texts wrapped in their cells (``"wrap"``), rows that do not fit counted, not dropped."""
    import textwrap
    frames: list[list[dict]] = []
    label_cols: list[str] = []
    for i, t in enumerate(p.targets):
        frame = []
        for item in prom.query_data(subst(t.expr)).get("result", []):
            labels = {k: v for k, v in item["metric"].items() if k not in ("__name__", "job", "instance")}
            label_cols += [k for k in labels if k not in label_cols]
            frame.append({**labels, ("value", i): float(item["value"][1])})
        frames.append(frame)
    ax.axis("off")
    rows = merge_frames(frames)
    if not rows:
        _no_data(ax)
        return
    label_cols = [c for c in label_cols if c not in p.hide_columns]
    values = {(f"Value #{chr(65 + i)}" if len(p.targets) > 1 else "Value"): i for i in range(len(p.targets))}
    order = [name for name, _, _ in p.columns]
    label_cols = ([c for c in order if c in label_cols] + [c for c in ("project", "experiment") if c in label_cols
                                                           and c not in order]
                  + [c for c in label_cols if c not in order and c not in ("project", "experiment")])
    # columns: ("label", name) or ("value", target index), in the panel's order (values where it puts them)
    cols: list[tuple[str, object]] = []
    for name in order:
        if name in values:
            cols.append(("value", values[name]))
        elif name in label_cols:
            cols.append(("label", name))
    cols += [("label", c) for c in label_cols if ("label", c) not in cols]
    cols += [("value", i) for i in range(len(p.targets)) if ("value", i) not in cols]
    shown = {name: text for name, text, _ in p.columns}
    wrap = {name for name, _, opt in p.columns if opt == "wrap"}
    header = [shown.get(c, c) if kind == "label" else p.targets[c].legend for kind, c in cols]
    widths = [3.0 if kind == "label" and c in wrap else 1.0 for kind, c in cols]
    total_w = sum(widths)
    chars = [max(6, int(230 * w / total_w)) for w in widths]  # characters per column at the preview's width
    cells, colours, heights = [], [], []
    rows.sort(key=lambda r: tuple(str(r.get(c, "")) for kind, c in cols if kind == "label"))
    by = [i for i, t in enumerate(p.targets) if p.sort_desc and t.legend == p.sort_desc]
    if by:  # Grafana's sortBy: that value column, largest first (a stable sort keeps the label order of ties)
        rows.sort(key=lambda r: -r.get(("value", by[0]), float("-inf")))
    for r in rows:
        row, cc, lines = [], [], 1
        for (kind, c), limit in zip(cols, chars):
            if kind == "label":
                text = " ".join(str(r.get(c, "")).split())
                if c in wrap:
                    wrapped = textwrap.wrap(text, limit) or [""]
                    lines = max(lines, len(wrapped))
                    row.append("\n".join(wrapped))
                else:
                    row.append(_cell_text(text, limit))
                cc.append("white")
                continue
            t = p.targets[c]
            v = r.get(("value", c))
            mapped = next(((txt, col) for mv, txt, col in t.mappings if v is not None and mv == v), None)
            if mapped:  # a coded column: the mapping's text and colour
                row.append(mapped[0])
                cc.append(_colour(mapped[1]) if mapped[1] != "transparent" else "white")
                continue
            unit = t.unit or p.unit
            row.append("" if v is None else (f"{v:.{p.decimals}f}" if p.decimals is not None and unit == "none"
                                             else _fmt(v, unit)))
            cc.append("white" if v is None or not t.thresholds else _step_colour(t.thresholds, v, "white"))
        cells.append(row)
        colours.append(cc)
        heights.append(lines)
    fits = _lines_that_fit(ax, 6) - 1  # the header's line
    keep, used = 0, 0
    while keep < len(cells) and used + heights[keep] <= fits:
        used += heights[keep]
        keep += 1
    more = len(cells) - keep
    if more:  # rows that do not fit are counted, never silently dropped
        keep = max(1, keep - 1)
        cells = cells[:keep] + [[f"+{len(rows) - keep} more rows"] + [""] * (len(cols) - 1)]
        colours = colours[:keep] + [["white"] * len(cols)]
        heights = heights[:keep] + [1]
    soft = {"green": "#b7e4c7", "red": "#ff8787", "orange": "#ffc078", "yellow": "#ffe066", "blue": "#a5d8ff"}
    colours = [[soft.get(c, c) for c in r] for r in colours]
    header = [_cell_text(h, limit) for h, limit in zip(header, chars)]
    # rows of one text line each (a wrapped cell: as many as it has), from the top, never past the panel (a table
    # was drawn over the next row's heading; a lone row stretched over the whole panel)
    unit_h = min(1.0 / (sum(heights) + 1), 1.45 * 6 / 72 / (ax.get_position().height * ax.figure.get_figheight()) * 1.4)
    used_h = unit_h * (sum(heights) + 1)
    tab = ax.table(cellText=cells, colLabels=header, cellColours=colours, cellLoc="center",
                   bbox=[0, 1 - used_h, 1, used_h], colWidths=[w / total_w for w in widths])
    tab.auto_set_font_size(False)
    tab.set_fontsize(6)
    for (ri, ci), cell in tab.get_celld().items():
        cell.set_height(unit_h * (1 if ri == 0 else heights[ri - 1]))
        if ri > 0 and cols[ci][0] == "label" and cols[ci][1] in wrap:
            cell.get_text().set_ha("left")
            cell.PAD = 0.01


def _statetimeline(ax, p: s.Panel, prom: PromAPI, subst, start, end, step) -> None:
    colour_of = {v: _colour(c) for v, _, c in p.mappings}
    text_of = {v: txt for v, txt, _ in p.mappings}
    names, y, seen = [], 0, set()
    for t in p.targets:
        for labels, xs, ys in _series(prom, subst(t.expr), start, end, step):
            for x0, v in zip(xs, ys):
                if math.isfinite(v):
                    seen.add(v)
                    ax.barh(y, step, left=x0 - end, color=colour_of.get(v, "#74c0fc"), height=0.8, linewidth=0)
            names.append(_legend(t.legend, labels))
            y += 1
    if not names:
        _no_data(ax)
        return
    # the lane names in a column of their own inside the panel, as Grafana draws them (tick labels left of the
    # plot ran off a panel at the page's left edge: "out rank 3")
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    room = min(0.4, 0.62 * 5 * (max(len(nm) for nm in names) + 2) / max(1.0, width_pt))
    left = (start - end) - room / (1 - room) * (end - start)
    ax.set_yticks(range(len(names)), [""] * len(names))
    ax.tick_params(axis="y", length=0)
    for k, nm in enumerate(names):
        ax.text(left, k, " " + nm, ha="left", va="center", fontsize=5, clip_on=True)
    ax.axvline(start - end, color="#cccccc", lw=0.5)
    ax.set_xlim(left, 0)
    ax.set_xticks([t for t in ax.get_xticks() if start - end <= t <= 0])  # no time ticks under the names
    ax.set_xlabel("seconds before now", fontsize=6)
    # the legend names the states drawn (not every mapping), beside the lanes, never over them
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour_of[v]) for v in text_of if v in seen]
    ax.legend(handles, [text_of[v] for v in text_of if v in seen], fontsize=5, loc="upper left",
              bbox_to_anchor=(1.005, 1.0), borderaxespad=0)


def xy_points(prom: PromAPI, p: s.Panel, subst, start, end, step) -> dict[tuple, dict[int, dict[float, float]]]:
    """The step-axis recipe, as Grafana's transformations do it: per run (project, experiment), join each
    timestamp's step (target A) with each value target, and keep the last value seen per step.
    Returns {run: {target index: {step: value}}}."""
    steps: dict[tuple, dict[float, float]] = {}
    for labels, xs, ys in _series(prom, subst(p.targets[0].expr), start, end, step):
        steps[(labels.get("project", ""), labels.get("experiment", ""))] = dict(zip(xs, ys))
    out: dict[tuple, dict[int, dict[float, float]]] = {}
    for i, t in enumerate(p.targets[1:], start=1):
        for labels, xs, ys in _series(prom, subst(t.expr), start, end, step):
            run = (labels.get("project", ""), labels.get("experiment", ""))
            at = steps.get(run, {})
            key = (i, tuple(sorted((k, v) for k, v in labels.items() if k not in ("project", "experiment"))))
            pts = out.setdefault(run, {}).setdefault(key, {})
            for x, y in zip(xs, ys):
                if x in at and math.isfinite(y):
                    pts[at[x]] = y  # later timestamps overwrite: the last value per step
    return out


def _xychart(ax, p: s.Panel, prom: PromAPI, subst, start, end, step) -> bool:
    drawn = False
    for run, by_target in sorted(xy_points(prom, p, subst, start, end, step).items()):
        for (i, extra), pts in sorted(by_target.items()):
            if not pts:
                continue
            xs = sorted(pts)
            t = p.targets[i]
            name = _legend(t.legend, {"project": run[0], "experiment": run[1], **dict(extra)})
            ax.plot(xs, [pts[x] for x in xs], lw=1, marker=".", ms=2, ls="--" if t.dashed else "-", label=name,
                    color=_fixed(p, name))
            drawn = True
    if not drawn:
        _no_data(ax)
        return False
    ax.set_xlabel("training step", fontsize=6)
    if p.log_scale:
        ax.set_yscale("log")
    # beside the plot, as the time series have it (inside, it hid the curves of a panel with 14 phases)
    _legend_that_fits(ax, fontsize=5, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0, framealpha=0.9)
    return True


def _heatmap(ax, p: s.Panel, prom: PromAPI, subst, start, end, step) -> None:
    bucket = 0.05
    cols: dict[float, list[int]] = {}
    for t in p.targets:
        for _, xs, ys in _series(prom, subst(t.expr), start, end, step):
            for x, v in zip(xs, ys):
                if math.isfinite(v):
                    col = cols.setdefault(x, [0] * int(round(1 / bucket)))
                    col[min(len(col) - 1, max(0, int(v / bucket)))] += 1
    if not cols:
        _no_data(ax)
        return
    xs = sorted(cols)
    grid = [[cols[x][b] for x in xs] for b in range(len(cols[xs[0]]))]
    ax.imshow(grid, aspect="auto", origin="lower", cmap="Oranges", extent=(xs[0] - end, xs[-1] - end, 0, 1))
    ax.set_xlabel("seconds before now", fontsize=6)


QUERY_ERRORS: list[str] = []  # every "query error" drawn since the process started (the renderer prints them)


def _query_error(ax, title: str, e: Exception) -> None:
    QUERY_ERRORS.append(f"{title}: {e}")
    ax.text(0.5, 0.5, f"query error: {e}"[:80], ha="center", va="center", fontsize=6, transform=ax.transAxes)


def _draw_panel(ax, p: s.Panel, prom: PromAPI, start: float, end: float, step: float, subst, title: str) -> None:
    ax.set_title(title, fontsize=8, loc="left")
    ax.tick_params(labelsize=6)
    try:
        if p.kind == "table":
            return _table(ax, p, prom, subst)
        if p.kind == "statetimeline":
            return _statetimeline(ax, p, prom, subst, start, end, step)
        if p.kind == "xychart":  # 11,000 points; 1 s, not Grafana's 15 s min interval: the preview stack scrapes every second
            _xychart(ax, p, prom, subst, start, end, max(1.0, (end - start) / XY_MAX_DATA_POINTS))
            _threshold_lines(ax, p)
            return None
        if p.kind == "heatmap":
            return _heatmap(ax, p, prom, subst, start, end, step)
    except Exception as e:  # noqa: BLE001 - a failing query shows in the picture, it does not stop it
        _query_error(ax, title, e)
        return None
    drawn = []
    for t in p.targets:
        try:
            if t.instant:  # the value now (a stat of the current state): one point per series
                series = [(item.get("metric", {}), [end], [float(item["value"][1])])
                          for item in prom.query(subst(t.expr))]
            else:
                series = list(_series(prom, subst(t.expr), start, end, step))
            for labels, xs, ys in series:
                drawn.append((t, _legend(t.legend, labels), [x - end for x in xs], ys))
        except Exception as e:  # noqa: BLE001
            _query_error(ax, title, e)
    if not drawn:
        _no_data(ax)
        return None
    if p.kind == "stat":
        ax.axis("off")
        one = len(drawn) == 1  # one value: centred and large; several: a left-aligned list (never clipped)
        size = 12 if one else 7
        fits = _lines_that_fit(ax, size)
        cols = 1 if len(drawn) <= fits else 2  # more runs than lines: two columns, then the rest counted
        shown = drawn if len(drawn) <= fits * cols else drawn[:fits * cols - 1]
        width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72 / cols
        longest = max((len(name) for _, name, _, _ in shown), default=1) + 14
        list_fs = min(size, max(4.0, width_pt / (0.62 * longest)))  # one size for the list, every line fits
        for k, (_, name, _, ys) in enumerate(shown):
            v = ys[-1]
            text = next((txt for mv, txt, _ in p.mappings if mv == v), None) or _fmt(v, p.unit)
            colour = (next((_colour(c) for mv, _, c in p.mappings if mv == v), None)
                      or next((_colour(c) for rx, c in p.fixed_colors if re.fullmatch(rx, name)), None)
                      or _step_colour(p.thresholds, v))
            col, line = divmod(k, fits)
            y = 0.95 - line / max(1, fits)
            if one:  # one value: large and centred, its run's name small beneath (it ran off the left edge)
                ax.text(0.5, 0.8, text, ha="center", va="top", transform=ax.transAxes, fontsize=size, weight="bold",
                        color=colour, clip_on=True)
                if p.scope == "run":
                    ax.text(0.5, 0.45, name, ha="center", va="top", transform=ax.transAxes, color=colour, clip_on=True,
                            fontsize=min(7.0, max(4.0, width_pt / (0.62 * max(1, len(name))))))
                continue
            label = f"{text}   {name}"
            ax.text(col / cols, y, label, ha="left", va="top", transform=ax.transAxes, fontsize=list_fs,
                    weight="bold", color=colour, clip_on=True)
        if len(shown) < len(drawn):  # the runs that do not fit are counted, never dropped silently
            ax.text(1 - 1 / cols, 0.95 - (fits - 1) / max(1, fits), f"+{len(drawn) - len(shown)} more",
                    ha="left", va="top", transform=ax.transAxes, fontsize=size, color="grey")
        return None
    if p.kind == "bargauge":
        names = [name for _, name, _, _ in drawn]
        vals = [ys[-1] for _, _, _, ys in drawn]
        ax.barh(names, vals, color=[_step_colour(p.thresholds, v, "#2ca02c") for v in vals])
        if p.max is not None:
            ax.set_xlim(p.min or 0, p.max)
        for k, v in enumerate(vals):  # each bar's value, as Grafana's bar gauge writes it (a bar at 0 is no bar)
            ax.text(max(v, ax.get_xlim()[0]), k, " " + _fmt(v, p.unit), va="center", ha="left", fontsize=5)
        ax.tick_params(axis="y", labelsize=5)
        _unit_axis(ax, p.unit, axis="x")
        return None
    gap = 2.5 * step
    if p.stack:
        base = {}
        cycle = [c["color"] for c in matplotlib.rcParams["axes.prop_cycle"]]
        for k, (t, name, xs, ys) in enumerate(drawn):
            # one colour per series, the next of the cycle unless fixed (fill_between(color=None) does not cycle:
            # every unfixed stack was drawn in one blue)
            colour, label = _fixed(p, name) or cycle[k % len(cycle)], name
            for sx, sy in _segments(xs, ys, gap):  # each stretch where the series has values: no bridged gaps
                lo = [base.get(x, 0.0) for x in sx]
                hi = [a + b for a, b in zip(lo, sy)]
                ax.fill_between(sx, lo, hi, alpha=0.5, label=label, step="post", color=colour)
                label = None  # one legend entry per series, however many stretches it has
                base.update(zip(sx, hi))
    else:
        for t, name, xs, ys in drawn:
            colour = _fixed(p, name)
            for sx, sy in _segments(xs, ys, gap):
                line, = ax.plot(sx, sy, lw=1, ls="--" if t.dashed else "-", label=name, color=colour)
                colour = line.get_color()  # every stretch of one series in one colour
    # the dashboard's time range, as Grafana draws it (a series that stopped, a stalled run's, filled the panel)
    ax.set_xlim(start - end, 0)
    ax.set_xlabel("seconds before now", fontsize=6)
    if p.log_scale:
        ax.set_yscale("log")
    if p.min is not None:
        ax.set_ylim(bottom=p.min)
    if p.max is not None:
        ax.set_ylim(top=p.max)
    # the legend beside the plot, never over it, cut to what the panel holds; the y axis says its unit
    _legend_that_fits(ax, fontsize=5, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0, framealpha=0.9)
    if not p.log_scale:
        _unit_axis(ax, p.unit)
    _threshold_lines(ax, p)
    return None


def tick_texts(values: list[float], unit: str) -> list[str]:
    """An axis's tick labels in the panel's unit, as Grafana's axis shows them: one scale for the whole axis (ms, s or
    min; B to TiB) and as many decimals as the ticks' spacing needs, no more (one decimal for every value made
    "0.1, 0.1, 0.1 preemptions/s" and "0.01 s, 0.01 s, 0.00 s" of distinct ticks)."""
    finite = [v for v in values if math.isfinite(v)]
    top = max((abs(v) for v in finite), default=0.0)
    scale, suffix = 1.0, ""
    if unit == "percentunit":
        scale, suffix = 100.0, "%"
    elif unit == "s":
        scale, suffix = (1 / 60, " min") if top >= 120 else (1.0, " s") if top >= 1 or top == 0 else (1000.0, " ms")
    elif unit == "bytes":
        for k, name in enumerate(("B", "KiB", "MiB", "GiB", "TiB")):
            scale, suffix = 1024.0 ** -k, f" {name}"
            if top * scale < 1024:
                break
    elif unit.startswith("suffix:"):
        suffix = unit[len("suffix:"):]
    scaled = [v * scale for v in values]
    ordered = sorted(v for v in scaled if math.isfinite(v))
    spacing = min((b - a for a, b in zip(ordered, ordered[1:]) if b > a), default=abs(ordered[0]) if ordered else 1.0)
    for decimals in range(7):  # the fewest decimals that keep every tick its own label, off by under 5 % of a step
        texts = [f"{v:.{decimals}f}" if math.isfinite(v) else "NaN" for v in scaled]
        if len(set(texts)) == len(texts) and all(abs(float(x) - v) <= 0.05 * (spacing or 1.0)
                                                 for x, v in zip(texts, scaled) if x != "NaN"):
            break
    return [x if x == "NaN" else x + suffix for x in texts]


def _unit_axis(ax, unit: str, axis: str = "y") -> None:
    """Tick labels in the panel's unit (percent, seconds, bytes, a suffix), as Grafana's axis shows them."""
    if unit in ("percentunit", "s", "bytes") or unit.startswith("suffix:"):
        from matplotlib.ticker import Formatter

        class UnitTicks(Formatter):
            def __call__(self, x, pos=None):
                return tick_texts([x], unit)[0]

            def format_ticks(self, values):
                return tick_texts(list(values), unit)
        (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(UnitTicks())
    ax.tick_params(labelsize=6)


def keep_tick_labels_inside(ax, left: float) -> None:
    """The plot moved right (its right edge kept, so the legend beside it stays) until its y tick labels, as drawn,
    start at the panel's left edge ``left`` (figure fraction): ``_tick_chars`` is an estimate, and a panel at the
    page's left edge had "100.0%" cut to "00.0%"."""
    fig = ax.figure
    bb = ax.yaxis.get_tightbbox(fig.canvas.get_renderer())
    if bb is None:
        return
    over = left + 0.002 - bb.x0 / (fig.get_figwidth() * fig.dpi)
    if over > 0:
        pos = ax.get_position()
        ax.set_position([pos.x0 + over, pos.y0, max(0.01, pos.width - over), pos.height])


def _tick_chars(unit: str) -> int:
    """About how many characters a y tick label of ``unit`` has (``_fmt``'s widest)."""
    if unit.startswith("suffix:"):
        return 6 + len(unit) - len("suffix:")
    return {"s": 8, "bytes": 9, "percentunit": 6}.get(unit, 6)


def _fixed(p: s.Panel, name: str) -> str | None:
    """The fixed colour the panel gives a series (the phase palette, the stall stages), as Grafana's override."""
    return next((_colour(c) for rx, c in s.series_colors(p) if re.fullmatch(rx, name)), None)


def _threshold_lines(ax, p: s.Panel) -> None:
    if not (p.show_thresholds or p.kind == "xychart"):
        return
    for st in p.thresholds:
        if st.value is not None:
            ax.axhline(st.value, color=_colour(st.color) if st.color != "transparent" else "grey", ls="--", lw=0.8)


def render_layout(d: s.Dashboard, runs: list[str], only_rows: tuple[str, ...] = ()) -> list[tuple[Placed, str]]:
    """Grafana's layout at view time: a panel repeated per run becomes one copy per selected run
    (REPEAT_MAX_PER_ROW per line, full width); panels below move down; a collapsed row is one line.
    ``only_rows``: the rows a first screen shows (the others left out)."""
    out: list[tuple[Placed, str]] = []
    shift = 0
    placed = layout(d)
    if only_rows:
        keep = [pl for pl in placed if (pl.row.title if pl.row is not None else
                                        next(r for r in d.rows if pl.panel in r.panels).title) in only_rows]
        top = min(pl.y for pl in keep)
        placed = [Placed(pl.id, pl.x, pl.y - top, pl.w, pl.h, row=pl.row, panel=pl.panel) for pl in keep]
    for pl in placed:
        if pl.row is not None:
            out.append((Placed(pl.id, pl.x, pl.y + shift, pl.w, pl.h, row=pl.row), ""))
            continue
        row = next(r for r in d.rows if pl.panel in r.panels)
        if row.collapsed:
            continue
        if not pl.panel.repeat or not runs:
            out.append((Placed(pl.id, pl.x, pl.y + shift, pl.w, pl.h, panel=pl.panel), ""))
            continue
        per_row = min(REPEAT_MAX_PER_ROW, len(runs))
        w = GRID_COLUMNS // per_row
        for k, run in enumerate(runs):
            out.append((Placed(pl.id, (k % per_row) * w, pl.y + shift + (k // per_row) * pl.h, w, pl.h,
                               panel=pl.panel), run))
        shift += (math.ceil(len(runs) / per_row) - 1) * pl.h
    return out


def _runs_text(project: str, experiment: str) -> str:
    """The selection in words: "all runs" for the default regexes (the title read "(.* / .*)")."""
    if project == ".*" and experiment == ".*":
        return "all runs"
    return f"{'all projects' if project == '.*' else project} / {'all experiments' if experiment == '.*' else experiment}"


def _duration_text(minutes: float) -> str:
    """A readable range ("45 s", "3 min", "2.5 h"): the title read "last 2.80171 min"."""
    if minutes < 1:
        return f"{round(minutes * 60)} s"
    if minutes < 120:
        return f"{round(minutes)} min"
    return f"{minutes / 60:.1f} h"


def render_dashboard(d: s.Dashboard, prom: PromAPI, out: Path, minutes: float = 30.0, project: str = ".*",
                     experiment: str = ".*", only_rows: tuple[str, ...] = (), name: str | None = None) -> Path:
    """``d`` drawn as a PNG ``out/<uid>.png`` (``name``: another file name); ``only_rows``: a first screen."""
    end = time.time()
    start = end - minutes * 60
    step = max(1.0, (end - start) / 300)
    rate_interval = f"{max(4 * int(step), 15)}s"
    window = default_window(prom, project, experiment)
    metrics = "|".join(d.variable_metrics or ("omniwatch_step",))
    runs = sorted(prom.label_values("experiment", substitute(f'{{__name__=~"{metrics}", {s.RUN_MATCHERS}}}',
                                                             project, experiment)))

    def substituter(exp: str):
        def subst(expr):
            return substitute(expr, project, exp, rate_interval, f"{int(step)}s", window)
        return subst

    placed = render_layout(d, runs, only_rows)
    rows = max(pl.y + pl.h for pl, _ in placed)
    fig = plt.figure(figsize=(16, rows * ROW_UNIT_IN + 0.9), dpi=80)  # the dpi it is saved at: text measured as drawn
    fig.suptitle(f"{d.title}   ({_runs_text(project, experiment)}, last {_duration_text(minutes)}; "
                 f"window = {window} typical steps of each run)", fontsize=11,
                 x=0.01, y=1 - 0.15 / (rows * ROW_UNIT_IN + 0.9), ha="left", va="top")
    top = 1 - 0.9 / (rows * ROW_UNIT_IN + 0.9)
    for pl, run in placed:
        left, width = pl.x / GRID_COLUMNS, pl.w / GRID_COLUMNS
        bottom = top * (1 - (pl.y + pl.h) / rows)
        height = top * pl.h / rows
        if pl.row is not None:
            mark = " (collapsed)" if pl.row.collapsed else ""
            fig.text(0.005, bottom + height / 2, pl.row.title + mark, fontsize=9, weight="bold", va="center")
            continue
        # a time series, a state timeline and an XY chart keep room for their legends; every panel for its tick
        # labels, as long as its unit makes them ("0.0 GPU-h/day" was cut to "-h/day" at the page's left edge)
        pad = max(0.03 * width, (6 + 3.3 * _tick_chars(pl.panel.unit)) / (72 * fig.get_figwidth()))
        beside = pl.panel.kind in ("timeseries", "statetimeline", "xychart")
        plot_w = (0.7 if beside else 0.92) * width - (pad - 0.03 * width)
        ax = fig.add_axes([left + pad, bottom + 0.18 * height, plot_w, 0.66 * height])
        title = pl.panel.title.replace("$experiment", run) if run else pl.panel.title
        subst = substituter(prom_regex_escape(run) if run else experiment)
        _draw_panel(ax, pl.panel, prom, start, end, step, subst, title)
        keep_tick_labels_inside(ax, left)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (name or f"{d.uid}.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


FIRST_SCREEN = ("Now", "Why slow")  # what the overview shows before any scrolling


def render_first_screens(prometheus_url: str, out: Path, runs: list[tuple[str, str, str]], minutes: float = 10.0,
                         dashboard=None) -> list[Path]:
    """The overview's first screen (``FIRST_SCREEN``) of each run, one PNG per ``(project, experiment, fault)``:
    ``first-screen-<fault>.png`` (docs/dashboards.md shows one per fault)."""
    prom = PromAPI(prometheus_url)
    try:
        if dashboard is None:
            from ..config import DEFAULT
            dashboard = drawn(DEFAULT)[0]
        return [render_dashboard(dashboard, prom, out, minutes, prom_regex_escape(project),
                                 prom_regex_escape(experiment), FIRST_SCREEN, f"first-screen-{fault}.png")
                for project, experiment, fault in runs]
    finally:
        prom.close()


def render_all(prometheus_url: str, out: Path, minutes: float = 30.0, project: str = ".*", experiment: str = ".*",
               dashboards=None) -> list[Path]:
    prom = PromAPI(prometheus_url)
    try:
        if dashboards is None:
            from ..config import DEFAULT
            dashboards = drawn(DEFAULT)
        return [render_dashboard(d, prom, out, minutes, project, experiment) for d in dashboards]
    finally:
        prom.close()
