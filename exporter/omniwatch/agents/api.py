"""Exporter side of the node agents (one of ``app.AREAS``):

- ``POST /api/v1/agents`` (bearer = push token): ``{"node", "address": "host:port", "ttl_s"?, "node_id"?}``,
  sent by every agent every few seconds (register = heartbeat);
- ``DELETE /api/v1/agents/{node}`` (bearer = push token): clean removal, no alert;
- ``GET /api/v1/agents``: the registry (no secrets);
- ``GET /api/v1/agents/sd``: Prometheus http_sd body of the live agents (job ``omniwatch-agent``, label ``node``).

The sweep that turns a silent agent into ``omniwatch_source_up{source="agent"} 0`` runs in a thread
tied to the app's lifespan (as discovery and the GPU sampler do), and on every read.
"""
from __future__ import annotations


from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from .. import jsonin
from ..periodic import Periodic
from ..web import area_state, on_lifespan, require_token
from .registry import AgentRegistry, RegistryFull, check_registration

router = APIRouter()
SWEEP_S = 1.0


def _registry(request: Request) -> AgentRegistry:
    return area_state(request, "agents", "agent registry")


def _require_token(request: Request) -> None:
    require_token(request, request.app.state.settings.push_token, "push")


@router.post("/api/v1/agents")
async def register_agent(request: Request):
    _require_token(request)
    reg = _registry(request)
    store = request.app.state.store
    try:
        body = jsonin.loads(await request.body())  # depth-bounded: never a RecursionError
    except jsonin.BodyError as e:
        store.count_error("agents", e.reason)
        raise HTTPException(400, str(e)) from None
    if not isinstance(body, dict):
        store.count_error("agents", "not_object")
        raise HTTPException(400, "body must be a JSON object")
    try:
        node, addr, ttl = check_registration(body.get("node"), body.get("address"), body.get("ttl_s"))
    except ValueError as e:
        request.app.state.store.count_error("agents", "bad_registration")
        raise HTTPException(422, str(e)) from None
    node_id = body.get("node_id") if isinstance(body.get("node_id"), str) else ""
    try:
        e = reg.register(node, addr, ttl, node_id)
    except RegistryFull as err:
        raise HTTPException(429, str(err)) from None
    return {"registered": True, "node": e.node, "address": e.address, "ttl_s": e.ttl_s}


@router.delete("/api/v1/agents/{node}")
def deregister_agent(node: str, request: Request):
    _require_token(request)
    return {"removed": _registry(request).deregister(node)}


@router.post("/api/v1/agents/fleet")
async def agent_fleet(request: Request):
    """A node agent's per-fleet GPU time (its cumulative totals, gpu/fleetnodes.py; bearer = push token)."""
    _require_token(request)
    nodes = getattr(request.app.state, "fleet_nodes", None)
    store = request.app.state.store
    if nodes is None:
        raise HTTPException(409, "per-fleet GPU time needs the Ray task-event source on this exporter (--ray-tasks)")
    try:
        taken = nodes.report(jsonin.loads(await request.body()))
    except (jsonin.BodyError, ValueError) as e:
        store.count_error("agents", "bad_fleet_report")
        raise HTTPException(400, str(e)) from None
    return {"taken": taken}


@router.get("/api/v1/agents")
def list_agents(request: Request):
    return JSONResponse([e.as_dict() for e in _registry(request).entries()])


@router.get("/api/v1/agents/sd")
def agents_sd(request: Request):
    return JSONResponse(_registry(request).http_sd())


def init(app) -> None:
    reg = AgentRegistry(app.state.store, **(app.state.settings.extra or {}).get("agents_registry", {}))
    app.state.agents = reg

    def sweep_all() -> None:
        reg.sweep()
        nodes = getattr(app.state, "fleet_nodes", None)
        if nodes is not None:   # a down agent's node: its GPUs' seconds are unmeasured, not idle
            with reg.lock:
                live = {node: e.live for node, e in reg.agents.items()}
            nodes.sweep(live)
    sweep = Periodic(SWEEP_S, sweep_all, name="omniwatch-agent-sweep", what="agent sweep", wait_first=True)
    on_lifespan(app, sweep.start, sweep.stop)
