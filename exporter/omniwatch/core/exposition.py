"""Render the run model as Prometheus metric families at scrape time (a custom collector on a
private registry: new metric objects each scrape, no timestamps, base units, ``_total`` counters)."""
from __future__ import annotations

import time
from collections import defaultdict

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from .. import __version__, names as n
from .analytics import CONTRACT_KEYS, is_validation_key
from .model import RunStore, passthrough_name
from .planned import PlannedCollector
from ..remedy_info import RemedyCollector
from .signals import SIGNALS
from ..trainer_config import ConfigCollector


# The families this collector renders; other collectors (GPU sampler, relay) own theirs.
OWNED = (
    n.BUILD_INFO, n.RUNS, n.MAX_RUNS, n.RUNS_EVICTED_TOTAL, n.SOURCE_UP, n.INGEST_ERRORS, n.ALERT_NOTIFICATIONS_TOTAL, n.STEPS_TOTAL,
    n.STEPS_REPLAYED_TOTAL, n.TRAINER_RESTARTS_TOTAL, n.STAGE_SECONDS_TOTAL, n.FLAGGED_STEPS_TOTAL,
    n.PASSTHROUGH_KEYS, n.STEP, n.LAST_STEP_TS, n.STEP_DURATION, n.STAGE_DURATION, n.REWARD_BOUND_RATIO,
    n.REWARD_CRITICAL_PATH, n.INTER_STAGE_IDLE_RATIO, n.MFU, n.THROUGHPUT, n.STEP_FLAG, n.WINDOW_STEPS,
    n.TYPICAL_STEP, n.REWARD_BOUND_WINDOW, n.IDLE_WINDOW, n.STEP_DURATION_WINDOW,
    *(sig.family for sig in SIGNALS), *(sig.reference for sig in SIGNALS if sig.reference),
    n.MFU_WINDOW, n.MFU_BASELINE, n.STEP_DURATION_BASELINE, n.SCRAPE_DURATION, n.RUN_INFO,
    n.REWARD_STEP_SHARE_WINDOW, n.STEP_REGRESSION, n.STEP_REGRESSION_TOP, n.MFU_UNSUPPORTED, n.GPU_SECONDS_TOTAL, n.RUN_GPUS, n.RUN_POOL_GPUS, n.GPU_HOURS_PER_DAY,
    n.STEP_REGRESSION_GPU_HOURS_PER_DAY, n.BASELINE_FIRST_STEP, n.BASELINE_LAST_STEP, n.STEP_DURATION_DRIFT, n.STEP_DRIFT,
    n.ROLLOUT_STRAGGLER, n.ROLLOUT_STRAGGLER_WINDOW, n.GRAD_NORM_NONFINITE, n.GRAD_NORM_NONFINITE_RECENT,
    n.GRAD_NORM_NONFINITE_TOTAL, n.RS_SEQ_MASKED_WINDOW, n.OUTSIDE_STEP_SECONDS, n.OUTSIDE_STEP_WINDOW,
    n.TIMER_RESIDUAL, n.TIMER_RESIDUAL_WINDOW, n.VALIDATION_STEP, n.STEP_DURATION_RATIO_WINDOW, n.WORKLOAD_RATIO,
    n.MFU_DRIFT, n.REFERENCE_INFO, n.REFERENCE_SHIFT_STEP, n.SHIFT_ONSET_STEP, n.SHIFT_SHAPE, n.SHIFT_SIZE,
    n.SHIFT_STEPS, n.STEP_PART_GROWTH,
)


class RunCollector(Collector):
    def __init__(self, store: RunStore):
        self.store = store
        self._last_render = 0.0

    def describe(self):
        return n.describe(OWNED)

    def collect(self):
        t0 = time.perf_counter()
        fams = {name: n.family(name) for name in OWNED}
        passthrough: dict[str, list] = defaultdict(list)
        s = self.store
        with s.lock:
            fams[n.BUILD_INFO].add_metric([__version__], 1)
            fams[n.RUNS].add_metric([], sum(1 for r in s.runs.values() if not s.hidden(r)))
            fams[n.MAX_RUNS].add_metric([], s.max_runs)
            fams[n.RUNS_EVICTED_TOTAL].add_metric([], s.evicted_total)
            for (src, target), up in sorted(s.sources.items()):
                fams[n.SOURCE_UP].add_metric([src, target], up)
            for (src, reason), cnt in sorted(s.errors.items()):
                fams[n.INGEST_ERRORS].add_metric([src, reason], cnt)
            for status, cnt in sorted(s.notifications.items()):
                fams[n.ALERT_NOTIFICATIONS_TOTAL].add_metric([status], cnt)
            now = s.clock()
            for (project, experiment), run in s.runs.items():
                if s.hidden(run, now):
                    continue
                rl = [project, experiment]
                fams[n.STEPS_TOTAL].add_metric(rl, run.steps_total)
                fams[n.STEPS_REPLAYED_TOTAL].add_metric(rl, run.replayed_total)
                fams[n.TRAINER_RESTARTS_TOTAL].add_metric(rl, run.restarts_total)
                for ph, sec in sorted(run.stage_seconds_total.items()):
                    fams[n.STAGE_SECONDS_TOTAL].add_metric(rl + [ph], sec)
                for flag in n.FLAGS:
                    cnt = run.warmup_total() if flag == "warmup" else run.flagged_total.get(flag, 0)
                    fams[n.FLAGGED_STEPS_TOTAL].add_metric(rl + [flag], cnt)
                fams[n.PASSTHROUGH_KEYS].add_metric(rl, run.passthrough_count())
                for bucket, sec in sorted(run.gpu_seconds.items()):
                    fams[n.GPU_SECONDS_TOTAL].add_metric(rl + [bucket], sec)
                if run.gpus is not None:
                    fams[n.RUN_GPUS].add_metric(rl + [run.gpus.source], run.gpus.count)
                pools, origin = s.pools(run)
                for pool, count in sorted(pools.items()):
                    fams[n.RUN_POOL_GPUS].add_metric(rl + [pool, origin], count)
                last = run.last
                if last is None:
                    continue
                fams[n.STEP].add_metric(rl, last.step)
                fams[n.LAST_STEP_TS].add_metric(rl, run.last_arrival)
                fams[n.RUN_INFO].add_metric(rl + [run.modes.get(k, "unknown") for k in ("trainer", "reward", "async_mode")], 1)
                if last.duration is not None:
                    fams[n.STEP_DURATION].add_metric(rl, last.duration)
                for ph, sec in last.phases.items():
                    fams[n.STAGE_DURATION].add_metric(rl + [ph], sec)
                if last.reward_bound_ratio is not None:
                    fams[n.REWARD_BOUND_RATIO].add_metric(rl, last.reward_bound_ratio)
                for mode, sec in last.reward_critical.items():
                    fams[n.REWARD_CRITICAL_PATH].add_metric(rl + [mode], sec)
                if last.idle_ratio is not None:
                    fams[n.INTER_STAGE_IDLE_RATIO].add_metric(rl, last.idle_ratio)
                for role, v in last.mfu.items():
                    fams[n.MFU].add_metric(rl + [role], v)
                if last.throughput is not None:
                    fams[n.THROUGHPUT].add_metric(rl, last.throughput)
                for flag in n.FLAGS:
                    fams[n.STEP_FLAG].add_metric(rl + [flag], 1 if flag in last.flags else 0)
                st = run.stats
                fams[n.WINDOW_STEPS].add_metric(rl, st.steps)
                if st.typical_step is not None:
                    fams[n.TYPICAL_STEP].add_metric(rl, st.typical_step)
                for fam, stats in ((n.REWARD_BOUND_WINDOW, st.reward_bound), (n.IDLE_WINDOW, st.idle),
                                   (n.STEP_DURATION_WINDOW, st.duration),
                                   *((sig.family, st.signals.get(sig.name)) for sig in SIGNALS),
                                   (n.REWARD_STEP_SHARE_WINDOW, st.reward_step_share)):
                    if stats:
                        for stat, v in stats.items():
                            fams[fam].add_metric(rl + [stat], v)
                for sig in SIGNALS:
                    if sig.reference and sig.name in st.signal_reference:
                        fams[sig.reference].add_metric(rl, st.signal_reference[sig.name])
                for role, stats in st.mfu.items():
                    for stat, v in stats.items():
                        fams[n.MFU_WINDOW].add_metric(rl + [role, stat], v)
                for role, v in st.mfu_baseline.items():
                    fams[n.MFU_BASELINE].add_metric(rl + [role], v)
                for role in st.mfu_unsupported:
                    fams[n.MFU_UNSUPPORTED].add_metric(rl + [role], 1)
                for cause, v in st.regression.items():
                    fams[n.STEP_REGRESSION].add_metric(rl + [cause], v)
                if st.regression_top is not None:  # every cause, 1 for the named one: a stable set of series
                    for cause in st.regression:    # (a backfill has no staleness markers for a series that ends)
                        fams[n.STEP_REGRESSION_TOP].add_metric(rl + [cause], 1 if cause == st.regression_top else 0)
                cost, reg_cost = run.cost_per_day()
                for bucket, v in sorted(cost.items()):
                    fams[n.GPU_HOURS_PER_DAY].add_metric(rl + [bucket], v)
                for cause, v in sorted(reg_cost.items()):
                    fams[n.STEP_REGRESSION_GPU_HOURS_PER_DAY].add_metric(rl + [cause], v)
                if st.duration_baseline is not None:
                    fams[n.STEP_DURATION_BASELINE].add_metric(rl, st.duration_baseline)
                if st.reference_first is not None:
                    fams[n.BASELINE_FIRST_STEP].add_metric(rl, st.reference_first)
                    fams[n.BASELINE_LAST_STEP].add_metric(rl, st.reference_last)
                if st.drift is not None:
                    fams[n.STEP_DURATION_DRIFT].add_metric(rl, st.drift)
                for cause, v in st.drift_regression.items():
                    fams[n.STEP_DRIFT].add_metric(rl + [cause], v)
                _reference(fams, rl, st)
                _signals(fams, rl, run, last, st)
                # Passthrough shows the present: a key the latest step did not carry is not exported;
                # a validation key keeps its last value with the step it came from.
                key_steps, last_step = run.key_steps, last.step
                for key, v in run.keys.items():
                    if key in CONTRACT_KEYS:
                        continue
                    ks = key_steps.get(key)
                    if ks == last_step and not is_validation_key(key):
                        passthrough[passthrough_name(key)].append((rl + [key], v))
                    elif ks is not None and is_validation_key(key):
                        passthrough[passthrough_name(key)].append((rl + [key], v))
                        fams[n.VALIDATION_STEP].add_metric(rl + [key], ks)
        fams[n.SCRAPE_DURATION].add_metric([], self._last_render)
        yield from fams.values()
        for fname in sorted(passthrough):
            samples = passthrough[fname]
            keys = sorted({lv[2] for lv, _ in samples})
            fam = GaugeMetricFamily(fname, "verl metric " + ", ".join(keys)[:300] + " as logged by the trainer.",
                                    labels=[n.L_PROJECT, n.L_EXPERIMENT, n.L_KEY])
            for lv, v in samples:
                fam.add_metric(lv, v)
            yield fam
        self._last_render = time.perf_counter() - t0


def _reference(fams: dict, rl: list[str], st) -> None:
    """Step time per unit of work against the reference, the workload, MFU's creep, where the reference comes from,
    and the shape of each shift since it."""
    if st.duration_ratio:
        for stat, v in st.duration_ratio.items():
            fams[n.STEP_DURATION_RATIO_WINDOW].add_metric(rl + [stat], v)
    for cause, stats in sorted(st.part_growth.items()):
        for stat, v in stats.items():
            fams[n.STEP_PART_GROWTH].add_metric(rl + [cause, stat], v)
    if st.workload_ratio is not None:
        fams[n.WORKLOAD_RATIO].add_metric(rl, st.workload_ratio)
    for role, v in st.mfu_drift.items():
        fams[n.MFU_DRIFT].add_metric(rl + [role], v)
    if st.reference_origin is not None and st.reference_first is not None:
        fams[n.REFERENCE_INFO].add_metric(rl + [st.reference_origin, st.reference_reason], 1)
    if st.reference_shift is not None:
        fams[n.REFERENCE_SHIFT_STEP].add_metric(rl, st.reference_shift.step)
    for (signal, role), sh in sorted(st.shapes.items()):
        lv = rl + [signal, role]
        fams[n.SHIFT_ONSET_STEP].add_metric(lv, sh.onset)
        fams[n.SHIFT_SIZE].add_metric(lv, abs(sh.ratio - 1))
        fams[n.SHIFT_STEPS].add_metric(lv, sh.steps)
        for kind in ("step", "creep"):  # both, 1 / 0: a stable set of series (a backfill has no staleness markers)
            fams[n.SHIFT_SHAPE].add_metric(lv + [kind], 1 if sh.kind == kind else 0)


def _signals(fams: dict, rl: list[str], run, last, st) -> None:
    """Straggler tail, skipped updates, RS rejection, time outside the step timer, the signed timer residual."""
    fams[n.GRAD_NORM_NONFINITE_TOTAL].add_metric(rl, run.grad_nonfinite_total)
    for fam, v in ((n.ROLLOUT_STRAGGLER, last.straggler_ratio), (n.OUTSIDE_STEP_SECONDS, last.outside_seconds),
                   (n.TIMER_RESIDUAL, last.timer_residual), (n.GRAD_NORM_NONFINITE_RECENT, st.grad_nonfinite_recent),
                   (n.GRAD_NORM_NONFINITE, None if last.grad_norm_nonfinite is None else int(last.grad_norm_nonfinite))):
        if v is not None:
            fams[fam].add_metric(rl, v)
    for fam, stats in ((n.ROLLOUT_STRAGGLER_WINDOW, st.straggler), (n.OUTSIDE_STEP_WINDOW, st.outside),
                       (n.TIMER_RESIDUAL_WINDOW, st.timer_residual)):
        if stats:
            for stat, v in stats.items():
                fams[fam].add_metric(rl + [stat], v)
    if st.rs_seq_masked:
        for stat, v in st.rs_seq_masked.items():
            fams[n.RS_SEQ_MASKED_WINDOW].add_metric(rl + [st.rs_mode or "decoupled", stat], v)


def make_registry(store: RunStore) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(store))
    reg.register(PlannedCollector(store))  # checkpoint / validation facts, end of run (planned.py)
    reg.register(ConfigCollector(store))  # what the trainer's configuration says (trainer_config.py)
    reg.register(RemedyCollector(store))  # each alert's remedy per run layout, for the dashboards (remedy_info.py)
    return reg
