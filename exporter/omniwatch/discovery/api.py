"""HTTP service discovery for Prometheus (``GET /api/v1/sd``) and the discovery collector.

``init(app)`` builds the Discovery from ``Settings.extra["discovery"]``, registers the collector on
the app's registry and ties the discovery thread to the app's lifespan (it starts when the server
starts and stops with it; building an app without serving it starts nothing).
"""
from __future__ import annotations


from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from prometheus_client.registry import Collector

from .. import names as n
from ..web import on_lifespan
from .config import from_settings
from . import ps
from .service import Discovery
from .taskmetrics import TaskCollector
from .taskring import TaskRing
from .taskwatch import TaskPoller
from .targets import KINDS, http_sd

router = APIRouter()


class DiscoveryCollector(Collector):
    def __init__(self, discovery: Discovery):
        self.discovery = discovery

    def describe(self):
        return n.describe((n.SD_TARGETS, n.ROLLOUT_MAX_NUM_SEQS))

    def collect(self):
        snap = self.discovery.snapshot
        sd = n.family(n.SD_TARGETS)
        for kind, cnt in snap.counts().items():
            sd.add_metric([kind], cnt)
        yield sd
        fam = n.family(n.ROLLOUT_MAX_NUM_SEQS)
        for labels, v in self.discovery.max_num_seqs_series(snap):
            fam.add_metric(labels, v)
        yield fam


@router.get("/api/v1/sd")
def service_discovery(request: Request, kind: str | None = None):
    """Prometheus http_sd_configs body; ``?kind=tq|rollout|reward|ray`` keeps one kind."""
    if kind is not None and kind not in KINDS:
        raise HTTPException(400, f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    disc: Discovery | None = getattr(request.app.state, "discovery", None)
    if disc is None:
        return JSONResponse([])
    snap = disc.snapshot
    return JSONResponse(http_sd(list(snap.targets), snap.project, snap.experiment, kind))


@router.get("/api/v1/ps")
def who_holds_the_step(request: Request):
    """What ``omniwatch ps`` prints: who holds the step, from the task-event source's latest poll."""
    poller = getattr(request.app.state, "ray_tasks", None)
    disc: Discovery | None = getattr(request.app.state, "discovery", None)
    if poller is None:
        return JSONResponse({"enabled": False, "jobs": [], "why": "the Ray task-event source is off (--ray-tasks)"})
    project, experiment = disc._run_labels() if disc else (None, None)
    return JSONResponse(ps.snapshot_json(poller.snapshot, project, experiment))


@router.get("/api/v1/discovery")
def discovery_status(request: Request):
    """What discovery found and why anything is missing (the same facts ``omniwatch discover`` prints)."""
    disc: Discovery | None = getattr(request.app.state, "discovery", None)
    if disc is None:
        return JSONResponse({"enabled": False})
    snap = disc.snapshot
    return JSONResponse({"enabled": True, "ts": snap.ts, "status": snap.status, "counts": snap.counts(),
                         "targets": [{"kind": t.kind, "address": t.address, "origin": t.origin, "role": t.role,
                                      "replica": t.replica} for t in snap.targets]})


def init(app) -> None:
    cfg = from_settings(app.state.settings)
    app.state.discovery = app.state.ray_tasks = app.state.gpu_fleet = None
    if cfg is None:
        return
    disc = Discovery(cfg, store=app.state.store)
    app.state.discovery = disc
    app.state.registry.register(DiscoveryCollector(disc))
    on_lifespan(app, disc.start, disc.stop)
    if cfg.ray_tasks:
        state_dir = getattr(app.state.settings, "state_dir", None)
        ring = TaskRing(state_dir, app.state.store, disc._run_labels) if state_dir else None   # persisted ledger
        poller = TaskPoller(cfg.ray_tasks, interval=cfg.ray_tasks_interval, timeout=cfg.timeout, job_id=cfg.ray_job,
                            ring=ring)
        app.state.ray_tasks = poller
        app.state.registry.register(TaskCollector(poller, disc._run_labels, cfg.ray_lanes_max))
        on_lifespan(app, poller.start, poller.stop)
        gpu = getattr(app.state, "gpu", None)   # the GPU area is mounted first (app.AREAS)
        if gpu is not None and gpu.sampler is not None:   # per-fleet GPU time (issue 24 item 6)
            from ..gpu.fleet import FleetAccountant, FleetCollector   # gpu.fleet imports discovery.phases
            app.state.gpu_fleet = FleetAccountant(gpu.sampler, poller, disc._run_labels, app.state.store)
            app.state.registry.register(FleetCollector(app.state.gpu_fleet))
