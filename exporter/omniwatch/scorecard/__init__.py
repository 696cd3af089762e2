"""The detection scorecard (issue 30): what a person receives for each injected fault of a public corpus of
verl-written runs, judged by the repository's rule files and Alertmanager configuration.

Modules: ``truth`` (the corpus' truth files, replaying a run as the live exporter read it), ``corpus`` (the case
table and its writer, through verl's ``Tracking``), ``amsim`` (Prometheus' notifier and Alertmanager's routing,
grouping, inhibition and deduplication modelled from ``alerts/alertmanager.yml`` on the backtest's clock),
``scoring`` (the figures), ``baseline`` (worse than the committed baseline?), ``card`` (terminal table, JSON,
docs/scorecard.md), ``commands`` (``omniwatch scorecard``).
"""
from __future__ import annotations


def add_commands(sub) -> None:
    from .commands import add_commands as _add
    _add(sub)
