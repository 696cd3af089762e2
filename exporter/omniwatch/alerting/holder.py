"""Who holds the step, joined into TrainingStalled's text: the exporter's Ray task-event source publishes
``omniwatch_step_holder_info{project, experiment, role, phase, holder}`` (the one-line answer, no ages in it)
and ``omniwatch_step_holder_seconds`` (how long that holder has held the step); the alert's description
queries both for the run at evaluation time, so the page and the relay message name the stage, the worker
and the node ("update_actor: 31/32 ranks done in 4 min, rank 7 on node-3 still running (for 38m 0s)").
Without the source (no Ray, ``--ray-tasks off``) both parts render nothing.

Kept apart from stalls.py (the stages and their thresholds): this is only the join (its promtool case is in
alerts/tests/health.test.yml).
"""
from __future__ import annotations

from .. import names as n
from .prose import P, Query, QueryLabel

HOLDER = P(QueryLabel(n.STEP_HOLDER_INFO, n.L_HOLDER, prefix=" Ray task events: "),
           Query(n.STEP_HOLDER_SECONDS, "dur", prefix=" (for ", suffix=")."))

