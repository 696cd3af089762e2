"""The one factory: dashboard specs -> grafana-foundation-sdk builders -> Grafana JSON.

Everything that must be the same on every dashboard lives here and nowhere else: the datasource
variable and the ``${datasource}`` reference on every panel and query, the run variables (and the
run-scoped node/gpu variables), panel ids (1, 2, 3 ... in layout order), refIds (A, B, C ... per
panel), the grid layout (24 columns, rows first, panels wrapped left to right), legends and
tooltips, and the ALERTS annotation on every time series.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

from grafana_foundation_sdk.builders import bargauge, stat, timeseries
from grafana_foundation_sdk.builders.common import (
    GraphThresholdsStyleConfig, ReduceDataOptions, StackingConfig, VizLegendOptions, VizTooltipOptions)
from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery, Dashboard as SdkDashboard, DatasourceVariable, QueryVariable, Row as SdkRow, ThresholdsConfig)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode, BigValueGraphMode, GraphThresholdsStyleMode, LegendDisplayMode, LegendPlacement,
    SortOrder, StackingMode, TooltipDisplayMode, VizOrientation)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync, DataSourceRef, DynamicConfigValue, GridPos, Threshold, ThresholdsMode, VariableOption,
    VariableRefresh, VariableSort)

from .. import names as n
from . import spec as s

PROM = DataSourceRef(type_val="prometheus", uid=s.DATASOURCE_UID)
GRID_COLUMNS = 24
REF_IDS = string.ascii_uppercase


@dataclass(frozen=True)
class Placed:
    """A row header or a panel with its id and grid position (shared by the JSON and the PNG renderer)."""
    id: int
    x: int
    y: int
    w: int
    h: int
    row: s.Row | None = None
    panel: s.Panel | None = None


def layout(d: s.Dashboard) -> list[Placed]:
    """Rows stacked top to bottom; inside a row, panels left to right, wrapping at 24 columns."""
    out: list[Placed] = []
    y, next_id = 0, 1
    for row in d.rows:
        out.append(Placed(next_id, 0, y, GRID_COLUMNS, 1, row=row))
        next_id += 1
        y += 1
        x, line_h = 0, 0
        for p in row.panels:
            if x + p.w > GRID_COLUMNS:
                y, x, line_h = y + line_h, 0, 0
            out.append(Placed(next_id, x, y, p.w, p.h, panel=p))
            next_id += 1
            x += p.w
            line_h = max(line_h, p.h)
        y += line_h
    return out


def _var_query(label: str, metrics: tuple[str, ...], extra: str) -> str:
    matchers = [f'__name__=~"{"|".join(metrics)}"'] + ([extra] if extra else [])
    return f"label_values({{{', '.join(matchers)}}}, {label})"


def _query_var(name: str, label: str, query: str, all_value: str | None):
    v = (QueryVariable(name).label(label).datasource(PROM).query(query)
         .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
         .multi(True).include_all(True).current(VariableOption(selected=True, text="All", value="$__all")))
    # project/experiment: All = ".*" (any run). node/gpu: no custom all value, so All is the regex of the
    # listed values, i.e. only the nodes of the selected runs.
    return v.all_value(all_value) if all_value is not None else v


def variables(d: s.Dashboard) -> list:
    metrics = d.variable_metrics or (n.STEP,)
    out = [
        DatasourceVariable(s.V_DATASOURCE).label("Data source").type("prometheus"),
        _query_var(s.V_PROJECT, "Project", _var_query(n.L_PROJECT, metrics, ""), ".*"),
        _query_var(s.V_EXPERIMENT, "Experiment",
                   _var_query(n.L_EXPERIMENT, metrics, f'{n.L_PROJECT}=~"${s.V_PROJECT}"'), ".*"),
    ]
    if d.gpu_variables:
        gm = d.gpu_variable_metrics
        out.append(_query_var(s.V_NODE, "Node", _var_query(n.L_NODE, gm, s.RUN_MATCHERS), None))
        out.append(_query_var(s.V_GPU, "GPU", _var_query(n.L_GPU, gm, s.RUN_MATCHERS + f', {n.L_NODE}=~"${s.V_NODE}"'),
                              None))
    return out


def alert_annotation() -> AnnotationQuery:
    """Firing omniwatch alerts of the selected runs, shown on every time series of the dashboard."""
    return (AnnotationQuery().name("omniwatch alerts").datasource(PROM).enable(True).hide(False)
            .icon_color("red").expr(s.sel(s.ALERTS, alertstate="firing")))


def _thresholds(steps: tuple[s.Step, ...]) -> ThresholdsConfig:
    steps = steps or (s.Step(None, "green"),)
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([Threshold(value=st.value, color=st.color)
                                                                     for st in steps])


def _query(t: s.Target, ref: str) -> Dataquery:
    q = Dataquery().expr(t.expr).legend_format(t.legend).ref_id(ref).datasource(PROM)
    return q.instant() if t.instant else q.range()


def _common(b, p: s.Panel, pl: Placed):
    b = (b.id(pl.id).title(p.title).description(p.full_description).datasource(PROM).unit(p.unit)
         .grid_pos(GridPos(h=pl.h, w=pl.w, x=pl.x, y=pl.y)).thresholds(_thresholds(p.thresholds)))
    if p.min is not None:
        b = b.min(p.min)
    if p.max is not None:
        b = b.max(p.max)
    for i, t in enumerate(p.targets):
        b = b.with_target(_query(t, REF_IDS[i]))
    return b


def _timeseries(p: s.Panel, pl: Placed):
    b = (timeseries.Panel().line_width(1).fill_opacity(25 if p.stack else 8).span_nulls(True)
         .legend(VizLegendOptions().display_mode(LegendDisplayMode.TABLE).placement(LegendPlacement.BOTTOM)
                 .show_legend(True).calcs(["lastNotNull", "max"]))
         .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)))
    if p.stack:
        b = b.stacking(StackingConfig().mode(StackingMode.NORMAL))
    if p.show_thresholds:
        b = b.thresholds_style(GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode(p.show_thresholds)))
    b = _common(b, p, pl)
    for i, t in enumerate(p.targets):
        if t.dashed:
            b = b.override_by_query(REF_IDS[i], [DynamicConfigValue(
                id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})])
    return b


def _stat(p: s.Panel, pl: Placed):
    b = (stat.Panel().graph_mode(BigValueGraphMode.AREA).color_mode(BigValueColorMode.VALUE)
         .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    return _common(b, p, pl)


def _bargauge(p: s.Panel, pl: Placed):
    b = (bargauge.Panel().orientation(VizOrientation.HORIZONTAL)
         .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    return _common(b, p, pl)


BUILDERS = {"timeseries": _timeseries, "stat": _stat, "bargauge": _bargauge}


def build(d: s.Dashboard) -> SdkDashboard:
    if len(max((p.targets for p in d.panels()), key=len)) > len(REF_IDS):
        raise ValueError(f"{d.uid}: more targets in a panel than refIds")
    b = (SdkDashboard(d.title).uid(d.uid).description(d.description).tags(list(d.tags)).refresh("30s")
         .time("now-6h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR).editable()
         .annotation(alert_annotation()))
    for v in variables(d):
        b = b.with_variable(v)
    for pl in layout(d):
        if pl.row is not None:
            b = b.with_row(SdkRow(pl.row.title).id(pl.id).collapsed(False)
                           .grid_pos(GridPos(h=1, w=GRID_COLUMNS, x=0, y=pl.y)))
        else:
            b = b.with_panel(BUILDERS[pl.panel.kind](pl.panel, pl))
    return b


def to_json(d: s.Dashboard) -> str:
    """Stable JSON text (sorted keys, 2-space indent, trailing newline)."""
    return JSONEncoder(sort_keys=True, indent=2).encode(build(d).build()) + "\n"
