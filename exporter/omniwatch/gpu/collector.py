"""Render-time collector for the GPU families (sampler counters and gauges, phase attribution, the
MFU cause check). Registered on the app's registry next to ``exposition.RunCollector``; like it, it
builds fresh metric families on every scrape and sets no timestamps."""
from __future__ import annotations

from collections import Counter

from prometheus_client.registry import Collector

from .. import names as n
from .peaks import Silicon, check_mfu, identify

OWNED = (
    n.GPU_BUSY_SECONDS_TOTAL, n.GPU_IDLE_SECONDS_TOTAL, n.GPU_UTILIZATION, n.GPU_MEMORY_USED, n.GPU_MEMORY_TOTAL,
    n.GPU_POWER, n.GPU_SM_CLOCK, n.GPU_INFO, n.GPU_PHASE_BUSY_SECONDS_TOTAL, n.GPU_PHASE_IDLE_SECONDS_TOTAL,
    n.GPU_IDLE_RATIO, n.GPU_INTER_STAGE_IDLE_WINDOW, n.MFU_IMPLIED_PEAK, n.MFU_SUSPECTED_CAUSE, n.MFU_DEVICE_PEAK,
)


def live_runs(store, runs):
    """The runs the store still exports (a finished, expired run, or one restored from a checkpoint that
    no current source produces, must not alert here either)."""
    if store is None:
        return list(runs)
    with store.lock:
        now = store.clock()
        return [k for k in runs if k in store.runs and not store.hidden(store.runs[k], now)]


def local_silicon(states) -> Silicon | None:
    """The silicon most of this node's GPUs are (the peak the MFU check compares against)."""
    sils = [identify(s.name, s.memory_total) for s in states]
    sils = [s for s in sils if s.peak]
    if not sils:
        return None
    return Counter(sils).most_common(1)[0][0]


def mfu_checks(store, sil: Silicon | None, override_tflops: float | None):
    """[(project, experiment, role, MfuCheck)] for every run's latest reported MFU > 0."""
    out = []
    if store is None:
        return out
    with store.lock:
        latest = [(p, e, dict(r.last.mfu)) for (p, e), r in store.runs.items() if r.last is not None]
    for p, e, mfu in latest:
        for role, v in sorted(mfu.items()):
            if v > 0:
                out.append((p, e, role, check_mfu(v, sil, override_tflops)))
    return out


class GpuCollector(Collector):
    def __init__(self, sampler=None, attributor=None, store=None, *, peak_tflops: float | None = None,
                 trainer_flops_tflops: float | None = None):
        self.sampler, self.attributor, self.store = sampler, attributor, store
        self.peak_tflops = peak_tflops              # the real device peak, for exporters without local GPUs
        self.trainer_flops_tflops = trainer_flops_tflops  # VERL_OMNI_DEVICE_FLOPS_TFLOPS the trainer uses, if known

    def describe(self):
        return n.describe(OWNED)

    def silicon(self) -> Silicon | None:
        states = self.sampler.snapshot() if self.sampler is not None else []
        sil = local_silicon(states)
        if self.peak_tflops:
            name = sil.name if sil else "configured"
            return Silicon(name, sil.verl_key if sil else None, sil.verl_peak if sil else None,
                           sil.silicon if sil else "configured", self.peak_tflops, sil.relabeled if sil else False)
        return sil

    def collect(self):
        f = {name: n.family(name) for name in OWNED}
        if self.sampler is not None:
            with self.sampler.lock:
                for st in self.sampler.snapshot():
                    lv = st.labels
                    f[n.GPU_BUSY_SECONDS_TOTAL].add_metric(lv, st.acct.busy_s)
                    f[n.GPU_IDLE_SECONDS_TOTAL].add_metric(lv, st.acct.idle_s)
                    sil = identify(st.name, st.memory_total)
                    f[n.GPU_INFO].add_metric(lv + [st.name, f"{sil.peak:g}" if sil.peak else ""], 1)
                    if not st.up:
                        continue  # stale gauges would look like live readings
                    for fam, v in ((n.GPU_UTILIZATION, None if st.util is None else st.util / 100.0),
                                   (n.GPU_MEMORY_USED, st.memory_used), (n.GPU_MEMORY_TOTAL, st.memory_total),
                                   (n.GPU_POWER, st.power_w), (n.GPU_SM_CLOCK, st.sm_clock_hz)):
                        if v is not None:
                            f[fam].add_metric(lv, v)
        if self.attributor is not None:
            a = self.attributor
            with a.lock:
                for (p, e, node, gpu, uuid, phase), (busy, idle) in sorted(a.totals.items()):
                    lv = [p, e, node, gpu, uuid, phase]
                    f[n.GPU_PHASE_BUSY_SECONDS_TOTAL].add_metric(lv, busy)
                    f[n.GPU_PHASE_IDLE_SECONDS_TOTAL].add_metric(lv, idle)
                for (p, e), (_step, ratios) in sorted(a.ratios.items()):
                    for phase, r in sorted(ratios.items()):
                        f[n.GPU_IDLE_RATIO].add_metric([p, e, phase], r)
            windows = a.inter_stage_windows()
            for p, e in sorted(live_runs(self.store, windows)):
                for stat, v in windows[(p, e)].items():
                    f[n.GPU_INTER_STAGE_IDLE_WINDOW].add_metric([p, e, stat], v)
        sil = self.silicon()
        for p, e, role, chk in mfu_checks(self.store, sil, self.trainer_flops_tflops):
            if sil is not None and sil.peak:
                f[n.MFU_DEVICE_PEAK].add_metric([p, e, role], sil.peak)
            if chk.implied_peak is not None:
                f[n.MFU_IMPLIED_PEAK].add_metric([p, e, role], chk.implied_peak)
            if chk.code:
                f[n.MFU_SUSPECTED_CAUSE].add_metric([p, e, role, chk.code], 1)
        yield from f.values()
