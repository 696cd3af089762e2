"""What every omniwatch web process shares: ``/metrics`` (client_python's ASGI app on the process's
private registry), ``/healthz``, the body-size limit, bearer tokens, and the two ways an area plugs in
(``mount``: its router after its ``init``; ``on_lifespan``: its background threads). Areas import this
module; it imports none of them."""
from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from prometheus_client.registry import CollectorRegistry
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from . import __version__
from .core.model import RunStore
from .ratelog import RateLimitedLog
from .settings import Settings

log = logging.getLogger(__name__)
_DISCONNECTS = RateLimitedLog(log)


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


class _MetricsApp:
    """client_python's ASGI app for the private registry (gzip and OpenMetrics negotiation included),
    as a plain route at ``/metrics`` (a Starlette mount would redirect ``/metrics`` to ``/metrics/``).
    client_python renders inside the event loop; here the render runs on two threads of its own, so a
    collector that waits (a lock held by a long ingest, a slow source) never holds up /healthz, push or the
    webhook, and requests that wait in the shared worker pool (a webhook waiting on a locked database)
    never hold up a scrape."""

    pool = None  # one per process, shared by its apps (the exporter; node agents and tests run several)

    def __init__(self, registry: CollectorRegistry):
        from concurrent.futures import ThreadPoolExecutor
        self.registry = registry
        if _MetricsApp.pool is None:
            _MetricsApp.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="omniwatch-metrics")

    async def __call__(self, scope, receive, send):
        import asyncio
        from urllib.parse import parse_qs

        from prometheus_client.exposition import _bake_output

        params = parse_qs(scope.get("query_string", b"").decode("utf8"))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        status, out_headers, output = await asyncio.get_running_loop().run_in_executor(
            self.pool, _bake_output, self.registry, headers.get("accept", ""), headers.get("accept-encoding", ""),
            params, False)
        payload = await receive()
        if payload.get("type") == "http.request":
            await send({"type": "http.response.start", "status": int(status.split(" ")[0]),
                        "headers": [tuple(x.encode("utf8") for x in h) for h in out_headers]})
            await send({"type": "http.response.body", "body": output})


def base_app(store: RunStore, registry: CollectorRegistry, settings: Settings, title: str,
             health: dict | None = None) -> FastAPI:
    """What every omniwatch process serves: ``/metrics`` from its registry and ``/healthz``."""
    app = FastAPI(title=title, version=__version__, docs_url=None, redoc_url=None)
    app.state.store, app.state.registry, app.state.settings = store, registry, settings
    app.router.routes.append(Route("/metrics", _MetricsApp(registry), methods=["GET", "HEAD"]))

    @app.get("/healthz")
    async def healthz():  # in the event loop on purpose: it answers while worker threads wait
        return {"status": "ok", "version": __version__, **(health or {})}

    return app


def mount(app: FastAPI, *areas) -> None:
    """Mount each area module (its ``router``, after its ``init(app)``)."""
    for area in areas:
        area.init(app)
        app.include_router(area.router)
