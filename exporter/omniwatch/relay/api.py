"""HTTP side of the relay: the Alertmanager webhook, alert history and relay status.

The webhook answers 200 only after the notification and its outbox rows are committed, so
Alertmanager's own retry covers anything that happens before that (exporter down, disk error).
"""
from __future__ import annotations

import logging
import sqlite3

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ..config import runbook_rewrite
from ..redact import redact_tree
from ..web import area_state, on_lifespan, require_token
from . import config as cfg
from .deliver import Relay, RelayCollector
from .payload import PayloadError, go_time, parse
from .store import DEFAULT_KEEP, AlertDB

log = logging.getLogger(__name__)

router = APIRouter()
SOURCE = "webhook"
MAX_LIMIT = 1000
STOP_SECONDS = 0.5


def _relay(request: Request) -> Relay:
    return area_state(request, "relay", "relay")


@router.post("/api/v1/alertmanager")
async def alertmanager_webhook(request: Request):
    st = request.app.state
    try:
        require_token(request, st.settings.webhook_token, "webhook")
    except HTTPException as e:
        st.store.count_error(SOURCE, "unauthorized" if e.status_code == 401 else "disabled")
        raise
    relay = _relay(request)
    body = await request.body()
    # Everything after the body is work (parsing, redaction of every label and annotation, the store): a worker
    # thread does it, so a hostile body never holds the event loop (/healthz, other requests) while it is judged
    return await run_in_threadpool(_store_notification, st, relay, body)


def _store_notification(st, relay: Relay, body: bytes):
    try:
        note = parse(body)
    except PayloadError as e:
        st.store.count_error(SOURCE, e.reason)
        log.warning("webhook body rejected: %s", e)
        raise HTTPException(400, str(e)) from None
    st.store.count_notification(note.status)
    # A credential pasted into a label or annotation is redacted before it is stored, listed or forwarded.
    data = redact_tree(note.model_dump(mode="json"))
    targets = relay.targets(note.status, note.commonLabels)
    try:
        new, dropped = relay.db.add(note.notification_id(), note.status, data["groupKey"], data["receiver"], data,
                                    targets)
    except Exception as e:  # disk full, locked db, ...: 503 makes Alertmanager retry
        st.store.count_error(SOURCE, "store_failed")
        set_storage_up(st.store, relay, False)
        log.error("webhook: could not store notification: %s: %s", type(e).__name__, e)
        raise HTTPException(503, "could not store the notification; Alertmanager will retry") from None
    relay.refresh_pending()  # /metrics reads this copy, never SQLite
    set_storage_up(st.store, relay, relay.storage_ok)
    if not new:
        st.store.count_error(SOURCE, "duplicate_notification")
    for _ in range(dropped):
        st.store.count_error("relay", "pruned_undelivered")
    relay.start()  # no-op when running; covers servers started without lifespan events
    relay.notify()
    out = {"status": "stored" if new else "duplicate", "durable": relay.db.path != ":memory:",
           "id": note.notification_id(), "receivers": targets}
    if relay.storage_error is not None:
        # The configured store is unusable (corrupt alerts.sqlite3, unwritable dir): what was accepted lives
        # in memory only and is lost with the process. Said here, in /api/v1/relay/status and as
        # omniwatch_source_up{source="relay"} 0 — never a plain "stored".
        out["status"] = "stored_in_memory" if new else "duplicate"
        out["warning"] = "alert storage is unusable; this notification is kept in memory only: " + relay.storage_error
    return out


def set_storage_up(store, relay: Relay, up: bool) -> None:
    """``omniwatch_source_up{source="relay", target="storage"}``: 1 while notifications are stored durably
    (or memory was chosen: no --state-dir), 0 while the configured store is unusable."""
    store.set_source_up("relay", "storage", up)


def flatten(received_at: float, body: dict) -> list[dict]:
    """One history row per alert of a notification."""
    return [{
        "receivedAt": received_at, "status": a.get("status"), "labels": a.get("labels", {}),
        "annotations": a.get("annotations", {}), "startsAt": go_time(a.get("startsAt")),
        "endsAt": go_time(a.get("endsAt")), "fingerprint": a.get("fingerprint", ""),
        "groupKey": body.get("groupKey", ""), "receiver": body.get("receiver", ""),
    } for a in body.get("alerts", [])]


@router.get("/api/v1/alerts")
def alerts(request: Request, limit: int = Query(100, ge=1, le=MAX_LIMIT),
           status: str | None = Query(None, pattern="^(firing|resolved)$")):
    out: list[dict] = []
    for received_at, body in _relay(request).db.recent():
        body = redact_tree(body)  # rows stored by an older version are redacted on the way out too
        rows = [r for r in reversed(flatten(received_at, body)) if status is None or r["status"] == status]
        out.extend(rows[: limit - len(out)])
        if len(out) >= limit:
            break
    out.reverse()  # newest last
    return JSONResponse(out)


@router.get("/api/v1/relay/status")
def relay_status(request: Request):
    return JSONResponse(_relay(request).status())


def config_path(settings) -> str | None:
    return (settings.extra or {}).get("relay_config") or settings.relay_config


def init(app) -> None:
    """Open the store, load receivers, register metrics, and tie the delivery threads to the app's
    lifespan (wrapping whatever lifespan is already there, so other areas can do the same)."""
    settings = app.state.settings
    keep = int((settings.extra or {}).get("relay_keep", DEFAULT_KEEP))
    storage_error = None
    try:
        db = AlertDB(settings.state_dir, keep=keep)
    except (OSError, sqlite3.Error) as e:  # unwritable dir, corrupt file: keep serving, in memory (the file
        # is left as it is: `sqlite3 alerts.sqlite3 .recover` may still save its history)
        storage_error = f"{type(e).__name__}: {e}; alert history and outbox are in memory only"
        log.error("relay storage in %s unusable: %s", settings.state_dir, storage_error)
        db = AlertDB(None, keep=keep)
    relay = Relay(db, cfg.load(config_path(settings), settings.grafana_url))
    relay.config.runbooks = runbook_rewrite(settings.host, settings.port)   # the rules' links, for older stacks
    relay.storage_error = storage_error
    relay.on_storage = lambda ok: set_storage_up(app.state.store, relay, ok)
    set_storage_up(app.state.store, relay, storage_error is None)
    app.state.relay = relay
    app.state.registry.register(RelayCollector(relay))
    # Bounded at shutdown: a delivery hanging on a stuck receiver (up to its HTTP timeout) must not hold
    # SIGTERM; its outbox row stays pending and the next process sends it again (same delivery id).
    on_lifespan(app, relay.start, lambda: relay.stop(timeout=STOP_SECONDS))
