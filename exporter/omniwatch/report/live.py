"""Facts of a live (or still-stored) run, read from the Prometheus that scraped its exporter:
``omniwatch report --prometheus URL --project P --experiment E``.

The series are the exporter's own (the ledger ``omniwatch_gpu_seconds_total{bucket}``, the step gauges,
the window statistics and baselines); a step is one distinct value of ``omniwatch_step`` in a range
query at ``--resolution`` (default 15 s, the default scrape interval), read at the last sample that
still shows it. The alert timeline is Prometheus' own ``ALERTS{alertstate="firing"}`` for the run — the
rules as they were evaluated live. A step shorter than the resolution is not seen, as in Grafana.
"""
from __future__ import annotations

import bisect
import time

from .. import names as n
from ..core import ledger
from ..config import DEFAULT
from ..alerting.records import REC_STALL_TYPICAL
from ..promapi import PromAPI, PromError
from . import gantt as lanes
from .facts import AlertSpan, RunFacts, StepPoint

DEFAULT_SINCE = 30 * 86400.0
DEFAULT_RESOLUTION = 15.0


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def live_facts(url: str, project: str, experiment: str, *, until: float | None = None,
               since: float = DEFAULT_SINCE, resolution: float = DEFAULT_RESOLUTION) -> RunFacts:
    until = time.time() if until is None else until
    sel = f"project={_q(project)},experiment={_q(experiment)}"
    with PromAPI(url) as prom:
        return _facts(prom, url, project, experiment, sel, until, since, resolution)


def _facts(prom, url, project, experiment, sel, until, since, res) -> RunFacts:
    coarse = max(res, since / 10_000)
    found = prom.query_range(f"max(omniwatch_step{{{sel}}})", until - since, until, coarse)
    if not found:
        raise PromError(f"no omniwatch_step{{{sel}}} in Prometheus at {prom.url} over the last {since / 86400:g} days")
    start = max(until - since, float(found[0]["values"][0][0]) - coarse)

    def rng(expr: str, by: str | None = None) -> dict[str, dict[float, float]]:
        out: dict[str, dict[float, float]] = {}
        for s in prom.query_range(expr, start, until, res):
            key = s["metric"].get(by, "") if by else ""
            out[key] = {float(t): float(v) for t, v in s["values"]}
        return out

    steps_s = rng(f"max(omniwatch_step{{{sel}}})").get("", {})
    times = sorted(steps_s)
    # the last sample showing each step (in order of appearance)
    marks: list[tuple[float, int]] = []
    for t in times:
        s = int(steps_s[t])
        if marks and marks[-1][1] == s:
            marks[-1] = (t, s)
        else:
            marks.append((t, s))
    one = {k: rng(f"max({m}{{{sel}}})").get("", {}) for k, m in (
        ("duration", n.STEP_DURATION), ("rb", n.REWARD_BOUND_RATIO), ("idle", n.INTER_STAGE_IDLE_RATIO),
        ("base", n.STEP_DURATION_BASELINE), ("thr", n.THROUGHPUT))}
    one["images"] = rng(f'max(verl_perf_total_num_images{{{sel},key="{ledger.K_IMAGES}"}})').get("", {})
    one["rb_min"] = rng(f'max({n.REWARD_BOUND_WINDOW}{{{sel},stat="min"}})').get("", {})
    one["idle_min"] = rng(f'max({n.IDLE_WINDOW}{{{sel},stat="min"}})').get("", {})
    ledger_s = rng(f"max by (bucket) ({n.GPU_SECONDS_TOTAL}{{{sel}}})", "bucket")
    mfu = rng(f"max by (role) ({n.MFU}{{{sel}}})", "role")
    mfu_base = rng(f"max by (role) ({n.MFU_BASELINE}{{{sel}}})", "role")
    mfu_max = rng(f'max by (role) ({n.MFU_WINDOW}{{{sel},stat="max"}})', "role")
    regr = rng(f"max by (cause) ({n.STEP_REGRESSION}{{{sel}}})", "cause")
    flags = rng(f"max by (flag) ({n.STEP_FLAG}{{{sel}}})", "flag")
    gpus_by = rng(f"max by (origin) ({n.RUN_GPUS}{{{sel}}})", "origin")  # origin: log | flag
    per_day = rng(f"max by (bucket) ({n.GPU_HOURS_PER_DAY}{{{sel}}})", "bucket")

    def at(series: dict[float, float], t: float):
        return series.get(t)

    points: list[StepPoint] = []
    prev: dict[str, float] = {}
    last_gpus = None
    for k, (t, s) in enumerate(marks):
        g = next((v[t] for v in gpus_by.values() if t in v), None)
        last_gpus = g or last_gpus
        now = {b: v[t] for b, v in ledger_s.items() if t in v}
        delta = {b: x - prev.get(b, 0.0) for b, x in now.items() if x - prev.get(b, 0.0) > 0}
        prev.update(now)
        cnt = last_gpus or 1
        points.append(StepPoint(
            index=k, step=s, duration=at(one["duration"], t),
            flags=sorted(f for f, v in flags.items() if v.get(t) == 1 and f != "warmup")
            + (["warmup"] if flags.get("warmup", {}).get(t) == 1 else []),
            gpu_seconds=delta, wall={b: x / cnt for b, x in delta.items()}, reward_bound=at(one["rb"], t),
            idle=at(one["idle"], t), mfu={r: v[t] for r, v in mfu.items() if t in v},
            mfu_baseline={r: v[t] for r, v in mfu_base.items() if t in v}, duration_baseline=at(one["base"], t),
            regression={c: v[t] for c, v in regr.items() if t in v}, reward_bound_min=at(one["rb_min"], t),
            idle_min=at(one["idle_min"], t), mfu_max={r: v[t] for r, v in mfu_max.items() if t in v},
            images=at(one["images"], t), throughput=at(one["thr"], t),
            per_day={b: v[t] for b, v in per_day.items() if t in v}))
    end = marks[-1][0]
    info = prom.query(f"max by (trainer, reward, async_mode) ({n.RUN_INFO}{{{sel}}})", end)
    modes = {k: v for k, v in (info[0]["metric"] if info else {}).items() if v and v != "unknown"}
    gsrc = next(iter(sorted(gpus_by)), None)
    gpus = int(gpus_by[gsrc][max(gpus_by[gsrc])]) if gsrc else None
    final = {b: v[max(v)] for b, v in ledger_s.items() if v}
    phases: dict[str, dict[str, float]] = {}
    for kind, metric in (("busy", n.GPU_PHASE_BUSY_SECONDS_TOTAL), ("idle", n.GPU_PHASE_IDLE_SECONDS_TOTAL)):
        for r in prom.query(f"sum by (phase) ({metric}{{{sel}}})", until):
            phases.setdefault(r["metric"].get("phase", "?"), {})[kind] = float(r["value"][1])
    pools, pools_source = {}, ""
    for r in prom.query(f"max by (pool, origin) ({n.RUN_POOL_GPUS}{{{sel}}})", until):
        pools[r["metric"].get("pool", "?")] = int(float(r["value"][1]))
        pools_source = r["metric"].get("origin", "")
    fleet: dict[str, dict[str, float]] = {}   # per node and cluster-wide (the exporter's and every agent's GPUs)
    for r in prom.query(f"sum by (node, bucket) ({n.GPU_FLEET_SECONDS_TOTAL}{{{sel}}})", until):
        fleet.setdefault(r["metric"].get("node", "?"), {})[r["metric"].get("bucket", "?")] = float(r["value"][1])
    peak = prom.query(f"max({n.MFU_DEVICE_PEAK}{{{sel}}})", until)
    series = {n.MFU_DEVICE_PEAK: float(peak[0]["value"][1])} if peak else {}
    alerts = _alerts(prom, sel, start, until, res, marks)
    # per-worker lanes of the last steps (report/gantt.py), from the task-event source's series
    lane_start = marks[-lanes.LAST_STEPS - 1][0] if len(marks) > lanes.LAST_STEPS else start
    bars = lanes.query(prom, sel, lane_start, until, res)
    # and of the slowest steps (each from the previous step's arrival to its own)
    slow = lanes.query_steps(prom, sel, lanes.slowest(marks, {p.step: p.duration for p in points if p.duration}),
                             res) if bars else []
    end_state, open_s, stall_end, last_at, error = _end(prom, sel, start, until, res)
    if open_s > 0:
        final[ledger.STALLED] = final.get(ledger.STALLED, 0.0) + open_s * (gpus or 1)
    return RunFacts(run=f"{prom.url} {project}/{experiment}", project=project, experiment=experiment,
                    source="prometheus", steps=points, gpu_seconds=final, gpus=gpus,
                    gpus_source=gsrc or "unknown", modes=modes, alerts=alerts, alerts_source="prometheus",
                    gpu_phases=phases, series=series, lanes=bars, slow_lanes=slow, pools=pools,
                    pools_source=pools_source, fleet_nodes=fleet, end_state=end_state,
                    open_stall_s=open_s, stall_end=stall_end, last_step_at=last_at, crash_error=error)


def _one(prom, expr: str, t: float) -> float | None:
    r = prom.query(expr, t)
    return float(r[0]["value"][1]) if r else None


def _end(prom, sel, start, until, res) -> tuple[str, float, float | None, float | None, str]:
    """How the run stands at ``until`` (issue 31 item 3): finished, crashed (its Ray job failed: priced to the crash,
    when the GPUs were freed), running, or stalled — and the stall still open then (ledger.open_stall, with the
    tolerance of the default alert config and the run's planned allowance): the ledger books a stall only when the
    next step arrives, so a hang would read 0 GPU-h."""
    span = f"{max(60, int(until - start))}s"   # the newest sample in the report's range (a series that stopped)

    def last_of(metric: str) -> float | None:
        return _one(prom, f"max(last_over_time({metric}{{{sel}}}[{span}]))", until)
    last = last_of(n.LAST_STEP_TS)
    if last is None:
        return "", 0.0, None, None, ""
    if (last_of(n.RUN_FINISHED) or 0) == 1:
        return "finished", 0.0, None, last, ""
    end, state, error = until, "", ""
    crashed = prom.query_range(f"max({n.RUN_CRASHED}{{{sel}}}) == 1", start, until, res)
    if crashed and crashed[0]["values"]:
        end, state = min(until, float(crashed[0]["values"][0][0])), "crashed"
        info = prom.query(f"max by ({n.L_ERROR}) ({n.RAY_JOB_INFO}{{{sel}}})", until)
        error = info[0]["metric"].get(n.L_ERROR, "") if info else ""
    typ = last_of(REC_STALL_TYPICAL) or last_of(n.TYPICAL_STEP)
    allowance = last_of(n.PLANNED_ALLOWANCE) or 0.0
    open_s = ledger.open_stall(end - last, typ, ledger.stall_tolerance_steps(DEFAULT), allowance)
    return state or ("stalled" if open_s > 0 else "running"), open_s, (end if open_s > 0 else None), last, error


def _alerts(prom, sel, start, until, res, marks) -> list[AlertSpan]:
    if not marks:
        return []
    ts = [t for t, _ in marks]
    out: list[AlertSpan] = []
    for s in prom.query_range(f'ALERTS{{alertstate="firing",{sel}}}', start, until, res):
        labels = {k: v for k, v in sorted(s["metric"].items())
                  if k not in ("__name__", "alertname", "alertstate", "job", "instance")}
        name = s["metric"].get("alertname", "?")
        cur: list[int] | None = None
        last_t = None
        for t, _v in s["values"]:
            t = float(t)
            i = max(0, bisect.bisect_right(ts, t) - 1)
            if cur is not None and last_t is not None and t - last_t <= res * 1.5:
                cur[1] = i
            else:
                cur = [i, i]
                out.append(AlertSpan(name, labels.get("severity", ""), 0, 0, labels, 0, 0))
                out[-1]._span = cur  # type: ignore[attr-defined]
            last_t = t
    for a in out:
        i, j = a._span  # type: ignore[attr-defined]
        a.first_index, a.last_index = i, j
        a.first_step, a.last_step = marks[i][1], marks[j][1]
        del a._span  # type: ignore[attr-defined]
    out.sort(key=lambda a: (a.first_index, a.alertname))
    return out
