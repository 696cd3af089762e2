"""Prove every panel shows data: run each target of each dashboard against a live Prometheus.

Grafana cannot run here, so this does what Grafana would do with a panel query: substitute the
dashboard variables (``$project``/``$experiment`` -> the selected regexes, ``$node``/``$gpu`` -> ``.*``,
``$__rate_interval`` -> a window covering several scrapes, ``$__interval`` -> the scrape interval,
``$window`` -> its default, the alerts' window in typical steps per run) and evaluate the expression as an
instant query. A target that returns no series, only NaN/Inf values, or an error is a failure. So is a
series of a run-scoped panel without its run (``project`` and ``experiment``), and a copy of a panel
repeated per run that shows another run's series. The variable queries are checked the same way, and
every annotation query must execute.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass


from ..promapi import PromAPI, PromError
from . import panels as s
from .catalog import dashboards as drawn
from ..config import DEFAULT
from .factory import annotations, variables

_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")
_LEFTOVER = re.compile(r"\$\{?[a-zA-Z_][a-zA-Z0-9_]*")
DEFAULT_WINDOW = str(s.window_steps(DEFAULT)[0])  # the committed dashboards' $window (typical steps per run)


@dataclass(frozen=True)
class Failure:
    dashboard: str
    panel: str
    ref_id: str
    query: str
    reason: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} [{self.ref_id}]: {self.reason}\n    {self.query}"


def substitute(expr: str, project: str = ".*", experiment: str = ".*", rate_interval: str = "1m",
               interval: str = "15s", window: str = DEFAULT_WINDOW, range_: str = "1h") -> str:
    """Replace the dashboard variables the way Grafana interpolates them into a PromQL query."""
    values = {
        s.V_PROJECT: project, s.V_EXPERIMENT: experiment, s.V_NODE: ".*", s.V_GPU: ".*", s.V_WINDOW: window,
        "__rate_interval": rate_interval, "__interval": interval, "__range": range_,
    }
    # Longest names first so "$__rate_interval" is not eaten by a shorter "$__interval"-like prefix.
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    left = _LEFTOVER.search(expr)
    if left:
        raise ValueError(f"unknown variable {left.group(0)} in {expr!r}")
    return expr


def _has_finite_value(result: dict) -> bool:
    rtype, data = result.get("resultType"), result.get("result")
    if rtype == "vector":
        samples = [item.get("value", [0, "NaN"])[1] for item in data or []]
    elif rtype == "scalar":
        samples = [data[1]] if data else []
    elif rtype == "matrix":
        samples = [v[1] for item in data or [] for v in item.get("values", [])]
    else:
        return False
    return any(math.isfinite(float(v)) for v in samples)


def window_choices(config=DEFAULT) -> list[str]:
    """The ``$window`` variable's values (typical steps per run), first = default."""
    return [str(k) for k in s.window_steps(config)]


def default_window(prom: PromAPI | None = None, project: str = ".*", experiment: str = ".*") -> str:
    """``$window``'s default (a fixed number of typical steps: each run's seconds are computed in the query)."""
    return window_choices()[0]


def _check_variables(prom: PromAPI, d: s.Dashboard, subst) -> list[Failure]:
    out = []
    for v in variables(d, d.config or DEFAULT):
        model = v.build()
        query = model.query if isinstance(model.query, str) else None
        if not query or str(model.type_val) == "datasource":  # the datasource variable lists data sources
            continue
        if model.name == s.V_WINDOW:  # a custom variable: fixed values, nothing to query
            continue
        m = _LABEL_VALUES.match(query)
        if not m:
            out.append(Failure(d.uid, f"variable {model.name}", "-", query, "not a label_values() query"))
            continue
        sel_ = subst(m.group("selector"))
        try:
            values = prom.label_values(m.group("label"), sel_)
        except (PromError, ValueError) as e:
            out.append(Failure(d.uid, f"variable {model.name}", "-", sel_, f"error: {e}"))
            continue
        if not values:
            out.append(Failure(d.uid, f"variable {model.name}", "-", sel_, "no values"))
    return out


def runless(result: dict) -> list[dict]:
    """The series of an instant-query result that do not carry their run."""
    return [item.get("metric", {}) for item in result.get("result") or []
            if not (item.get("metric", {}).get("project") and item.get("metric", {}).get("experiment"))]


def run_target(prom: PromAPI, t: s.Target, q: str, range_s: float, step_s: float) -> dict:
    """The target as Grafana runs it: an instant query for ``instant`` targets, else a range query over the
    last ``range_s`` seconds (a time-series panel draws the range, so a gauge that is absent at this very
    instant, e.g. no worker running between two phases, still shows)."""
    if t.instant:
        return prom.query_data(q)
    end = time.time()
    return prom.query_range_data(q, end - range_s, end, step_s)


def verify(prometheus_url: str, project: str = ".*", experiment: str = ".*", rate_interval: str = "1m",
           interval: str = "15s", dashboards=None, repeats: bool = True, range_s: float = 300.0,
           step_s: float = 5.0) -> list[Failure]:
    """Run every target (and variable and annotation query) of ``dashboards`` as Grafana would (instant
    targets at now, range targets over the last ``range_s``); return what showed no data, a run-scoped
    series without its run, or a per-run copy showing another run."""
    failures: list[Failure] = []
    prom = PromAPI(prometheus_url)
    try:
        try:  # an unreachable or broken Prometheus is one error, not one per target
            prom.query_data("vector(1)")
        except PromError as e:
            return [Failure("-", "prometheus", "-", prometheus_url, f"error: {e}")]
        window = default_window()

        def subst(expr: str, exp: str = experiment) -> str:
            return substitute(expr, project, exp, rate_interval, interval, window)

        for d in (dashboards or drawn(DEFAULT)):
            failures += _check_variables(prom, d, subst)
            for a in annotations():
                try:
                    prom.query_data(subst(a.expr))
                except (PromError, ValueError) as e:
                    failures.append(Failure(d.uid, f"annotation {a.name}", "-", a.expr, f"error: {e}"))
            for p in d.panels():
                for i, t in enumerate(p.targets):
                    ref = chr(ord("A") + i)
                    try:
                        q = subst(t.expr)
                        data = run_target(prom, t, q, range_s, step_s)
                    except (PromError, ValueError) as e:
                        failures.append(Failure(d.uid, p.title, ref, t.expr, f"error: {e}"))
                        continue
                    if not data.get("result"):
                        failures.append(Failure(d.uid, p.title, ref, q, "no series"))
                    elif not _has_finite_value(data):
                        failures.append(Failure(d.uid, p.title, ref, q, "only NaN/Inf values"))
                    elif p.scope == "run" and runless(data):
                        failures.append(Failure(d.uid, p.title, ref, q, f"series without its run: {runless(data)[:3]}"))
                if p.repeat and repeats:
                    failures += _check_repeat(prom, d, p, subst)
    finally:
        prom.close()
    return failures


def prom_regex_escape(value: str) -> str:
    """A variable value as Grafana puts it into a PromQL regex matcher: regex metacharacters escaped, the
    backslash doubled for the PromQL string."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def _check_repeat(prom: PromAPI, d: s.Dashboard, p: s.Panel, subst) -> list[Failure]:
    """Grafana makes one copy of a repeated panel per selected experiment, with $experiment set to it:
    each copy must show that run only."""
    out = []
    try:
        exps = prom.label_values(s.V_EXPERIMENT, subst(f'{{__name__=~"{"|".join(d.variable_metrics)}", '
                                                       f'{s.RUN_MATCHERS}}}'))
    except (PromError, ValueError) as e:
        return [Failure(d.uid, p.title, "-", "", f"error listing experiments: {e}")]
    for exp in exps:
        for i, t in enumerate(p.targets):
            q = subst(t.expr, prom_regex_escape(exp))
            try:
                data = prom.query_data(q)
            except (PromError, ValueError) as e:
                out.append(Failure(d.uid, f"{p.title} [{exp}]", chr(ord("A") + i), q, f"error: {e}"))
                continue
            others = {item["metric"].get("experiment") for item in data.get("result") or []} - {exp}
            if others:
                out.append(Failure(d.uid, f"{p.title} [{exp}]", chr(ord("A") + i), q,
                                   f"the copy for {exp} shows other runs: {sorted(map(str, others))}"))
    return out


def count_targets(dashboards=None) -> int:
    return sum(len(p.targets) for d in (dashboards or drawn(DEFAULT)) for p in d.panels())


def as_dicts(failures: list[Failure]) -> list[dict]:
    return [asdict(f) for f in failures]
