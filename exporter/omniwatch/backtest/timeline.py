"""When each logged step happened: wall-clock times rebuilt from the run's own timers.

verl logs a step's line right after the step (and its validation, ``timing_s/testing``) finished, so
line i arrived at ``start + sum(wall seconds of lines 0..i)``. ``start`` is given, or the file's mtime
(when the last line was written) minus the run's total. Used by backfill (when to ingest each step)
and by backtest (which step a timestamp belongs to).
"""
from __future__ import annotations

import bisect
import re
import itertools
import math
from dataclasses import dataclass
from datetime import datetime, timezone

from .runfile import RecordedRun


def parse_time(text: str) -> float:
    """A unix timestamp (``1700000000``, ``1700000000.5``), an ISO 8601 / RFC 3339 time
    (``2025-01-31T12:00:00Z``; naive times are UTC) or ``now``. ValueError with a clear message otherwise."""
    t = text.strip()
    if t.lower() == "now":
        import time
        return time.time()
    try:
        v = float(t)
    except ValueError:
        try:
            dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"not a unix timestamp or ISO 8601 time: {text!r}") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        v = dt.timestamp()
    if not math.isfinite(v) or v < 0 or v > 4e9:
        raise ValueError(f"time out of range: {text!r}")
    return v


def parse_duration(text: str) -> float:
    """Prometheus-style duration (``15s``, ``1m``, ``500ms``, ``1h30m``) or plain seconds -> seconds."""
    t = text.strip()
    try:
        v = float(t)
    except ValueError:

        parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", t)
        if not parts or "".join(n + u for n, u in parts) != t:
            raise ValueError(f"not a duration: {text!r} (e.g. 15s, 1m, 500ms)") from None
        mult = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
        v = sum(float(n) * mult[u] for n, u in parts)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"duration must be > 0: {text!r}")
    return v


@dataclass
class Timeline:
    start: float
    arrivals: list[float]  # per entry, non-decreasing
    steps: list[int]       # per entry

    @classmethod
    def of(cls, run: RecordedRun, start: float | None = None, pace: float | None = None) -> "Timeline":
        """Arrivals from the run's timers, or every ``pace`` seconds (see ``RecordedRun.wall_seconds``)."""
        walls = run.wall_seconds(pace)
        if start is None:
            start = run.mtime - sum(walls)
        arrivals = [start + s for s in itertools.accumulate(walls)]
        return cls(start, arrivals, [e.step for e in run.entries])

    @property
    def end(self) -> float:
        return self.arrivals[-1]

    def index_at(self, t: float) -> int | None:
        """Index of the latest entry that had arrived at ``t`` (None before the first)."""
        i = bisect.bisect_right(self.arrivals, t) - 1
        return i if i >= 0 else None

    def step_at(self, t: float) -> int | None:
        i = self.index_at(t)
        return None if i is None else self.steps[i]
