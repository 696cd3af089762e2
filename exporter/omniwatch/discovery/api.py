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


@router.get("/api/v1/raytasks/calls")
def shared_calls(request: Request, since: int = 0):
    """The task-event ledger's calls changed since ``since`` (its change counter), the actor and node tables and
    the poll times: what a node agent mirrors to attribute its own GPUs (discovery/taskshare.py)."""
    poller = getattr(request.app.state, "ray_tasks", None)
    if poller is None:
        raise HTTPException(404, "the Ray task-event source is off on this exporter (--ray-tasks)")
    from .taskshare import share
    with poller.lock:
        return JSONResponse(share(poller, max(0, since)))


@router.post("/api/v1/raytasks/recover")
async def recover_calls(request: Request):
    """Calls a node agent's observer saw that no poll did: their finished-task pages are fetched by the one
    poller (bearer = push token)."""
    from .. import jsonin
    from ..web import require_token
    from .taskshare import check_wants
    require_token(request, request.app.state.settings.push_token, "push")
    poller = getattr(request.app.state, "ray_tasks", None)
    if poller is None:
        raise HTTPException(404, "the Ray task-event source is off on this exporter (--ray-tasks)")
    try:
        wants, refresh = check_wants(jsonin.loads(await request.body()))
    except (jsonin.BodyError, ValueError) as e:
        request.app.state.store.count_error("ray_tasks", "bad_recover")
        raise HTTPException(400, str(e)) from None
    taken = sum(1 for w in wants if poller.recovery.want(*w))   # Recovery has its own lock: a poll may hold the poller's
    if refresh:
        poller.recovery.refresh_actors = True
    return {"taken": taken}


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
    app.state.discovery = app.state.ray_tasks = app.state.gpu_fleet = app.state.fleet_nodes = None
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
        poller.run_labels = disc._run_labels   # shared with the node agents (taskshare.py)
        store = app.state.store
        poller.on_pools = lambda pools: store.set_ray_pools(*disc._run_labels(), pools)   # the ledger's GPUs
        app.state.ray_tasks = poller
        app.state.registry.register(TaskCollector(poller, disc._run_labels, cfg.ray_lanes_max))
        on_lifespan(app, poller.start, poller.stop)
        # per-fleet GPU time (issue 24 item 6; every node: issue 33 item 3): this exporter's GPUs and the agents'
        from ..gpu.fleet import FleetAccountant, FleetCollector   # gpu.fleet imports discovery.phases
        from ..gpu.fleetnodes import NodeTotals
        app.state.fleet_nodes = NodeTotals(app.state.store)
        gpu = getattr(app.state, "gpu", None)   # the GPU area is mounted first (app.AREAS)
        if gpu is not None and gpu.sampler is not None:
            observe = getattr(app.state.settings, "extra", {}).get("gpu_call_watch", True)
            app.state.gpu_fleet = FleetAccountant(gpu.sampler, poller, disc._run_labels, app.state.store,
                                                  observe=observe)
            on_lifespan(app, lambda: None, app.state.gpu_fleet.close)
        app.state.registry.register(FleetCollector(app.state.gpu_fleet, app.state.fleet_nodes))
