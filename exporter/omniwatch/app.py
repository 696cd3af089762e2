"""The exporter's one FastAPI app: ``/metrics``, the push API, the Alertmanager webhook and alert
history, HTTP service discovery and health. Areas add routers; this module wires them."""
from __future__ import annotations

import hmac
import importlib
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from starlette.requests import ClientDisconnect

from . import __version__
from .ratelog import RateLimitedLog
from .model import RunStore
from .settings import Settings

log = logging.getLogger(__name__)
_DISCONNECTS = RateLimitedLog(log)

# Optional areas: each module exposes ``router`` (an APIRouter) and ``init(app)``.
ROUTER_MODULES = ["omniwatch.sources.push", "omniwatch.relay", "omniwatch.gpu.api", "omniwatch.discovery",
                  "omniwatch.agents"]


class BodyLimit:
    """ASGI middleware: 413 for bodies over ``limit`` bytes, whether or not Content-Length is sent."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    if int(v) > self.limit:
                        return await _too_large(send, self.limit)
                except ValueError:
                    return await _reply(send, 400, b'{"detail":"bad Content-Length"}')
        seen = 0

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge()
            return msg

        try:
            return await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            return await _too_large(send, self.limit)
        except ClientDisconnect:  # the client went away mid-upload (or its body timed out): one line, counted
            app = scope.get("app")
            store = getattr(getattr(app, "state", None), "store", None)
            if store is not None:
                store.count_error("http", "client_disconnected")
            _DISCONNECTS("disconnect", logging.INFO, "%s %s: client disconnected before its body was received",
                          scope.get("method"), scope.get("path"))


class _BodyTooLarge(Exception):
    pass


async def _reply(send, status: int, body: bytes):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _too_large(send, limit: int):
    await _reply(send, 413, ('{"detail":"request body larger than %d bytes"}' % limit).encode())


def require_token(request: Request, expected: str | None, what: str) -> None:
    """Bearer-token check in constant time. No token configured = the endpoint is disabled."""
    if not expected:
        raise HTTPException(403, f"{what} is disabled: set OMNIWATCH_{what.upper()}_TOKEN (or _FILE) on the exporter")
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


def area_state(request: Request, attr: str, what: str):
    """An area's object on ``app.state`` (set by its ``init``), or 503 when the area did not start."""
    obj = getattr(request.app.state, attr, None)
    if obj is None:
        raise HTTPException(503, f"{what} is not initialised")
    return obj


def on_lifespan(app: FastAPI, start, stop) -> None:
    """Run ``start()`` when the server starts and ``stop()`` when it stops, around whatever lifespan the
    app already has: how an area ties its background threads (relay delivery, GPU sampling, discovery,
    agent sweeps) to the server without knowing about the others."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        start()
        try:
            async with inner(a) as state:
                yield state
        finally:
            stop()

    app.router.lifespan_context = lifespan


def base_app(store: RunStore, registry: CollectorRegistry, settings: Settings, title: str,
             health: dict | None = None) -> FastAPI:
    """What every omniwatch process serves: ``/metrics`` from its registry and ``/healthz``."""
    app = FastAPI(title=title, version=__version__, docs_url=None, redoc_url=None)
    app.state.store, app.state.registry, app.state.settings = store, registry, settings

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz():
        return {"status": "ok", "version": __version__, **(health or {})}

    return app


def mount_areas(app: FastAPI, modules: list[str]) -> None:
    """Mount each installed area module's ``router`` after its ``init(app)``; absent areas are skipped."""
    for modname in modules:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname or (e.name and modname.startswith(e.name + ".")):
                continue
            raise
        if not hasattr(mod, "router"):
            log.warning("%s has no router; not mounted", modname)
            continue
        if hasattr(mod, "init"):
            mod.init(app)
        app.include_router(mod.router)


def create_app(store: RunStore, registry: CollectorRegistry, settings: Settings) -> FastAPI:
    app = base_app(store, registry, settings, "omniwatch exporter")

    @app.get("/-/ready")
    def ready():
        return {"status": "ready"}

    @app.get("/", response_class=HTMLResponse)
    def index():
        return ("<html><head><title>omniwatch</title></head><body><h1>omniwatch exporter</h1>"
                '<ul><li><a href="/metrics">/metrics</a></li><li><a href="/api/v1/alerts">/api/v1/alerts</a></li>'
                '<li><a href="/api/v1/runs">/api/v1/runs</a></li><li><a href="/runbooks">/runbooks</a></li>'
                '<li><a href="/healthz">/healthz</a></li></ul></body></html>')

    @app.get("/runbooks", response_class=HTMLResponse)
    def runbooks_page():
        from .runbooks import page
        return page()

    @app.get("/api/v1/runs")
    def runs():
        with store.lock:
            out = []
            for (p, e), run in store.runs.items():
                if store.hidden(run):
                    continue
                out.append({"project": p, "experiment": e, "step": run.last.step if run.last else None,
                            "steps_total": run.steps_total, "restarts": run.restarts_total})
        return JSONResponse(out)

    mount_areas(app, ROUTER_MODULES)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app
