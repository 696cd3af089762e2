"""The NVML sampler through the device interface: error injection and recovery, missing pynvml,
the collector's exposition (checked by promtool), the MFU cause check, and the real-GPU path
(skipped where NVML cannot initialise)."""
import subprocess
import sys
from collections import deque

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from conftest import require_tool, skip_optional
from omniwatch import names
from omniwatch.gpu import devices
from omniwatch.gpu.collector import GpuCollector
from omniwatch.gpu.devices import GpuError, GpuUnavailable, TraceBackend, TraceDevice
from omniwatch.gpu.peaks import check_mfu, identify, verl_match
from omniwatch.gpu.sampler import GpuSampler
from omniwatch.core.model import RunStore
from omniwatch.core.parse import ParsedStep

S = 1_000_000


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def busy_chunk(t0, n=5, util=100):
    return [(int((t0 + 0.2 * i) * S), util) for i in range(1, n + 1)]


def make(chunks, open_failures=(), store=None, **kw):
    dev = TraceDevice(0, "GPU-aaaa", "NVIDIA H200", deque(chunks), memory_used=1 << 30,
                      memory_total=143771 << 20, power=300.0, clock_hz=1.98e9)
    clock = Clock()
    s = GpuSampler(TraceBackend([dev], open_failures), store, node="n1", clock=clock, **kw)
    return s, dev, clock


def up(store, target="n1/gpu0"):
    return store.sources.get(("nvml", target))


def test_gpu_lost_goes_down_backs_off_and_recovers_without_counters_going_back():
    store = RunStore()
    lost = GpuError("NVMLError_GpuIsLost")
    s, dev, clock = make([busy_chunk(100), busy_chunk(101, util=0), lost, busy_chunk(102), busy_chunk(103)],
                         open_failures=[], store=store)
    s.backend.open_failures = deque()
    seen = []
    for _ in range(2):
        s.poll_once()
        clock.t += 1
        seen.append(s.gpus["GPU-aaaa"].acct.busy_s + s.gpus["GPU-aaaa"].acct.idle_s)
    assert up(store) == 1
    s.backend.open_failures.extend([GpuUnavailable("driver reset in progress")])
    s.poll_once()                                  # the read fails: down, NVML closed
    assert up(store) == 0 and store.errors[("nvml", "NVMLError_GpuIsLost")] == 1
    assert s.backend.closes == 1
    clock.t += 0.5
    s.poll_once()                                  # inside the backoff: nothing tried
    assert s.backend.opens == 1
    clock.t += 1
    s.poll_once()                                  # re-open fails (driver not back): still down, longer backoff
    assert up(store) == 0 and s.backend.opens == 2
    clock.t += 1.5
    s.poll_once()
    assert s.backend.opens == 2                    # backoff doubled
    clock.t += 1
    for _ in range(3):
        s.poll_once()
        clock.t += 1
        seen.append(s.gpus["GPU-aaaa"].acct.busy_s + s.gpus["GPU-aaaa"].acct.idle_s)
    assert up(store) == 1
    assert seen == sorted(seen) and seen[-1] > seen[1]
    # the samples after the outage continue from the kept origin: the last_us passed is not 0
    assert dev.calls[-1] > 0


def test_missing_pynvml_is_reported_absent_and_sampler_stops(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    store = RunStore()
    s = GpuSampler(devices.NvmlBackend(), store, node="n1", required=True)
    s.poll_once()
    assert s.absent and "nvidia-ml-py" in s.absent
    assert up(store, "n1") == 0
    s.start()
    s._thread.join(5)                              # the thread ends by itself
    assert not s._thread.is_alive()
    assert devices.nvml_available() is not None


def test_nvml_init_failure_is_down_and_retried():
    store = RunStore()
    s, dev, clock = make([busy_chunk(100)], store=store)
    s.backend.open_failures = deque([GpuUnavailable("no driver")])
    s.poll_once()
    assert up(store, "n1") == 0 and s.absent is None
    clock.t += 1.1
    s.poll_once()
    assert up(store) == 1 and ("nvml", "n1") not in store.sources


def test_stale_device_resyncs_after_a_backwards_clock_jump():
    s, dev, clock = make([busy_chunk(1000), [], [], [], [], [], [], busy_chunk(500)])
    s.poll_once()
    for _ in range(7):
        clock.t += 1
        s.poll_once()
    acct = s.gpus["GPU-aaaa"].acct
    assert acct.events.get("clock_jump", 0) == 0  # events are moved to the store; check the origin moved
    assert acct.last_us == busy_chunk(500)[-1][0]
    assert 0 in dev.calls[1:]                      # a full read (last_us=0) was made to resync


def _collector_text(s, store):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(s, None, store))
    return generate_latest(reg).decode()


def test_collector_exposition_passes_promtool():
    store = RunStore()
    s, dev, clock = make([busy_chunk(100), busy_chunk(101, util=0)], store=store)
    s.poll_once()
    clock.t += 1
    s.poll_once()
    store.ingest("p", "e", ParsedStep(1, {"perf/mfu/actor": 8.2, "timing_s/step": 10.0}), "test")
    text = _collector_text(s, store)
    assert 'omniwatch_gpu_busy_seconds_total{gpu="0",node="n1",uuid="GPU-aaaa"} 0.8' in text
    assert 'omniwatch_gpu_idle_seconds_total{gpu="0",node="n1",uuid="GPU-aaaa"} 1.0' in text
    assert 'peak_tflops="989"' in text and names.GPU_POWER in text and names.GPU_SM_CLOCK in text
    assert 'omniwatch_mfu_implied_peak_tflops{experiment="e",project="p",role="actor"} 120.6' in text
    promtool = require_tool("promtool")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_verl_substring_match_order_and_relabeled_sku():
    assert verl_match("NVIDIA H200") == ("H200", 989.0)
    assert verl_match("NVIDIA H20") == ("H20", 148.0)
    assert verl_match("NVIDIA L40S") == ("L40S", 362.05)
    assert verl_match("NVIDIA L20X") == ("L20", 119.5)
    assert verl_match("NVIDIA GeForce RTX 4090") is None
    sil = identify("NVIDIA L20X", 143771 << 20)
    assert sil.relabeled and sil.silicon == "H200" and sil.verl_peak == 119.5
    chk = check_mfu(7.9, sil)
    assert chk.code == "relabeled_sku" and "VERL_OMNI_DEVICE_FLOPS_TFLOPS=989" in chk.cause
    assert chk.implied_peak == pytest.approx(989 / 7.9)
    assert check_mfu(0.45, identify("NVIDIA H200", 143771 << 20)).code is None
    genuine = identify("NVIDIA L20", 46068 << 20)
    assert not genuine.relabeled and genuine.peak == 119.5
    assert check_mfu(1.3, identify("NVIDIA H200", 143771 << 20)).code == "flops_overcount"
    assert check_mfu(4.0, identify("NVIDIA H200", 143771 << 20), override_tflops=120).code == "peak_mismatch"
    # the relabeled card is reported whatever the MFU value: 0.8 on an H200 divided by the L20's peak is
    # really ~0.1 (the check used to run only above 1.0)
    low = check_mfu(0.8, sil)
    assert low.code == "relabeled_sku" and "989" in low.cause
    assert check_mfu(0.8, sil, override_tflops=989).code is None  # pinned right: nothing to report
    assert check_mfu(0.0, sil).code is None  # MFU 0: the estimator is unsupported, not a wrong peak


def test_mfu_cause_series_for_a_relabeled_card():
    store = RunStore()
    dev = TraceDevice(0, "GPU-bbbb", "NVIDIA L20X", deque([busy_chunk(100)]), memory_total=143771 << 20)
    s = GpuSampler(TraceBackend([dev]), store, node="n1", clock=Clock())
    s.poll_once()
    store.ingest("p", "e", ParsedStep(3, {"perf/mfu/actor": 7.9}), "test")
    text = _collector_text(s, store)
    assert 'omniwatch_mfu_suspected_cause{cause="relabeled_sku",experiment="e",project="p",role="actor"} 1.0' in text
    assert 'name="NVIDIA L20X"' in text and 'peak_tflops="989"' in text
    assert 'omniwatch_mfu_device_peak_tflops{experiment="e",project="p",role="actor"} 989.0' in text
    store.ingest("p", "e", ParsedStep(4, {"perf/mfu/actor": 0.83}), "test")  # inflated, but under 1.0
    assert 'omniwatch_mfu_suspected_cause{cause="relabeled_sku",experiment="e",project="p",role="actor"} 1.0' in \
        _collector_text(s, store)


def test_real_nvml_path_when_a_gpu_is_present():
    why = devices.nvml_available()
    if why is not None:
        skip_optional(f"no usable NVML here ({why})",
                      "pip install -e '.[gpu]' on a machine with an NVIDIA GPU and driver")
    store = RunStore()
    s = GpuSampler(devices.NvmlBackend(), store, node="hw")
    try:
        s.poll_once()
        import time
        time.sleep(1.2)
        s.poll_once()
        st = s.snapshot()
        assert st and all(g.up for g in st)
        assert all(g.acct.busy_s + g.acct.idle_s > 0.5 for g in st)
        assert all(g.memory_total and g.memory_total > 0 for g in st)
    finally:
        s.stop()
