"""Declarative panel specs (Ray-style): a dashboard is data, one factory turns it into SDK builders.

A spec says *what* a panel shows (title, description with the bad shape, unit, PromQL targets,
thresholds, kind, size, whether it repeats per run); layout, panel ids, refIds, datasource
references, variables, links and annotations are the factory's job, so every dashboard gets them the
same way. PromQL is written with the selector helpers below, which put the dashboard variables into
every query exactly once: ``sel(metric)`` filters by the run (``$project``/``$experiment``),
``gsel(metric)`` by the run-scoped ``$node``/``$gpu`` variables.

Two kinds of counters, two windows:

- counters that move continuously (requests, NVML sample seconds): ``rate(...[$__rate_interval])``;
- counters that move **once per training step** (``PER_STEP_COUNTERS``: stage seconds, GPU phase
  seconds, step counts): ``increase`` over **each run's own window** (:func:`increase_w`): ``$window`` is a
  number of typical steps (3, the alerts' window, by default), and each run is read over the rung of
  ``WINDOW_LADDER`` that holds ``$window`` of *its own* typical steps (``omniwatch_typical_step_seconds``, a
  per-run series). A 30-second run selected with a 15-minute run is judged over ~2 minutes, the 15-minute
  run over 45 (issue 26 item 3). A step of 15 minutes read over a 1-minute ``$__rate_interval`` is 0 for
  14 minutes and 15x the truth for one; a ratio of two ``increase``s over three steps is the share of those
  steps' seconds.

Every alert threshold comes from the alert ``Config`` the dashboard is built with through :func:`cfg_step` (the
config path is kept, so tests compare it with the rule files, and the factory draws the path's value in the config
it renders with); a colour band that is not an alert threshold says why in ``Step.note``. No module here reads a
module-level config: every dashboard is ``dashboard(cfg)`` (issue 32 item 5).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter

from .. import palette
from ..core import ledger
from .. import names as n
from ..config import Config
from ..core.analytics import PHASE_ORDER
from ..core.model import passthrough_name
from ..core.signals import SIGNALS
from ..alerting import records as _records
from ..alerting.records import (REC_AGE, REC_GPU_IDLE_MIN, REC_IDLE_MIN, REC_STALL_CRITICAL, REC_STALL_INFO,
                                REC_STALL_TYPICAL, REC_STALL_WARNING)

# Grafana variables and macros, named once.
V_DATASOURCE = "datasource"
V_PROJECT = "project"
V_EXPERIMENT = "experiment"
V_NODE = "node"
V_GPU = "gpu"
V_WINDOW = "window"
RATE_INTERVAL = "$__rate_interval"
WINDOW = "${window}"  # the $window variable: a number of typical steps, each run reads its own (increase_w)
ALERTS = "ALERTS"  # Prometheus' synthetic series of pending/firing alerts
DATASOURCE_UID = "${datasource}"
PROVISIONED_UID = "omniwatch-prometheus"  # the uid docker-compose provisions (dashboards/provisioning/datasources)

from ..names import RUN_BY  # noqa: E402  (one definition: names.py)
RUN_MATCHERS = f'{n.L_PROJECT}=~"${V_PROJECT}", {n.L_EXPERIMENT}=~"${V_EXPERIMENT}"'
GPU_MATCHERS = f'{n.L_NODE}=~"${V_NODE}", {n.L_GPU}=~"${V_GPU}"'
RUN_LEGEND = "{{project}}/{{experiment}}"
EXP = "{{experiment}}"

# Alerts of alerts/endpoints.rules.yml and the always-firing pipeline heartbeat. names.py holds the
# ALERT_* constants of the generated rules; tests/test_dashboards.py checks these exist in alerts/ too.
ALERT_ROLLOUT_SATURATED = n.ALERT_ROLLOUT_SATURATED
# What RolloutQueueSaturated asks (alerting/endpoints.py), in the words of the panels that show it.
def saturation_rule(c: Config) -> str:
    """What RolloutQueueSaturated asks, with ``c``'s thresholds."""
    return (f"RolloutQueueSaturated fires when a replica was saturated (requests waiting while every slot "
                       f"runs) in at least {c.rollout_queue.saturated_share:.0%} of the time its phase ran over "
                       f"the last {c.rollout_queue.window} (generation time, not wall time: a colocated engine "
                       f"sleeps between gens) and is saturated or asleep now, for {c.rollout_queue.for_}, and only "
                       f"while the training step waits on it: the phase the replica serves (gen for rollout replicas, "
                       f"gen + reward for reward replicas) held at least {c.rollout_queue.critical_path_share:.0%} "
                       f"of every step over that window (a separate_async trainer-bound run keeps its servers busy by "
                       f"design and is not paged). A replica running one request at a time is labelled engine=serial.")
ALERT_TQ_BACKLOG = n.ALERT_TQ_BACKLOG
ALERT_GPU_MEMORY = n.ALERT_GPU_MEMORY
ALERT_WATCHDOG = n.ALERT_WATCHDOG

# Recording rules of alerts/*.rules.yml the panels plot (each alert's own series); tests check each is a
# `record:` there.
RECORDS = tuple(v for k, v in dict(globals()).items() if k.startswith("REC_"))
# Every recording rule of alerts/ (the panels' step-window statistics among them).
ALL_RECORDS = tuple(v for k, v in vars(_records).items() if k.startswith("REC_") and isinstance(v, str))

# Counters that move once per training step: never read over $__rate_interval (tests check it).
PER_STEP_COUNTERS = (n.STAGE_SECONDS_TOTAL, n.GPU_PHASE_IDLE_SECONDS_TOTAL, n.GPU_PHASE_BUSY_SECONDS_TOTAL,
                     n.GPU_SECONDS_TOTAL, n.GRAD_NORM_NONFINITE_TOTAL, n.STEPS_TOTAL, n.FLAGGED_STEPS_TOTAL,
                     n.STEPS_REPLAYED_TOTAL, n.TRAINER_RESTARTS_TOTAL)

KINDS = ("timeseries", "stat", "bargauge", "table", "statetimeline", "xychart", "heatmap")
SCOPES = ("run", "node", "global")  # run: every series carries project+experiment; node: per GPU/node; global


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
    """Per-second rate of a continuously moving counter (never a per-step counter)."""
    return f"rate({selector}[{RATE_INTERVAL}])"


def run_window_seconds() -> str:
    """Per run (``project``, ``experiment``): ``$window`` of its own typical steps, in seconds."""
    return f"{sel(n.TYPICAL_STEP)} * {WINDOW}"  # matched on (project, experiment): no max by needed (a filter)


def window_rung(i: int) -> str:
    """The runs whose own window (``run_window_seconds``) falls on rung ``i`` of ``WINDOW_LADDER``: the
    smallest rung that holds it (the first takes every shorter window, the last every longer one). A run
    without a typical step yet (its first steps) is on the ``WINDOW_FALLBACK`` rung."""
    w = run_window_seconds()
    lo = WINDOW_LADDER[i - 1] if i else None
    if i == 0:
        cond = f"{w} <= {WINDOW_LADDER[0]}"
    elif i == len(WINDOW_LADDER) - 1:
        cond = f"{w} > {lo}"
    else:
        cond = f"({w} > {lo}) <= {WINDOW_LADDER[i]}"
    if WINDOW_LADDER[i] == WINDOW_FALLBACK:
        cond += f" or on ({RUN_BY}) ({run_max(sel(n.STEP))} unless on ({RUN_BY}) {run_max(sel(n.TYPICAL_STEP))})"
    return cond


def window_range_seconds() -> str:
    """Per run: the seconds of the rung its counters are read over (what ``increase_w`` covers)."""
    return "(" + " or ".join(f"(({window_rung(i)}) * 0 + {r})" for i, r in enumerate(WINDOW_LADDER)) + ")"


def increase_w(selector: str) -> str:
    """Increase of a per-step counter over each run's own window: per rung of ``WINDOW_LADDER``, the counter now
    minus the counter one rung ago, kept for the runs on that rung (``window_rung``). PromQL has no per-series
    range, so a run's window is the smallest rung that holds ``$window`` of its typical steps (at most 2x longer:
    3 steps of 30 s are read over 120 s, 3 steps of 15 min over 2700 s). The difference of two samples (not
    ``increase``) costs the same for every rung and has no extrapolation: it is exactly the seconds of the steps
    that ended inside the window. A run younger than its window counts from 0; a counter reset (an exporter
    that lost its state) reads 0, never negative."""
    terms = [f"(clamp_min({selector} - ({selector} offset {r}s or {selector} * 0), 0) and on ({RUN_BY}) "
             f"({window_rung(i)}))" for i, r in enumerate(WINDOW_LADDER)]
    return "(" + " or ".join(terms) + ")"


def by_run(*labels: str) -> str:
    """``project, experiment[, labels]``: the grouping every run-scoped aggregation keeps."""
    return ", ".join((RUN_BY, *labels))


def run_max(expr: str, *labels: str) -> str:
    """``max by (project, experiment[, labels]) (expr)``: one series per run (a run scraped from
    several exporters folds into one, as the recording rules do)."""
    return f"max by ({by_run(*labels)}) ({expr})"


def hist_quantile(q: float, metric_base: str, by: str, **extra: str) -> str:
    """``histogram_quantile`` over a histogram's ``_bucket`` rate, keeping the ``by`` labels."""
    return f"histogram_quantile({q}, sum by (le, {by}) ({rate(sel(metric_base + '_bucket', **extra))}))"


def hist_mean(metric_base: str, by: str, **extra: str) -> str:
    """Mean from ``_sum``/``_count`` rates (what a histogram says without bucket interpolation)."""
    return (f"sum by ({by}) ({rate(sel(metric_base + '_sum', **extra))}) / "
            f"sum by ({by}) ({rate(sel(metric_base + '_count', **extra))})")


def verl(key: str) -> str:
    """Selector of one passed-through verl key (family name derived exactly as the exporter does)."""
    return sel(passthrough_name(key), **{n.L_KEY: key})


def first_of(*exprs: str) -> str:
    """The first expression that has a series for a label set: ``a or b or c`` (one series per replica
    whichever metric name form its server exposes)."""
    return " or ".join(f"({e})" if " or " in e else e for e in exprs)


# ``$window``'s choices in typical steps: the alerts' own window (config window.k, the default) and a longer view.
def window_steps(config: Config) -> tuple[int, int]:
    return (config.window.k, 10)


def window_default(config: Config) -> str:
    """How a panel description names ``$window`` (its default: the alerts' window of ``config``)."""
    return f"$window typical steps of each run (default: {window_steps(config)[0]})"


# The spans a run's own window is read over (seconds): 1 min (four 15 s scrapes) to 3 h (10 steps of 15 min
# need 9000 s). Each rung is at most 2x the one below, so a run's window holds $window to 2 x $window steps.
WINDOW_LADDER = (60, 120, 180, 330, 600, 900, 1800, 2700, 5400, 10800)
WINDOW_FALLBACK = 900  # a run without a typical step yet (its first steps)


def cfg_value(path: str, config: Config) -> float:
    """A number of the alert configuration ``config`` by dotted path (``reward_bound.ratio``)."""
    return float(attrgetter(path)(config))


# Which alert each configured threshold belongs to (the alert whose rule compares with that number).
THRESHOLD_ALERT = {
    "reward_bound.ratio": n.ALERT_REWARD_BOUND,
    "reward_bound.step_share": n.ALERT_REWARD_BOUND,
    "inter_stage_idle.ratio": n.ALERT_IDLE,
    "mfu.impossible": n.ALERT_MFU_IMPOSSIBLE,
    "mfu.drop_ratio": n.ALERT_MFU_DROP,
    "mfu.floor": n.ALERT_MFU_LOW,
    "step_time.regression_ratio": n.ALERT_STEP_REGRESSION,
    "step_drift.ratio": n.ALERT_STEP_REGRESSION,
    "mfu.drift_ratio": n.ALERT_MFU_DROP,
    "stall.notice_steps": n.ALERT_STALLED,
    "straggler.ratio": n.ALERT_STRAGGLER,
    "rank_straggler.spread": n.ALERT_RANK_STRAGGLER,
    "rank_straggler.dispatches": n.ALERT_RANK_STRAGGLER,
    "grad_norm.nonfinite_steps": n.ALERT_GRAD_NONFINITE,
    "rollout_rejection.seq_masked_fraction": n.ALERT_RS_REJECTION,
    "outside_step.ratio": n.ALERT_OUTSIDE_STEP,
    "timer_overlap.tolerance": n.ALERT_TIMERS_EXCEED,
    "gpu_memory.ratio": ALERT_GPU_MEMORY,
    "rollout_queue.saturated_share": ALERT_ROLLOUT_SATURATED,
    "transferqueue.ttf_seconds": ALERT_TQ_BACKLOG,
    "transferqueue.full_utilization": ALERT_TQ_BACKLOG,
    **{sig.rule.fire[2]: sig.rule.name for sig in SIGNALS if sig.rule},  # declared once: core/signals.py
}

# Thresholds that differ per run (TrainingStalled's warning and critical stages add the run's planned work
# and typical steps): no fixed line can draw them, so panels plot the recording rule that holds each run's
# threshold; the config path is the number the rule scales by (tests check the rule uses it and that a
# panel linking the alert plots the rule).
RULE_THRESHOLDS = {
    "stall.notice_steps": (n.ALERT_STALLED, REC_STALL_INFO),
    "stall.unseen_planned_steps": (n.ALERT_STALLED, REC_STALL_WARNING),
    "stall.critical_extra_steps": (n.ALERT_STALLED, REC_STALL_CRITICAL),
}


@dataclass(frozen=True)
class Step:
    """One threshold step: from ``value`` (None = base) upwards the colour is ``color``. ``config`` is
    the alert-config path the value came from (``negate``: the rule compares with minus that number, as
    TimersExceedStep's ``< -timer_overlap.tolerance``); a value without one is a display band and says why
    in ``note``."""
    value: float | None
    color: str
    config: str = ""
    note: str = ""
    negate: bool = False

    def __post_init__(self):
        if self.value is not None and not (self.config or self.note):
            raise ValueError(f"threshold {self.value}: an alert threshold comes from the config (cfg_step); "
                             "a display band says why (note=...)")
        if self.negate and not self.config:
            raise ValueError(f"threshold {self.value}: only a configured threshold is negated")

    def value_in(self, config: Config) -> float | None:
        """The step's value under ``config`` (the factory draws this): a configured threshold follows the
        config the dashboards are generated with; a display band keeps its value."""
        if not self.config:
            return self.value
        v = cfg_value(self.config, config)
        return -v if self.negate else v


def cfg_step(cfg: Config, path: str, color: str, negate: bool = False) -> Step:
    """A threshold step at the configured alert threshold ``path`` of ``cfg`` (``negate``: at minus it)."""
    v = cfg_value(path, cfg)
    return Step(-v if negate else v, color, config=path, negate=negate)


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = "__auto"
    dashed: bool = False  # drawn as a dashed line (a reference such as 0.7 x baseline)
    instant: bool = False
    table: bool = False   # format "table" (table panels, XY charts)
    unit: str = ""        # per-column / per-series unit override (tables)
    thresholds: tuple[Step, ...] = ()  # per-column colours (tables)
    mappings: tuple[tuple[float, str, str], ...] = ()  # per-column value -> (text, colour) (tables)


@dataclass(frozen=True)
class Panel:
    title: str
    description: "str | Callable[[Config], str]"  # a function of the config when it quotes a threshold
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
    runbook: str | tuple[str, ...] = ()  # alert name(s) whose runbook applies: panel link + description
    scope: str = "run"      # "run": every series keeps its run (project, experiment); "node"; "global"
    repeat: bool = False    # one copy per selected experiment (stacked panels never mix runs)
    mappings: tuple[tuple[float, str, str], ...] = ()  # value -> (text, colour)
    decimals: int | None = None
    log_scale: bool = False
    # (regex on the whole display name, colour): a fixed colour for the series it matches, whatever the
    # thresholds say (the stall gauge colours each run by its stage, which no fixed threshold can express)
    fixed_colors: tuple[tuple[str, str], ...] = ()
    # XY charts: labels besides the run that tell the y series apart (the validation reward's ``key``); the
    # step target carries them too, so Grafana's merge joins each y row to its own step (issue 26 item 6)
    xy_labels: tuple[str, ...] = ()
    # Tables: (field, shown as, option) in the order shown (option "wrap": the cell's text wraps, and it opens whole
    # on click); label columns left out; data links of every row besides the run's ((title, url) with
    # ${__data.fields.<label>})
    columns: tuple[tuple[str, str, "str | None"], ...] = ()
    hide_columns: tuple[str, ...] = ()
    row_links: tuple[tuple[str, str], ...] = ()
    # Tables: the target (by its legend) whose value orders the rows, largest first ("Why slow": the costliest
    # run on top); None: Grafana's order
    sort_desc: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"panel {self.title!r}: kind {self.kind!r} not in {KINDS}")
        if self.scope not in SCOPES:
            raise ValueError(f"panel {self.title!r}: scope {self.scope!r} not in {SCOPES}")
        if not self.targets:
            raise ValueError(f"panel {self.title!r} has no targets")
        if not 1 <= self.w <= 24:
            raise ValueError(f"panel {self.title!r}: width {self.w} outside 1..24")
        if self.kind == "xychart" and (len(self.targets) < 2 or not all(t.table for t in self.targets)):
            raise ValueError(f"panel {self.title!r}: an XY chart needs the step target and >= 1 value target, "
                             "all table-format")
        if self.repeat and (self.scope != "run" or self.w != 24):
            raise ValueError(f"panel {self.title!r}: a panel repeated per run is run-scoped and alone on its line "
                             "(w=24; Grafana lays the copies out side by side)")

    @property
    def alerts(self) -> tuple[str, ...]:
        return (self.runbook,) if isinstance(self.runbook, str) and self.runbook else tuple(self.runbook or ())

    @property
    def all_steps(self) -> tuple[Step, ...]:
        return self.thresholds + tuple(s for t in self.targets for s in t.thresholds)

    def full_description(self, config: Config) -> str:
        """The description read with ``config`` (a description that quotes a threshold is a function of the
        config, so ``dashboards generate --config`` words it with that config's numbers), with a runbook link
        per alert (``config``'s runbook base)."""
        text = self.description(config) if callable(self.description) else self.description
        if not self.alerts:
            return text
        links = ", ".join(f"[{a}]({config.runbook_url(a)})" for a in self.alerts)
        return f"{text}\n\nRunbook: {links}"


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]
    collapsed: bool = False  # optional detail: folded until opened


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
    slots: tuple[str, ...] = field(default=())  # where panels of alerts still to come go (docs/dashboards.md)
    config: "Config | None" = field(default=None, compare=False)  # the alert config it was drawn with (dashboard(cfg))

    def panels(self):
        for row in self.rows:
            yield from row.panels

    @property
    def uses_window(self) -> bool:
        return any(WINDOW in t.expr for p in self.panels() for t in p.targets)


def reads_step_window(p: "Panel") -> bool:
    """Whether the panel is built on step-window statistics: ``increase`` over ``$window`` or a recording rule of
    the alerts (their ``*_k`` window statistics, stage shares, stall thresholds). Such a series has no value
    while no step comes, and the panel must show that gap (``spanNulls`` off)."""
    return any(WINDOW in t.expr or any(rec in t.expr for rec in ALL_RECORDS) for t in p.targets)


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


TAG = "omniwatch"  # every omniwatch dashboard carries it; the dashboard links list dashboards by it


def default_tags(*extra: str) -> tuple[str, ...]:
    return (TAG, "generated", *extra)


def alerts_sel(**extra: str) -> str:
    """ALERTS of the selected runs, without the always-firing Watchdog and without alerts that belong to
    no run (``experiment=~".*"`` also matches an absent label)."""
    name = extra.pop("alertname", "!=" + ALERT_WATCHDOG)  # an explicit alert name (or a regex leaving Watchdog out)
    return sel(ALERTS, alertname=name, **{n.L_EXPERIMENT: "!="}, **extra)


def idle_evidence() -> str:
    """The inter-stage idle window minimum the rule prefers: GPU-measured where omniwatch's sampler saw the
    run's GPUs, the timer residual only where it did not (label ``evidence``)."""
    return (f'label_replace({sel(REC_GPU_IDLE_MIN)}, "evidence", "gpu", "", "") or on ({RUN_BY}) '
            f'label_replace({sel(REC_IDLE_MIN)}, "evidence", "timers", "", "")')


def staged_alertname(expr: str) -> str:
    """``expr`` (ALERTS series) with TrainingStalled's stage in its alert name (``TrainingStalled (warning)``):
    the stages are one alert name with three severities, and each stage is its own row of a timeline."""
    return (f'label_replace(label_join({expr}, "stage_of", ":", "alertname", "severity"), "alertname", '
            f'"{n.ALERT_STALLED} ($1)", "stage_of", "{n.ALERT_STALLED}:(.+)")')


def alert_states_by_run() -> str:
    """Per run and alert: 2 firing, 1 pending (TrainingStalled per stage); a run with neither shows one row
    ``alertname="none"`` at 0."""
    firing = staged_alertname("2 * " + alerts_sel(alertstate="firing"))
    pending = staged_alertname(alerts_sel(alertstate="pending"))
    return (f"max by ({RUN_BY}, alertname) ({firing} or {pending}) or on ({RUN_BY}) "
            f'label_replace(0 * {run_max(sel(n.STEP))}, "alertname", "none", "", "")')


ALERT_STATE_MAPPINGS = ((0, "no alert", "green"), (1, "pending", "orange"), (2, "firing", "red"))


def firing_by_run() -> str:
    """Firing alerts per run, each alert name once (TrainingStalled firing at info, warning and critical is one
    stall, not 3 alerts); 0 for a run with none (the runs come from omniwatch_step)."""
    return (f"count by ({RUN_BY}) (max by ({RUN_BY}, alertname) ({alerts_sel(alertstate='firing')})) "
            f"or on ({RUN_BY}) 0 * {run_max(sel(n.STEP))}")


# --- TrainingStalled in stages --------------------------------------------------------------------------
def per_typical_step(expr: str) -> str:
    """Seconds of a run as a number of its typical steps."""
    return f"{expr} / on ({RUN_BY}) {run_max(sel(n.TYPICAL_STEP))}"


AGE_STEPS = per_typical_step(sel(REC_AGE))  # time since the run's last step, in its typical steps
STAGE_RUNNING, STAGE_INFO, STAGE_WARNING, STAGE_CRITICAL, STAGE_FINISHED, STAGE_CRASHED = range(6)
# One colour per stage, shared by the stall gauge, the table's stage column and the stage timeline.
STALL_STAGE_MAPPINGS = ((STAGE_RUNNING, "running", "green"), (STAGE_INFO, "info", "yellow"),
                        (STAGE_WARNING, "warning", "orange"), (STAGE_CRITICAL, "critical", "red"),
                        (STAGE_FINISHED, "finished", "blue"), (STAGE_CRASHED, "crashed", "purple"))
STALL_THRESHOLD_RECORDS = ((STAGE_INFO, REC_STALL_INFO), (STAGE_WARNING, REC_STALL_WARNING),
                           (STAGE_CRITICAL, REC_STALL_CRITICAL))


def _finished() -> str:
    return f"{run_max(sel(n.RUN_FINISHED))} == 1"


def _past(record: str) -> str:
    return f"{sel(REC_AGE)} > on ({RUN_BY}) {sel(record)}"


def stall_stage() -> str:
    """Per run, the TrainingStalled stage its age has reached (the rules' own thresholds): 0 running, 1 info,
    2 warning, 3 critical, 4 finished (its last step was the planned last: the rules never stall it), 5 crashed
    (its Ray job failed: TrainingCrashed pages, TrainingStalled stays quiet). A run
    without a typical step yet is running. The alerts also wait for ``for:`` and, with --checkpoint-root,
    for a checkpoint still being written; the alert timelines show what fired."""
    passed = f" + on ({RUN_BY}) ".join(f"({sel(REC_AGE)} > bool on ({RUN_BY}) {sel(rec)})"
                                        for _, rec in STALL_THRESHOLD_RECORDS)
    crashed = f"{STAGE_CRASHED} * (max by ({RUN_BY}) ({sel(n.RUN_CRASHED)}) == 1)"
    return (f"{crashed} or on ({RUN_BY}) {STAGE_FINISHED} * ({_finished()}) or on ({RUN_BY}) ({passed}) "
            f"or on ({RUN_BY}) 0 * {run_max(sel(n.STEP))}")


def age_steps_by_stage() -> str:
    """``AGE_STEPS`` per run with the stage it reached as label ``stage`` (running / info / warning /
    critical / finished), the highest stage first."""
    def staged(cond: str, stage: int) -> str:
        text = next(t for v, t, _ in STALL_STAGE_MAPPINGS if v == stage)
        return f'label_replace({AGE_STEPS} and on ({RUN_BY}) ({cond}), "stage", "{text}", "", "")'
    parts = [staged(_finished(), STAGE_FINISHED)]
    parts += [staged(_past(rec), stage) for stage, rec in reversed(STALL_THRESHOLD_RECORDS)]
    parts.append(f'label_replace({AGE_STEPS}, "stage", "running", "", "")')
    return f" or on ({RUN_BY}) ".join(parts)


def stage_colors() -> tuple[tuple[str, str], ...]:
    """Fixed colours for series whose display name ends in a stage (``age_steps_by_stage`` legends); the
    running ones keep the panel's thresholds. Grafana anchors a regex without slashes (``^...$``)."""
    return tuple((f".* {text}", colour) for v, text, colour in STALL_STAGE_MAPPINGS if v != STAGE_RUNNING)


# --- series in a fixed reading order ---------------------------------------------------------------------
ORDER_LABEL = "_order"  # sorts before every other label name, so Prometheus' range results sort by it first


def in_order(expr: str, label: str, head: tuple[str, ...], tail: tuple[str, ...] = ()) -> str:
    """``expr`` with a label ``_order`` that puts its series in reading order: the ``label`` values of
    ``head`` first (in that order), any other value next (alphabetically), the values of ``tail`` last.
    Prometheus sorts a range query's series by their labels and Grafana stacks them in that order."""
    out = f'label_replace({expr}, "{ORDER_LABEL}", "{len(head):02d}", "", "")'
    for i, v in enumerate(head):
        out = f'label_replace({out}, "{ORDER_LABEL}", "{i:02d}", "{label}", "{v}")'
    for i, v in enumerate(tail, start=len(head) + 1):
        out = f'label_replace({out}, "{ORDER_LABEL}", "{i:02d}", "{label}", "{v}")'
    return out


def order_key(value: str, head: tuple[str, ...], tail: tuple[str, ...] = ()) -> tuple[str, str]:
    """The sort key ``in_order`` gives a series with this label value (what Prometheus sorts by)."""
    if value in head:
        return f"{head.index(value):02d}", value
    if value in tail:
        return f"{len(head) + 1 + tail.index(value):02d}", value
    return f"{len(head):02d}", value


# The step's phases in the exporter's order (analytics.PHASE_ORDER), the untimed rest last.
PHASES = (*PHASE_ORDER, n.UNTRACKED_PHASE)
# Ledger buckets in ledger.ordered()'s order: phases in step order, any other phase, then the rest.
LEDGER_HEAD, LEDGER_TAIL = ledger.PHASE_BUCKETS, ledger.NON_PHASE


def gpu_seconds(*labels: str) -> str:
    """GPU-seconds of the run's ledger over $window (a per-step counter), by ``labels``."""
    return f"sum by ({by_run(*labels)}) ({increase_w(sel(n.GPU_SECONDS_TOTAL))})"


def stall_beyond() -> str:
    """Per run, the seconds since its last step beyond the ledger's stall tolerance (negative within it). The
    tolerance is ``ledger.stall_tolerance_steps``: (stall.notice_steps - 1) typical steps, read from the recorded
    stall thresholds (TrainingStalled's info threshold less one typical step), so dashboards drawn beside rules
    made with a tuned alert config (``rules generate --config``) follow that config, not the default."""
    tolerance = f"({sel(REC_STALL_INFO)} - on ({RUN_BY}) {sel(REC_STALL_TYPICAL)})"
    return f"{run_max(sel(REC_AGE))} - on ({RUN_BY}) {tolerance}"


def open_stall_gpu_seconds() -> str:
    """GPU-seconds of a stall still going on, inside the last $window seconds (label ``bucket="stalled"``):
    the run's GPUs x the time since its last step beyond the ledger's stall tolerance (``stall_beyond``), at
    most the run's own window (``window_range_seconds``). The ledger counter books a stall only when the next
    step comes, which never happens after a crash; this shows the idle GPUs while the stall lasts (issue 26
    item 4). A finished run is not stalled."""
    beyond = stall_beyond()
    # the smaller of the two, per run (label "x" keeps both sides of the or apart)
    within = (f'min by ({RUN_BY}) (label_replace({beyond}, "x", "beyond", "", "") or '
              f'label_replace({window_range_seconds()}, "x", "span", "", ""))')
    secs = (f"{run_max(sel(n.RUN_GPUS))} * on ({RUN_BY}) {within} "
            f"> 0 unless on ({RUN_BY}) ({run_max(sel(n.RUN_FINISHED))} == 1)")
    return f'label_replace(label_replace({secs}, "{n.L_BUCKET}", "{ledger.STALLED}", "", ""), "src", "open", "", "")'


def stall_open() -> str:
    """Per run, 1 while a stall goes on: no step for longer than the ledger's stall tolerance (``stall_beyond``),
    and the run is not finished."""
    return f"({stall_beyond()} > bool 0 == 1 unless on ({RUN_BY}) ({run_max(sel(n.RUN_FINISHED))} == 1))"


def gpu_hours_per_day(**extra: str) -> str:
    """GPU-hours per day by ledger bucket at the current rate (omniwatch_gpu_hours_per_day) — except while a stall
    goes on: the exporter's rate is the pre-stall one (it moves with steps), but every GPU of the run is idle, so
    the run then costs its GPUs x 24 GPU-hours per day, all ``stalled`` (issue 26 item 9)."""
    stalled = (f'label_replace({run_max(sel(n.RUN_GPUS))} * 24 and on ({RUN_BY}) {stall_open()}, '
               f'"{n.L_BUCKET}", "{ledger.STALLED}", "", "")')
    rate = f"{run_max(sel(n.GPU_HOURS_PER_DAY, **extra), n.L_BUCKET)} unless on ({RUN_BY}) {stall_open()}"
    return f"({stalled} or {rate})"


def ledger_gpu_seconds(*labels: str) -> str:
    """``gpu_seconds`` plus the open stall (``open_stall_gpu_seconds``), by ``labels``."""
    booked = f'label_replace({increase_w(sel(n.GPU_SECONDS_TOTAL))}, "src", "ledger", "", "")'
    return f"sum by ({by_run(*labels)}) ({booked} or {open_stall_gpu_seconds()})"


def ledger_share() -> str:
    """Each bucket's share of the run's GPU-seconds over $window (a stall still going on included as
    ``stalled``), buckets in ledger order."""
    share = (f"{ledger_gpu_seconds(n.L_BUCKET)} / on ({RUN_BY}) group_left () "
             f"({ledger_gpu_seconds()} > 0)")
    return in_order(share, n.L_BUCKET, LEDGER_HEAD, LEDGER_TAIL)


def phase_colors(names_=None) -> tuple[tuple[str, str], ...]:
    """Fixed colours for series whose display name ends in a phase or ledger bucket (legends ``... {{phase}}`` /
    ``... {{bucket}}``): one colour per phase on every dashboard, the previews and the report (palette.py).
    Grafana anchors a regex without slashes (``^...$``)."""
    names_ = tuple(palette.PHASE_COLORS) if names_ is None else names_
    return tuple((f".* {re.escape(name)}", palette.color(name)) for name in names_)


PHASE_LEGEND = re.compile(r"\{\{\s*(%s|%s|%s)\s*\}\}$" % (n.L_PHASE, n.L_BUCKET, n.L_PHASE_T))


def series_colors(p: "Panel") -> tuple[tuple[str, str], ...]:
    """The panel's fixed series colours: its own, or the phase palette when its series are split by phase or
    ledger bucket (a legend ending in ``{{phase}}`` / ``{{bucket}}``), so every dashboard colours a phase alike."""
    if p.fixed_colors:
        return p.fixed_colors
    if p.kind in ("timeseries", "bargauge") and any(PHASE_LEGEND.search(t.legend) for t in p.targets):
        return phase_colors()
    return ()


def gpu_hours_panel(cfg: Config) -> Panel:
    """"Where the GPU-hours went" (overview and bottlenecks): ledger shares over $window, stacked, per run."""
    return Panel(
        "Where the GPU-hours went: $experiment",
        f"Over the last {window_default(cfg)}, each ledger bucket's share of the run's "
        "GPU-seconds (omniwatch_gpu_seconds_total: the run's GPUs x the wall time between its steps, every second in "
        "exactly one bucket), stacked in ledger order: the phases in step order, any other timed phase, then "
        "reward_critical_path (reward on the critical path), inter_stage_idle (untimed time between phases), "
        "checkpoint, validation, outside_step_timer (between two steps, outside every timer) and stalled (beyond "
        "the stall tolerance). The counter moves once per step: it is read over whole steps, never over the "
        "scrape interval. One panel per run.",
        (Target(ledger_share(), EXP + " {{bucket}}"),),
        unit="percentunit", min=0, max=1, stack=True, w=24, h=8, repeat=True, fixed_colors=phase_colors(),
        runbook=(n.ALERT_REWARD_BOUND, n.ALERT_IDLE, n.ALERT_OUTSIDE_STEP, n.ALERT_STALLED))


__all__ = ["Dashboard", "Row", "Panel", "Target", "Step", "sel", "gsel", "rate", "increase_w", "hist_quantile",
           "hist_mean", "cfg_step", "RATE_INTERVAL", "WINDOW", "DATASOURCE_UID", "PROVISIONED_UID"]
