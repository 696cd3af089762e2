"""One periodic background thread: a daemon thread that calls ``scan_once()`` (or the function it was given)
every ``interval`` seconds until ``stop()``. Every plain start/loop/stop thread of the package uses it: the
trainer-config, checkpoint-directory and log-writer watches, the file sources' polls, the state checkpointer,
the agents' heartbeat and the registry's sweep, the demo endpoints' ticker. A failed scan is logged
(``scan_failed``) and the next one runs on schedule; ``wait_first`` waits one interval before the first scan
(for a caller that did one already, or has none due); ``start()`` after ``stop()`` starts it again. ``duty``
(a share of one core, None: unbounded) stretches the wait after a scan to ``scan CPU time / duty`` when that is
longer than ``interval``: a scan whose cost grows with the load (the checkpointer serialising 64 runs) then takes
at most that share of a core, and runs every ``interval`` while it is cheap."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class Periodic:
    thread_name = "omniwatch-periodic"
    what = "periodic scan"          # said in the log line of a failed scan
    join_timeout = 5.0
    wait_first = False
    duty: float | None = None

    def __init__(self, interval: float, fn: Callable[[], object] | None = None, *, name: str | None = None,
                 what: str | None = None, wait_first: bool | None = None, join_timeout: float | None = None):
        self.interval = interval
        self._fn = fn
        for attr, value in (("thread_name", name), ("what", what), ("wait_first", wait_first),
                            ("join_timeout", join_timeout)):
            if value is not None:
                setattr(self, attr, value)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scan_once(self):
        if self._fn is None:  # pragma: no cover - a subclass defines scan_once, or fn is given
            raise NotImplementedError
        self._fn()

    def scan_failed(self) -> None:
        """Called inside the ``except`` of a failed scan (the exception is the current one)."""
        log.exception("%s failed", self.what)

    def _loop(self) -> None:
        if self.wait_first and self._stop.wait(self.interval):
            return
        while not self._stop.is_set():
            cpu0 = time.thread_time()
            try:
                self.scan_once()
            except Exception:
                self.scan_failed()
            self._stop.wait(self.next_wait(time.thread_time() - cpu0))

    def next_wait(self, scan_cpu_s: float) -> float:
        """The wait after a scan that took ``scan_cpu_s`` of this thread's CPU (see ``duty``)."""
        return self.interval if not self.duty else max(self.interval, scan_cpu_s / self.duty)

    def start(self):
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread, waiting for it at most ``timeout`` s (default ``join_timeout``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout if timeout is None else timeout)
