"""RankStraggler: one worker rank is persistently the last of its worker group to finish a phase, by a wide
margin — from Ray's task events (discovery/taskmetrics.py counts, per role and phase, how many finished
dispatches in a row the same rank was last, and the smallest slowest/median spread over them). Both
thresholds live in config.py (``rank_straggler``); the counting stays in Python. Kept in its own module
(rule, prose, remedy; its promtool case is in alerts/tests/signals.test.yml) so stalls.py / rulespec.py carry one line each."""
from __future__ import annotations

from .. import names as n
from ..config import Config
from .prose import RUN, Label, P, Query, QueryLabel, Value
from .rule import AlertSpec, sel

BY = "project, experiment, role, phase, rank, node"
STREAK = Query(n.RAY_STRAGGLER_STREAK, "f0", matchers="role=%q,phase=%q,rank=%q", label_args=("role", "phase", "rank"))
# Where that rank spends the time, while it runs its call: its stack (Ray's /task/traceback; discovery/traceback.py)
STACK = QueryLabel(n.RAY_STACK_INFO, n.L_STACK, prefix=" While it ran, it was in ", suffix=".",
                   matchers=f"{n.L_STACK_OF}=`straggler`,rank=%q", label_args=("rank",))


def remedy():
    from . import remedies  # the text lives with every other remedy (remedies.rank_straggler)
    return remedies.rank_straggler()


def rules(cfg: Config) -> list:
    c = cfg.rank_straggler
    return [AlertSpec(
        n.ALERT_RANK_STRAGGLER,
        f"max by ({BY}) ({sel(cfg, n.RAY_STRAGGLER_SPREAD_MIN)}) >= {c.spread:g}\n"
        f"and on ({BY}) max by ({BY}) ({sel(cfg, n.RAY_STRAGGLER_STREAK)}) >= {c.dispatches:d}",
        "warning", "One worker rank is always the last to finish, by a wide margin.",
        P(RUN, ": rank ", Label("rank"), " on node ", Label("node"), " finished ", Label("role"), " ",
          Label("phase"), " last in ", STREAK, " dispatches in a row, each time at least ", Value("f2"),
          "x the median worker's time (thresholds: ", f"{c.dispatches:d}", " dispatches, ", f"{c.spread:g}",
          "x). Every other rank waits for it.", STACK),
        cfg.step_for, {}, remedy(),
        comment="From Ray's task events (--ray-tasks): the exporter counts the streak; thresholds in config.py.")]

