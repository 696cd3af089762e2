"""Durable alert history and relay outbox in one SQLite file (WAL mode).

Why SQLite: a webhook is acknowledged to Alertmanager only after the notification and its outbox rows
are committed, so an exporter crash after the 200 loses nothing, and a restart delivers what was left.
One connection for writes guarded by a lock (alert traffic is tiny; this keeps the in-memory mode, used
when no state dir is configured, a single shared database). On disk, reads go through a second connection
with its own lock: a write waiting for SQLite's busy timeout (another process holding the write lock: a
backup, a stray second process) never holds up a read — WAL readers do not wait for writers.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DB_NAME = "alerts.sqlite3"
DEFAULT_KEEP = 10_000

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS notifications (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,          -- idempotency id (payload.Notification.notification_id)
  received_at REAL NOT NULL,
  status TEXT NOT NULL,
  group_key TEXT NOT NULL,
  receiver TEXT NOT NULL,
  body TEXT NOT NULL,               -- the webhook JSON as received (unknown fields kept)
  duplicates INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS outbox (
  delivery_id TEXT PRIMARY KEY,     -- sent as X-Omniwatch-Delivery-Id
  seq INTEGER NOT NULL REFERENCES notifications(seq) ON DELETE CASCADE,
  receiver TEXT NOT NULL,
  state TEXT NOT NULL,              -- pending | delivered | failed
  attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt_at REAL NOT NULL DEFAULT 0,
  last_error TEXT,                  -- already redacted
  updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_receiver_state ON outbox(receiver, state, seq);
"""


@dataclass
class OutboxRow:
    delivery_id: str
    seq: int
    receiver: str
    attempts: int
    next_attempt_at: float
    first_seen: float
    body: dict


def delivery_id(notification_id: str, receiver: str) -> str:
    return hashlib.sha256(f"{notification_id}\0{receiver}".encode()).hexdigest()[:32]


class AlertDB:
    def __init__(self, state_dir: str | None, keep: int = DEFAULT_KEEP, clock=time.time):
        self.keep, self.clock = keep, clock
        self.lock = threading.Lock()
        if state_dir:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
            self.path = str(Path(state_dir) / DB_NAME)
        else:
            self.path = ":memory:"
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        self.db.row_factory = sqlite3.Row
        with self.lock:
            if self.path != ":memory:":
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=FULL")  # the 200 to Alertmanager means "on disk"
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(_SCHEMA)
        if self.path == ":memory:":
            self.rdb, self.rlock = self.db, self.lock
        else:
            self.rdb = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
            self.rdb.row_factory = sqlite3.Row
            self.rlock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            self.db.close()
        if self.rdb is not self.db:
            with self.rlock:
                self.rdb.close()

    # -- intake ---------------------------------------------------------------------------------
    def add(self, nid: str, status: str, group_key: str, receiver: str, body: dict,
            receivers: list[str]) -> tuple[bool, int]:
        """Store a notification and one outbox row per receiver, atomically. Returns (new, dropped):
        new=False for a duplicate id; dropped = pending deliveries lost to pruning (counted as failed)."""
        now = self.clock()
        with self.lock, self.db:
            self.db.execute("BEGIN IMMEDIATE")
            cur = self.db.execute("UPDATE notifications SET duplicates = duplicates + 1 WHERE id = ?", (nid,))
            if cur.rowcount:
                return False, 0
            seq = self.db.execute(
                "INSERT INTO notifications(id, received_at, status, group_key, receiver, body) VALUES (?,?,?,?,?,?)",
                (nid, now, status, group_key, receiver, json.dumps(body, separators=(",", ":")))).lastrowid
            self.db.executemany(
                "INSERT INTO outbox(delivery_id, seq, receiver, state, updated_at) VALUES (?,?,?,?,?)",
                [(delivery_id(nid, r), seq, r, PENDING, now) for r in receivers])
            return True, self._prune(seq)

    def _prune(self, newest_seq: int) -> int:
        cutoff = newest_seq - self.keep
        if cutoff <= 0:
            return 0
        dropped = self.db.execute("SELECT COUNT(*) FROM outbox WHERE seq <= ? AND state = ?",
                                  (cutoff, PENDING)).fetchone()[0]
        self.db.execute("DELETE FROM notifications WHERE seq <= ?", (cutoff,))  # outbox rows cascade
        return dropped

    # -- delivery -------------------------------------------------------------------------------
    def head(self, receiver: str, skip: tuple[str, ...] = ()) -> OutboxRow | None:
        """Oldest undelivered row of a receiver: deliveries go out in arrival order (firing before
        its resolved), so a down receiver holds its queue instead of reordering it. ``skip``: delivery ids
        already settled whose new state could not be written yet (a full disk): never sent again."""
        not_in = f" AND o.delivery_id NOT IN ({','.join('?' * len(skip))})" if skip else ""
        with self.rlock:
            r = self.rdb.execute(
                "SELECT o.delivery_id, o.seq, o.receiver, o.attempts, o.next_attempt_at, n.received_at, n.body "
                "FROM outbox o JOIN notifications n ON n.seq = o.seq "
                f"WHERE o.receiver = ? AND o.state = ?{not_in} ORDER BY o.seq LIMIT 1",
                (receiver, PENDING, *skip)).fetchone()
        if r is None:
            return None
        return OutboxRow(r["delivery_id"], r["seq"], r["receiver"], r["attempts"], r["next_attempt_at"],
                         r["received_at"], json.loads(r["body"]))

    def mark(self, did: str, state: str, error: str | None = None, next_attempt_at: float = 0.0) -> None:
        with self.lock, self.db:
            self.db.execute(
                "UPDATE outbox SET state = ?, attempts = attempts + 1, last_error = COALESCE(?, last_error), "
                "next_attempt_at = ?, updated_at = ? WHERE delivery_id = ?",
                (state, error, next_attempt_at, self.clock(), did))

    # -- reading --------------------------------------------------------------------------------
    def pending_counts(self) -> dict[str, int]:
        with self.rlock:
            rows = self.rdb.execute("SELECT receiver, COUNT(*) FROM outbox WHERE state = ? GROUP BY receiver",
                                   (PENDING,)).fetchall()
        return {r[0]: r[1] for r in rows}

    def receiver_status(self) -> dict[str, dict]:
        with self.rlock:
            rows = self.rdb.execute("SELECT receiver, state, COUNT(*) AS n FROM outbox GROUP BY receiver, state").fetchall()
            errs = self.rdb.execute(
                "SELECT receiver, last_error, MAX(updated_at) AS at FROM outbox WHERE last_error IS NOT NULL "
                "GROUP BY receiver").fetchall()
        out: dict[str, dict] = {}
        for r in rows:
            d = out.setdefault(r["receiver"], {PENDING: 0, DELIVERED: 0, FAILED: 0, "last_error": None, "last_error_at": None})
            d[r["state"]] = r["n"]
        for r in errs:
            d = out.setdefault(r["receiver"], {PENDING: 0, DELIVERED: 0, FAILED: 0})
            d["last_error"], d["last_error_at"] = r["last_error"], r["at"]
        return out

    def counts(self) -> dict[str, int]:
        with self.rlock:
            n, dup = self.rdb.execute("SELECT COUNT(*), COALESCE(SUM(duplicates), 0) FROM notifications").fetchone()
        return {"notifications": n, "duplicates": dup}

    def recent(self, page: int = 200):
        """Yield (received_at, body) newest first, a page at a time; the caller stops at its limit."""
        before = None
        while True:
            with self.rlock:
                rows = self.rdb.execute(
                    "SELECT seq, received_at, body FROM notifications WHERE seq < COALESCE(?, 9223372036854775807) "
                    "ORDER BY seq DESC LIMIT ?", (before, page)).fetchall()
            for r in rows:
                yield r["received_at"], json.loads(r["body"])
            if len(rows) < page:
                return
            before = rows[-1]["seq"]
