"""The NVML sampler: drains each GPU's utilization-sample ring about once a second, accumulates
busy/idle seconds, keeps the classified intervals of the last few minutes for phase attribution, and
reads memory, power and SM clock for the gauges.

Why drain ``nvmlDeviceGetSamples`` instead of scraping a utilization gauge: a gauge scraped every
10-15 s reports only the last <= 1 s window, so multi-second idle gaps between training phases are
seen only by luck (reference endpoints.md section 4.3). The driver keeps ~one sample per 0.2 s in a
ring; reading it incrementally from the last timestamp loses nothing as long as we drain faster than
the ring wraps.

Failure handling: any read error (GPU lost, driver reset, ``NVMLError_*``) marks that GPU's
``omniwatch_source_up{source="nvml",target="<node>/gpu<i>"}`` 0, closes NVML and re-opens it with
exponential backoff (1 s doubling to 60 s); on success up returns to 1. Counters live in per-UUID state
that survives re-opens, so they never go backwards, and the sample origin is kept so samples still in
the driver ring are neither lost nor counted twice. Without ``nvidia-ml-py`` or without a driver the
sampler logs one clear line and reports the source down (``required``) or absent (``auto``).
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .. import backoff
from ..periodic import Periodic
from .accounting import DEFAULT_MAX_GAP_S, DEFAULT_THRESHOLD, Interval, SampleAccountant
from .devices import Backend, Device, GpuError, GpuUnavailable, NvmlBackend, Sample

log = logging.getLogger(__name__)

SOURCE = "nvml"
DEFAULT_INTERVAL_S = 1.0
DEFAULT_RING_S = 300.0
STALE_S = 5.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0


@dataclass
class GpuState:
    """Everything known about one GPU (by UUID); outlives device handles."""

    node: str
    index: int
    uuid: str
    name: str
    acct: SampleAccountant
    ring: deque = field(default_factory=deque)  # Interval, sorted by end
    up: bool = True
    util: int | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    power_w: float | None = None
    sm_clock_hz: float | None = None
    last_new: float = 0.0  # monotonic time the last new sample arrived
    pids: frozenset = frozenset()  # compute pids NVML lists on this GPU (often none: gpu/fleet.py)

    @property
    def target(self) -> str:
        return f"{self.node}/gpu{self.index}"

    @property
    def labels(self) -> list[str]:
        return [self.node, str(self.index), self.uuid]

    @property
    def watermark(self) -> float | None:
        """Unix time up to which this GPU's intervals are complete."""
        return self.ring[-1].end if self.ring else None


class GpuSampler(Periodic):
    thread_name, what = "omniwatch-nvml", "GPU sampler poll"

    def __init__(self, backend: Backend | None = None, store=None, *, node: str | None = None,
                 threshold: float = DEFAULT_THRESHOLD, interval_s: float = DEFAULT_INTERVAL_S,
                 ring_seconds: float = DEFAULT_RING_S, max_gap_s: float = DEFAULT_MAX_GAP_S,
                 required: bool = False, clock: Callable[[], float] = time.monotonic,
                 raw_hook: Callable[[GpuState, list[Sample]], None] | None = None):
        if not 0 <= threshold < 100:
            raise ValueError("busy threshold must be in [0, 100) percent")
        self.backend = backend if backend is not None else NvmlBackend()
        self.store = store
        self.node = node or socket.gethostname()
        self.threshold, self.interval_s, self.max_gap_s = threshold, interval_s, max_gap_s
        self.ring_seconds = ring_seconds
        self.required = required
        self.clock = clock
        self.raw_hook = raw_hook
        self.lock = threading.RLock()
        self.gpus: dict[str, GpuState] = {}  # uuid -> state
        self.devices: list[tuple[Device, GpuState]] = []
        self.listeners: list[Callable[[], None]] = []  # called after every poll (phase attribution)
        self.absent: str | None = None  # why sampling is permanently off
        self.open_failures = 0  # consecutive NVML open/read failures (backoff.delay)
        self.next_open_at = 0.0
        self.polls = 0
        self.cpu_s = 0.0  # thread CPU seconds spent in poll_once (the sampler's own cost)
        super().__init__(interval_s)

    # -- source_up bookkeeping ----------------------------------------------------------------------
    def _up(self, target: str, up: bool) -> None:
        if self.store is not None:
            self.store.set_source_up(SOURCE, target, up)

    def _count(self, reason: str, n: int = 1) -> None:
        if self.store is not None and n:
            self.store.count_error(SOURCE, reason, n)

    # -- open / close ---------------------------------------------------------------------------------
    def _open(self, now: float) -> None:
        try:
            devs = self.backend.open()
        except GpuUnavailable as e:
            self._open_failed(now, str(e), permanent=e.permanent)
            return
        except GpuError as e:
            self._count(e.reason)
            self._open_failed(now, str(e), permanent=False)
            return
        with self.lock:
            self.devices = []
            for d in devs:
                st = self.gpus.get(d.uuid)
                if st is None:
                    st = GpuState(self.node, d.index, d.uuid, d.name,
                                  SampleAccountant(self.threshold, self.max_gap_s))
                    st.ring = deque(maxlen=max(16, int(self.ring_seconds / 0.1)))
                    self.gpus[d.uuid] = st
                st.index, st.name, st.up, st.last_new = d.index, d.name, True, now
                self.devices.append((d, st))
        if self.store is not None:
            self.store.remove_source(SOURCE, self.node)
        for _, st in self.devices:
            self._up(st.target, True)
        log.info("NVML: sampling %d GPU(s) on %s every %.1f s (busy above %g %%)",
                 len(self.devices), self.node, self.interval_s, self.threshold)

    def _open_failed(self, now: float, why: str, permanent: bool) -> None:
        with self.lock:
            known = list(self.gpus.values())
            for st in known:
                st.up = False
        for st in known:
            self._up(st.target, False)
        if permanent:
            if self.absent is None:
                log.warning("GPU sampling off: %s", why)
            self.absent = why
            if self.required and not known:
                self._up(self.node, False)
            return
        if not known:
            self._up(self.node, False)
        log.warning("NVML unavailable (%s); retrying in %.0f s", why, self._retry_in())
        self._schedule_reopen(now)

    def _close(self, now: float) -> None:
        self.devices = []
        try:
            self.backend.close()
        except Exception:
            log.debug("NVML close failed", exc_info=True)
        self._schedule_reopen(now)

    def _retry_in(self) -> float:
        return backoff.delay(self.open_failures, BACKOFF_MIN_S, BACKOFF_MAX_S)

    def _schedule_reopen(self, now: float) -> None:
        self.next_open_at = now + self._retry_in()
        self.open_failures += 1

    # -- one poll ----------------------------------------------------------------------------------
    def poll_once(self) -> None:
        now = self.clock()
        if self.absent is not None:
            return
        if not self.devices:
            if now < self.next_open_at:
                return
            self._open(now)
            if not self.devices:
                return
        failed = False
        for dev, st in list(self.devices):
            try:
                self._drain(dev, st, now)
            except GpuError as e:
                failed = True
                self._count(e.reason)
                with self.lock:
                    st.up = False
                self._up(st.target, False)
                log.warning("NVML read failed on %s (%s: %s); re-opening NVML in %.0f s",
                            st.target, e.reason, e, self._retry_in())
        if failed:
            self._close(now)
        else:
            self.open_failures = 0
        self.polls += 1
        for fn in list(self.listeners):
            try:
                fn()
            except Exception:
                log.exception("GPU poll listener failed")

    def _drain(self, dev: Device, st: GpuState, now: float) -> None:
        acct = st.acct
        samples = dev.samples(acct.last_us or 0)
        if samples:
            if self.raw_hook:
                self.raw_hook(st, samples)
            ivs = acct.feed(samples)
            st.last_new = now
        elif acct.last_us is not None and now - st.last_new > STALE_S:
            # Nothing newer than our origin for a while: either the GPU stopped sampling or the wall
            # clock went back (then every new sample is "older" than last_us and never returned).
            st.last_new = now
            ivs = acct.resync(dev.samples(0))
        else:
            ivs = []
        events = dict(acct.events)
        acct.events.clear()
        with self.lock:  # intervals first: a failing gauge read below must not lose them
            self._append(st, ivs)
            if samples:
                st.util = max(samples)[1]
        for reason, n in events.items():
            self._count(reason, n)
        used, total = dev.memory()
        power, clock = dev.power_watts(), dev.sm_clock_hz()
        pids = dev.pids() if hasattr(dev, "pids") else frozenset()
        with self.lock:
            st.memory_used, st.memory_total, st.power_w, st.sm_clock_hz = used, total, power, clock
            st.pids = pids
            st.up = True
        self._up(st.target, True)

    def _append(self, st: GpuState, ivs: list[Interval]) -> None:
        ring = st.ring
        for iv in ivs:
            if ring and iv.start < ring[-1].end - 1e-3:  # after a clock jump: keep the ring sorted
                ring.clear()
            ring.append(iv)
        if ring:
            horizon = ring[-1].end - self.ring_seconds
            while ring and ring[0].end < horizon:
                ring.popleft()

    # -- thread (periodic.py: a failed poll is logged, the exporter keeps serving) --------------------------
    scan_once = poll_once

    def next_wait(self, scan_cpu_s: float) -> float:
        self.cpu_s += scan_cpu_s
        if self.absent is not None:   # sampling is off for good: the thread ends
            self._stop.set()
        return self.interval_s

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        self.devices = []
        try:
            self.backend.close()
        except Exception:
            pass

    # -- reads for collector and attribution ---------------------------------------------------------
    def snapshot(self) -> list[GpuState]:
        with self.lock:
            return sorted(self.gpus.values(), key=lambda s: (s.index, s.uuid))
