"""HTTP service discovery for Prometheus (``GET /api/v1/sd``) and the discovery collector.

``init(app)`` builds the Discovery from ``Settings.extra["discovery"]``, registers the collector on
the app's registry and ties the discovery thread to the app's lifespan (it starts when the server
starts and stops with it; building an app without serving it starts nothing).
"""
from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client.registry import Collector

from .. import names as n
from ..runlabel import fit_label
from ..config import DEFAULT as ALERTS
from ..web import on_lifespan
from .config import from_settings
from . import ps
from .service import Discovery
from .taskmetrics import TaskCollector
from .taskring import TaskRing
from .jobs import JOBS_INTERVAL_S, JobWatch
from .taskwatch import TaskPoller
from .traceback import StackDumper, StackWatch
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


class StackCollector(Collector):
    """``omniwatch_ray_stack_info``: where the held call (and the straggler rank) is stuck, one line per kind."""

    def __init__(self, watch: StackWatch, run_labels):
        self.watch, self.run_labels = watch, run_labels

    def describe(self):
        return n.describe((n.RAY_STACK_INFO,))

    def collect(self):
        fam = n.family(n.RAY_STACK_INFO)
        project, experiment = self.run_labels()
        for of in ("holder", "straggler"):
            d = self.watch.shown(of)
            if d is not None and d.text:
                fam.add_metric([project or "", experiment or "", of, d.role, d.phase,
                                "" if d.rank is None else str(d.rank), d.text], d.at)
        yield fam


def _job_of(request: Request, project: str | None, experiment: str | None):
    store = getattr(request.app.state, "store", None)
    if store is None or not project:
        return None
    with store.lock:
        run = store.runs.get((project, experiment or ""))
        return run.planned.ray if run is not None else None


@router.get("/api/v1/ps")
def who_holds_the_step(request: Request):
    """What ``omniwatch ps`` prints: who holds the step, from the task-event source's latest poll, with where the
    held call is stuck (its stack, when dumped) and the run's Ray job."""
    poller = getattr(request.app.state, "ray_tasks", None)
    disc: Discovery | None = getattr(request.app.state, "discovery", None)
    if poller is None:
        return JSONResponse({"enabled": False, "jobs": [], "why": "the Ray task-event source is off (--ray-tasks)"})
    project, experiment = disc._run_labels() if disc else (None, None)
    watch: StackWatch | None = getattr(request.app.state, "ray_stacks", None)
    return JSONResponse(ps.snapshot_json(poller.snapshot, project, experiment,
                                         watch.shown("holder") if watch else None,
                                         watch.shown("straggler") if watch else None,
                                         _job_of(request, project, experiment)))


@router.get("/api/v1/stacks")
def stacks_json(request: Request):
    """The whole stack dumps the task-event source took (newest first), and what is shown now."""
    watch: StackWatch | None = getattr(request.app.state, "ray_stacks", None)
    if watch is None:
        return JSONResponse({"enabled": False, "dumps": [], "why": "the Ray task-event source is off (--ray-tasks)"})
    with watch.dumper.lock:
        dumps = [d.to_json() for d in reversed(watch.dumper.dumps)]
    return JSONResponse({"enabled": True, "dumps": dumps, "refused": {k: v[1] for k, v in watch.dumper.refused.items()},
                         "shown": {of: (d.to_json() if (d := watch.shown(of)) else None) for of in ("holder", "straggler")}})


@router.get("/stacks", response_class=PlainTextResponse)
def stacks_page(request: Request):
    """The whole dumps as text: the page the alert's remedy and ``omniwatch ps`` point at."""
    watch: StackWatch | None = getattr(request.app.state, "ray_stacks", None)
    if watch is None:
        return PlainTextResponse("The Ray task-event source is off (omniwatch serve --ray-tasks ADDR).\n")
    with watch.dumper.lock:
        dumps = list(reversed(watch.dumper.dumps))
    out = [f"Stacks of held Ray calls (newest first, at most {watch.dumper.dumps.maxlen}; py-spy through Ray's "
           "/task/traceback)\n"]
    for why in {v[1] for v in watch.dumper.refused.values()}:
        out.append(f"Refused: {why}\n")
    for d in dumps:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(d.at))
        out.append(f"=== {when} UTC  {d.of}: {d.method} ({d.role}, rank {d.rank}, node {d.node}, pid {d.pid}, "
                   f"task {d.key[0]} attempt {d.key[1]})\n--- {d.text}\n{d.full}\n")
    if not dumps:
        out.append("No stack dumped yet: a call is dumped when it holds a stalled step or lags its dispatch.\n")
    return PlainTextResponse("\n".join(out))


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
    app.state.discovery = app.state.ray_tasks = app.state.gpu_fleet = app.state.fleet_nodes = app.state.ray_stacks = None
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
        poller.store = store                   # bad rows, cut answers, clocks ahead: ingest errors

        def run_job() -> str | None:           # the watched run's Ray job, as JobWatch matched it: the views' job
            p, e = disc._run_labels()
            return store.ray_jobs().get((fit_label(p), fit_label(e))) if p and e else None
        poller.run_job = run_job
        poller.on_pools = lambda pools: store.set_ray_pools(*disc._run_labels(), pools)   # the ledger's GPUs
        app.state.ray_tasks = poller
        app.state.registry.register(TaskCollector(poller, disc._run_labels, cfg.ray_lanes_max))
        # the hang, end to end (issue 31): the stack of a held call and the run's Ray job, beside the ledger
        watch = StackWatch(StackDumper(poller.api, native=cfg.ray_stack_native), disc._run_labels, store.stalled,
                           straggler_dispatches=ALERTS.rank_straggler.dispatches)
        app.state.ray_stacks = watch
        poller.hooks += [watch, JobWatch(poller.api, store, disc._run_labels, job_id=cfg.ray_job,
                                         interval=max(poller.interval, JOBS_INTERVAL_S))]
        app.state.registry.register(StackCollector(watch, disc._run_labels))
        on_lifespan(app, poller.start, poller.stop)
        # per-fleet GPU time over this ledger: gpu/api.init_fleet, after this area (app.py; gpu reads discovery)
