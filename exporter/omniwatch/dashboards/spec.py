"""Declarative panel specs (Ray-style): a dashboard is data, one factory turns it into SDK builders.

A spec says *what* a panel shows (title, description with the bad shape and its runbook, unit,
PromQL targets, thresholds, kind, size); layout, panel ids, refIds, datasource references and the
variables are the factory's job, so every dashboard gets them the same way. PromQL is written with
the selector helpers below, which put the dashboard variables into every query exactly once:
``sel(metric)`` filters by the run (``$project``/``$experiment``), ``gsel(metric)`` by the run-scoped
``$node``/``$gpu`` variables, and rates always use ``$__rate_interval``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import names as n

# Grafana variables and macros, named once.
V_DATASOURCE = "datasource"
V_PROJECT = "project"
V_EXPERIMENT = "experiment"
V_NODE = "node"
V_GPU = "gpu"
RATE_INTERVAL = "$__rate_interval"
ALERTS = "ALERTS"  # Prometheus' synthetic series of pending/firing alerts
DATASOURCE_UID = "${datasource}"
PROVISIONED_UID = "omniwatch-prometheus"  # the uid docker-compose provisions (dashboards/provisioning/datasources)

RUN_MATCHERS = f'{n.L_PROJECT}=~"${V_PROJECT}", {n.L_EXPERIMENT}=~"${V_EXPERIMENT}"'
GPU_MATCHERS = f'{n.L_NODE}=~"${V_NODE}", {n.L_GPU}=~"${V_GPU}"'

KINDS = ("timeseries", "stat", "bargauge")


def _selector(metric: str, base: str, extra: dict[str, str] | None) -> str:
    parts = [base]
    for label, value in (extra or {}).items():
        # value "=~x" / "!=x" / "!~x" keeps its operator; a bare value means equality.
        op, val = ("=", value)
        for candidate in ("=~", "!~", "!="):
            if value.startswith(candidate):
                op, val = candidate, value[len(candidate):]
                break
        parts.append(f'{label}{op}"{val}"')
    return f"{metric}{{{', '.join(parts)}}}"


def sel(metric: str, **extra: str) -> str:
    """``metric{project=~"$project", experiment=~"$experiment", extra...}``."""
    return _selector(metric, RUN_MATCHERS, extra)


def gsel(metric: str, run: bool = False, **extra: str) -> str:
    """Selector for per-GPU series: ``node=~"$node", gpu=~"$gpu"`` (+ the run matchers when the
    series carries them). omniwatch's NVML gauges are per device, not per run; the ``node`` variable
    is scoped to the selected runs, which is what ties them to a run."""
    base = (RUN_MATCHERS + ", " + GPU_MATCHERS) if run else GPU_MATCHERS
    return _selector(metric, base, extra)


def rate(selector: str) -> str:
    return f"rate({selector}[{RATE_INTERVAL}])"


def hist_quantile(q: float, metric_base: str, by: str, **extra: str) -> str:
    """``histogram_quantile`` over a histogram's ``_bucket`` rate, keeping the ``by`` labels."""
    return f"histogram_quantile({q}, sum by (le, {by}) ({rate(sel(metric_base + '_bucket', **extra))}))"


def hist_mean(metric_base: str, by: str, **extra: str) -> str:
    """Mean from ``_sum``/``_count`` rates (what a histogram says without bucket interpolation)."""
    return (f"sum by ({by}) ({rate(sel(metric_base + '_sum', **extra))}) / "
            f"sum by ({by}) ({rate(sel(metric_base + '_count', **extra))})")


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = "__auto"
    dashed: bool = False  # drawn as a dashed line (a reference such as 0.7 x baseline)
    instant: bool = False


@dataclass(frozen=True)
class Step:
    """One threshold step: from ``value`` (None = base) upwards the colour is ``color``."""
    value: float | None
    color: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"
    thresholds: tuple[Step, ...] = ()
    show_thresholds: str = ""  # timeseries: "" off, "dashed", "line+area", "dashed+area"
    stack: bool = False
    min: float | None = None
    max: float | None = None
    w: int = 12
    h: int = 8
    runbook: str = ""  # alert name whose runbook applies; linked at the end of the description

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"panel {self.title!r}: kind {self.kind!r} not in {KINDS}")
        if not self.targets:
            raise ValueError(f"panel {self.title!r} has no targets")
        if not 1 <= self.w <= 24:
            raise ValueError(f"panel {self.title!r}: width {self.w} outside 1..24")

    @property
    def full_description(self) -> str:
        if not self.runbook:
            return self.description
        from ..alerting.config import DEFAULT
        url = DEFAULT.runbook_url(self.runbook)
        return f"{self.description}\n\nRunbook: [{self.runbook}]({url})"


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = ()
    gpu_variables: bool = False  # add the run-scoped node / gpu variables
    variable_metrics: tuple[str, ...] = ()  # series the project/experiment variables are read from
    gpu_variable_metrics: tuple[str, ...] = ()  # series the node/gpu variables are read from (run-labelled)

    def panels(self):
        for row in self.rows:
            yield from row.panels


def dashboard_ids(dashboards) -> None:
    """Import-time check: uids unique, titles unique within a dashboard."""
    seen = set()
    for d in dashboards:
        if d.uid in seen:
            raise ValueError(f"duplicate dashboard uid {d.uid}")
        seen.add(d.uid)
        titles = [p.title for p in d.panels()]
        dup = {t for t in titles if titles.count(t) > 1}
        if dup:
            raise ValueError(f"{d.uid}: duplicate panel titles {sorted(dup)}")


def default_tags(*extra: str) -> tuple[str, ...]:
    return ("omniwatch", "generated", *extra)


__all__ = ["Dashboard", "Row", "Panel", "Target", "Step", "sel", "gsel", "rate", "hist_quantile", "hist_mean",
           "RATE_INTERVAL", "DATASOURCE_UID", "PROVISIONED_UID"]
