"""The Ray task-event source: polls Ray's state API (rayapi.py) into a TaskLedger (taskevents.py), one
thread, bounded work per poll, backoff when Ray is slow or away, and a measured cost per poll.

Runs beside discovery (``--ray-tasks``; on a multi-node cluster on the node whose exporter runs
discovery: the state API is the head's dashboard). Readers (the collector, ``omniwatch ps`` through
``/api/v1/ps``) only read ``snapshot``, swapped whole at the end of each poll with everything a scrape renders
(counts, lanes, straggler streaks: ``TaskSnapshot.view``), so a scrape never waits on a poll (issue 35 item 1).
Ray is asked outside ``lock``: the poller's thread is the ledger's only writer, and takes the lock only to apply
an answer (milliseconds), so the readers that do take it (the agents' mirror, the fleet accountant, the ring's
writer) never wait on Ray either; every call has a total deadline and a byte and row cap (rayapi.py).

One poll = 2 state-API calls (RUNNING tasks, actors not ALIVE — of the watched job) + the
actor and node tables when an actor not seen before runs a task or is being created (at most every
``actor_refresh_s``, 1 s: a new worker is mapped at its first call) + the finished rows of the calls that
ended (by task id, at most ``final_budget``: a call that failed gets its exact end and FAILED state there, so
no FAILED listing is asked -- that set grows with the run and carries a traceback per row) and the finished-task
pages of calls a node observer saw but no poll did (at most ``recover_budget``; taskfinal.py).
Measured (benchmarks/raytasks_poll.py): 8 / 64 / 512 workers -> 14 / 111 / 881 KiB and a median 5 / 9 / 34 ms
of exporter CPU per poll.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from .. import backoff
from ..redact import redact
from . import taskevents as te
from . import pools, taskring
from .rayapi import RayAPIError, StateAPI
from .taskfinal import Recovery, settle

log = logging.getLogger("omniwatch.raytasks")


AMBIGUOUS = "?"    # several Ray jobs run and none is known to be the watched run's


@dataclass
class PollCost:
    calls: int = 0
    bytes: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    rows: int = 0


@dataclass(frozen=True)
class TaskSnapshot:
    ts: float = 0.0
    up: bool | None = None
    why: str = ""
    job_id: str = ""
    holder: dict = field(default_factory=dict)
    groups: tuple = ()
    replicas: tuple = ()
    dead: tuple = ()
    dropped: int = 0
    lossy: bool = False
    truncated_polls: int = 0
    drop_increases: int = 0
    polls: int = 0
    cost: PollCost = field(default_factory=PollCost)
    # what a scrape renders, computed by the poll under the lock: {"counts": {(role, phase): n}, "lanes":
    # [(role, rank, code)], "streaks": [...]} (taskmetrics.py)
    view: dict = field(default_factory=dict)


class TaskPoller:
    def __init__(self, address: str | None = None, interval: float = 5.0, timeout: float = 5.0,
                 page: int = 2000, job_id: str | None = None, actor_refresh_s: float = 1.0,
                 ledger: te.TaskLedger | None = None, ring=None, final_budget: int = 32, recover_budget: int = 2):
        self.api = StateAPI(address, timeout=timeout, limit=page)
        self.interval = interval
        self.job_id = job_id
        self.actor_refresh_s = actor_refresh_s
        self.ledger = ledger or te.TaskLedger(dispatch_gap_s=max(2.0, interval))
        self.snapshot = TaskSnapshot(why=f"connecting to Ray's state API at {self.api.base}")
        self.failures = 0
        self._last_actor_refresh = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # held only while the poller's thread changes the ledger (never across a call to Ray); re-entrant: a caller
        # may hold it around poll() (tests, the overhead benchmark)
        self.lock = threading.RLock()
        self.lanes_max = 64              # --ray-lanes-max: per-rank lanes up to this many workers per role
        self.store = None                # RunStore: bad rows, cut answers, clock skew counted (ingest errors)
        self.run_job = None              # () -> the watched run's Ray job id as JobWatch matched it (api.py)
        self._ring_doc = None            # the persisted ring, read at start, restored at the first poll into its job
        self._counted: dict[str, int] = {}
        self.ring = ring              # taskring.TaskRing: the ledger persisted in --state-dir (None: not kept)
        self._saved_at = 0.0
        self.recovery = Recovery()    # calls node observers saw that no poll did (taskfinal.py)
        self.final_budget, self.recover_budget = final_budget, recover_budget
        self.pools: dict[str, int] = {}   # GPUs per pool from Ray's placement groups (pools.py), every REFRESH_S
        self._pools_at = 0.0
        self._pools_owed = False          # new workers were seen: their pools were just reserved, read them soon
        self.on_pools = None              # called with the pools when they change (the run's ledger GPUs)
        # Called as hook(poller, snapshot) after each poll that Ray answered, outside the lock, in this thread: the
        # stack of a held call (traceback.StackWatch), the run's Ray job (jobs.JobWatch). A hook never stops polls.
        self.hooks: list = []

    def _job(self) -> str | None:
        """The Ray job the views describe (issue 35 item 9: with two training jobs on one cluster the holder described
        the other one): ``--ray-job``; else the run's job as JobWatch matched it (its log writer, the only training
        job, ...: ``run_job``); else the only job with calls or live actors. Several and none known: AMBIGUOUS --
        no job's calls are shown as this run's."""
        if self.job_id:
            return self.job_id
        if self.run_job is not None:
            try:
                j = self.run_job()
            except Exception:   # a lookup in the run model never breaks a poll
                j = None
            if j:
                return j
        jobs = self.ledger.jobs()
        if len(jobs) > 1:
            return AMBIGUOUS
        return jobs[0] if jobs else None

    def poll(self, now: float | None = None) -> TaskSnapshot:
        """One bounded poll; raises RayAPIError when Ray does not answer. Ray is asked without the lock; every
        change of the ledger is made under it."""
        c0, w0 = self.api.cost.calls, self.api.cost.bytes
        cpu0, t0 = time.process_time(), time.monotonic()
        led, lock = self.ledger, self.lock
        job_f = [("job_id", "=", self.job_id)] if self.job_id else []
        # detail: Ray returns start_time_ms / end_time_ms only in the detailed view
        running = self.api.list("tasks", [("state", "=", "RUNNING")] + job_f, detail=True)
        if self._ring_doc is not None:
            self._restore_ring(running.rows, job_f)
        # the actor table (names -> ranks, pids) and the node table (ids -> IPs) when a running call's actor is
        # new or was last seen before it was ALIVE, or its node is new; at most every actor_refresh_s
        stale = led.stale_actor_ids(running.rows)
        new_nodes = {r.get("node_id") for r in running.rows if isinstance(r.get("node_id"), str)
                     and r.get("node_id") not in led.nodes}
        now = time.time() if now is None else now   # the poll's time: calls gone from RUNNING closed by then
        wall = now
        stale = stale or (self.recovery.refresh_actors and {"observed"})
        if (stale or new_nodes) and (not self._last_actor_refresh or wall - self._last_actor_refresh >= self.actor_refresh_s):
            self.recovery.refresh_actors = False
            if stale:
                rows = self.api.list("actors", job_f).rows
                with lock:
                    led.apply_actors(rows)
            if new_nodes:
                rows = self.api.list("nodes", limit=1000).rows
                with lock:
                    led.apply_nodes(rows)
            self._last_actor_refresh = wall
            self._pools_owed = True   # new workers: their pools were just reserved (read at most every 5 s)
        # DEAD / RESTARTING (and not yet created) actors: one call; a healthy job has few
        rows = self.api.list("actors", [("state", "!=", "ALIVE")] + job_f, limit=200).rows
        with lock:
            led.apply_actors(rows)
            res = led.apply(running.rows, (), now, dropped=running.dropped, truncated=running.truncated)
        settle(self.api, led, job_f, self.recovery, self.final_budget, self.recover_budget, lock=lock)
        if now - self._pools_at >= (pools.OWED_S if self._pools_owed else pools.REFRESH_S):   # issue 33 item 4
            self._pools_at, self._pools_owed = now, False
            try:
                got = pools.pools(self.api.list("placement_groups", detail=True, limit=pools.MAX_GROUPS).rows)
            except RayAPIError:   # an older or trimmed dashboard without the table: the ledger keeps its GPUs
                got = self.pools
            if got != self.pools:
                self.pools = got
                if self.on_pools is not None:
                    self.on_pools(dict(got))
        snap = self.publish(now, res["lossy"], (c0, w0, cpu0, t0, len(running.rows)))
        self._count_skips()
        return snap

    def _restore_ring(self, rows: list, job_f: list) -> None:
        """The first poll: the job now is the flag, the run's matched job, or the one job with running calls (else
        with live actors); the ring is restored only when it was written for that job."""
        doc, self._ring_doc = self._ring_doc, None
        job = self.job_id or (self.run_job() if self.run_job is not None else None)
        if not job:
            jobs = {r.get("job_id") for r in rows if isinstance(r, dict) and isinstance(r.get("job_id"), str)} - {""}
            if not jobs:
                jobs = {a.get("job_id") for a in self.api.list("actors", [("state", "=", "ALIVE")] + job_f).rows
                        if isinstance(a, dict) and isinstance(a.get("job_id"), str)} - {""}
            job = next(iter(jobs)) if len(jobs) == 1 else None
        if job and doc.get("job_id") in (job, ""):
            with self.lock:
                self.ring.restore_doc(self.ledger, doc)
        else:
            self.ring.other(doc, job)

    def publish(self, now: float, lossy: bool = False, since: tuple = (0, 0, 0.0, 0.0, 0)) -> TaskSnapshot:
        """Build the snapshot readers render from the ledger (under the lock) and swap it in whole: holder,
        groups, replicas, dead actors and the scrape's view (counts, lanes, streaks), so a scrape reads it
        without touching the ledger. ``since``: the cost counters at the poll's start."""
        with self.lock:
            snap = self._snapshot(now, lossy, *since)
        self.snapshot = snap
        return snap

    def _snapshot(self, now: float, lossy: bool, c0: int, w0: int, cpu0: float, t0: float, rows: int) -> TaskSnapshot:
        from .taskmetrics import lanes, straggler_streaks
        led = self.ledger
        job = self._job()
        why = f"{len(led.running)} running calls, {len(led.actors)} actors known"
        if lossy:
            why += ("; Ray dropped task events (its GCS keeps a bounded number): lanes are incomplete"
                    if led.dropped_seen else "; the answer was cut at the page size: lanes are incomplete")
        cost = PollCost(self.api.cost.calls - c0, self.api.cost.bytes - w0, time.monotonic() - t0 if t0 else 0.0,
                        time.process_time() - cpu0 if cpu0 else 0.0, rows)
        if job == AMBIGUOUS:   # nothing of another job's is shown as this run's: the holder says what to do
            jobs = led.jobs()
            holder = {"phase": "other", "role": "other", "age_s": 0.0,
                      "text": f"{len(jobs)} Ray jobs run and none is known to be this run's: give --ray-job (or watch "
                              "the run's log on this node)"}
            return TaskSnapshot(now, True, why + f"; {len(jobs)} Ray jobs, none matched to the run", "", holder,
                                (), (), (), led.dropped_seen, lossy, led.truncated_polls, led.drop_increases, led.polls,
                                cost, {"counts": {}, "lanes": [], "streaks": []})
        counts: dict[tuple[str, str], int] = {}
        for t in led.running.values():
            if job is None or t.job_id == job:
                counts[(t.call.role, t.call.phase)] = counts.get((t.call.role, t.call.phase), 0) + 1
        lane, _ = lanes(led, self.lanes_max, job)
        view = {"counts": counts, "lanes": lane, "streaks": straggler_streaks(led, job)}
        return TaskSnapshot(now, True, why, job or "", te.holder(led, now, job), tuple(te.groups(led, now, job)),
                            tuple(te.replicas(led, now, job)),
                            tuple({"name": a.name, "class": a.class_name, "state": a.state, "rank": led.rank_of.get(a.name),
                                   "node": te._node(led, a.node_id), "pid": a.pid, "why": a.death}
                                  for a in led.dead_actors(job)),
                            led.dropped_seen, lossy, led.truncated_polls, led.drop_increases, led.polls, cost, view)

    def _count_skips(self) -> None:
        """What the poll skipped, as ingest errors of source ray_tasks (bad rows, answers given up, rows over the
        page size, calls stamped in the future)."""
        if self.store is None:
            return
        for reason, v in (("bad_row", self.ledger.bad_rows), ("answer_cut", self.api.cut_answers),
                          ("rows_over_limit", self.api.cut_rows), ("clock_ahead", self.ledger.clock_ahead)):
            d = v - self._counted.get(reason, 0)
            if d > 0:
                self.store.count_error("ray_tasks", reason, d)
                self._counted[reason] = v

    # -- thread ----------------------------------------------------------------------------------
    def persist(self, force: bool = False) -> None:
        """Write the ring (at most every taskring.PERSIST_S unless ``force``); never raises."""
        if self.ring is None or (not force and time.monotonic() - self._saved_at < taskring.PERSIST_S):
            return
        self._saved_at = time.monotonic()
        try:
            with self.lock:
                job = self.snapshot.job_id or self._job() or ""
                data = self.ring.snapshot(self.ledger, "" if job == AMBIGUOUS else job)
            self.ring.save(data)
        except Exception:
            log.exception("saving the Ray task-event ring failed")

    def start(self) -> None:
        if self.ring is not None and self._thread is None:
            # restored at the first poll, and only into the job it was written for (issue 35 item 9: the previous
            # job's ring -- its RankStraggler streak -- was restored into the next job)
            self._ring_doc = self.ring.read(self.job_id)
            self._saved_at = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="omniwatch-ray-tasks", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.persist(force=True)
        self.api.close()

    def _loop(self) -> None:
        said = None
        while not self._stop.is_set():
            wait = self.interval
            try:
                snap = self.poll()
                self.failures = 0
                if snap.cost.wall_s > self.interval / 2:  # Ray is slow: poll less often
                    wait = min(60.0, self.interval + 2 * snap.cost.wall_s)
                msg = "Ray task events: attached"
                self.persist()
                for hook in self.hooks:
                    try:
                        hook(self, snap)
                    except Exception:  # a hook's failure is logged, polling goes on
                        log.exception("Ray task-event hook %s failed", type(hook).__name__)
            except RayAPIError as e:
                self.failures += 1
                wait = backoff.delay(self.failures, self.interval, 60.0)
                old = self.snapshot
                self.snapshot = TaskSnapshot(time.time(), False, redact(str(e)), old.job_id, polls=old.polls)
                msg = f"Ray task events off: {e} (retrying with backoff)"
                self._count_skips()
            except Exception as e:  # the source must keep running, and say it is not current
                log.exception("Ray task-event poll failed")
                self.failures += 1
                wait = backoff.delay(self.failures, self.interval, 60.0)
                old = self.snapshot
                self.snapshot = TaskSnapshot(time.time(), False, f"the last poll failed: {type(e).__name__}",
                                             old.job_id, polls=old.polls)
                msg = None
            if msg and msg != said:
                (log.info if msg.endswith("attached") else log.warning)("%s", msg)
                said = msg
            self._stop.wait(wait)
