"""Replay, backfill and backtest: bring a finished verl run into Prometheus and ask which alerts
would have fired, at which steps (design note "the past looks like the present").

Modules: ``runfile`` (read a run), ``timeline`` (when each step happened), ``openmetrics`` (scrapes in
simulated time), ``tsdb`` (promtool, temporary Prometheus), ``ruleset`` (rule files), ``backfill``,
``evaluate`` (Prometheus' alert state machine), ``backtest`` (the one engine: many runs, one
Prometheus pass), ``replay``, ``report``, ``commands``.
"""
from __future__ import annotations


def add_commands(sub) -> None:
    from .commands import add_commands as _add
    _add(sub)
