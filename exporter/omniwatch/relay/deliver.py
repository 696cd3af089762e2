"""The delivery side of the relay: one thread per receiver drains that receiver's outbox in arrival
order, marks a row delivered only after a 2xx, and backs off (exponential, capped, jittered) while
the destination is down. Rows live in SQLite, so what an exporter restart interrupted is sent by the
next process. Every error string is redacted before it is logged or stored.

A delivery whose outcome cannot be written (``database or disk is full``, a database another process keeps
locked) is settled in memory: it is not sent again, the rows behind it go on, the storage error shows in
``/api/v1/relay/status`` and as ``omniwatch_source_up{source="relay",target="storage"} 0``, and each step
tries to write the outcomes again (an exporter restart before that sends those rows again, with the same
delivery id). ``/metrics`` reads the outbox depth this thread last read, never SQLite.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import defaultdict

import httpx
from prometheus_client.registry import Collector

from .. import __version__, backoff, names as n
from ..redact import redact_tree
from . import messages
from .config import Receiver, RelayConfig, redact
from .store import DELIVERED, FAILED, PENDING, AlertDB, OutboxRow

log = logging.getLogger(__name__)

RESULT_OK, RESULT_RETRY, RESULT_FAILED = "ok", "retry", "failed"
RESULTS = (RESULT_OK, RESULT_RETRY, RESULT_FAILED)
RETRYABLE_4XX = (408, 425, 429)
# Feishu/Lark answer HTTP 200 with a non-zero ``code`` when they refuse a message. Only these codes are rate
# limits worth retrying (11232: the bot's frequency limit, 100/min and 5/s; 230020: the chat's); any other
# code (19021 bad signature, 19024 keyword not found, 9499 bad request, ...) refuses this message for good,
# and retrying it would hold every later alert of the receiver behind it.
FEISHU_RATE_LIMIT_CODES = frozenset({11232, 230020})
IDLE_WAIT_SECONDS = 5.0        # re-check the outbox this often even without a wake-up
DELIVERY_HEADER = "X-Omniwatch-Delivery-Id"


class _Redactor(logging.Filter):
    """httpx logs every request URL at INFO; webhook URLs are secrets, so scrub them on the record."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            msg = record.getMessage()
            clean = redact(msg, self.secrets)
            if clean != msg:
                record.msg, record.args = clean, None
        return True


_REDACTOR = _Redactor()
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).addFilter(_REDACTOR)


class Outcome:
    __slots__ = ("result", "error", "retry_after")

    def __init__(self, result: str, error: str | None = None, retry_after: float | None = None):
        self.result, self.error, self.retry_after = result, error, retry_after


class Relay:
    def __init__(self, db: AlertDB, config: RelayConfig, clock=time.time):
        self.db, self.config, self.clock = db, config, clock
        self.receivers = {r.name: r for r in config.receivers}
        self.active = [r for r in config.receivers if r.enabled]
        self.secrets = config.secrets()
        _REDACTOR.secrets = sorted(set(_REDACTOR.secrets) | set(self.secrets))
        self.deliveries: dict[tuple[str, str], int] = defaultdict(int)
        self._lock = threading.Lock()        # counters
        self._life = threading.Lock()        # start/stop
        self._wake = {r.name: threading.Event() for r in self.active}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.storage_error: str | None = None   # the configured store is unusable (memory fallback, at start)
        self.write_error: str | None = None     # outcomes could not be written (disk full, locked), cleared on success
        self.on_storage = None                  # fn(ok) when storage health changes (omniwatch_source_up)
        # receiver -> delivery id -> (state, error, next_attempt_at, attempts) settled but not written yet
        self._unwritten: dict[str, dict[str, tuple]] = {r.name: {} for r in self.active}
        self.pending_cache: dict[str, int] = {}  # what /metrics shows (read by the delivery threads)
        self.refresh_pending()
        for r in config.receivers:
            if r.error:
                log.error("relay receiver %s disabled: %s", r.name, redact(r.error, self.secrets))
        if config.error:
            log.error("relay config %s not loaded: %s", config.path, config.error)

    # -- storage health -------------------------------------------------------------------------
    @property
    def storage_ok(self) -> bool:
        return self.storage_error is None and self.write_error is None

    def refresh_pending(self) -> None:
        """Read the outbox depth for /metrics (off the event loop: delivery threads, the webhook's thread)."""
        try:
            counts = self.db.pending_counts()
        except (sqlite3.Error, OSError):
            return  # keep the last value; the write path reports the storage error
        unwritten = {name: sum(1 for st, *_ in list(rows.values()) if st != PENDING)
                     for name, rows in list(self._unwritten.items())}
        self.pending_cache = {k: max(0, v - unwritten.get(k, 0)) for k, v in counts.items()}

    def _set_write_error(self, error: str | None) -> None:
        if error == self.write_error:
            return
        was_ok = self.storage_ok
        if error is None:
            log.info("relay: delivery outcomes are written to %s again", self.db.path)
        elif self.write_error is None:
            log.error("relay: cannot write delivery outcomes to %s (%s); delivered notifications are remembered "
                      "in memory and not sent again; retrying the write every step", self.db.path, error)
        self.write_error = error
        if was_ok != self.storage_ok and self.on_storage is not None:
            self.on_storage(self.storage_ok)

    def _mark(self, rcv: str, did: str, state: str, error: str | None = None, next_attempt_at: float = 0.0) -> None:
        """Write a delivery's outcome; when it cannot be written, keep it in memory (see the module doc)."""
        try:
            self.db.mark(did, state, error, next_attempt_at)
        except (sqlite3.Error, OSError) as e:
            rows = self._unwritten.setdefault(rcv, {})
            tries = rows[did][3] + 1 if did in rows else 1  # attempts not written yet (the backoff keeps growing)
            rows[did] = (state, error, next_attempt_at, tries)
            self._set_write_error(f"{type(e).__name__}: {e}")
        else:
            self._unwritten.get(rcv, {}).pop(did, None)  # an older outcome of it must not be written over this one

    def _flush(self, rcv: str) -> None:
        """Write the outcomes a storage error kept in memory, oldest first; stop at the first failure."""
        rows = self._unwritten.get(rcv)
        while rows:
            did, (state, error, nxt, _) = next(iter(rows.items()))
            try:
                self.db.mark(did, state, error, nxt)
            except (sqlite3.Error, OSError) as e:
                self._set_write_error(f"{type(e).__name__}: {e}")
                return
            del rows[did]
        if not any(self._unwritten.values()):
            self._set_write_error(None)

    # -- intake ---------------------------------------------------------------------------------
    def targets(self, status: str, labels: dict[str, str]) -> list[str]:
        return [r.name for r in self.active if r.wants(status, labels)]

    def notify(self) -> None:
        for ev in self._wake.values():
            ev.set()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        with self._life:
            if any(t.is_alive() for t in self._threads):
                return
            self._stop = threading.Event()
            self._threads = [threading.Thread(target=self._loop, args=(r, self._stop), daemon=True,
                                              name=f"omniwatch-relay-{r.name}") for r in self.active]
            for t in self._threads:
                t.start()

    def stop(self, timeout: float | None = None) -> None:
        with self._life:
            self._stop.set()
            self.notify()
            limit = timeout if timeout is not None else self.config.retry.timeout_seconds + 2
            deadline = time.monotonic() + limit
            for t in self._threads:
                t.join(max(0.0, deadline - time.monotonic()))
            self._threads = []

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    # -- delivery -------------------------------------------------------------------------------
    def _count(self, receiver: str, result: str) -> None:
        with self._lock:
            self.deliveries[(receiver, result)] += 1

    def _loop(self, rcv: Receiver, stop: threading.Event) -> None:
        wake = self._wake[rcv.name]
        with httpx.Client(timeout=self.config.retry.timeout_seconds, follow_redirects=False,
                          headers={"User-Agent": f"omniwatch-relay/{__version__}"}) as client:
            while not stop.is_set():
                wake.clear()
                try:
                    wait = self._step(rcv, client)
                except Exception as e:  # keep the thread alive whatever happens (disk full, bug, ...)
                    log.error("relay %s: unexpected %s: %s", rcv.name, type(e).__name__, redact(str(e), self.secrets))
                    wait = 1.0
                if wait > 0:
                    wake.wait(wait)

    def _step(self, rcv: Receiver, client: httpx.Client) -> float:
        """Try the head of this receiver's queue once; return how long to wait before the next try."""
        unwritten = self._unwritten.setdefault(rcv.name, {})
        if unwritten:
            self._flush(rcv.name)
        settled = tuple(d for d, (st, *_) in unwritten.items() if st != PENDING)
        row = self.db.head(rcv.name, settled)
        self.refresh_pending()
        if row is None:
            return IDLE_WAIT_SECONDS
        if row.delivery_id in unwritten:  # a retry whose schedule is only in memory
            _, _, row.next_attempt_at, tries = unwritten[row.delivery_id]
            row.attempts += tries
        now = self.clock()
        if row.next_attempt_at > now:
            return min(row.next_attempt_at - now, IDLE_WAIT_SECONDS)
        retry = self.config.retry
        if row.attempts and now - row.first_seen > retry.give_up_after_seconds:
            self._mark(rcv.name, row.delivery_id, FAILED, f"gave up after {row.attempts} attempts")
            self._count(rcv.name, RESULT_FAILED)
            return 0
        out = self.send(rcv, row, client)
        if out.result == RESULT_OK:
            self._mark(rcv.name, row.delivery_id, DELIVERED)
            log.info("relay %s: delivered %s", rcv.name, row.delivery_id[:12])
        elif out.result == RESULT_FAILED:
            self._mark(rcv.name, row.delivery_id, FAILED, out.error)
            log.error("relay %s: delivery %s failed permanently: %s", rcv.name, row.delivery_id[:12], out.error)
        else:
            delay = max(backoff.delay(row.attempts, retry.initial_seconds, retry.max_seconds, jitter=True), min(out.retry_after or 0, retry.max_seconds))
            self._mark(rcv.name, row.delivery_id, PENDING, out.error, next_attempt_at=now + delay)
            log.warning("relay %s: delivery %s attempt %d failed (%s); retrying in %.1fs",
                        rcv.name, row.delivery_id[:12], row.attempts + 1, out.error, delay)
        self._count(rcv.name, out.result)
        return 0

    def payload(self, rcv: Receiver, row: OutboxRow) -> dict:
        row.body = redact_tree(row.body)  # stored redacted; rows an older version stored are redacted here
        msg = messages.build(row.body, self.config.grafana_url, self.config.runbooks)
        if rcv.type == "slack":
            return messages.render_slack(msg, rcv.channel)
        if rcv.type == "feishu":
            body = messages.render_feishu(msg, rcv.format)
            if rcv.secret:
                body.update(messages.feishu_sign(rcv.secret))  # signed at send time: Feishu rejects old timestamps
            return body
        return messages.render_webhook(msg, row.body, row.delivery_id)

    def send(self, rcv: Receiver, row: OutboxRow, client: httpx.Client) -> Outcome:
        headers = {DELIVERY_HEADER: row.delivery_id, **rcv.headers}
        try:
            resp = client.post(rcv.url, json=self.payload(rcv, row), headers=headers)
        except httpx.HTTPError as e:
            return Outcome(RESULT_RETRY, redact(f"{type(e).__name__}: {e}", self.secrets)[:300])
        code = resp.status_code
        if 200 <= code < 300:
            if rcv.type == "feishu":  # Feishu answers 200 with {"code": <non-zero>, "msg": ...} on errors
                try:
                    data = resp.json()
                except ValueError:
                    data = {}
                fc = data.get("code", data.get("StatusCode", 0)) if isinstance(data, dict) else 0
                if fc:
                    err = redact(f"feishu code {fc}: {str(data.get('msg', data.get('StatusMessage', '')))[:200]}",
                                 self.secrets)
                    return Outcome(RESULT_RETRY if fc in FEISHU_RATE_LIMIT_CODES else RESULT_FAILED, err)
            return Outcome(RESULT_OK)
        err = redact(f"HTTP {code}: {resp.text[:200]}", self.secrets)
        if code >= 500 or code in RETRYABLE_4XX:
            ra = resp.headers.get("retry-after", "")
            return Outcome(RESULT_RETRY, err, float(ra) if ra.isdigit() else None)
        return Outcome(RESULT_FAILED, err)

    # -- reporting ------------------------------------------------------------------------------
    def delivery_counts(self) -> dict[tuple[str, str], int]:
        """(receiver, result) -> count since start; every active receiver has all three results."""
        with self._lock:
            counts = dict(self.deliveries)
        zero = {(r.name, res): 0 for r in self.active for res in RESULTS}
        return zero | counts

    def status(self) -> dict:
        db_status = self.db.receiver_status()
        deliveries = self.delivery_counts()
        out = []
        for name in sorted(set(self.receivers) | set(db_status)):
            r = self.receivers.get(name)
            d = db_status.get(name, {})
            out.append({
                "name": name, "type": r.type if r else None,
                "enabled": bool(r and r.enabled),
                "config_error": r.error if r else "not in the relay config (left from an earlier config)",
                "pending": d.get(PENDING, 0), "delivered": d.get(DELIVERED, 0), "failed": d.get(FAILED, 0),
                "last_error": d.get("last_error"), "last_error_at": d.get("last_error_at"),
                "deliveries_since_start": {res: deliveries.get((name, res), 0)
                                           for res in RESULTS},
            })
        return {"config": self.config.path, "config_error": self.config.error,
                "storage_error": self.storage_error or self.write_error,
                "unwritten_outcomes": sum(len(rows) for rows in self._unwritten.values()),
                "storage": "memory" if self.db.path == ":memory:" else "sqlite", "running": self.running,
                **self.db.counts(), "receivers": out}


OWNED = (n.RELAY_DELIVERIES_TOTAL, n.RELAY_PENDING)


class RelayCollector(Collector):
    """Renders the relay's counters and the outbox depth (read from SQLite at scrape time)."""

    def __init__(self, relay: Relay):
        self.relay = relay

    def describe(self):
        return n.describe(OWNED)

    def collect(self):
        total = n.family(n.RELAY_DELIVERIES_TOTAL)
        for labels, v in sorted(self.relay.delivery_counts().items()):
            total.add_metric(list(labels), v)
        pending = n.family(n.RELAY_PENDING)
        counts = {r.name: 0 for r in self.relay.active} | self.relay.pending_cache  # never SQLite at scrape time
        for rcv, v in sorted(counts.items()):
            pending.add_metric([rcv], v)
        yield total
        yield pending
