"""The dashboards omniwatch ships, in the order they are listed and rendered: each a pure function of the alert
``Config`` (``dashboard(cfg)``: thresholds, windows, selectors and the words of the descriptions follow it)."""
from __future__ import annotations

import dataclasses
import re

from ..config import Config
from . import bottlenecks, factory, gpus, lanes, overview, rollout, transferqueue
from .panels import V_EXPERIMENT, Dashboard, Panel, Row, dashboard_ids

BUILDERS = (overview.dashboard, bottlenecks.dashboard, rollout.dashboard, transferqueue.dashboard, gpus.dashboard,
            lanes.dashboard)


# Labels that split a run's series into a fleet (replicas, storage units, ops, worker ranks, causes, phases): a panel
# of all selected runs split by one draws runs x fleet series (7 runs: 20-50 lines and a legend that overflows), so
# such a panel is drawn once per run instead (issue 32 item 6: fleet panels usable with 10 runs).
FLEET_LABELS = frozenset(("replica", "role", "storage_unit_id", "partition_id", "op_type", "task_name", "rank",
                          "node", "cause", "phase", "reason"))
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def fleet(p: Panel) -> bool:
    """Whether ``p`` draws every selected run's fleet in one panel (run-scoped, not repeated, its legend splitting
    a run by a fleet label)."""
    if p.repeat or p.scope != "run" or p.kind not in ("timeseries", "bargauge", "statetimeline"):
        return False
    return any(set(_LEGEND_LABEL.findall(t.legend)) & FLEET_LABELS for t in p.targets)


def _lines(panels: list[Panel]) -> list[Panel]:
    """Panels laid left to right in lines of 24 columns, a panel alone on its line (a repeated one) between them:
    the line a repeated panel interrupts is stretched to the full width (the SDK wraps only after a full line)."""
    out: list[Panel] = []
    line: list[Panel] = []

    def flush():
        used = sum(p.w for p in line)
        if line and used < 24:
            widths = [p.w * 24 // used for p in line]
            widths[-1] += 24 - sum(widths)
            line[:] = [dataclasses.replace(p, w=w) for p, w in zip(line, widths)]
        out.extend(line)
        line.clear()
    for p in panels:
        if p.w == 24:
            flush()
            out.append(p)
            continue
        if sum(q.w for q in line) + p.w > 24:
            flush()
        line.append(p)
    flush()
    return out


def per_run(d: Dashboard) -> Dashboard:
    """``d`` with every fleet panel repeated per run (one copy per selected experiment, two per line)."""
    def one(p: Panel) -> Panel:
        if not fleet(p):
            return p
        title = p.title if "$experiment" in p.title else f"{p.title}: ${V_EXPERIMENT}"
        return dataclasses.replace(p, title=title, repeat=True, w=24)
    return dataclasses.replace(d, rows=tuple(Row(r.title, tuple(_lines([one(p) for p in r.panels])), r.collapsed)
                                             for r in d.rows))


def dashboards(cfg: Config) -> tuple[Dashboard, ...]:
    """Every dashboard drawn with ``cfg`` (uids unique, titles unique within a dashboard: checked here), fleet panels
    drawn once per run."""
    out = tuple(per_run(build(cfg)) for build in BUILDERS)
    dashboard_ids(out)
    # A run's data links lead to that run on the other dashboards.
    factory.LINK_TARGETS.update({d.uid: d.title.split(" / ")[-1] for d in out})
    return out


def by_uid(uid: str, cfg: Config) -> Dashboard:
    for d in dashboards(cfg):
        if d.uid == uid:
            return d
    raise KeyError(f"no dashboard {uid!r}; known: {', '.join(d.uid for d in dashboards(cfg))}")


def __getattr__(name: str):
    """``DASHBOARDS``: the dashboards as committed (drawn with the default alert config), for code that reads the
    committed JSON's specs; built on first use, never at import."""
    if name == "DASHBOARDS":
        from ..config import DEFAULT
        try:
            return dashboards(DEFAULT)
        except AttributeError as e:   # raised from here it would read "cannot import name 'DASHBOARDS'"
            raise RuntimeError(f"drawing the dashboards failed: {e}") from e
    raise AttributeError(name)
