"""Connection and descriptor pressure on the exporter's HTTP server (uvicorn + h11).

What uvicorn's settings give, and what they do not (uvicorn 0.54, read in its source):

- ``h11_max_incomplete_event_size`` bounds a request head (16 KiB here); ``timeout_keep_alive`` closes an
  idle keep-alive connection (5 s); ``backlog`` is both the listen queue and how many connections
  asyncio accepts per loop turn (128 here, so a burst cannot take 2,048 descriptors in one turn);
  ``limit_concurrency`` is kept as a backstop (a 503 beyond it);
- but nothing times out a connection that never finishes its request head or body (the keep-alive timer
  starts only after a response, and any byte cancels it), and ``limit_concurrency`` answers 503 *after*
  a request arrived: it accepts and holds every connection (so descriptors still run out) and counts
  idle ones (so 256 idle attackers would make every scrape a 503).

So :func:`protocol_class` subclasses uvicorn's h11 protocol with the two missing pieces:

- a **deadline per request phase**: the head must be complete ``header_timeout`` seconds after the
  connection (or the previous response), the body ``body_timeout`` seconds after the head; past it the
  connection is closed (a 408 for a late head) and counted;
- a **connection cap with eviction**: at ``max_connections`` a new connection closes the *oldest
  connection still waiting for a request head* (slowloris sockets, idle keep-alives) rather than being
  refused, so a scrape that sends its request at once is served while attackers only evict each other;
  only when every connection is inside a request is the newcomer answered 503 and closed.

:class:`AcceptErrorHandler` replaces asyncio's handling of ``accept()`` failures (EMFILE/ENFILE):
asyncio logs every failed accept with a traceback — up to ``backlog`` per loop turn, each retried a
second later (CPython ``selector_events._accept_connection``) — the >1 MB/s log storm. Here they are
counted and logged at most once per ``LOG_EVERY`` seconds.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import resource
import time
from collections import defaultdict

import h11
import uvicorn
from prometheus_client.registry import Collector
from uvicorn.protocols.http.h11_impl import H11Protocol

from . import names as n
from .ratelog import LOG_EVERY, RateLimitedLog
from .settings import DEFAULT_HOST, Settings

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
BACKLOG = 128
MAX_HEAD_BYTES = 16 * 1024
RAISE_NOFILE_TO = 65536  # the soft limit is raised towards the hard one, up to this
RESERVED_FDS = 64      # Python, the listening socket, SQLite (db + WAL + shm), logs, NVML, discovery clients
_503 = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n"
        b"content-length: 31\r\n\r\ntoo many connections; try again")
_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\nconnection: close\r\n"
        b"content-length: 37\r\n\r\nrequest head not received in time\r\n\r\n")


class GuardStats:
    """Counters shared by the protocol instances of one server (event-loop thread) and read at scrape."""

    def __init__(self) -> None:
        self.closed: dict[str, int] = defaultdict(int)  # reason -> connections closed by the guard
        self.open = 0

    def count(self, reason: str, k: int = 1) -> None:
        self.closed[reason] += k


class GuardCollector(Collector):
    def __init__(self, stats: GuardStats):
        self.stats = stats

    def describe(self):
        return n.describe((n.HTTP_CONNECTIONS, n.HTTP_CONNECTIONS_CLOSED))

    def collect(self):
        opened = n.family(n.HTTP_CONNECTIONS)
        opened.add_metric([], self.stats.open)
        closed = n.family(n.HTTP_CONNECTIONS_CLOSED)
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], self.stats.closed.get(reason, 0))
        yield opened
        yield closed


CLOSE_REASONS = ("header_timeout", "body_timeout", "evicted", "over_capacity", "accept_error")


def protocol_class(stats: GuardStats, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                   header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                   body_timeout: float = DEFAULT_BODY_TIMEOUT) -> type[H11Protocol]:
    """uvicorn's h11 protocol with per-phase deadlines and a connection cap with eviction."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            self._phase: str | None = None
            self._since = time.monotonic()
            self._deadline: asyncio.TimerHandle | None = None
            self._gone = False
            live = [c for c in self.connections if not getattr(c, "_gone", True)]
            if len(live) >= max_connections:
                waiting = [c for c in live if c._phase == "headers"]
                if waiting:
                    victim = min(waiting, key=lambda c: c._since)
                    victim._close("evicted")
                else:  # every connection is inside a request: refuse this one
                    stats.count("over_capacity")
                    self._gone = True
                    transport.write(_503)
                    transport.close()
                    return
            super().connection_made(transport)
            stats.open += 1
            self._sync_phase()

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if not hasattr(self, "transport") or self.transport is None:  # refused in connection_made
                return
            if not getattr(self, "_counted_lost", False):
                self._counted_lost = True
                stats.open -= 1
            self._gone = True
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._sync_phase()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._sync_phase()

        def _sync_phase(self) -> None:
            if self._gone:
                return
            st = self.conn.their_state
            phase = "headers" if st is h11.IDLE else "body" if st is h11.SEND_BODY else None
            if phase == self._phase:
                return
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            self._phase, self._since = phase, time.monotonic()
            if phase is not None:
                timeout = header_timeout if phase == "headers" else body_timeout
                self._deadline = self.loop.call_later(timeout, self._expire, phase)

        def _expire(self, phase: str) -> None:
            self._deadline = None
            if self._phase == phase and not self._gone:
                self._close("header_timeout" if phase == "headers" else "body_timeout")

        def _close(self, reason: str) -> None:
            stats.count(reason)
            self._gone = True
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if self.transport is None or self.transport.is_closing():
                return
            if reason == "header_timeout" and (self.cycle is None or self.cycle.response_complete):
                self.transport.write(_408)
            self.transport.close()  # a body in flight: the app's receive() sees http.disconnect

    return GuardedH11Protocol


class AcceptErrorHandler:
    """asyncio loop exception handler: accept() out of descriptors is counted and logged rate-limited;
    every other context goes to asyncio's default handler."""

    def __init__(self, stats: GuardStats, every: float = LOG_EVERY):
        self.stats = stats
        self.ratelog = RateLimitedLog(log, every)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if context.get("message") == "socket.accept() out of system resource":
            self.stats.count("accept_error")
            exc = context.get("exception")
            self.ratelog("accept", logging.ERROR,
                         "accept() failed: %s; new connections wait in the listen queue until descriptors "
                         "free up (raise `ulimit -n`, or lower --max-connections / --max-open-files)",
                         exc if exc is not None else "out of system resource")
            return
        loop.default_exception_handler(context)


def descriptor_budget(max_connections: int, max_open_files: int, sources: int) -> int:
    """Raise the soft descriptor limit towards the hard one (a default soft limit is often 1,024 while the
    hard limit is far higher; at most ``RAISE_NOFILE_TO``), and return a connection cap that fits what is
    left after the file pools, the accept burst and a reserve. Logs when the configured cap had to shrink."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = RAISE_NOFILE_TO if hard == resource.RLIM_INFINITY else min(hard, RAISE_NOFILE_TO)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    except (ValueError, OSError):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = soft - RESERVED_FDS - BACKLOG - max_open_files * sources
    cap = max(16, min(max_connections, room))
    if cap < max_connections:
        log.warning("descriptor limit %d: serving at most %d connections (asked %d; %d per file source held "
                    "for files); raise `ulimit -n` for more", soft, cap, max_connections, max_open_files)
    return cap


# --- uvicorn with the guard: ``omniwatch serve`` (server.py) and every in-process server (node agents, tests) ---
class GuardedServer(uvicorn.Server):
    """uvicorn's server with accept() failures handled by :class:`AcceptErrorHandler`."""

    def __init__(self, config: uvicorn.Config, stats: GuardStats):
        super().__init__(config)
        self.accept_errors = AcceptErrorHandler(stats)

    async def startup(self, sockets=None) -> None:
        asyncio.get_running_loop().set_exception_handler(self.accept_errors)
        await super().startup(sockets=sockets)


def server_config(app, settings: Settings, stats: GuardStats, sources: int = 0) -> uvicorn.Config:
    """The uvicorn settings that bound connections and descriptors (see httpguard's docstring for why
    each is set and what uvicorn cannot do alone)."""
    cap = descriptor_budget(settings.max_connections, settings.max_open_files, sources)
    proto = protocol_class(stats, cap, settings.header_timeout, settings.body_timeout)
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                          http=proto, backlog=BACKLOG, limit_concurrency=2 * cap + BACKLOG,
                          h11_max_incomplete_event_size=MAX_HEAD_BYTES, timeout_keep_alive=5,
                          timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS)


SHUTDOWN_GRACE_SECONDS = 1  # requests in flight at SIGTERM get this long; the whole exit stays under 2 s


class BackgroundServer:
    """Run an ASGI app with uvicorn in a thread (node agents, tests, demo helpers), with the same
    connection guard as ``omniwatch serve`` (a node agent's port is as reachable as the exporter's)."""

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0):
        import socket
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        stats = GuardStats()
        registry = getattr(getattr(app, "state", None), "registry", None)
        if registry is not None:
            registry.register(GuardCollector(stats))
        settings = getattr(getattr(app, "state", None), "settings", None) or Settings()
        self.server = GuardedServer(server_config(app, settings, stats), stats)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
