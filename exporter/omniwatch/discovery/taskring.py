"""The task-event ring, persisted: what the Ray task-event ledger knows (recent dispatches and their calls, the
calls still running, the actor and node tables, Ray's dropped-event count) written to the exporter's
``--state-dir`` so that an exporter restart continues the lanes, the holder and the straggler streaks instead of
starting blind (issue 24 item 5: "the exporter keeps a bounded ring of them per run and persists it with its
state").

Its own file, ``<state-dir>/ray-tasks.json``, beside the run checkpoint (``core/state.py``) and written the same
way (temp file, fsync, rename), every ``PERSIST_S`` seconds when something changed and once at stop; one
exporter per state dir (``core/statelock.py``) owns both. A separate file keeps the run checkpoint's schema
(``core/statefile.py``) and its restore path untouched by a source that is off by default.

Bounded: the newest ``MAX_DISPATCHES`` dispatches and at most ``MAX_TASKS`` calls; a file over ``MAX_BYTES`` is
not read. The job and run it was written for are in the file: a ring of another job or run is not restored
(counted ``ring_other_run``). Anything unusable (not JSON, a wrong shape, a wrong version, too big) is moved
aside to ``ray-tasks.json.corrupt`` and counted (``omniwatch_ingest_errors_total{source="ray_tasks",
reason="corrupt_ring"|"oversize_ring"}``); the ledger starts empty, never half-restored.

Restore semantics: calls that were running are running again (same Ray task id and attempt); the first poll
closes the ones Ray no longer lists as running, at that poll's time (``end_estimated``: while the exporter was
down their end is known only to the restart), and keeps the rest in their dispatch, so "31/32 ranks done"
survives the restart.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

from ..core.statelock import Checkpoint
from .phases import Call
from .taskevents import Actor, Dispatch, Task, TaskLedger

log = logging.getLogger("omniwatch.raytasks")
VERSION = 1
FILENAME = "ray-tasks.json"
SOURCE = "ray_tasks"
MAX_DISPATCHES = 500
MAX_TASKS = 20000
MAX_ACTORS = 4096
MAX_BYTES = 32 << 20
PERSIST_S = 10.0


def _task(t: Task) -> list:
    c = t.call
    return [t.key[0], t.key[1], t.name, c.role, c.phase, c.method, c.group, c.replica, t.actor_id, t.node_id,
            t.pid, t.job_id, t.start, t.end, t.end_estimated, t.failed]


def _task_from(x: list) -> Task:
    (tid, attempt, name, role, phase, method, group, replica, actor, node, pid, job, start, end, est, failed) = x
    for v in (tid, name, role, phase, method, group, replica, actor, node, job):
        if not isinstance(v, str):
            raise ValueError("a task field is not a string")
    if not isinstance(attempt, int) or not isinstance(start, (int, float)) or \
            not (end is None or isinstance(end, (int, float))) or not (pid is None or isinstance(pid, int)):
        raise ValueError("a task field has the wrong type")
    return Task((tid, attempt), name, Call(role, phase, method, group, replica), actor, node, pid, job, float(start),
                None if end is None else float(end), bool(est), bool(failed))


def to_json(ledger: TaskLedger, job_id: str, run: tuple[str, str]) -> dict:
    """The ring (call under the poller's lock)."""
    # keyed by job (issue 35 item 9): only the job's own dispatches and calls are kept, so a ring is never another
    # job's history (without a job: everything, as before)
    ds = [d for d in ledger.dispatches if not job_id or (d.tasks and d.tasks[0].job_id == job_id)][-MAX_DISPATCHES:]
    budget = MAX_TASKS
    kept: list[Dispatch] = []
    for d in reversed(ds):   # newest first, until the task budget is spent
        if len(d.tasks) > budget:
            break
        budget -= len(d.tasks)
        kept.append(d)
    kept.reverse()
    index: dict[tuple[str, int], int] = {}
    tasks: list[list] = []

    def ref(t: Task) -> int:
        if t.key not in index:
            index[t.key] = len(tasks)
            tasks.append(_task(t))
        return index[t.key]
    dispatches = [[d.group, d.role, d.phase, d.method, d.start, [ref(t) for t in d.tasks]] for d in kept]
    running = [ref(t) for t in ledger.running.values() if not job_id or t.job_id == job_id]
    actors = [[a.actor_id, a.name, a.class_name, a.state, a.node_id, a.pid, a.job_id, a.death]
              for a in list(ledger.actors.values())[-MAX_ACTORS:]]
    return {"version": VERSION, "job_id": job_id, "run": list(run), "tasks": tasks, "dispatches": dispatches,
            "running": running, "actors": actors, "nodes": ledger.nodes, "node_info": ledger.node_info,
            "dropped_seen": ledger.dropped_seen}


def restore(ledger: TaskLedger, data: dict) -> int:
    """Validate the whole ring, then fill the (empty) ledger. Raises ValueError on any bad shape (nothing is
    changed then). Returns the number of calls restored."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError("not a task-event ring of this version")
    tasks = [_task_from(x) for x in data["tasks"]]
    if len(tasks) > MAX_TASKS:
        raise ValueError("more calls than the ring holds")
    ds = []
    for g, role, phase, method, start, refs in data["dispatches"][-MAX_DISPATCHES:]:
        if not all(isinstance(v, str) for v in (g, role, phase, method)) or not isinstance(start, (int, float)):
            raise ValueError("a dispatch field has the wrong type")
        d = Dispatch(g, role, phase, method, float(start))
        d.tasks = [tasks[i] for i in refs]   # IndexError / TypeError on a bad reference
        ds.append(d)
    running = [tasks[i] for i in data["running"]]
    actors = [Actor(str(a), str(n), str(c), str(s), str(node), p if isinstance(p, int) else None, str(j), str(w)[:160])
              for a, n, c, s, node, p, j, w in data["actors"][-MAX_ACTORS:]]
    nodes = {str(k): str(v)[:64] for k, v in dict(data["nodes"]).items()}
    node_info = {str(k): dict(v) for k, v in dict(data.get("node_info") or {}).items()}
    dropped = int(data.get("dropped_seen") or 0)
    # all checked: fill
    for a in actors:
        ledger.actors[a.actor_id] = a
    from .phases import ranks
    ledger.rank_of = ranks([a.name for a in ledger.actors.values()])
    ledger.nodes.update(nodes)
    ledger.node_info.update(node_info)
    ledger.dropped_seen = max(ledger.dropped_seen, dropped)
    for d in ds:
        d.workers = {t.actor_id for t in d.tasks if ledger._one_call_each(t)}   # one call per verl worker
        ledger.dispatches.append(d)
        ledger._open_dispatch[(d.group, d.method)] = d   # the latest per (group, method)
    for t in sorted((t for t in tasks if t.end is not None), key=lambda t: t.end):
        t.final = True   # the ring keeps no lookups in flight: a restored end is as good as it will get
        ledger._remember(t)
    for t in running:
        if t.end is None:
            ledger.running[t.key] = t
    return len(tasks)


class TaskRing:
    """Load at start, save every ``PERSIST_S`` (from the poller's thread) and at stop."""

    def __init__(self, state_dir: str | os.PathLike, store=None, run_labels=lambda: ("", "")):
        self.path = Path(state_dir) / FILENAME
        self.store, self.run_labels = store, run_labels
        self._file = Checkpoint(self.path)
        self.restored = 0

    def _count(self, reason: str) -> None:
        if self.store is not None:
            self.store.count_error(SOURCE, reason)

    def _set_aside(self, why: str, reason: str) -> None:
        bad = self.path.with_name(self.path.name + ".corrupt")
        log.error("Ray task-event ring %s is unusable (%s); moved to %s, lanes start empty", self.path, why, bad)
        self._count(reason)
        try:
            os.replace(self.path, bad)
        except OSError:
            pass

    def read(self, job_id: str | None) -> dict | None:
        """The ring document, validated as far as it can be without a ledger (None: absent, set aside, or of
        another job or run -- counted). ``restore_doc`` fills a ledger from it once the job is known."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as e:
            log.error("cannot read the Ray task-event ring %s: %s", self.path, e)
            self._count("unreadable_ring")
            return None
        if size > MAX_BYTES:
            self._set_aside(f"{size} bytes, over {MAX_BYTES}", "oversize_ring")
            return None
        try:
            data = orjson.loads(self.path.read_bytes())
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError("not a task-event ring of this version")
            if not isinstance(data.get("job_id"), str) or not isinstance(data.get("run"), list):
                raise ValueError("no job or run")
        except (ValueError, KeyError, TypeError, IndexError, OSError) as e:
            self._set_aside(f"{type(e).__name__}: {str(e)[:120]}", "corrupt_ring")
            return None
        run = tuple(data.get("run") or ())
        mine = tuple(x or "" for x in self.run_labels())
        if (job_id and data.get("job_id") and data["job_id"] != job_id) or (any(mine) and run != mine):
            self.other(data, job_id)
            return None
        return data

    def other(self, data: dict, job_id: str | None) -> None:
        log.info("Ray task-event ring %s is of another job or run (%s %s; the job now: %s); not restored", self.path,
                 data.get("job_id"), "/".join(map(str, data.get("run") or ())), job_id or "unknown")
        self._count("ring_other_run")

    def restore_doc(self, ledger: TaskLedger, data: dict) -> int:
        try:
            n = restore(ledger, data)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            self._set_aside(f"{type(e).__name__}: {str(e)[:120]}", "corrupt_ring")
            return 0
        self.restored = n
        log.info("restored %d Ray worker calls from %s", n, self.path)
        return n

    def load(self, ledger: TaskLedger, job_id: str | None) -> int:
        data = self.read(job_id)
        return 0 if data is None else self.restore_doc(ledger, data)

    def snapshot(self, ledger: TaskLedger, job_id: str) -> dict:
        """The ring as a document (call under the poller's lock; ``save`` it outside)."""
        return to_json(ledger, job_id, tuple(x or "" for x in self.run_labels()))

    def save(self, data: dict) -> bool:
        f = self._file
        if not f.write(orjson.dumps(data)):
            if f.error_is_new:
                log.error("cannot write the Ray task-event ring to %s (%s)", self.path, f.error)
            self._count("ring_write_failed")
            return False
        return True
