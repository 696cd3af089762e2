"""GPUs: utilisation, memory and power per node and GPU from the three sources a VeRL-Omni cluster may
have: omniwatch's own NVML sampler (``omniwatch_gpu_*``, per device, no run labels), dcgm-exporter and
Ray's node agent (both scraped with the run's target labels, and relabelled to ``node``/``gpu``).
Units are normalised here: DCGM/Ray percent -> ratio, MiB -> bytes, mW -> W."""
from __future__ import annotations

from .. import names as n
from . import external as x
from .spec import Dashboard, Panel, Row, Step, Target, default_tags, gsel, rate

LEG = "{{node}} gpu{{gpu}}"
NV, DC, RY = "nvml ", "dcgm ", "ray "
BY = f"{n.L_NODE}, {n.L_GPU}"


def per_gpu(expr: str) -> str:
    return f"max by ({BY}) ({expr})"


UTIL = Row("Utilisation", (
    Panel("GPU utilisation", "Share of time a kernel was running (NVML definition, shared by all three sources; "
          "100 % says a kernel ran, not that the GPU was full). Gaps between phases show as dips only in the "
          "busy-share panel: a gauge scraped every 10-15 s misses short idle gaps.",
          (Target(per_gpu(gsel(n.GPU_UTILIZATION)), NV + LEG),
           Target(per_gpu(gsel(x.DCGM_UTIL, run=True)) + " / 100", DC + LEG),
           Target(per_gpu(gsel(x.RAY_GPU_UTIL, run=True)) + " / 100", RY + LEG)),
          unit="percentunit", min=0, max=1, w=12, runbook=n.ALERT_IDLE),
    Panel("Busy share (5 Hz sampler)", "Busy seconds / (busy + idle) seconds from omniwatch's NVML sample "
          "counters: unlike the utilisation gauge this counts every 0.2 s sample, so inter-stage gaps lower it.",
          (Target(f"sum by ({BY}) ({rate(gsel(n.GPU_BUSY_SECONDS_TOTAL))}) / "
                  f"(sum by ({BY}) ({rate(gsel(n.GPU_BUSY_SECONDS_TOTAL))}) + "
                  f"sum by ({BY}) ({rate(gsel(n.GPU_IDLE_SECONDS_TOTAL))}))", LEG),),
          unit="percentunit", min=0, max=1, thresholds=(Step(None, "red"), Step(0.8, "green")),
          show_thresholds="dashed", w=12, runbook=n.ALERT_IDLE),
    Panel("Tensor pipe active (DCGM)", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: ratio of cycles the tensor pipe is "
          "busy, the closest hardware counter to MFU. Far below the reported MFU means the MFU estimate is "
          "wrong (see MFUImpossible).",
          (Target(per_gpu(gsel(x.DCGM_TENSOR_ACTIVE, run=True)), DC + LEG),),
          unit="percentunit", min=0, max=1, w=12, runbook=n.ALERT_MFU_IMPOSSIBLE),
    Panel("SM clock", "SM clock from NVML. Dropping under load is power or thermal throttling, which lowers "
          "MFU without any software change.",
          (Target(per_gpu(gsel(n.GPU_SM_CLOCK)), NV + LEG),), unit="hertz", min=0, w=12, runbook=n.ALERT_MFU_DROP),
))

MEMORY = Row("Memory and power", (
    Panel("GPU memory used", "Device memory in use. DCGM FB_USED and Ray gram_used are MiB and are converted "
          "to bytes here. Close to total means the next larger batch or resolution will OOM.",
          (Target(per_gpu(gsel(n.GPU_MEMORY_USED)), NV + LEG),
           Target(per_gpu(gsel(x.DCGM_FB_USED, run=True)) + f" * {x.MIB}", DC + LEG),
           Target(per_gpu(gsel(x.RAY_GRAM_USED, run=True)) + f" * {x.MIB}", RY + LEG)),
          unit="bytes", min=0, w=12),
    Panel("GPU memory used share", "Used / total device memory (NVML; DCGM used / (used + free)).",
          (Target(f"{per_gpu(gsel(n.GPU_MEMORY_USED))} / {per_gpu(gsel(n.GPU_MEMORY_TOTAL))}", NV + LEG),
           Target(f"{per_gpu(gsel(x.DCGM_FB_USED, run=True))} / ({per_gpu(gsel(x.DCGM_FB_USED, run=True))} + "
                  f"{per_gpu(gsel(x.DCGM_FB_FREE, run=True))})", DC + LEG)),
          unit="percentunit", min=0, max=1, thresholds=(Step(None, "green"), Step(0.95, "red")),
          show_thresholds="dashed", w=12),
    Panel("GPU power", "Power draw. Power flat well below the board limit while utilisation reads 100 % means "
          "small kernels or waiting (the utilisation definition counts any kernel).",
          (Target(per_gpu(gsel(n.GPU_POWER)), NV + LEG),
           Target(per_gpu(gsel(x.DCGM_POWER, run=True)), DC + LEG),
           Target(per_gpu(gsel(x.RAY_GPU_POWER, run=True)) + " / 1000", RY + LEG)),
          unit="watt", min=0, w=24),
))

DASHBOARD = Dashboard(
    uid="omniwatch-gpus",
    title="omniwatch / GPUs",
    description="GPU utilisation, memory and power per node and GPU from omniwatch's NVML sampler, dcgm-exporter "
                "and Ray.",
    rows=(UTIL, MEMORY),
    tags=default_tags("gpu"),
    gpu_variables=True,
    variable_metrics=(n.STEP, x.DCGM_UTIL, x.RAY_GPU_UTIL),
    gpu_variable_metrics=(n.GPU_PHASE_BUSY_SECONDS_TOTAL, x.DCGM_UTIL, x.RAY_GPU_UTIL),
)
