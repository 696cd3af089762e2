"""The one factory: dashboard specs -> grafana-foundation-sdk builders -> Grafana JSON.

Everything that must be the same on every dashboard lives here and nowhere else: the datasource
variable and the ``${datasource}`` reference on every panel and query, the run variables (and the
run-scoped node/gpu variables, and ``$window``, typical steps per run, where a panel reads per-step counters), panel ids
(1, 2, 3 ... in layout order), refIds (A, B, C ... per panel), the grid layout (24 columns, rows first,
panels wrapped left to right; a collapsed row keeps its panels inside it), legends and tooltips, the
links (the five dashboards to each other keeping time and variables; a runbook link on every panel tied
to an alert; data links from a run's series to that run on the other dashboards) and the annotations
(firing alerts titled by alert name and tagged with run and severity; validation / checkpoint steps;
trainer restarts).

Where grafana-foundation-sdk 11.6 has no typed field, the raw escape hatch is used and said so:
transformations are ``DataTransformerConfig(id, options=<dict>)`` (the SDK types the envelope, not the
options of ``merge`` / ``groupBy`` / ``sortBy`` / ``partitionByValues`` / ``organize``), and the
Prometheus annotation fields (``titleFormat``, ``tagKeys``, ``textFormat``, ``useValueForTime``, the
``target`` query) are added by :class:`PromAnnotation`, a subclass of the SDK's ``AnnotationQuery``
model whose ``to_json`` writes them (the model only knows the generic fields).
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, statetimeline, table, timeseries, xychart
from grafana_foundation_sdk.builders.common import (
    GraphThresholdsStyleConfig, HeatmapCalculationBucketConfig, HeatmapCalculationOptions, ReduceDataOptions,
    ScaleDistributionConfig, StackingConfig, TableSortByFieldState, VizLegendOptions, VizTooltipOptions)
from grafana_foundation_sdk.builders.dashboard import (
    CustomVariable, Dashboard as SdkDashboard, DashboardLink, DatasourceVariable, QueryVariable, Row as SdkRow, ThresholdsConfig)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import xychart as xm
from grafana_foundation_sdk.models.common import (
    BigValueColorMode, BigValueGraphMode, BigValueTextMode, GraphThresholdsStyleMode, HeatmapCalculationMode,
    LegendDisplayMode, LegendPlacement, ScaleDistribution, SortOrder, StackingMode, TableCellBackgroundDisplayMode,
    TableAutoCellOptions, TableColoredBackgroundCellOptions, TooltipDisplayMode, VisibilityMode, VizOrientation)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync, DashboardLinkType, DataSourceRef, DataTransformerConfig, DynamicConfigValue,
    Threshold, ThresholdsMode, ValueMap, ValueMappingResult, VariableOption, VariableRefresh,
    VariableSort)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from .. import names as n
from ..config import Config
from ..stack import PROFILES
from . import panels as s

PROM = DataSourceRef(type_val="prometheus", uid=s.DATASOURCE_UID)
GRID_COLUMNS = 24
REF_IDS = string.ascii_uppercase
REPEAT_MAX_PER_ROW = 2
# XY charts against step: a point per step needs a query step <= the training step, and a query step below
# the scrape interval only repeats the same sample (min interval 1 s fetched each step ~7.5 times: issue 26).
# Min interval = the default profile's scrape interval (stack.PROFILES); with Prometheus' 11,000-point cap a
# 6 h and 24 h range are queried every 15 s, 7 days every 1 m (Grafana rounds 55 s up). A step is never shorter
# than a scrape.
XY_INTERVAL = PROFILES["default"]["scrape_interval"]
XY_MAX_DATA_POINTS = 11000
ANNOTATION_STEP = "1m"


@dataclass(frozen=True)
class Placed:
    """A row header or a panel with its id and grid position (the renderer places panels where the JSON says)."""
    id: int
    x: int
    y: int
    w: int
    h: int
    row: s.Row | None = None
    panel: s.Panel | None = None


def numbered(d: s.Dashboard) -> list[tuple[int, s.Row | s.Panel]]:
    """Rows and panels in dashboard order with their ids (1, 2, 3 ...). Positions are the SDK's: the dashboard
    builder places each panel left to right and wraps at 24 columns (``Dashboard.with_panel`` / ``with_row``),
    so the specs give only widths and heights."""
    out: list[tuple[int, s.Row | s.Panel]] = []
    for row in d.rows:
        out.append((len(out) + 1, row))
        for p in row.panels:
            out.append((len(out) + 1, p))
    return out


def layout(d: s.Dashboard, config: Config | None = None) -> list[Placed]:
    """Each row and panel with the grid position the generated JSON gives it (the SDK's layout), drawn with
    ``config`` or the config the dashboard was built with."""
    doc = build(d, config or d.config).build()
    pos = {}
    for p in doc.panels:
        pos[p.id_val] = p.grid_pos
        for q in getattr(p, "panels", None) or []:
            pos[q.id_val] = q.grid_pos
    out = []
    for i, item in numbered(d):
        g = pos[i]
        kind = {"row": item} if isinstance(item, s.Row) else {"panel": item}
        out.append(Placed(i, g.x, g.y, g.w, g.h, **kind))
    return out


# --- variables -------------------------------------------------------------------------------------
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


def window_variable(config: Config):
    """``$window``: how many typical steps each run is read over (3, the alerts' window, is the default; 10 a
    longer view). A custom variable, not a query: each run's own window in seconds is computed inside the
    panel queries from its own typical step (spec.increase_w), never from the slowest selected run."""
    steps = s.window_steps(config)
    values = ",".join(str(k) for k in steps)
    first = str(steps[0])
    return (CustomVariable(s.V_WINDOW).label("Window (typical steps per run)").values(values)
            .current(VariableOption(selected=True, text=first, value=first)).multi(False).include_all(False))


def variables(d: s.Dashboard, config: Config) -> list:
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
    if d.uses_window:
        out.append(window_variable(config))
    return out


# --- annotations -----------------------------------------------------------------------------------
class PromAnnotation(dm.AnnotationQuery):
    """The SDK's AnnotationQuery plus the Prometheus annotation fields it does not model (Grafana 11.6's
    Prometheus annotation editor: the query in ``target`` with ``interval`` as min step; title, tags and
    text templates and "series value as timestamp" at the top level)."""

    def __init__(self, name: str, expr: str, color: str, title: str, tags: str, text: str,
                 step: str = ANNOTATION_STEP, enable: bool = True, exclude_panels: tuple[int, ...] = ()):
        flt = dm.AnnotationPanelFilter(exclude=True, ids=list(exclude_panels)) if exclude_panels else None
        super().__init__(name=name, datasource=PROM, enable=enable, hide=False, icon_color=color, expr=expr,
                         filter_val=flt)
        self.title_format, self.tag_keys, self.text_format, self.step = title, tags, text, step
        self.query = Dataquery().expr(expr).interval(step).ref_id("Anno").datasource(PROM).range().build()

    def to_json(self) -> dict[str, object]:
        out = super().to_json()
        out.update(target=self.query, titleFormat=self.title_format, tagKeys=self.tag_keys,
                   textFormat=self.text_format, useValueForTime=False, step=self.step)
        return out


class _Built(cogbuilder.Builder):
    def __init__(self, model):
        self.model = model

    def build(self):
        return self.model


# Annotation lookbacks: each point of an annotation query covers the whole interval since the previous one
# (Grafana's step for the query is $__interval, at least ANNOTATION_STEP), so an event shorter than the step
# (a validation step's flag, a restart) is not missed between two samples (issue 26 item 7).
ANNOTATION_LOOKBACK = "$__interval"


def annotations(d: s.Dashboard | None = None) -> list[PromAnnotation]:
    """On every dashboard: firing alerts (title = alert name; tags = run and severity; Watchdog left out),
    validation and checkpoint steps (they explain step-time spikes) and trainer restarts. Panels repeated per
    run are left out of the all-runs alert annotation (a run's copy would show every run's alerts; the Alerts
    row's timeline has them per run)."""
    repeated = tuple(i for i, p in numbered(d) if isinstance(p, s.Panel) and p.repeat) if d else ()
    return [
        PromAnnotation("omniwatch alerts", f"max by ({s.by_run('alertname', 'severity')}) "
                                           f"({s.alerts_sel(alertstate='firing')})",
                       "red", "{{alertname}}", "project,experiment,severity",
                       "{{alertname}} ({{severity}}) on {{project}}/{{experiment}}", exclude_panels=repeated),
        PromAnnotation("validation / checkpoint steps",
                       s.run_max(f"max_over_time({s.sel(n.STEP_FLAG, flag='=~validation|checkpoint')}"
                                 f"[{ANNOTATION_LOOKBACK}])", 'flag') + " == 1",
                       "blue", "{{flag}} step", "project,experiment,flag",
                       "{{project}}/{{experiment}}: the latest step was a {{flag}} step (left out of the windows)"),
        PromAnnotation("trainer restarts",
                       f"{s.run_max(f'changes({s.sel(n.TRAINER_RESTARTS_TOTAL)}[{ANNOTATION_LOOKBACK}])')} > 0",
                       "orange", "trainer restart", "project,experiment",
                       "{{project}}/{{experiment}}: the trainer restarted (log truncated or step counter went back); "
                       "baselines start again"),
    ]


# --- links -----------------------------------------------------------------------------------------
def dashboard_links() -> list:
    """The five dashboards, listed by their common tag, keeping the time range and the variables."""
    return [DashboardLink("omniwatch").type(DashboardLinkType.DASHBOARDS).tags([s.TAG]).as_dropdown(False)
            .keep_time(True).include_vars(True).target_blank(False)]


def runbook_links(p: s.Panel, config: Config) -> list:
    return [DashboardLink(f"Runbook: {a}").type(DashboardLinkType.LINK).url(config.runbook_url(a))
            .target_blank(True) for a in p.alerts]


# Filled by catalog.py (the dashboards a run's data links point at); uid -> title.
LINK_TARGETS: dict[str, str] = {}


def run_links(p: s.Panel, own_uid: str) -> list:
    """Data links from a run's series (labels) or row (table fields) to that run on the other dashboards."""
    if p.scope != "run":
        return []
    if p.kind == "table":
        proj, exp = "${__data.fields.project}", "${__data.fields.experiment}"
    else:
        proj, exp = "${__field.labels.project}", "${__field.labels.experiment}"
    out = []
    for uid, title in LINK_TARGETS.items():
        if uid == own_uid:
            continue
        url = (f"/d/{uid}/?var-{s.V_DATASOURCE}=${{{s.V_DATASOURCE}}}&var-{s.V_PROJECT}={proj}"
               f"&var-{s.V_EXPERIMENT}={exp}&${{__url_time_range}}")
        out.append(DashboardLink(f"{title}: {proj}/{exp}").type(DashboardLinkType.LINK).url(url))
    return out


# --- panels ----------------------------------------------------------------------------------------
def _thresholds(steps: tuple[s.Step, ...], config: Config) -> ThresholdsConfig:
    """Threshold steps as drawn under ``config``: a configured alert threshold takes that config's value."""
    steps = steps or (s.Step(None, "green"),)
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([Threshold(value=st.value_in(config), color=st.color)
                                                                     for st in steps])


def _threshold_model(steps: tuple[s.Step, ...], config: Config) -> dm.ThresholdsConfig:
    return _thresholds(steps, config).build()


def _query(t: s.Target, ref: str, p: s.Panel) -> Dataquery:
    q = Dataquery().expr(t.expr).legend_format(t.legend).ref_id(ref).datasource(PROM)
    if t.table:
        q = q.format(PromQueryFormat.TABLE)
    if p.kind == "xychart":
        q = q.interval(XY_INTERVAL)
    return q.instant() if t.instant else q.range()


def _value_maps(mappings: tuple[tuple[float, str, str], ...]) -> list:
    if not mappings:
        return []
    return [ValueMap({f"{v:g}": ValueMappingResult(text=text, color=color, index=i)
                      for i, (v, text, color) in enumerate(mappings)})]


def _mappings(p: s.Panel) -> list:
    return _value_maps(p.mappings)


def _common(b, p: s.Panel, pid: int, own_uid: str, config: Config):
    b = (b.id(pid).title(p.title).description(p.full_description(config)).datasource(PROM).unit(p.unit)
         .span(p.w).height(p.h).thresholds(_thresholds(p.thresholds, config)))
    if p.min is not None:
        b = b.min(p.min)
    if p.max is not None:
        b = b.max(p.max)
    if p.decimals is not None:
        b = b.decimals(p.decimals)
    if p.mappings:
        b = b.mappings(_mappings(p))
    if p.alerts:
        b = b.links(runbook_links(p, config))
    links = run_links(p, own_uid) + [DashboardLink(title).type(DashboardLinkType.LINK).url(url)
                                      for title, url in p.row_links]
    if links:
        b = b.data_links(links)
    if p.repeat:
        b = b.repeat(s.V_EXPERIMENT).repeat_direction("h").max_per_row(REPEAT_MAX_PER_ROW)
    for i, t in enumerate(p.targets):
        b = b.with_target(_query(t, REF_IDS[i], p))
    for regex, colour in s.series_colors(p):
        b = b.override_by_regexp(regex, [DynamicConfigValue(id_val="color",
                                                            value={"mode": "fixed", "fixedColor": colour})])
    return b


def _legend(calcs=("lastNotNull", "max")) -> VizLegendOptions:
    return (VizLegendOptions().display_mode(LegendDisplayMode.TABLE).placement(LegendPlacement.BOTTOM)
            .show_legend(True).calcs(list(calcs)))


def _tooltip() -> VizTooltipOptions:
    return VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)


def _dash(b, p: s.Panel):
    for i, t in enumerate(p.targets):
        if t.dashed:
            b = b.override_by_query(REF_IDS[i], [DynamicConfigValue(
                id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})])
    return b


def _timeseries(p: s.Panel, pid: int, uid: str, config: Config):
    # A panel on step-window ratios shows a stall as the gap it is (the ratio has no value while no step
    # comes); bridging it with spanNulls would draw a 3 h hang as a slow drift (issue 26 item 5).
    b = (timeseries.Panel().line_width(1).fill_opacity(25 if p.stack else 8).span_nulls(not s.reads_step_window(p))
         .legend(_legend()).tooltip(_tooltip()))
    if p.stack:
        b = b.stacking(StackingConfig().mode(StackingMode.NORMAL))
    if p.show_thresholds:
        b = b.thresholds_style(GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode(p.show_thresholds)))
    if p.log_scale:
        b = b.scale_distribution(ScaleDistributionConfig().type(ScaleDistribution.LOG).log(10))
    return _dash(_common(b, p, pid, uid, config), p)


def _stat(p: s.Panel, pid: int, uid: str, config: Config):
    b = (stat.Panel().graph_mode(BigValueGraphMode.AREA).color_mode(BigValueColorMode.VALUE)
         .text_mode(BigValueTextMode.VALUE_AND_NAME if len(p.targets) > 1 or p.scope == "run" else BigValueTextMode.AUTO)
         .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if p.mappings:
        b = b.color_mode(BigValueColorMode.BACKGROUND).graph_mode(BigValueGraphMode.NONE)
    return _common(b, p, pid, uid, config)


def _bargauge(p: s.Panel, pid: int, uid: str, config: Config):
    b = (bargauge.Panel().orientation(VizOrientation.HORIZONTAL)
         .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    return _common(b, p, pid, uid, config)


def value_field(p: s.Panel, i: int) -> str:
    """The name Grafana gives the value column of target ``i`` in a table-format response."""
    return f"Value #{REF_IDS[i]}" if len(p.targets) > 1 else "Value"


def _table(p: s.Panel, pid: int, uid: str, config: Config):
    """Instant table-format queries, one row per run (or per label set): merge joins them on their labels;
    each value column is named by its target's legend and coloured by its thresholds."""
    b = table.Panel().show_header(True)
    if p.sort_desc:
        b = b.sort_by([TableSortByFieldState().display_name(p.sort_desc).desc(True)])
    b = _common(b, p, pid, uid, config)
    labels = [n.L_PROJECT, n.L_EXPERIMENT]
    order = {name: i for i, name in enumerate(labels)}
    b = b.with_transformation(DataTransformerConfig(id_val="merge", options={}))
    values = {value_field(p, i) for i in range(len(p.targets))}
    if p.columns:
        order = {name: i for i, (name, _, _) in enumerate(p.columns)}
    for i, t in enumerate(p.targets):
        order.setdefault(value_field(p, i), len(order))
    exclude = {"Time": True, "__name__": True, "job": True, "instance": True, **{c: True for c in p.hide_columns}}
    rename = {name: shown for name, shown, _ in p.columns if name not in values and shown != name}
    b = b.with_transformation(DataTransformerConfig(id_val="organize", options={
        "excludeByName": exclude, "indexByName": order, "renameByName": rename}))
    for name, shown, option in p.columns:
        if option == "wrap":  # a long text (a remedy): wrapped in its cell, shown whole on click
            b = b.override_by_name(shown if name not in values else name, [
                DynamicConfigValue(id_val="custom.cellOptions", value=TableAutoCellOptions(wrap_text=True)),
                DynamicConfigValue(id_val="custom.inspect", value=True),
                DynamicConfigValue(id_val="custom.minWidth", value=320)])
    for i, t in enumerate(p.targets):
        props = [DynamicConfigValue(id_val="displayName", value=t.legend)]
        if t.unit:
            props.append(DynamicConfigValue(id_val="unit", value=t.unit))
        if t.mappings:  # a coded column (the stall stage): its text and colour per value
            props.append(DynamicConfigValue(id_val="mappings", value=_value_maps(t.mappings)))
        if t.thresholds:
            props += [DynamicConfigValue(id_val="thresholds", value=_threshold_model(t.thresholds, config)),
                      DynamicConfigValue(id_val="color", value={"mode": "thresholds"})]
        if t.thresholds or t.mappings:
            props.append(DynamicConfigValue(id_val="custom.cellOptions", value=TableColoredBackgroundCellOptions(
                mode=TableCellBackgroundDisplayMode.BASIC)))
        b = b.override_by_name(value_field(p, i), props)
    return b


def _statetimeline(p: s.Panel, pid: int, uid: str, config: Config):
    b = (statetimeline.Panel().show_value(VisibilityMode.NEVER).merge_values(True).row_height(0.8)
         .legend(VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
                 .placement(LegendPlacement.BOTTOM))
         .tooltip(_tooltip()))
    return _common(b, p, pid, uid, config)


def _grafana_legend(template: str) -> str:
    """``{{label}}`` (query legend) -> ``${__field.labels.label}`` (field display name template)."""
    return re.sub(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", r"${__field.labels.\1}", template)


def xy_transformations(p: s.Panel) -> list[DataTransformerConfig]:
    """Step-axis recipe (Grafana 11.6): table-format range queries -> merge (one row per timestamp and
    run) -> group by run and step (last value per step) -> sort by step -> partition by run (one frame,
    hence one XY series, per run). ``Panel.xy_labels`` (the validation reward's ``key``) are grouped and
    partitioned on like the run: one series per run and key, none dropped."""
    step_field = value_field(p, 0)
    run_labels = [n.L_PROJECT, n.L_EXPERIMENT, *p.xy_labels]
    fields = {label: {"operation": "groupby", "aggregations": []} for label in run_labels}
    fields[step_field] = {"operation": "groupby", "aggregations": []}
    for i in range(1, len(p.targets)):
        fields[value_field(p, i)] = {"operation": "aggregate", "aggregations": ["lastNotNull"]}
    return [
        DataTransformerConfig(id_val="merge", options={}),
        DataTransformerConfig(id_val="groupBy", options={"fields": fields}),
        DataTransformerConfig(id_val="sortBy", options={"fields": {}, "sort": [{"field": step_field, "desc": False}]}),
        DataTransformerConfig(id_val="partitionByValues", options={
            "fields": run_labels, "keepFields": False}),
    ]


def _xychart(p: s.Panel, pid: int, uid: str, config: Config):
    step_field = value_field(p, 0)
    b = (xychart.Panel().mapping(xm.SeriesMapping.AUTO)
         .series([xychart.XYSeriesConfig().x(xychart.XychartXYSeriesConfigX().matcher(
             xychart.MatcherConfig().id("byName").options(step_field)))])
         .show(xm.XYShowMode.POINTS_AND_LINES).point_size(xychart.XychartFieldConfigPointSize().fixed(3))
         .line_width(1).legend(_legend(("lastNotNull",))).tooltip(_tooltip())
         .max_data_points(XY_MAX_DATA_POINTS).interval(XY_INTERVAL))
    if p.log_scale:
        b = b.scale_distribution(ScaleDistributionConfig().type(ScaleDistribution.LOG).log(10))
    b = _common(b, p, pid, uid, config)
    for t in xy_transformations(p):
        b = b.with_transformation(t)
    b = b.override_by_name(step_field, [DynamicConfigValue(id_val="displayName", value="step"),
                                        DynamicConfigValue(id_val="unit", value="none"),
                                        DynamicConfigValue(id_val="decimals", value=0)])
    for i, t in enumerate(p.targets[1:], start=1):
        props = [DynamicConfigValue(id_val="displayName", value=_grafana_legend(t.legend))]
        if t.dashed:
            props.append(DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}))
        b = b.override_by_name(f"{value_field(p, i)} (lastNotNull)", props)
    return b


def _heatmap(p: s.Panel, pid: int, uid: str, config: Config):
    """Distribution of the series' values over time (e.g. every GPU's busy share): calculated buckets."""
    b = (heatmap.Panel().calculate(True)
         .calculation(HeatmapCalculationOptions().y_buckets(
             HeatmapCalculationBucketConfig().mode(HeatmapCalculationMode.SIZE).value("0.05")))
         .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges")
                .scale(hm.HeatmapColorScale.EXPONENTIAL).fill("dark-orange"))
         .cell_gap(1).show_value(VisibilityMode.NEVER).hide_legend())
    return _common(b, p, pid, uid, config)


BUILDERS = {"timeseries": _timeseries, "stat": _stat, "bargauge": _bargauge, "table": _table,
            "statetimeline": _statetimeline, "xychart": _xychart, "heatmap": _heatmap}


def build(d: s.Dashboard, config: Config) -> SdkDashboard:
    """The SDK dashboard of spec ``d`` with ``config``'s thresholds, runbook links and default window."""
    if len(max((p.targets for p in d.panels()), key=len)) > len(REF_IDS):
        raise ValueError(f"{d.uid}: more targets in a panel than refIds")
    b = (SdkDashboard(d.title).uid(d.uid).description(d.description).tags(list(d.tags)).refresh("30s")
         .time("now-6h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR).editable())
    for a in annotations(d):
        b = b.annotation(_Built(a))
    for link in dashboard_links():
        b = b.link(link)
    for v in variables(d, config):
        b = b.with_variable(v)
    row = None
    for i, item in numbered(d):
        if isinstance(item, s.Row):
            if row is not None:
                b = b.with_row(row)
            row = SdkRow(item.title).id(i).collapsed(item.collapsed)
            if not item.collapsed:
                b, row = b.with_row(row), None
            continue
        panel = BUILDERS[item.kind](item, i, d.uid, config)
        if row is not None:          # a collapsed row holds its panels
            row = row.with_panel(panel)
        else:
            b = b.with_panel(panel)
    if row is not None:
        b = b.with_row(row)
    return b


def to_json(d: s.Dashboard, config: Config) -> str:
    """Stable JSON text (sorted keys, 2-space indent, trailing newline) of ``d`` drawn with ``config``."""
    return JSONEncoder(sort_keys=True, indent=2).encode(build(d, config).build()) + "\n"
