"""GPUs: busy share first, one series per GPU merged from the three sources a VeRL-Omni cluster may have
(omniwatch's NVML sampler, dcgm-exporter, Ray's node agent; ``a or b or c`` keeps the first source that
has the GPU, as the memory recording rule does), and at hundreds of GPUs per-node summaries (min / mean /
max over a node's GPUs, the least busy GPUs, a heatmap of every GPU) instead of 1,500 lines; the per-GPU
lines sit in collapsed rows. Units are normalised: DCGM/Ray percent -> ratio, MiB -> bytes, mW -> W.

The NVML busy/idle second counters move with every 0.2 s sample (not once per training step), so their
rate over $__rate_interval is the busy share of that interval."""
from __future__ import annotations

from .. import names as n
from ..config import Config
from ..alerting.records import (REC_GPU_MEMORY)
from .. import external as x
from .panels import RATE_INTERVAL, Dashboard, Panel, Row, Step, Target, cfg_step, default_tags, first_of, gsel, rate

LEG = "{{node}} gpu{{gpu}}"
NODE = "{{node}}"
BY = f"{n.L_NODE}, {n.L_GPU}"


def per_gpu(expr: str) -> str:
    return f"max by ({BY}) ({expr})"


def _nvml_busy() -> str:
    busy = f"sum by ({BY}) ({rate(gsel(n.GPU_BUSY_SECONDS_TOTAL))})"
    idle = f"sum by ({BY}) ({rate(gsel(n.GPU_IDLE_SECONDS_TOTAL))})"
    return f"{busy} / (({busy} + {idle}) > 0)"


# One busy-share series per GPU: NVML's 5 Hz sample counters where omniwatch samples the GPU, else the
# average utilisation gauge of DCGM, else Ray's (both percent).
BUSY = first_of(
    _nvml_busy(),
    per_gpu(f"avg_over_time({gsel(x.DCGM_UTIL, run=True)}[{RATE_INTERVAL}])") + " / 100",
    per_gpu(f"avg_over_time({gsel(x.RAY_GPU_UTIL, run=True)}[{RATE_INTERVAL}])") + " / 100",
)
UTIL = first_of(per_gpu(gsel(n.GPU_UTILIZATION)),
                per_gpu(gsel(x.DCGM_UTIL, run=True)) + " / 100",
                per_gpu(gsel(x.RAY_GPU_UTIL, run=True)) + " / 100")
MEM_USED = first_of(per_gpu(gsel(n.GPU_MEMORY_USED)),
                    per_gpu(gsel(x.DCGM_FB_USED, run=True)) + f" * {x.MIB}",
                    per_gpu(gsel(x.RAY_GRAM_USED, run=True)) + f" * {x.MIB}")
MEM_SHARE = per_gpu(gsel(REC_GPU_MEMORY))  # the GPUMemoryNearFull rule's own series, all sources
POWER = first_of(per_gpu(gsel(n.GPU_POWER)),
                 per_gpu(gsel(x.DCGM_POWER, run=True)),
                 per_gpu(gsel(x.RAY_GPU_POWER, run=True)) + " / 1000")
BOTTOM_K = 10

BUSY_BAND = (Step(None, "red"), Step(0.8, "green", note="a GPU busy under 80 % of the time is worth a look; "
                                                       "the alerts count idle per phase, not per GPU"))

def bottom_over_range() -> str:
    """The busy share of the BOTTOM_K GPUs ranked once over the dashboard's range (mean busy share over
    ``$__range`` evaluated ``@ end()``, so every step of the range query keeps the same GPUs)."""
    rank = f"bottomk({BOTTOM_K}, avg_over_time(({BUSY})[$__range:$__interval] @ end()))"
    return f"({BUSY}) and on ({BY}) ({rank})"


def dashboard(cfg: Config) -> Dashboard:
    """This dashboard drawn with ``cfg`` (thresholds, windows, selectors, the words of its descriptions)."""
    SUMMARY = Row("Busy share", (
        Panel("Busy share by node (min / mean / max over its GPUs)",
              "Per node: the least busy, the mean and the busiest of its GPUs. Busy = share of time a kernel ran "
              "(NVML's 5 Hz samples, or the DCGM / Ray utilisation averaged over the interval). A low min with a high "
              "max is an imbalanced node (a straggler rank, an idle reward GPU); all three low is a node waiting.",
              (Target(f"min by ({n.L_NODE}) ({BUSY})", NODE + " min"),
               Target(f"avg by ({n.L_NODE}) ({BUSY})", NODE + " mean", dashed=True),
               Target(f"max by ({n.L_NODE}) ({BUSY})", NODE + " max", dashed=True)),
              unit="percentunit", min=0, max=1, thresholds=BUSY_BAND, show_thresholds="dashed", w=12, h=9,
              scope="node", runbook=n.ALERT_IDLE),
        Panel(f"Least busy GPUs (bottom {BOTTOM_K})",
              f"The {BOTTOM_K} GPUs with the lowest mean busy share over the whole time range (ranked once, at its end: "
              "ranking at each moment drew the union of every GPU that was ever among the lowest), whatever the cluster "
              "size. A GPU here for hours is a GPU the job does not use (wrong placement, a dead rank).",
              (Target(bottom_over_range(), LEG),),
              unit="percentunit", min=0, max=1, thresholds=BUSY_BAND, w=12, h=9, scope="node", runbook=n.ALERT_IDLE),
        Panel("Busy share of every GPU (heatmap)",
              "How many GPUs sit at each busy share over time (buckets of 5 %): one glance at 8 or 1,500 GPUs. A band "
              "near 0 during training is idle GPUs; two bands are two pools (rollout and actor, or a reward pool).",
              (Target(BUSY, LEG),), unit="percentunit", kind="heatmap", w=24, h=8, scope="node"),
    ))

    MEMORY = Row("Memory and power by node", (
        Panel("GPU memory used share (max per node)",
              "The GPUMemoryNearFull rule's series (used / total from NVML, DCGM or Ray), the fullest GPU of each node. "
              "Staying above the line for the rule's window means no headroom in any phase.",
              (Target(f"max by ({n.L_NODE}) ({MEM_SHARE})", NODE),),
              unit="percentunit", min=0, max=1, thresholds=(Step(None, "green"), cfg_step(cfg, "gpu_memory.ratio", "red")),
              show_thresholds="dashed+area", w=8, scope="node", runbook="GPUMemoryNearFull"),
        Panel("SM clock (min per node)",
              "The slowest SM clock of each node's GPUs (NVML). Dropping under load is power or thermal throttling, "
              "which lowers MFU without any software change.",
              (Target(f"min by ({n.L_NODE}) ({per_gpu(gsel(n.GPU_SM_CLOCK))})", NODE),),
              unit="hertz", min=0, w=8, scope="node", runbook=n.ALERT_MFU_DROP),
        Panel("GPU power (sum per node)",
              "Power draw of each node's GPUs. Flat well below the board limits while utilisation reads 100 % means "
              "small kernels or waiting (the utilisation definition counts any kernel).",
              (Target(f"sum by ({n.L_NODE}) ({POWER})", NODE),), unit="watt", min=0, w=8, scope="node"),
        Panel("Tensor pipe active (DCGM, mean per node)",
              "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: ratio of cycles the tensor pipe is busy, the closest hardware counter "
              "to MFU. Far below the reported MFU means the MFU estimate is wrong (see MFUImpossible).",
              (Target(f"avg by ({n.L_NODE}) ({per_gpu(gsel(x.DCGM_TENSOR_ACTIVE, run=True))})", NODE),),
              unit="percentunit", min=0, max=1, w=24, h=7, scope="node", runbook=n.ALERT_MFU_IMPOSSIBLE),
    ))

    PER_GPU = Row("Per GPU (one series per GPU)", (
        Panel("Busy share per GPU",
              "Busy seconds / (busy + idle) seconds per GPU from omniwatch's NVML sample counters (every 0.2 s sample, "
              "so inter-stage gaps lower it), else DCGM / Ray utilisation averaged over the interval.",
              (Target(BUSY, LEG),), unit="percentunit", min=0, max=1, thresholds=BUSY_BAND, show_thresholds="dashed",
              w=12, scope="node", runbook=n.ALERT_IDLE),
        Panel("GPU utilisation per GPU",
              "Share of time a kernel was running at the last sample (NVML definition, shared by all three sources; "
              "100 % says a kernel ran, not that the GPU was full). A gauge scraped every 10-15 s misses short gaps: "
              "read the busy share.",
              (Target(UTIL, LEG),), unit="percentunit", min=0, max=1, w=12, scope="node"),
        Panel("GPU memory used per GPU",
              "Device memory in use (DCGM FB_USED and Ray gram_used are MiB, converted to bytes here). Close to total "
              "means the next larger batch or resolution will OOM.",
              (Target(MEM_USED, LEG),), unit="bytes", min=0, w=12, scope="node", runbook="GPUMemoryNearFull"),
        Panel("GPU power per GPU", "Power draw per GPU.", (Target(POWER, LEG),), unit="watt", min=0, w=12, scope="node"),
    ), collapsed=True)

    return Dashboard(
        config=cfg,
        uid="omniwatch-gpus",
        title="omniwatch / GPUs",
        description="GPU busy share first; per-node summaries (min / mean / max, least busy GPUs, heatmap) that stay "
                    "readable at hundreds of GPUs; one merged series per GPU from NVML, DCGM or Ray in the collapsed "
                    "per-GPU row.",
        rows=(SUMMARY, MEMORY, PER_GPU),
        tags=default_tags("gpu"),
        gpu_variables=True,
        variable_metrics=(n.STEP, x.DCGM_UTIL, x.RAY_GPU_UTIL),
        gpu_variable_metrics=(n.GPU_PHASE_BUSY_SECONDS_TOTAL, x.DCGM_UTIL, x.RAY_GPU_UTIL),
    )
