"""RankStraggler: one worker rank is persistently the last of its worker group to finish a phase, by a wide
margin — from Ray's task events (discovery/taskmetrics.py counts, per role and phase, how many finished
dispatches in a row the same rank was last, and the smallest slowest/median spread over them). Both
thresholds live in config.py (``rank_straggler``); the counting stays in Python. Kept in its own module
(rule, prose, remedy, promtool cases) so stalls.py / spec.py carry one line each."""
from __future__ import annotations

from .. import names as n
from .config import Config
from .prose import RUN, Ctx, Label, P, Query, Value
from .rule import Alert, sel
from .testcase import INTERVAL, JOB, Case, Check, Expect, Series

BY = "project, experiment, role, phase, rank, node"
STREAK = Query(n.RAY_STRAGGLER_STREAK, "f0", matchers="role=%q,phase=%q,rank=%q", label_args=("role", "phase", "rank"))


def remedy() -> P:
    return P("The same worker finishes last every time, so the whole worker group waits for it at every dispatch. "
             "Look at that node: a GPU throttling or shared with another job (GPU dashboard: SM clock, utilisation, "
             "other processes), a slower interconnect link, a data shard much larger than the others (uneven "
             "micro-batches), or host contention (CPU, page cache, dataloader). Cordon or replace the node, or "
             "rebalance the batch; `omniwatch ps` names the node and pid while it runs.")


def rules(cfg: Config) -> list:
    c = cfg.rank_straggler
    return [Alert(
        n.ALERT_RANK_STRAGGLER,
        f"max by ({BY}) ({sel(cfg, n.RAY_STRAGGLER_SPREAD_MIN)}) >= {c.spread:g}\n"
        f"and on ({BY}) max by ({BY}) ({sel(cfg, n.RAY_STRAGGLER_STREAK)}) >= {c.dispatches:d}",
        "warning", "One worker rank is always the last to finish, by a wide margin.",
        P(RUN, ": rank ", Label("rank"), " on node ", Label("node"), " finished ", Label("role"), " ",
          Label("phase"), " last in ", STREAK, " dispatches in a row, each time at least ", Value("f2"),
          "x the median worker's time (thresholds: ", f"{c.dispatches:d}", " dispatches, ", f"{c.spread:g}",
          "x). Every other rank waits for it."),
        cfg.step_for, {}, remedy(),
        comment="From Ray's task events (--ray-tasks): the exporter counts the streak; thresholds in config.py.")]


def cases(cfg: Config) -> list:
    c = cfg.rank_straggler
    lab = {**JOB, "project": "flowgrpo", "experiment": "ranks", "role": "actor_rollout", "phase": "update_actor",
           "node": "10.0.0.3"}
    samples = 8
    series = [  # rank 7: slow and always last (fires); rank 2 of ref: always last but close (quiet);
        # infer: wide once, then another rank (quiet)
        Series(n.RAY_STRAGGLER_STREAK, {**lab, "rank": "7"}, f"1 2 3 4x{samples - 3}"),
        Series(n.RAY_STRAGGLER_SPREAD_MIN, {**lab, "rank": "7"}, f"2.2 2.1 2.0x{samples - 2}"),
        Series(n.RAY_STRAGGLER_STREAK, {**lab, "phase": "infer_ref_batch", "rank": "2"}, f"5x{samples - 1}"),
        Series(n.RAY_STRAGGLER_SPREAD_MIN, {**lab, "phase": "infer_ref_batch", "rank": "2"}, f"1.08x{samples - 1}"),
        Series(n.RAY_STRAGGLER_STREAK, {**lab, "phase": "infer_actor_batch", "rank": "0"}, f"1x{samples - 1}"),
        Series(n.RAY_STRAGGLER_SPREAD_MIN, {**lab, "phase": "infer_actor_batch", "rank": "0"}, f"3.0x{samples - 1}"),
    ]
    fire_at = 2 * INTERVAL + 15  # streak reaches 3 at the third sample, + for: 15s
    alert_labels = {"severity": "warning", "project": "flowgrpo", "experiment": "ranks", "role": "actor_rollout",
                    "phase": "update_actor", "rank": "7", "node": "10.0.0.3"}
    ctx_labels = {k: v for k, v in alert_labels.items() if k != "severity"}

    def expect(at: int, streak: float) -> list:
        return [Expect(alert_labels, Ctx(ctx_labels, 2.0, {n.RAY_STRAGGLER_STREAK: streak}))]
    return [Case(f"RankStraggler: the same rank last in {c.dispatches:d} dispatches in a row at {c.spread:g}x or more "
                 "fires, naming rank and node; a rank always last by a hair, or wide only once, stays quiet",
                 series, [Check(INTERVAL, n.ALERT_RANK_STRAGGLER, []),
                          Check(2 * INTERVAL, n.ALERT_RANK_STRAGGLER, []),
                          Check(fire_at + INTERVAL, n.ALERT_RANK_STRAGGLER, expect(fire_at + INTERVAL, 4))])]
