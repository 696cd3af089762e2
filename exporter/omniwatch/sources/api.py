"""``GET /api/v1/sources``: what the exporter watches — per watch spec, whether it exists, the files and
runs it yields, and the lines read and skipped by reason (``omniwatch status`` and ``up`` print it)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter()


def init(app, sources: list) -> None:
    app.state.sources = sources
    app.include_router(router)


@router.get("/api/v1/sources")
def sources(request: Request):
    return JSONResponse([row for src in getattr(request.app.state, "sources", [])
                         if hasattr(src, "describe") for row in src.describe()])
