"""Wiring into the exporter app (one of ``app.AREAS``):
starts the NVML sampler, registers the GPU collector and the step listener, and serves

- ``POST /api/v1/phases`` (bearer = push token): exact phase spans from ``omniwatch.client.phase``;
  body ``{"project", "experiment", "phase", "start", "end", "gpus"?}`` or ``{"spans": [...]}``
  (at most 1000); each bad span is a 400/422 with the reason, never a crash.
- ``GET /api/v1/gpu``: GPUs, the sampler state and the MFU cause sentences (no secrets).

Options (``settings.extra``, else environment): ``gpu`` = auto|on|off (``OMNIWATCH_GPU``, default
auto: sample when NVML works here, stay silent otherwise; on: report the source down when it does
not), ``gpu_busy_threshold`` (``OMNIWATCH_GPU_BUSY_THRESHOLD``, percent, default 50),
``gpu_interval_s`` (default 1), ``gpu_node`` (default the host name), ``gpu_peak_tflops`` (the real
device peak, for an exporter that sees no GPU), ``gpu_trainer_flops_tflops`` (the trainer's
``VERL_OMNI_DEVICE_FLOPS_TFLOPS``, read from that variable when unset), ``gpu_inter_stage_evidence``
(``OMNIWATCH_GPU_INTER_STAGE_EVIDENCE``, on|off: publish the GPU inter-stage idle window that
InterStageIdleGPU prefers; default on, off for a replayed trace, whose GPUs run none of the runs).
"""
from __future__ import annotations

import logging
import math
import re
import time

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from .. import jsonin
from ..web import area_state, on_lifespan, require_token
from .attribution import Attributor
from .collector import GpuCollector, mfu_checks
from .devices import NvmlBackend, nvml_available
from .peaks import parse_override
from .sampler import GpuSampler

log = logging.getLogger(__name__)
router = APIRouter()

MAX_SPANS = 1000
MAX_SPAN_S = 24 * 3600.0
FUTURE_SLACK_S = 60.0
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class SpanIn(BaseModel):
    project: str = Field(min_length=1, max_length=128)
    experiment: str = Field(min_length=1, max_length=128)
    phase: str
    start: float
    end: float
    gpus: list[str | int] | None = Field(default=None, max_length=256)


class SpansIn(BaseModel):
    spans: list[SpanIn] = Field(max_length=MAX_SPANS)


def check_span(s: SpanIn, now: float) -> str | None:
    """The reason a span is unusable, or None."""
    if not _NAME.match(s.phase):
        return "phase must match [A-Za-z0-9_.:-]{1,64}"
    if not (math.isfinite(s.start) and math.isfinite(s.end)):
        return "start and end must be finite unix seconds"
    if s.end < s.start:
        return "end is before start"
    if s.end - s.start > MAX_SPAN_S:
        return "span longer than 24 h"
    if s.end > now + FUTURE_SLACK_S:
        return "span ends in the future (clock skew?)"
    return None


def _opt(settings, key: str):
    """An option set on this exporter (``settings.extra``: flags that parse into objects, tests), else the
    setting (OMNIWATCH_GPU, ...)."""
    v = (getattr(settings, "extra", {}) or {}).get(key)
    return v if v is not None else getattr(settings, key)


def init(app) -> None:
    settings, store, registry = app.state.settings, app.state.store, app.state.registry
    extra = getattr(settings, "extra", {}) or {}
    mode = str(_opt(settings, "gpu")).lower()
    sampler = attributor = None
    backend = extra.get("gpu_backend")  # a devices.Backend object: replays and tests
    if mode != "off":
        why = nvml_available() if mode == "auto" and backend is None else None
        if why is not None:
            log.info("GPU sampling off (gpu=auto): %s", why)
        else:
            sampler = GpuSampler(backend or NvmlBackend(), store, node=_opt(settings, "gpu_node"),
                                 threshold=float(_opt(settings, "gpu_busy_threshold")),
                                 interval_s=float(_opt(settings, "gpu_interval_s")), required=mode == "on")
            default = "off" if getattr(backend, "replayed", False) else "on"
            evidence = str(_opt(settings, "gpu_inter_stage_evidence") or default)
            attributor = Attributor(sampler, store, evidence=evidence.lower() not in ("off", "0", "false", "no"))
            store.listeners.append(attributor.on_step)
            _tie_to_lifespan(app, sampler)
    trainer = parse_override(_opt(settings, "gpu_trainer_flops_tflops"))
    peak_setting = _opt(settings, "gpu_peak_tflops")
    peak = parse_override(str(peak_setting)) if peak_setting is not None else None
    collector = GpuCollector(sampler, attributor, store, peak_tflops=peak, trainer_flops_tflops=trainer)
    registry.register(collector)
    app.state.gpu = collector


def init_fleet(app) -> None:
    """Per-fleet GPU time (issue 24 item 6; issue 33 item 3) over discovery's Ray task ledger (app.py calls it after
    every area: gpu reads discovery, discovery imports nothing of gpu)."""
    if (poller := getattr(app.state, "ray_tasks", None)) is None:
        return
    from .fleet import FleetAccountant, FleetCollector
    from .fleetnodes import NodeTotals
    app.state.fleet_nodes = NodeTotals(app.state.store)
    gpu = getattr(app.state, "gpu", None)
    if gpu is not None and gpu.sampler is not None:
        observe = getattr(app.state.settings, "extra", {}).get("gpu_call_watch", True)
        app.state.gpu_fleet = FleetAccountant(gpu.sampler, poller, poller.run_labels, app.state.store,
                                              observe=observe)
        on_lifespan(app, lambda: None, app.state.gpu_fleet.close)
    app.state.registry.register(FleetCollector(app.state.gpu_fleet, app.state.fleet_nodes))


def _tie_to_lifespan(app, sampler: GpuSampler) -> None:
    """Sample while the server runs."""
    on_lifespan(app, sampler.start, sampler.stop)


def _collector(request: Request) -> GpuCollector:
    return area_state(request, "gpu", "GPU module")


@router.post("/api/v1/phases")
async def post_phases(request: Request):
    require_token(request, request.app.state.settings.push_token, "push")
    c = _collector(request)
    store = request.app.state.store
    try:
        body = jsonin.loads(await request.body())  # depth-bounded: never a RecursionError
    except jsonin.BodyError as e:
        store.count_error("phases", e.reason)
        raise HTTPException(400, str(e)) from None
    try:
        spans = SpansIn.model_validate(body).spans if isinstance(body, dict) and "spans" in body \
            else [SpanIn.model_validate(body)]
    except Exception as e:  # pydantic.ValidationError; the message names fields, never values
        store.count_error("phases", "bad_span")
        raise HTTPException(422, f"invalid span: {_fields(e)}") from None
    now = time.time()
    for i, s in enumerate(spans):
        why = check_span(s, now)
        if why:
            request.app.state.store.count_error("phases", "bad_span")
            raise HTTPException(400, f"span {i}: {why}")
    if c.attributor is None:
        return {"accepted": 0, "attributed": False, "detail": "GPU sampling is off on this exporter"}
    for s in spans:
        gpus = frozenset(str(g) for g in s.gpus) if s.gpus else None
        c.attributor.add_span(s.project, s.experiment, s.phase, s.start, s.end, gpus)
    return {"accepted": len(spans), "attributed": True}


def _fields(e: Exception) -> str:
    errs = getattr(e, "errors", None)
    if callable(errs):
        return "; ".join(f"{'.'.join(str(x) for x in err.get('loc', ()))}: {err.get('msg')}" for err in errs()[:5])
    return "bad body"


@router.get("/api/v1/gpu")
def get_gpu(request: Request):
    c = _collector(request)
    s = c.sampler
    gpus = []
    if s is not None:
        with s.lock:
            for st in s.snapshot():
                gpus.append({"node": st.node, "gpu": st.index, "uuid": st.uuid, "name": st.name, "up": st.up,
                             "busy_s": st.acct.busy_s, "idle_s": st.acct.idle_s, "util": st.util,
                             "memory_total_bytes": st.memory_total})
    sil = c.silicon()
    checks = [{"project": p, "experiment": e, "role": r, "mfu": k.mfu, "implied_peak_tflops": k.implied_peak,
               "cause": k.code, "message": k.cause}
              for p, e, r, k in mfu_checks(request.app.state.store, sil, c.trainer_flops_tflops)]
    return {"sampling": s is not None and s.absent is None, "absent": s.absent if s else "off or no NVML here",
            "threshold_pct": s.threshold if s else None, "gpus": gpus,
            "silicon": sil.silicon if sil else None, "peak_tflops": sil.peak if sil else None, "mfu": checks}
