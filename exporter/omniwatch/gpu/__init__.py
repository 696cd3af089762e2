"""GPU busy/idle accounting at sub-second resolution (NVML utilization samples), attributed to
training phases, plus the MFU cause check. Modules: ``devices`` (NVML and recorded-trace devices),
``accounting`` (samples -> busy/idle intervals), ``sampler`` (the polling thread), ``attribution``
(phase spans -> per-phase counters), ``peaks`` (device peaks, MFU cause), ``collector`` (exposition),
``api`` (``POST /api/v1/phases``, ``GET /api/v1/gpu``, wiring into the app)."""
