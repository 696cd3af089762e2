"""``/metrics`` render time: 10 concurrent runs x 150 passthrough keys (plus every contract series)
and 64 GPUs of sampler series, rendered by omniwatch's collectors, against a plain prometheus_client
registry holding exactly the same series (same names, labels, values) rendered by ``generate_latest``
in the same process, interleaved so both see the same machine state. Also GET /metrics over HTTP."""
from __future__ import annotations

import gc
from collections import deque
import time

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omniwatch.core.exposition import make_registry
from omniwatch.gpu.collector import GpuCollector
from omniwatch.gpu.devices import TraceBackend, TraceDevice
from omniwatch.gpu.sampler import GpuSampler
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_record
from omniwatch.simulate import RunSpec, step_dict

from common import median, pct

RUNS, KEYS, GPUS, STEPS = 10, 150, 64, 30
PASSTHROUGH_BASE = 46  # legacy step_dict keys that are not contract series


def build_store() -> RunStore:
    store = RunStore()
    for r in range(RUNS):
        spec = RunSpec(seed=r, extra_keys=KEYS - PASSTHROUGH_BASE)
        for s in range(1, STEPS + 1):
            # arrival = now: runs whose last step is old are expired from /metrics (finished runs)
            store.ingest("bench", f"run{r}", parse_record({"step": s, "data": step_dict(spec, s)}), "push")
    return store


def build_gpus(store: RunStore) -> GpuSampler:
    """64 H200s (8 nodes' worth on one sampler) fed one second of 5 Hz NVML samples each."""
    t0 = int(time.time() * 1e6)
    devs = [TraceDevice(i, f"GPU-{i:08x}-bench", "NVIDIA H200",
                        chunks=deque([[(t0 + k * 200_000, 100 if (i + k) % 3 else 0) for k in range(5)]]),
                        memory_used=40 << 30, memory_total=141 << 30, power=600.0, clock_hz=1.98e9)
            for i in range(GPUS)]
    sampler = GpuSampler(TraceBackend(devs), store, node="bench-node")
    sampler.poll_once()
    return sampler


def plain_twin(text: str) -> CollectorRegistry:
    """A registry of ordinary Gauge/Counter objects holding every sample of ``text``."""
    disable_created_metrics()  # omniwatch's collectors emit no _created series; neither may the twin
    reg = CollectorRegistry(auto_describe=False)
    for fam in text_string_to_metric_families(text):
        if not fam.samples:
            continue
        labels = list(fam.samples[0].labels)
        if fam.type == "counter":
            m = Counter(fam.name, fam.documentation or "x", labels, registry=reg)
            for s in fam.samples:
                if s.name.endswith("_total"):
                    (m.labels(**s.labels) if labels else m).inc(s.value)
        else:
            m = Gauge(fam.name, fam.documentation or "x", labels, registry=reg)
            for s in fam.samples:
                (m.labels(**s.labels) if labels else m).set(s.value)
    return reg


def _series(text: bytes) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


def run(iterations: int = 300, http: bool = True) -> dict:
    store = build_store()
    reg = make_registry(store)
    reg.register(GpuCollector(build_gpus(store), None, store))
    ours_text = generate_latest(reg)
    plain = plain_twin(ours_text.decode())
    plain_text = generate_latest(plain)
    ours, base, collect = [], [], []
    gc.collect()
    for _ in range(iterations):
        t0 = time.perf_counter()
        generate_latest(reg)
        t1 = time.perf_counter()
        generate_latest(plain)
        t2 = time.perf_counter()
        list(reg.collect())  # model -> metric families only (no text formatting)
        t3 = time.perf_counter()
        ours.append(t1 - t0)
        base.append(t2 - t1)
        collect.append(t3 - t2)
    out = {
        "series_omniwatch": _series(ours_text), "series_plain": _series(plain_text), "bytes": len(ours_text),
        "iterations": iterations,
        "omniwatch_p50_ms": median(ours) * 1e3, "omniwatch_p99_ms": pct(ours, 99) * 1e3,
        "plain_p50_ms": median(base) * 1e3, "plain_p99_ms": pct(base, 99) * 1e3,
        "collect_only_p50_ms": median(collect) * 1e3,
        "ratio_p50": median(ours) / median(base), "ratio_p99": pct(ours, 99) / pct(base, 99), "target_ratio": 1.2, "target_p99_ms": 20.0,
    }
    if http:
        out.update(_http(store, iterations))
    return out


def _http(store, iterations: int) -> dict:
    """GET /metrics from the exporter's own app on loopback. The app mounts its GPU area, which registers
    its own collector (here without a sampler: the MFU families only), so it gets a registry of the run
    collector alone; its series count is reported with the latency."""
    from omniwatch.app import create_app
    from omniwatch.httpguard import BackgroundServer
    from omniwatch.settings import Settings
    srv = BackgroundServer(create_app(store, make_registry(store), Settings(gpu="off"))).start()
    lat = []
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            first = c.get("/metrics")
            first.raise_for_status()
            series = _series(first.content)
            for _ in range(iterations):
                t0 = time.perf_counter()
                c.get("/metrics").raise_for_status()
                lat.append(time.perf_counter() - t0)
    finally:
        srv.stop()
    return {"http_p50_ms": median(lat) * 1e3, "http_p99_ms": pct(lat, 99) * 1e3, "http_series": series}
