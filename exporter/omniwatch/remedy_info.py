"""The remedy text of every alert for each run layout, as an info series Grafana can read
(``omniwatch_remedy_info{alertname, trainer, reward, async_mode, remedy} 1``; issue 26 item 1).

Prometheus keeps an alert's ``remedy`` annotation out of PromQL (ALERTS has no annotations), so the
overview's "Why slow" row joins the run's firing alert with this series through ``omniwatch_run_info``
(the run's layout labels). The text is rendered exactly as the report's verdict renders it
(``report.verdict.remedy``: the alert's remedy prose for the layout) with no run series: where a remedy
quotes a run's own value (the device peak) or its trainer config (engine, LoRA), the layout default is
shown; the alert notification carries the run's full text. One series per alert and per layout the exported
runs have (a handful), never per run: the text is up to ~2 KB.
"""
from __future__ import annotations

from functools import lru_cache

LAYOUT = ("trainer", "reward", "async_mode")


@lru_cache(maxsize=64)
def remedies(layout: tuple[str, str, str]) -> tuple[tuple[str, str], ...]:
    """(alertname, remedy text) for every alert that has a remedy, for this layout (``unknown`` parts: the
    remedy's default branch, as Prometheus renders it when omniwatch_run_info says unknown)."""
    from .alerting import rulespec as spec
    from .alerting.config import DEFAULT
    from .report.verdict import remedy
    modes = dict(zip(LAYOUT, layout))
    out = {}
    for a in spec.alerts(DEFAULT):
        if a.remedy is not None and a.name not in out:
            text = remedy(a.name, {}, modes)
            if text:
                out[a.name] = " ".join(text.split())  # one line: a table cell
    return tuple(sorted(out.items()))


class RemedyCollector:
    def __init__(self, store):
        self.store = store

    def describe(self):
        from . import names as n
        return n.describe((n.REMEDY_INFO,))

    def collect(self):
        from . import names as n
        fam = n.family(n.REMEDY_INFO)
        s = self.store
        with s.lock:
            now = s.clock()
            layouts = {tuple(run.modes.get(k, "unknown") for k in LAYOUT)
                       for run in s.runs.values() if not s.hidden(run, now) and run.last is not None}
        for layout in sorted(layouts):
            for alertname, text in remedies(layout):
                fam.add_metric([alertname, *layout, text], 1)
        yield fam
