"""The small device interface the sampler is built on, its NVML implementation, and a recorded-trace
implementation for tests and replays.

Why an interface: the busy/idle logic must be tested on machines without a GPU (CI has none), so the
sampler talks to a :class:`Backend` that opens :class:`Device` objects. :class:`NvmlBackend` wraps
``pynvml`` (PyPI ``nvidia-ml-py``, the ``gpu`` extra; imported lazily so the exporter runs without it);
:class:`TraceBackend` replays recorded ``nvmlDeviceGetSamples`` sequences chunk by chunk, with errors
injected where the script says, through exactly the same sampler code.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Protocol

Sample = tuple[int, int]  # (timestamp in microseconds of the CPU wall clock, utilization percent)


class GpuUnavailable(Exception):
    """No way to read GPUs here (library not installed, no driver, no device). ``permanent`` is
    True when retrying cannot help (the Python package is missing)."""

    def __init__(self, msg: str, permanent: bool = False):
        super().__init__(msg)
        self.permanent = permanent


class GpuError(Exception):
    """A read failed on an opened device (GPU lost, driver reset, any ``NVMLError_*``). ``reason`` is
    a short, label-safe name such as ``NVMLError_GpuIsLost``."""

    def __init__(self, reason: str, msg: str = ""):
        super().__init__(msg or reason)
        self.reason = reason


class Device(Protocol):
    index: int
    uuid: str
    name: str

    def samples(self, last_us: int) -> list[Sample]:
        """Utilization samples newer than ``last_us`` (0 = everything the driver buffer holds);
        ``[]`` when there are none. Raises :class:`GpuError`."""

    def memory(self) -> tuple[int, int]:
        """(used, total) bytes."""

    def power_watts(self) -> float | None: ...

    def sm_clock_hz(self) -> float | None: ...


class Backend(Protocol):
    def open(self) -> list[Device]:
        """Initialise and enumerate. Raises :class:`GpuUnavailable` (or :class:`GpuError`)."""

    def close(self) -> None: ...


# --- NVML --------------------------------------------------------------------------------------
def _import_pynvml():
    try:
        import pynvml  # noqa: PLC0415 - optional dependency, imported only when GPUs are sampled
    except ImportError as e:
        raise GpuUnavailable("nvidia-ml-py is not installed (pip install 'omniwatch[gpu]')", permanent=True) from e
    return pynvml


def _reason(exc: Exception) -> str:
    name = type(exc).__name__
    return name if name.startswith("NVMLError") else "NVMLError"


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlDevice:
    """One GPU through pynvml. Every NVML exception becomes :class:`GpuError`."""

    def __init__(self, nvml, index: int):
        self._nvml = nvml
        self.index = index
        try:
            self._h = nvml.nvmlDeviceGetHandleByIndex(index)
            self.uuid = _text(nvml.nvmlDeviceGetUUID(self._h))
            self.name = _text(nvml.nvmlDeviceGetName(self._h))
        except nvml.NVMLError as e:
            raise GpuError(_reason(e), str(e)) from e

    def _call(self, fn, *args):
        try:
            return fn(self._h, *args)
        except self._nvml.NVMLError as e:
            raise GpuError(_reason(e), str(e)) from e

    def samples(self, last_us: int) -> list[Sample]:
        n = self._nvml
        try:
            _, raw = n.nvmlDeviceGetSamples(self._h, n.NVML_GPU_UTILIZATION_SAMPLES, int(last_us))
        except n.NVMLError_NotFound:
            return []  # no sample newer than last_us: not an error
        except n.NVMLError as e:
            raise GpuError(_reason(e), str(e)) from e
        return [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in raw]

    def memory(self) -> tuple[int, int]:
        m = self._call(self._nvml.nvmlDeviceGetMemoryInfo)
        return int(m.used), int(m.total)

    def power_watts(self) -> float | None:
        try:
            return self._call(self._nvml.nvmlDeviceGetPowerUsage) / 1000.0
        except GpuError as e:
            if e.reason == "NVMLError_NotSupported":
                return None
            raise

    def sm_clock_hz(self) -> float | None:
        try:
            return self._call(self._nvml.nvmlDeviceGetClockInfo, self._nvml.NVML_CLOCK_SM) * 1e6
        except GpuError as e:
            if e.reason == "NVMLError_NotSupported":
                return None
            raise

    def pids(self) -> frozenset[int]:
        """Compute processes NVML lists on this GPU. Often empty in containers and VMs (on our H200 it was
        ``[]`` while a CUDA process ran): per-fleet GPU time uses it only where it names a worker's pid."""
        try:
            return frozenset(int(p.pid) for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._h))
        except Exception:  # NVMLError_* or an older pynvml: no pids, never a failed read
            return frozenset()


class NvmlBackend:
    """``nvmlInit`` + one :class:`NvmlDevice` per GPU; ``close`` calls ``nvmlShutdown``."""

    def __init__(self):
        self._nvml = None
        self.driver: str | None = None

    def open(self) -> list[Device]:
        nvml = _import_pynvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise GpuUnavailable(f"NVML init failed ({_reason(e)}: {e}); no NVIDIA driver on this host?") from e
        self._nvml = nvml
        try:
            self.driver = _text(nvml.nvmlSystemGetDriverVersion())
            count = nvml.nvmlDeviceGetCount()
            return [NvmlDevice(nvml, i) for i in range(count)]
        except nvml.NVMLError as e:
            self.close()
            raise GpuError(_reason(e), str(e)) from e
        except GpuError:
            self.close()
            raise

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down a lost driver may fail; nothing to do about it
                pass
            self._nvml = None


def nvml_available() -> str | None:
    """None when NVML can be initialised here, else the reason (for tests: skip, don't fail)."""
    b = NvmlBackend()
    try:
        devs = b.open()
    except (GpuUnavailable, GpuError) as e:
        return str(e)
    finally:
        b.close()
    return None if devs else "NVML reports no GPU"


# --- recorded traces -----------------------------------------------------------------------------
@dataclass
class TraceDevice:
    """A device that answers each ``samples`` call with the next scripted chunk: a list of samples or
    an exception to raise. ``memory``/``power``/``clock`` answer fixed values (or raise ``fail_reads``)."""

    index: int
    uuid: str
    name: str
    chunks: deque = field(default_factory=deque)
    memory_used: int = 0
    memory_total: int = 0
    power: float | None = None
    clock_hz: float | None = None
    fail_reads: Exception | None = None
    calls: list[int] = field(default_factory=list)  # the last_us of every samples() call
    visible_pids: frozenset = frozenset()           # what NVML's process list would answer

    def pids(self) -> frozenset[int]:
        return self.visible_pids

    def samples(self, last_us: int) -> list[Sample]:
        self.calls.append(last_us)
        if not self.chunks:
            return []
        chunk = self.chunks.popleft()
        if isinstance(chunk, Exception):
            raise chunk
        if last_us:
            return [s for s in chunk if s[0] > last_us]
        return list(chunk)

    def _check(self):
        if self.fail_reads is not None:
            raise self.fail_reads

    def memory(self) -> tuple[int, int]:
        self._check()
        return self.memory_used, self.memory_total

    def power_watts(self) -> float | None:
        self._check()
        return self.power

    def sm_clock_hz(self) -> float | None:
        self._check()
        return self.clock_hz


class TraceBackend:
    """Opens the given devices; ``open_failures`` is a queue of exceptions raised by successive
    ``open`` calls before it succeeds (driver not ready, reset in progress)."""

    def __init__(self, devices: Iterable[TraceDevice], open_failures: Iterable[Exception] = ()):
        self.devices = list(devices)
        self.open_failures = deque(open_failures)
        self.opens = 0
        self.closes = 0

    def open(self) -> list[Device]:
        self.opens += 1
        if self.open_failures:
            raise self.open_failures.popleft()
        return list(self.devices)

    def close(self) -> None:
        self.closes += 1


def chunked(samples: list[Sample], period_us: int) -> deque:
    """Split a recorded sample list into the chunks successive ~``period_us`` drains would return."""
    out: deque = deque()
    if not samples:
        return out
    cur: list[Sample] = []
    edge = samples[0][0] + period_us
    for s in samples:
        while s[0] > edge:
            out.append(cur)
            cur = []
            edge += period_us
        cur.append(s)
    out.append(cur)
    return out
