"""One log line per interval for an event that can repeat thousands of times a second (accept() out of
descriptors, clients disconnecting mid-upload): the first is logged, the rest counted into the next line."""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

LOG_EVERY = 10.0


class RateLimitedLog:
    """Log one line per ``every`` seconds for a recurring event, with how many were not logged."""

    def __init__(self, logger: logging.Logger, every: float = LOG_EVERY, clock=time.monotonic):
        self.logger, self.every, self.clock = logger, every, clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def __call__(self, key: str, level: int, msg: str, *args) -> bool:
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every:
                self._suppressed[key] += 1
                return False
            self._last[key] = now
            skipped, self._suppressed[key] = self._suppressed[key], 0
        if skipped:
            msg += f" ({skipped} more since the last such line)"
        self.logger.log(level, msg, *args)
        return True
