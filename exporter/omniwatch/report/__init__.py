"""Shareable run reports on the live stack's own analytics and rules: ``omniwatch report`` (one run, a
live run, or every run under a log root) and ``omniwatch compare`` (run vs run).

Modules: ``facts`` (what a report says, as data), ``replay`` (finished runs: the exporter's RunStore +
the backtest engine, all runs in one Prometheus pass), ``live`` (a run in a live Prometheus), ``verdict``
(bottlenecks ranked by GPU-hours, remedies from alerting/remedies.py), ``html`` (Bokeh pages),
``output`` (JSON, terminal), ``compare``, ``index``, ``commands``.
"""
from __future__ import annotations


def add_commands(sub) -> None:
    from .commands import add_commands as _add
    _add(sub)
