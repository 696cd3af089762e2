"""GPU busy/idle accounting at sub-second resolution (NVML utilization samples), attributed to
training phases, plus the MFU cause check. Modules: ``devices`` (NVML and recorded-trace devices),
``accounting`` (samples -> busy/idle intervals), ``sampler`` (the polling thread), ``attribution``
(phase spans -> per-phase counters), ``peaks`` (device peaks, MFU cause), ``collector`` (exposition),
``api`` (``POST /api/v1/phases``, ``GET /api/v1/gpu``, wiring into the app)."""

# Alternative / coarse GPU sources that Prometheus scrapes directly (documented in docs/gpu.md);
# rules and dashboards fall back to them where omniwatch's own sampler is not running.
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"                 # 0-100, same NVML definition, last window only
DCGM_FB_USED, DCGM_FB_FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"  # MiB
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"                 # W
DCGM_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"                 # MHz
DCGM_GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # 0-1, profiling (may be missing on H100/H200)
DCGM_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"  # 0-1
RAY_GPU_UTIL = "ray_node_gpus_utilization"             # 0-100, labels GpuIndex, GpuDeviceName, ip
RAY_GRAM_USED, RAY_GRAM_AVAILABLE = "ray_node_gram_used", "ray_node_gram_available"  # MiB despite metadata
RAY_GPU_POWER_MW = "ray_node_gpu_power_milliwatts"
