"""HTTP push: trainers that prefer to push their step dict ``POST /api/v1/push`` with a bearer token.

Body: ``{"project": str, "experiment": str, "step": int, "data": {key: number}}`` or, batched,
``{"project", "experiment", "steps": [{"step", "data"}, ...]}``. Answers what was accepted and what
was skipped and why; bad input is a 4xx (whole body) or a counted skip (one step or value)."""
from __future__ import annotations

import re

import orjson
from fastapi import APIRouter, HTTPException, Request

from ..app import require_token
from ..parse import LineError, parse_record
from ..redact import looks_like_credential

router = APIRouter()
SOURCE = "push"
MAX_STEPS_PER_BODY = 1000
_LABEL_OK = re.compile(r"[\w.\-+@:/ ]{1,128}")


def init(app) -> None:
    store, settings = app.state.store, app.state.settings
    if settings.push_token:
        store.set_source_up(SOURCE, "http", True)


def _label(body: dict, key: str, store) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not _LABEL_OK.fullmatch(v):
        store.count_error(SOURCE, f"bad_{key}")
        raise HTTPException(400, f"'{key}' must be a string of 1-128 letters, digits or . - + @ : / _ space")
    if looks_like_credential(v):  # a label is shown everywhere; the value is not echoed back
        store.count_error(SOURCE, f"credential_in_{key}")
        raise HTTPException(400, f"'{key}' looks like a credential (token/key); refusing to make it a label")
    return v


@router.post("/api/v1/push")
async def push(request: Request):
    store, settings = request.app.state.store, request.app.state.settings
    require_token(request, settings.push_token, "push")
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        store.count_error(SOURCE, "malformed_json")
        raise HTTPException(400, f"body is not JSON: {str(e)[:100]}") from None
    if not isinstance(body, dict):
        store.count_error(SOURCE, "not_object")
        raise HTTPException(400, "body must be a JSON object")
    project, experiment = _label(body, "project", store), _label(body, "experiment", store)
    if "steps" in body:
        steps = body["steps"]
        if not isinstance(steps, list) or len(steps) > MAX_STEPS_PER_BODY:
            store.count_error(SOURCE, "bad_steps")
            raise HTTPException(400, f"'steps' must be a list of at most {MAX_STEPS_PER_BODY} {{step, data}} objects")
    else:
        steps = [body]
    accepted, skipped = 0, {}
    for item in steps:
        try:
            parsed = parse_record(item)
        except LineError as e:
            store.count_error(SOURCE, e.reason)
            skipped[e.reason] = skipped.get(e.reason, 0) + 1
            continue
        if store.ingest(project, experiment, parsed, SOURCE, feed=f"push:{project}/{experiment}") is not None:
            accepted += 1
        else:
            skipped["not_applied"] = skipped.get("not_applied", 0) + 1
        for reason, n in parsed.dropped.items():
            skipped[f"values_{reason}"] = skipped.get(f"values_{reason}", 0) + n
    if not accepted and skipped and len(steps) == 1 and "not_applied" not in skipped:
        raise HTTPException(422, {"accepted": 0, "skipped": skipped})
    return {"accepted": accepted, "skipped": skipped}
