"""HTTP push: trainers that prefer to push their step dict ``POST /api/v1/push`` with a bearer token.

Body: ``{"project": str, "experiment": str, "step": int, "data": {key: number}}`` or, batched,
``{"project", "experiment", "steps": [{"step", "data"}, ...]}``. Answers what was accepted and what
was skipped and why; bad input is a 4xx (whole body) or a counted skip (one step or value)."""
from __future__ import annotations

import re

from fastapi import APIRouter, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from . import jsonin
from .core.parse import LineError, parse_record
from .redact import looks_like_credential
from .web import require_token

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
    """A batch is validated whole before any step is applied: one bad step refuses the body (422, the
    reasons by index, every reason counted) and nothing of it is applied, so a corrected retry is not
    mistaken for a trainer restart. Values dropped inside a good step (non-numeric, secret-named, ...)
    are counted skips; the step is applied."""
    store, settings = request.app.state.store, request.app.state.settings
    require_token(request, settings.push_token, "push")
    raw = await request.body()
    # decoding, validation and ingestion (the run model's lock) in a worker thread: never on the event loop
    return await run_in_threadpool(_apply, store, raw)


def _apply(store, raw: bytes) -> dict:
    try:
        body = jsonin.loads(raw)
    except jsonin.BodyError as e:
        store.count_error(SOURCE, e.reason)
        raise HTTPException(400, str(e)) from None
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
    parsed, errors = [], []
    for i, item in enumerate(steps):
        try:
            parsed.append(parse_record(item))
        except LineError as e:
            errors.append({"index": i, "reason": e.reason})
    if errors:
        reasons: dict[str, int] = {}
        for err in errors:
            store.count_error(SOURCE, err["reason"])
            reasons[err["reason"]] = reasons.get(err["reason"], 0) + 1
        raise HTTPException(422, {"accepted": 0, "skipped": reasons, "errors": errors[:50],
                                  "detail": "no step of this body was applied; fix the steps listed and resend"})
    accepted, skipped = 0, {}
    for p in parsed:
        if store.ingest(project, experiment, p, SOURCE, feed=f"push:{project}/{experiment}") is not None:
            accepted += 1
        else:
            skipped["not_applied"] = skipped.get("not_applied", 0) + 1
        for reason, n in p.dropped.items():
            skipped[f"values_{reason}"] = skipped.get(f"values_{reason}", 0) + n
    return {"accepted": accepted, "skipped": skipped}
