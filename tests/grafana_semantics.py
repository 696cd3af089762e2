"""What Grafana does with a panel before Prometheus sees its query, ported from Grafana's source, so a test can run
a generated panel exactly as Grafana would over a backfilled dataset (issue 26, Proof).

- **interval** (``$__interval``): ``calculateInterval(range, resolution, lowLimit)`` and ``roundInterval`` of
  grafana/grafana ``packages/grafana-data/src/datetime/rangeutil.ts`` (commit 0aff354e847331158a17a497ff48aa41b20e68b5):
  range / resolution rounded to Grafana's ladder, never below the low limit (the panel's or query's min interval,
  else the data source's scrape interval). The resolution is the panel's ``maxDataPoints``, else its width in pixels.
- **the Prometheus step**: at least range / 11,000 (Prometheus refuses more points per series).
- **``$__rate_interval``**: max(``$__interval`` + scrape interval, 4 x scrape interval) (Grafana's documented rule).
- **template variables**: a multi-value variable set to "All" becomes its ``allValue`` (``.*`` for the run
  variables); a panel repeated by ``$experiment`` is queried once per selected value, the value regex-escaped
  (``verify.prom_regex_escape``); a custom variable (``$window``) takes its current value.

The transformations the generated tables and XY charts use (merge, groupBy, partitionByValues) are exercised by
tests/test_dashboards_iii.py through promtool; this harness covers the time-series panels' queries.
"""
from __future__ import annotations

from dataclasses import dataclass

from omniwatch.dashboards.verify import DEFAULT_WINDOW, prom_regex_escape, substitute

GRID_COLUMNS = 24
DASHBOARD_WIDTH_PX = 1920
PROM_MAX_POINTS = 11000

# roundInterval's ladder: (below this many ms, round to this many ms), in Grafana's order.
_ROUND = ((10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000), (3500, 2000),
          (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000), (90000, 60000),
          (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000), (1500000, 1200000),
          (2700000, 1800000), (5400000, 3600000), (9000000, 7200000), (16200000, 10800000),
          (32400000, 21600000), (86400000, 43200000), (604800000, 86400000), (1814400000, 604800000),
          (3628800000, 2592000000))


def round_interval(ms: float) -> int:
    """grafana-data rangeutil.roundInterval."""
    for below, rounded in _ROUND:
        if ms < below:
            return rounded
    return 31536000000


def interval_ms(text: str) -> int:
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    for u in ("ms", "s", "m", "h", "d"):
        if text.endswith(u) and text[: -len(u)].replace(".", "", 1).isdigit():
            return int(float(text[: -len(u)]) * units[u])
    return int(float(text) * 1000)


def calculate_interval(range_ms: float, resolution: int, low_limit: str | None) -> int:
    """grafana-data rangeutil.calculateInterval (milliseconds)."""
    low = interval_ms(low_limit) if low_limit else 1
    return max(round_interval(range_ms / resolution), low)


@dataclass(frozen=True)
class Request:
    expr: str
    start: float
    end: float
    step: float
    interval_s: float


def panel_width_px(panel: dict) -> int:
    return int(panel["gridPos"]["w"] * DASHBOARD_WIDTH_PX / GRID_COLUMNS)


def requests(panel: dict, start: float, end: float, *, scrape: str = "15s", experiments: list[str] | None = None,
             window: str | None = None) -> list[tuple[str | None, list[Request]]]:
    """The range queries Grafana sends for ``panel`` over [start, end]: one list per copy (a panel repeated by
    $experiment: one per value of ``experiments``; otherwise one with $experiment = All)."""
    range_ms = (end - start) * 1000
    resolution = panel.get("maxDataPoints") or panel_width_px(panel)
    copies = experiments if panel.get("repeat") else [None]
    out = []
    for exp in copies:
        reqs = []
        for t in panel["targets"]:
            low = t.get("interval") or panel.get("interval") or scrape
            iv = calculate_interval(range_ms, resolution, low) / 1000
            step = max(iv, (end - start) / PROM_MAX_POINTS)
            rate_iv = max(iv + interval_ms(scrape) / 1000, 4 * interval_ms(scrape) / 1000)
            expr = substitute(t["expr"], experiment=prom_regex_escape(exp) if exp else ".*",
                              rate_interval=f"{int(rate_iv)}s", interval=f"{int(iv)}s",
                              window=window or DEFAULT_WINDOW, range_=f"{int(end - start)}s")
            reqs.append(Request(expr, start, end, step, iv))
        out.append((exp, reqs))
    return out


def variable_current(doc: dict, name: str) -> str:
    """The current value a dashboard's JSON gives a variable (what Grafana uses until the user picks another)."""
    v = next(v for v in doc["templating"]["list"] if v["name"] == name)
    return str(v["current"]["value"])


def run(prom, req: Request) -> dict[tuple, list[tuple[float, float]]]:
    """The range query's series: {sorted label items: [(t, value), ...]}."""
    data = prom.query_range_data(req.expr, req.start, req.end, req.step)
    return {tuple(sorted(r["metric"].items())): [(float(t), float(v)) for t, v in r["values"]]
            for r in data.get("result", [])}
