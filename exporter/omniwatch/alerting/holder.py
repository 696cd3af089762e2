"""Who holds the step, joined into TrainingStalled's text: the exporter's Ray task-event source publishes
``omniwatch_step_holder_info{project, experiment, role, phase, holder}`` (the one-line answer, no ages in it)
and ``omniwatch_step_holder_seconds`` (how long that holder has held the step); the alert's description
queries both for the run at evaluation time, so the page and the relay message name the stage, the worker
and the node ("update_actor: 31/32 ranks done in 4 min, rank 7 on node-3 still running (for 38m 0s)").
Without the source (no Ray, ``--ray-tasks off``) both parts render nothing.

Kept apart from stalls.py (the stages and their thresholds): this is only the join and its promtool case.
"""
from __future__ import annotations

from dataclasses import replace

from .. import names as n
from .config import Config
from .prose import Ctx, P, Query, QueryLabel
from .testcase import INTERVAL, Case, Check, Expect, Series, dur

HOLDER = P(QueryLabel(n.STEP_HOLDER_INFO, n.L_HOLDER, prefix=" Ray task events: "),
           Query(n.STEP_HOLDER_SECONDS, "dur", prefix=" (for ", suffix=")."))
HANG_TEXT = "update_actor: 31/32 ranks done in 4 min, rank 7 on node-3 still running"


def cases(cfg: Config) -> list:
    from .stalls import SEVERITIES, Stall, _stage_times  # the stages' own scenario (stalls imports HOLDER)
    hold = dur(cfg.step_for)
    run = Stall("hang_holder", 240, 720)
    crit = _stage_times(cfg, run, INTERVAL, hold)["critical"]
    samples = crit // INTERVAL + 2
    held = 600.0  # the holder's age is the source's own number, not the alert's
    lab = run.labels()
    series = run.series(samples, INTERVAL) + [
        Series(n.STEP_HOLDER_INFO, {**lab, "role": "actor_rollout", "phase": "update_actor", n.L_HOLDER: HANG_TEXT},
               f"1x{samples - 1}"),
        Series(n.STEP_HOLDER_SECONDS, lab, f"{held:g}x{samples - 1}")]

    def ctx(at: int) -> Ctx:
        c = run.ctx(cfg, at, INTERVAL)
        return replace(c, series={**c.series, f"{n.STEP_HOLDER_INFO}:{n.L_HOLDER}": HANG_TEXT,
                                  n.STEP_HOLDER_SECONDS: held})
    return [Case("TrainingStalled names who holds the step when the Ray task-event source says it (every stage)",
                 series, [Check(crit, n.ALERT_STALLED,
                                [Expect({"severity": s, "project": run.project, "experiment": run.experiment}, ctx(crit))
                                 for s in SEVERITIES])])]
