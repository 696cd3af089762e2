"""One periodic background scan: a daemon thread that calls ``scan_once()`` every ``interval`` seconds until
``stop()`` (the trainer-config, checkpoint-directory and log-writer watches share it). A failed scan is logged
and the next one runs on schedule."""
from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class Periodic:
    thread_name = "omniwatch-periodic"
    what = "periodic scan"          # said in the log line of a failed scan
    join_timeout = 5.0

    def __init__(self, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scan_once(self):  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan_once()
            except Exception:
                log.exception("%s failed", self.what)
            self._stop.wait(self.interval)

    def start(self):
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout)
