"""Replay: feed a recorded run into the live stack at an accelerated pace.

Either write the lines, as verl's FileLogger does (``open(path, "wb")`` unbuffered, one orjson line per
step), into a file the running exporter watches, or POST each step to the exporter's push endpoint.
Line i is written ``wall_i / speed`` seconds after line i-1 (``wall`` = the step's own timers), or
every ``pace`` seconds (uniform; ``backtest --pace`` reproduces such a replay), on a monotonic schedule
so sleeps do not drift. A ``stop`` event ends a replay between two lines (callers that stop once they
have seen enough, e.g. a test that waits for an alert).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from ..settings import read_secret
from .runfile import RecordedRun

PUSH_PATH = "/api/v1/push"
PUSH_RETRIES = 3


@dataclass
class ReplayStats:
    sent: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # reason -> steps


def target_file(to: str, run: RecordedRun) -> Path:
    """``--to`` a directory (existing, or ending in /) is a VERL_FILE_LOGGER_ROOT:
    ``<root>/<project>/<experiment>.jsonl``; anything else is the file itself."""
    p = Path(to)
    if p.is_dir() or to.endswith(("/", "\\")):
        return p / run.project / f"{run.experiment}.jsonl"
    return p


def push_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith(PUSH_PATH) else url + PUSH_PATH


def intervals(run: RecordedRun, speed: float = 1.0, pace: float | None = None) -> list[float]:
    """Seconds before each line: ``pace`` for every line, else the line's timers / ``speed``."""
    if pace is not None:
        return run.wall_seconds(pace)
    return [w / speed for w in run.wall_seconds()]


def _schedule(run: RecordedRun, speed: float, sleep=time.sleep, clock=time.monotonic,
              pace: float | None = None, stop: threading.Event | None = None):
    """Yield each entry when it is due; nothing more once ``stop`` is set."""
    if stop is not None:
        sleep = stop.wait  # a set stop event ends the wait at once
    due = clock()
    for entry, gap in zip(run.entries, intervals(run, speed, pace)):
        due += gap
        delay = due - clock()
        if delay > 0:
            sleep(delay)
        if stop is not None and stop.is_set():
            return
        yield entry


def replay_to_file(run: RecordedRun, path: Path, speed: float = 60.0, progress=None, sleep=time.sleep, *,
                   pace: float | None = None, stop: threading.Event | None = None) -> ReplayStats:
    stats = ReplayStats()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=0) as f:  # verl FileLogger: "wb" (a restart truncates), unbuffered
        for entry in _schedule(run, speed, sleep, pace=pace, stop=stop):
            f.write(orjson.dumps(entry.record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            stats.sent += 1
            if progress:
                progress.advance()
    return stats


def replay_to_push(run: RecordedRun, url: str, speed: float = 60.0, progress=None, sleep=time.sleep,
                   token: str | None = None, *, pace: float | None = None,
                   stop: threading.Event | None = None) -> ReplayStats:
    """POST {"project", "experiment", "step", "data"} per step with the bearer token from
    OMNIWATCH_PUSH_TOKEN (or _FILE). A refused step is counted by HTTP status, never retried; a
    connection error is retried a few times, then counted."""
    stats = ReplayStats()
    token = token if token is not None else read_secret("OMNIWATCH_PUSH_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=10, headers=headers, trust_env=False) as client:
        for entry in _schedule(run, speed, sleep, pace=pace, stop=stop):
            body = {"project": run.project, "experiment": run.experiment, **entry.record}
            reason = None
            for attempt in range(PUSH_RETRIES):
                try:
                    r = client.post(push_url(url), content=orjson.dumps(body),
                                    headers={"Content-Type": "application/json"})
                    reason = None if r.status_code < 300 else f"http_{r.status_code}"
                    break
                except httpx.HTTPError as e:
                    reason = type(e).__name__
                    sleep(0.2 * (attempt + 1))
            if reason:
                stats.failed[reason] = stats.failed.get(reason, 0) + 1
            else:
                stats.sent += 1
            if progress:
                progress.advance()
    return stats
