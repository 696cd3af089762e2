"""The Ray task-event source's series: poll cost and losses, who holds the step, workers per phase,
per-worker lanes (collapsed above a worker count) and straggler streaks. Rendered at scrape time from
the poller's snapshot and ledger (bounded: labels come from fixed role / phase sets and worker ranks
below the collapse bound)."""
from __future__ import annotations

from prometheus_client.registry import Collector

from .. import names as n
from ..redact import redact
from . import taskevents as te
from .phases import PHASES

PHASE_CODE = {p: i + 1 for i, p in enumerate(PHASES)}   # 0 = idle (no call running)


def straggler_streaks(ledger: te.TaskLedger, job_id: str | None = None) -> list[dict]:
    """Per (role, phase): the rank that finished last in the most recent finished dispatches, how many
    dispatches in a row it was last, and the smallest spread (last / median duration) over that streak.
    The alert thresholds both in PromQL (config.py); the counting is here. ``job_id``: that job's
    dispatches only (a previous job's streak is not the run's)."""
    by: dict[tuple[str, str], list[te.Dispatch]] = {}
    for d in ledger.dispatches:
        if job_id is not None and (not d.tasks or d.tasks[0].job_id != job_id):
            continue
        if d.spread() is not None and not d.role.endswith("_server"):
            by.setdefault((d.role, d.phase), []).append(d)
    out = []
    for (role, phase), ds in by.items():
        ds = sorted(ds, key=lambda d: d.start)
        streak, spread_min, last_rank, node = 0, None, None, ""
        for d in reversed(ds):
            t = max(d.tasks, key=lambda t: t.end)
            r = ledger.rank(t)
            if r is None or sum(1 for x in d.tasks if x.end == t.end) > 1:
                break  # no single last worker (ranks closed by the same poll tie): the streak ends here
            if last_rank is None:
                last_rank, node = r, te._node(ledger, t.node_id)
            elif r != last_rank:
                break
            streak += 1
            sp = d.spread()
            spread_min = sp if spread_min is None else min(spread_min, sp)
        if last_rank is not None:
            out.append({"role": role, "phase": phase, "rank": last_rank, "node": node, "streak": streak,
                        "spread_min": spread_min, "spread_last": ds[-1].spread()})
    return out


def lanes(ledger: te.TaskLedger, collapse_above: int,
          job_id: str | None = None) -> tuple[list[tuple[str, int, int]], list[tuple[str, str, int]]]:
    """(per-worker lanes [(role, rank, phase code)], collapsed counts [(role, phase, workers)]): a role with
    more than ``collapse_above`` workers exports "N of M ranks in phase X" instead of one lane per rank.
    ``job_id``: that job's calls and dispatches only."""
    per_role: dict[str, dict[int, int]] = {}
    counts: dict[tuple[str, str], int] = {}
    for t in ledger.running.values():
        r = ledger.rank(t)
        if r is None or t.call.role.endswith("_server") or (job_id is not None and t.job_id != job_id):
            continue
        per_role.setdefault(t.call.role, {})[r] = PHASE_CODE.get(t.call.phase, PHASE_CODE["other"])
        counts[(t.call.role, t.call.phase)] = counts.get((t.call.role, t.call.phase), 0) + 1
    size: dict[str, int] = {}
    for d in ledger.dispatches:  # a role's size: the largest dispatch seen
        if not d.role.endswith("_server") and (job_id is None or (d.tasks and d.tasks[0].job_id == job_id)):
            size[d.role] = max(size.get(d.role, 0), len(d.tasks))
    for role, running in per_role.items():  # ... or its highest rank running now (agent / reward loops: per-sample
        size[role] = max(size.get(role, 0), max(running) + 1)  # calls make no dispatch of the whole group)
    lane, collapsed = [], []
    for role, m in size.items():
        if m > collapse_above:
            collapsed += [(role, ph, c) for (r, ph), c in counts.items() if r == role]
            continue
        running = per_role.get(role, {})
        lane += [(role, rank, running.get(rank, 0)) for rank in range(m)]
    return lane, collapsed


class TaskCollector(Collector):
    OWNED = (n.RAY_TASK_POLLS_TOTAL, n.RAY_TASK_POLL_SECONDS, n.RAY_STATE_API_CALLS_TOTAL, n.RAY_TASK_EVENTS_DROPPED,
             n.RAY_TASK_EVENTS_LOSSY, n.STEP_HOLDER_INFO, n.STEP_HOLDER_SECONDS, n.RAY_WORKERS_RUNNING,
             n.RAY_WORKER_PHASE, n.RAY_DISPATCH_SPREAD, n.RAY_STRAGGLER_STREAK, n.RAY_STRAGGLER_SPREAD_MIN)

    def __init__(self, poller, run_labels, collapse_above: int = 64):
        self.poller = poller
        self.run_labels = run_labels          # () -> (project, experiment)
        self.collapse_above = collapse_above
        poller.lanes_max = collapse_above     # the poll computes the lanes the scrape renders
        self.calls = 0

    def describe(self):
        return n.describe(self.OWNED)

    def collect(self):
        # the last completed poll's snapshot only: a scrape never takes the poller's lock (issue 35 item 1)
        snap = self.poller.snapshot
        project, experiment = self.run_labels()
        run = [project or "", experiment or ""]
        fams = {k: n.family(k) for k in self.OWNED}
        fams[n.RAY_TASK_POLLS_TOTAL].add_metric([], snap.polls)
        fams[n.RAY_STATE_API_CALLS_TOTAL].add_metric([], self.poller.api.cost.calls)
        if snap.up:
            fams[n.RAY_TASK_POLL_SECONDS].add_metric(["wall"], snap.cost.wall_s)
            fams[n.RAY_TASK_POLL_SECONDS].add_metric(["cpu"], snap.cost.cpu_s)
            fams[n.RAY_TASK_EVENTS_DROPPED].add_metric([], snap.dropped)
            fams[n.RAY_TASK_EVENTS_LOSSY].add_metric([], 1 if snap.lossy else 0)
            h = snap.holder
            if h:
                # actor names are the trainer's: the text goes through the one redactor before it is a label
                fams[n.STEP_HOLDER_INFO].add_metric(run + [h["role"], h["phase"], redact(h["text"])], 1)
                fams[n.STEP_HOLDER_SECONDS].add_metric(run, h["age_s"])
            view = snap.view
            counts, lane, streaks = view.get("counts", {}), view.get("lanes", ()), view.get("streaks", ())
            for (role, phase), c in sorted(counts.items()):
                fams[n.RAY_WORKERS_RUNNING].add_metric(run + [role, phase], c)
            for role, rank, code in lane:
                fams[n.RAY_WORKER_PHASE].add_metric(run + [role, str(rank)], code)
            for s in streaks:
                if s["spread_last"] is not None:
                    fams[n.RAY_DISPATCH_SPREAD].add_metric(run + [s["role"], s["phase"]], s["spread_last"])
                fams[n.RAY_STRAGGLER_STREAK].add_metric(run + [s["role"], s["phase"], str(s["rank"]), s["node"]],
                                                        s["streak"])
                fams[n.RAY_STRAGGLER_SPREAD_MIN].add_metric(run + [s["role"], s["phase"], str(s["rank"]), s["node"]],
                                                            s["spread_min"])
        yield from fams.values()
