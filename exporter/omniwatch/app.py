"""The exporter's one FastAPI app: ``/metrics``, the push API, the Alertmanager webhook and alert
history, HTTP service discovery, GPU phase spans, node agents, runbooks and health. Each area is a
module with ``router`` and ``init(app)``, listed here."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client.registry import CollectorRegistry

from . import push, runbooks
from .agents import api as agents
from .discovery import api as discovery
from .gpu import api as gpu
from .core.model import RunStore
from .relay import api as relay
from .settings import Settings
from .web import BodyLimit, base_app, mount

AREAS = (push, relay, gpu, discovery, agents)


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
        return runbooks.page()

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

    mount(app, *AREAS)
    gpu.init_fleet(app)   # the GPU area over discovery's Ray task ledger
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app
