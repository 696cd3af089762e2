"""A recorded NVML trace played back as a live GPU, in wall-clock time and looping: the GPU a demo,
the dashboard tests and a machine without NVIDIA driver can show.

Why: the GPU panels (utilisation, busy share, phase idle) can only be proven to show data with a GPU
sampler running, and CI has no GPU. :class:`LoopBackend` implements the sampler's ``devices.Backend``
over a recorded trace (``tests/fixtures/gpu/*.nvml.json`` or the shared ``h200_flowgrpo_shaped``
layout, both read by :func:`replay.normalize`): the sample at trace position ``p`` is returned once
the wall clock reaches ``origin + (p - start)``, lap after lap, so the real sampler, accounting and
phase attribution run unchanged. :meth:`LoopBackend.steps_between` gives the trace's own steps at
the same wall times, so a caller can ingest them as a run whose phases line up with the samples.

The traces record utilization samples and memory total (and memory used, in the shared layout), but
not power or SM clock. Those gauges come from :data:`H200_READINGS`, measured with ``nvidia-smi`` on
the same H200 model (context open and idle: 122 W, SM 1980 MHz; 8192x8192 bf16 matmul loop: ~470 W,
SM ~1740 MHz; 1139 MiB used), interpolated by the current utilization. They are replay values, not
readings of the recorded run: docs/dashboards.md says so.

``omniwatch serve --gpu replay:TRACE.json`` builds one with :func:`gpu_option`.
"""
from __future__ import annotations

import argparse
import bisect
import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .devices import Sample
from .trace import normalize

# Measured once on an NVIDIA H200 (driver 580.159.04) with nvidia-smi: see the module docstring.
H200_READINGS = {"idle_w": 122.0, "busy_w": 470.0, "idle_sm_hz": 1.98e9, "busy_sm_hz": 1.74e9,
                 "memory_used": 1139 << 20}
DEFAULT_TRACE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "gpu" / "h200_idle_validation.nvml.json"
LEAD_S = 2.0            # playback starts this long before the trace's first span (skips its idle lead-in)
BACKLOG_S = 60.0        # what a first read (last_us = 0) returns: like NVML's ring, some recent history
MAX_SAMPLES_PER_READ = 5000
MAX_TRACE_BYTES = 64 << 20


@dataclass(frozen=True)
class Trace:
    name: str
    gpu: str
    samples: list[Sample]          # (us, util), strictly increasing timestamps
    memory_total: int
    memory_used: list[tuple[float, int]]  # (unix s, bytes), may be empty
    steps: list[dict]              # {"step", "arrival", "timing": {"timing_s/<phase>": s}}
    start_s: float                 # trace position (unix s of the recording) that plays at the origin

    @property
    def period_us(self) -> int:
        return max(1, (self.samples[-1][0] - self.samples[0][0]) // max(1, len(self.samples) - 1))

    @property
    def lap_us(self) -> int:
        """One loop of the trace: first to last sample plus one sample period."""
        return self.samples[-1][0] - self.samples[0][0] + self.period_us


def load_trace(path: str | Path) -> Trace:
    """Read and check a trace; every problem is a ``ValueError`` naming the file and the reason."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_TRACE_BYTES:
            raise ValueError(f"{p}: larger than {MAX_TRACE_BYTES >> 20} MiB")
        fx = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"{p}: cannot read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    if not isinstance(fx, dict) or not ({"samples_us", "samples"} & fx.keys()) or "spans" not in fx:
        raise ValueError(f"{p}: not an NVML trace (needs samples_us or samples, and spans)")
    try:
        data = normalize(fx)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{p}: malformed trace ({type(e).__name__}: {e})") from None
    samples: list[Sample] = []
    for ts, util in sorted(data["samples"]):
        if 0 <= util <= 100 and (not samples or ts > samples[-1][0]):
            samples.append((ts, util))
    if len(samples) < 2:
        raise ValueError(f"{p}: fewer than two usable utilization samples")
    spans = [s["start"] for s in data["spans"] if isinstance(s.get("start"), (int, float))]
    first = samples[0][0] / 1e6
    start = max(first, min(spans) - LEAD_S) if spans else first
    used = [(float(t), int(b)) for t, b in fx.get("memory_used_bytes") or [] if b >= 0]
    steps = [s for s in data["steps"] if isinstance(s.get("timing"), dict) and isinstance(s.get("arrival"), (int, float))]
    return Trace(p.name, str(fx.get("gpu") or "NVIDIA H200"), samples, int(fx.get("memory_total_bytes") or 0),
                 sorted(used), steps, start)


class LoopDevice:
    """One replayed GPU (``devices.Device``). ``offset_us`` shifts this GPU within the lap, so several
    devices replaying one trace are not in lockstep."""

    def __init__(self, trace: Trace, index: int, origin_us: int, offset_us: int = 0,
                 clock: Callable[[], float] = time.time, readings: dict | None = None):
        self.trace, self.index, self.clock = trace, index, clock
        self.uuid = f"GPU-replay-{index:02d}-{zlib.crc32(trace.name.encode()):08x}"
        self.name = trace.gpu
        self.readings = dict(H200_READINGS, **(readings or {}))
        # wall_us = ts + shift + k * lap for lap k >= 0
        self.shift_us = origin_us - int(trace.start_s * 1e6) - offset_us
        self._ts = [s[0] for s in trace.samples]
        self._util = 0

    def _between(self, lo_us: int, hi_us: int) -> list[Sample]:
        """Samples with wall time in (lo_us, hi_us], capped to the newest MAX_SAMPLES_PER_READ."""
        tr, lap, ts = self.trace, self.trace.lap_us, self._ts
        first = ts[0] + self.shift_us
        if hi_us <= lo_us or hi_us < first:
            return []
        lo_us = max(lo_us, hi_us - MAX_SAMPLES_PER_READ * tr.period_us)
        k = max(0, (lo_us - first) // lap)
        out: list[Sample] = []
        while first + k * lap <= hi_us:
            base = self.shift_us + k * lap
            i = bisect.bisect_right(ts, lo_us - base)
            j = bisect.bisect_right(ts, hi_us - base)
            out.extend((ts[n] + base, tr.samples[n][1]) for n in range(i, j))
            k += 1
        return out[-MAX_SAMPLES_PER_READ:]

    def samples(self, last_us: int) -> list[Sample]:
        now_us = int(self.clock() * 1e6)
        lo = last_us if last_us else now_us - int(BACKLOG_S * 1e6)
        out = self._between(lo, now_us)
        if out:
            self._util = out[-1][1]
        return out

    def _mix(self, idle: float, busy: float) -> float:
        return idle + (busy - idle) * self._util / 100.0

    def memory(self) -> tuple[int, int]:
        used = self.readings["memory_used"]
        if self.trace.memory_used:
            pos = self._position_s()
            i = bisect.bisect_right(self.trace.memory_used, (pos, float("inf"))) - 1
            used = self.trace.memory_used[max(0, i)][1]
        total = self.trace.memory_total or max(used, 1)
        return min(used, total), total

    def _position_s(self) -> float:
        """Where in the recording (unix s of the recording) the wall clock is now."""
        rel = int(self.clock() * 1e6) - self.shift_us - self._ts[0]
        return (self._ts[0] + rel % self.trace.lap_us) / 1e6

    def power_watts(self) -> float | None:
        return self._mix(self.readings["idle_w"], self.readings["busy_w"])

    def sm_clock_hz(self) -> float | None:
        return self._mix(self.readings["idle_sm_hz"], self.readings["busy_sm_hz"])


class LoopBackend:
    """``devices.Backend`` over :class:`LoopDevice` objects; ``gpus`` replay the same trace, spread
    evenly over the lap. Playback position ``trace.start_s`` is at wall time ``origin`` (default: now).

    ``replayed``: these GPUs do not run the runs the exporter watches, so their idle is no evidence
    about them; the GPU module does not publish the inter-stage idle window (InterStageIdleGPU keeps
    the timer evidence) unless ``gpu_inter_stage_evidence=on`` says otherwise."""

    replayed = True

    def __init__(self, trace: Trace, gpus: int = 1, origin: float | None = None,
                 clock: Callable[[], float] = time.time, readings: dict | None = None):
        if not 1 <= gpus <= 64:
            raise ValueError("gpus must be 1-64")
        self.trace, self.clock = trace, clock
        self.origin_us = int((clock() if origin is None else origin) * 1e6)
        lap = trace.lap_us
        self.devices = [LoopDevice(trace, i, self.origin_us, i * lap // gpus, clock, readings) for i in range(gpus)]

    def open(self) -> list[LoopDevice]:
        return list(self.devices)

    def close(self) -> None:
        pass

    def steps_between(self, t0: float, t1: float) -> list[tuple[float, dict]]:
        """The trace's steps (of GPU 0's playback) whose step end falls in wall time (t0, t1]:
        ``[(arrival_unix_s, timing_dict)]`` in order, lap after lap."""
        lap_s = self.trace.lap_us / 1e6
        shift_s = self.devices[0].shift_us / 1e6
        first = self.trace.samples[0][0] / 1e6 + shift_s
        out = []
        k = max(0, int((t0 - first) // lap_s) - 1)
        while first + k * lap_s <= t1:
            for st in self.trace.steps:
                wall = st["arrival"] + shift_s + k * lap_s
                if t0 < wall <= t1 and wall >= self.origin_us / 1e6:
                    out.append((wall, dict(st["timing"])))
            k += 1
        return sorted(out, key=lambda x: x[0])


def replay_backend(path: str | Path, gpus: int = 1, **kw) -> LoopBackend:
    return LoopBackend(load_trace(path), gpus=gpus, **kw)


def gpu_option(value: str):
    """argparse ``type`` for ``omniwatch serve --gpu``: ``auto|on|off`` stay strings;
    ``replay:PATH`` (``replay:`` alone = the committed H200 trace) becomes a :class:`LoopBackend`."""
    v = value.strip()
    if v.lower() in ("auto", "on", "off"):
        return v.lower()
    if not v.startswith("replay:"):
        raise argparse.ArgumentTypeError("expected auto, on, off or replay:TRACE.json")
    path = v[len("replay:"):] or str(DEFAULT_TRACE)
    try:
        return replay_backend(path)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def settings_extra(option) -> dict:
    """``settings.extra`` entries for a parsed ``--gpu`` value (see :func:`gpu_option`)."""
    if isinstance(option, LoopBackend):
        return {"gpu": "on", "gpu_backend": option}
    return {"gpu": option} if option is not None else {}
