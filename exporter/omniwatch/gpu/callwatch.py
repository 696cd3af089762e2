"""What each GPU worker on this node is running, from its process title: the node-local view of worker calls
that no poll of Ray's state API can give at sub-second resolution (issue 33 item 1: calls that start and end
between two polls).

Ray sets a worker's process title around every task it executes (``_raylet.pyx`` ``execute_task``:
``with ray._private.worker._changeproctitle(title, next_title)``, title ``ray::<Class>.<method>``, back to
``ray::<Class>`` for an actor after the call; docs/verl-source.md R17). Reading ``/proc/<pid>/cmdline`` of
the few actors that hold this node's GPUs every ``interval`` seconds (default 0.05: 40 us a read) gives each
call's method and its start / end to within one interval; a change is placed at the midpoint between the
sample that saw the old title and the one that saw the new (unbiased, +-interval/2).

The observer only *finds* calls; Ray's recorded times stay the boundaries wherever Ray has the call
(gpu/fleet.py). A call Ray never showed running is asked for from a finished-task page
(discovery/taskfinal.py) and keeps the observed boundaries only if that page cannot give it.

Bounded: the pids come from the actor table (the actors mapped to this node's GPUs), at most
``MAX_PIDS``; at most ``max_calls`` finished observations are kept. A pid this process cannot read (another
PID namespace, gone) is counted and skipped; the observer never raises into its caller.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..periodic import Periodic

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.05
SCAN_S = 1.0
MAX_PIDS = 256
TITLE_BYTES = 512


@dataclass(frozen=True)
class Observed:
    actor_id: str
    pid: int
    name: str          # Ray's task name: ``<Class>.<method>``
    start: float
    end: float | None  # None: still running at the last sample


def title_call(raw: bytes) -> str | None:
    """``ray::WorkerDict.actor_rollout_update_actor\\0...`` -> ``WorkerDict.actor_rollout_update_actor``;
    an idle actor (``ray::WorkerDict``), ``ray::IDLE`` or anything else -> None."""
    title = raw.split(b"\x00", 1)[0].decode("utf-8", "replace").strip()
    if not title.startswith("ray::"):
        return None
    rest = title[5:]
    if rest.endswith("::Exiting"):
        rest = rest[: -len("::Exiting")]
    cls, dot, method = rest.partition(".")
    if not dot or not cls or not method or " " in rest or method == "__init__":
        return None   # __init__: the actor is being created (Ray's creation task, not a call)
    return rest[:200]


class CallObserver(Periodic):
    """Samples the process titles of ``pids()`` (pid -> actor id: the workers mapped to this node's GPUs) and of
    the Ray actor workers a scan of ``/proc`` finds (every ``scan_s``; a worker the actor table does not name
    yet -- just created -- is watched from its first call) every ``interval`` s in its own thread, or when
    ``sample()`` is called (tests, replays)."""
    thread_name, what = "omniwatch-callwatch", "call observer sample"

    def __init__(self, pids: Callable[[], dict[int, str]], interval: float = DEFAULT_INTERVAL_S,
                 read: Callable[[int], bytes] | None = None, clock: Callable[[], float] = time.time,
                 max_calls: int = 8192, on_sample: Callable[[float, dict], None] | None = None,
                 scan: Callable[[], list[int]] | None = None, scan_s: float = SCAN_S):
        super().__init__(max(0.005, float(interval)))
        self.pids, self.clock = pids, clock
        self.read = read or _read_title
        self.scan = scan if scan is not None else (_proc_pids if read is None else None)
        self.scan_s = scan_s
        self._last_scan = 0.0
        self._kind: dict[int, str] = {}      # pid -> "actor" (a Ray actor worker), "idle" (ray::IDLE), "other"
        self.lock = threading.Lock()
        self.done: deque[Observed] = deque(maxlen=max_calls)
        self.current: dict[int, tuple[str, str | None, float]] = {}   # pid -> (actor, name, since)
        self.last_sample = 0.0
        self.unreadable = 0
        self.samples = 0
        self.on_sample = on_sample        # (time, {pid: name or None}): a recorder for replay fixtures

    def _scan(self) -> None:
        """Find this node's Ray actor workers: new pids are read once; a worker still ``ray::IDLE`` (Ray hands
        idle workers to new actors) or not titled yet is read again at the next scan."""
        try:
            pids = set(self.scan())
        except OSError:
            return
        for pid in list(self._kind):
            if pid not in pids:
                del self._kind[pid]
        for pid in pids:
            if self._kind.get(pid) in ("other", "actor"):
                continue
            try:
                raw = self.read(pid)
            except OSError:
                continue
            title = raw.split(b"\x00", 1)[0]
            if title.startswith(b"ray::IDLE") or b"default_worker.py" in raw:
                self._kind[pid] = "idle"
            elif title.startswith(b"ray::") and len(self._kind) < 4 * MAX_PIDS:
                self._kind[pid] = "actor"
            else:
                self._kind[pid] = "other"

    def sample(self, now: float | None = None) -> None:
        try:
            pids = dict(list(self.pids().items())[:MAX_PIDS])
        except Exception:
            log.debug("call observer: no pids", exc_info=True)
            pids = {}
        now = self.clock() if now is None else now
        if self.scan is not None and now - self._last_scan >= self.scan_s:
            self._last_scan = now
            self._scan()
        watch = dict(pids)
        for pid, kind in self._kind.items():
            if kind == "actor" and pid not in watch and len(watch) < MAX_PIDS:
                watch[pid] = ""
        seen: dict[int, str | None] = {}
        for pid in watch:
            try:
                seen[pid] = title_call(self.read(pid))
            except OSError:
                self.unreadable += 1
                self._kind.pop(pid, None)
        self.apply(now, seen, {p: a for p, a in watch.items() if p in seen})

    def apply(self, now: float, seen: dict[int, str | None], actors: dict[int, str]) -> None:
        """One sample: ``seen`` pid -> the task name its title shows (None: idle)."""
        if self.on_sample is not None:
            self.on_sample(now, {"seen": seen, "actors": actors})
        with self.lock:
            mid = (self.last_sample + now) / 2 if self.last_sample else now
            for pid in list(self.current):
                if pid not in seen:   # not sampled any more (actor gone, unmapped): its open call ends here
                    actor, name, since = self.current.pop(pid)
                    if name:
                        self.done.append(Observed(actor, pid, name, since, mid))
            for pid, name in seen.items():
                actor = actors.get(pid, "")
                cur = self.current.get(pid)
                if cur is None:
                    # first look at this pid: a call already running started at an unknown time before now
                    self.current[pid] = (actor, name, now)
                    continue
                if cur[1] != name:
                    if cur[1]:
                        self.done.append(Observed(cur[0] or actor, pid, cur[1], cur[2], mid))
                    self.current[pid] = (actor, name, mid)
                elif actor and not cur[0]:
                    self.current[pid] = (actor, cur[1], cur[2])
            self.last_sample = now
            self.samples += 1

    def calls(self, lo: float) -> list[Observed]:
        """Observed calls ending after ``lo`` (finished ones and those still running)."""
        return self.snapshot(lo)[0]

    def snapshot(self, lo: float) -> tuple[list[Observed], float]:
        """(calls ending after ``lo``, the time of the sample they are complete up to), read together."""
        with self.lock:
            out = [o for o in self.done if o.end is not None and o.end > lo]
            out += [Observed(a, pid, name, since, None) for pid, (a, name, since) in self.current.items() if name]
            return out, self.last_sample

    @property
    def watermark(self) -> float:
        return self.last_sample

    def scan_once(self) -> None:   # the thread (periodic.py): one sample every ``interval``
        self.sample()


def _proc_pids() -> list[int]:
    import os
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _read_title(pid: int) -> bytes:
    with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
        return f.read(TITLE_BYTES)
