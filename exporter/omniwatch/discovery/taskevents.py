"""Ray task events -> who holds the step, per-worker lanes and stragglers (pure; fed by taskwatch.py).

One poll = the RUNNING tasks, the FAILED tasks and the DEAD / RESTARTING actors of the watched job, plus
the actor table when an unknown actor shows up (rayapi.py says why nothing else can be asked
incrementally). ``TaskLedger.apply`` merges a poll:

- a task seen RUNNING for the first time opens with Ray's ``start_time_ms``;
- a task that was running and is no longer in the RUNNING set ended between the two polls: it closes at
  its FAILED row's ``end_time_ms`` when there is one, else at the time of the poll that missed it
  (``end_estimated``) and waits in ``awaiting`` until Ray's own finished row gives its exact end
  (``apply_final``: looked up by task id, taskfinal.py) -- then it is ``final``; a call whose row never
  comes (evicted, dropped) keeps the poll's estimate after ``FINAL_TRIES`` lookups (``finals_estimated``);
- a call that starts and ends between two polls is not in any RUNNING answer; when a node's call observer
  (gpu/callwatch.py) saw it, its finished row is recovered from a finished-task page
  (``add_recovered``: ``recovered=True``, exact and final);
- an actor creation task (``ACTOR_CREATION_TASK``) is not a call, but its actor goes into ``creating``:
  the poller re-reads the actor table (rate-bounded) so the actor's first call is mapped;
- Ray's own dropped-event count going up, or a page our ``limit`` cut, marks the poll ``lossy``: the
  ledger then does not close tasks it merely failed to see, and says so (``drops``, ``truncated``).

Dispatches: verl's worker group sends one call per rank at once (``func_generator`` ->
``execute_all_async``), so the calls of one (worker group, method) that open within ``dispatch_gap_s``
of the first are one dispatch -- and, as each rank gets one call, a second call on a worker already in the
open dispatch opens the next one (a step shorter than the gap, seen by polls as far apart as the gap, would
otherwise merge two dispatches: "4/5 ranks done" of a 4-rank group); its straggler spread is
(last end - start) / median(end - start).
Memory is bounded: at most ``max_done`` closed calls and ``max_dispatches`` dispatches are kept.
"""
from __future__ import annotations

import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice

from ..redact import redact
from ..runlabel import strip_control
from .phases import Call, classify, ranks, worker_name

DEAD_STATES = ("DEAD", "RESTARTING")
_classify = lru_cache(maxsize=4096)(classify)   # pure; a Call is frozen, so calls of one method share it


@dataclass(slots=True)
class Task:
    key: tuple[str, int]
    name: str
    call: Call
    actor_id: str
    node_id: str
    pid: int | None
    job_id: str
    start: float
    end: float | None = None
    end_estimated: bool = False
    failed: bool = False
    final: bool = False          # start and end are Ray's recorded times (or the estimate, given up)
    seen: float = 0.0            # the last poll whose RUNNING answer had it: its end is after seen - Ray's lag
    recovered: bool = False      # never seen running: from a finished-task page

    def age(self, now: float) -> float:
        return max(0.0, (self.end if self.end is not None else now) - self.start)


@dataclass
class Dispatch:
    group: str
    role: str
    phase: str
    method: str
    start: float
    tasks: list[Task] = field(default_factory=list)
    workers: set = field(default_factory=set)    # actor ids of the verl workers with a call in it (one call each)

    def add(self, t: Task, one_each: bool) -> None:
        self.tasks.append(t)
        if one_each:
            self.workers.add(t.actor_id)

    @property
    def done(self) -> list[Task]:
        return [t for t in self.tasks if t.end is not None]

    @property
    def running(self) -> list[Task]:
        return [t for t in self.tasks if t.end is None]

    def spread(self) -> float | None:
        """(slowest duration) / (median duration) of a finished dispatch of >= 2 workers."""
        if len(self.tasks) < 2 or self.running:
            return None
        durs = [t.age(0) for t in self.tasks]
        med = statistics.median(durs)
        return max(durs) / med if med > 0 else None


@dataclass(slots=True)
class Actor:
    actor_id: str
    name: str
    class_name: str
    state: str
    node_id: str
    pid: int | None
    job_id: str
    death: str = ""


class BadRow(ValueError):
    """A Ray row with a field of the wrong type or range: counted and skipped, never a failed poll."""


MAX_ID = 128          # Ray's ids are 16-28 bytes hex; a longer "id" is not one
MAX_NAME = 512        # task / actor / class names kept (a longer one is cut: no verl name is near it)


def _ms(v) -> float | None:
    """Ray's milliseconds -> seconds; None when absent; BadRow when not a finite positive number."""
    if v in (None, "", 0):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise BadRow("time")
    try:
        f = float(v) / 1000.0
    except ValueError:
        raise BadRow("time") from None
    if not (0 < f < 1e11):   # also refuses nan / inf
        raise BadRow("time")
    return f


def _pid(v) -> int | None:
    if v in (None, "", 0):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise BadRow("pid")
    try:
        p = int(v)
    except ValueError:
        raise BadRow("pid") from None
    if not 0 < p < 1 << 31:
        raise BadRow("pid")
    return p


def _id(v, what: str = "id") -> str:
    """An id field: absent -> "", a string up to MAX_ID characters, else BadRow (a list, a dict, a number)."""
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > MAX_ID:
        raise BadRow(what)
    return v


def _text(v, n: int = MAX_NAME) -> str:
    """A name or state: at most ``n`` characters, one line (no control characters: a name is shown in
    ``omniwatch ps``, the holder label and alert messages, where a newline would plant a line)."""
    if v is None:
        return ""
    if not isinstance(v, str):
        raise BadRow("text")
    return strip_control(v[:n])


def _attempt(v) -> int:
    if v in (None, ""):
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise BadRow("attempt")
    try:
        a = int(v)
    except ValueError:
        raise BadRow("attempt") from None
    if not 0 <= a < 1 << 20:
        raise BadRow("attempt")
    return a


def task_key(r: dict) -> tuple[str, int] | None:
    """(task id, attempt) of a row, None when either is not what Ray sends."""
    try:
        tid = _id(r.get("task_id"), "task_id")
        return (tid, _attempt(r.get("attempt_number"))) if tid else None
    except BadRow:
        return None


FINAL_TRIES = 3          # lookups of a closed call's finished row before its poll-time end is kept
FINAL_WAIT_S = 60.0      # a closed call's finished row is looked for (and waited for) this long at most
MAX_AWAITING = 4096      # closed calls waiting for their finished row (beyond: the oldest keep their estimate)
MAX_CREATING = 1024
MAX_ACTORS = 8192        # actors known (the oldest DEAD ones leave first)
MAX_NODES = 4096
CLOCK_SLACK_S = 60.0     # a call stamped as starting later than this after the poll: the node's clock is ahead


class TaskLedger:
    def __init__(self, max_done: int = 20000, max_dispatches: int = 2000, dispatch_gap_s: float = 5.0,
                 max_calls: int | None = None):
        self.running: dict[tuple[str, int], Task] = {}
        self.done: deque[Task] = deque()
        self.max_done = max_done
        self.closed: dict[tuple[str, int], Task] = {}     # the calls in ``done``, by key
        self.awaiting: dict[tuple[str, int], Task] = {}   # closed, end not final yet (oldest first)
        self.tries: dict[tuple[str, int], int] = {}
        self.creating: dict[str, float] = {}              # actor id -> when its creation task was seen
        self.created: dict[str, float] = {}               # actor id -> its creation task's end (0: unknown)
        # bumped at every change of a call; ``changes`` holds the keys of the last changes, bounded: the newest
        # has seq ``seq`` and each one before it one less (``change_seqs``), so no seq is stored per change
        self.seq = 0
        self.changes: deque[tuple[str, int]] = deque(maxlen=4 * max_done)
        self.finals_exact = 0        # closed calls whose end became Ray's recorded end
        self.finals_estimated = 0    # ... that kept the poll's estimate (no finished row came)
        self.recovered = 0           # calls no poll saw, recovered from finished-task pages
        self.dispatches: deque[Dispatch] = deque()
        self.max_dispatches = max_dispatches
        # calls held by the dispatches, all together (issue 35 item 3: 2,000 dispatches x 512 workers was a
        # million calls): the oldest dispatches leave once their calls pass this bound
        self.max_calls = max_done if max_calls is None else max_calls
        self.dispatch_calls = 0
        self._open_dispatch: dict[tuple[str, str], Dispatch] = {}
        self.actors: dict[str, Actor] = {}
        self.rank_of: dict[str, int] = {}
        self.nodes: dict[str, str] = {}   # node_id -> node IP (or name)
        self.node_info: dict[str, dict] = {}   # node_id -> {ip, name, gpus} (per-fleet GPU time, gpu/fleet.py)
        self.dispatch_gap_s = dispatch_gap_s
        self.dropped_seen = 0        # Ray's dropped task-event count, max seen
        self.drop_increases = 0      # polls on which it went up
        self.truncated_polls = 0
        self.bad_rows = 0            # rows without a task id / start time, or a field of the wrong type (skipped)
        self.clock_ahead = 0         # calls whose start was stamped after the poll (a node's clock ahead)
        self.polls = 0
        self.last_poll = 0.0
        self.prev_poll = 0.0         # the poll before last_poll: calls started before it are all known
        self.lossy_since: float | None = None

    # -- actors ----------------------------------------------------------------------------------
    def stale_actor_ids(self, rows: list[dict]) -> set[str]:
        """Actors of running calls that are unknown, or known only from before they were ALIVE (a pending
        actor has no node yet), actors being created, and actors last seen pending or restarting: the actor
        table is re-read for them (rate-bounded by the poller) so a new worker is mapped at its first call."""
        ids = {a for r in rows if isinstance(r, dict) and isinstance(a := r.get("actor_id"), str)}
        return {a for a in ids if a and len(a) <= MAX_ID
                and (a not in self.actors or self.actors[a].state != "ALIVE")} | \
            {a for a in self.creating if a not in self.actors or self.actors[a].state != "ALIVE"} | \
            {aid for aid, a in self.actors.items() if a.state not in ("ALIVE", "DEAD")}   # pending, restarting

    def apply_actors(self, rows: list[dict]) -> None:
        for r in rows:
            try:
                aid = _id(r.get("actor_id"), "actor_id")
                if not aid:
                    raise BadRow("actor_id")
                death = r.get("death_cause") or {}
                why = ""
                if isinstance(death, dict):
                    ctx = death.get("actor_died_error_context") or {}
                    why = str(ctx.get("error_message") or "")[:160] if isinstance(ctx, dict) else ""
                a = Actor(aid, _text(r.get("name")), _text(r.get("class_name")), _text(r.get("state"), 32),
                          _id(r.get("node_id"), "node_id"), _pid(r.get("pid")), _id(r.get("job_id"), "job_id"),
                          redact(strip_control(" ".join(why.split()))))   # an error text: redacted once, here
            except BadRow:
                self.bad_rows += 1
                continue
            self.actors.pop(aid, None)   # re-inserted: the dict's order is the order actors were last seen
            self.actors[aid] = a
            if a.state in ("ALIVE", "DEAD"):
                self.creating.pop(aid, None)
        while len(self.actors) > MAX_ACTORS:   # bounded: the longest-unseen DEAD actor leaves first
            old = next((k for k, a in self.actors.items() if a.state == "DEAD"), None) or next(iter(self.actors))
            del self.actors[old]
            self.created.pop(old, None)
        self.rank_of = ranks([a.name for a in self.actors.values()])

    def apply_nodes(self, rows: list[dict]) -> None:
        for r in rows:
            try:
                nid = _id(r.get("node_id"), "node_id")
                if not nid:
                    continue
                ip, name = _text(r.get("node_ip"), 64), _text(r.get("node_name"), 64)
            except BadRow:
                self.bad_rows += 1
                continue
            res = r.get("resources_total") if isinstance(r.get("resources_total"), dict) else {}
            gpus = res.get("GPU") or 0
            gpus = gpus if isinstance(gpus, (int, float)) and not isinstance(gpus, bool) and 0 <= gpus <= 4096 else 0
            if nid not in self.nodes and len(self.nodes) >= MAX_NODES:
                self.bad_rows += 1
                continue
            self.nodes[nid] = name or ip
            self.node_info[nid] = {"ip": ip, "name": name, "gpus": gpus}

    def add_finished(self, rows: list[dict]) -> int:
        """FINISHED rows of tasks that belong to an open dispatch (same worker group and method, started
        within ``dispatch_gap_s`` of it): ``omniwatch ps`` asks for them once, so a single look knows how
        many ranks of the current call are done and when. Returns how many were added."""
        added = 0
        known = {t.key for d in self._open_dispatch.values() for t in d.tasks}
        for r in rows:
            t = self._row_task(r)
            try:
                end = _ms(r.get("end_time_ms")) if t is not None else None
            except BadRow:
                self.bad_rows += 1
                continue
            if t is None or end is None or t.key in known:
                continue
            d = self._open_dispatch.get((t.call.group or t.actor_id, t.call.method))
            one_each = self._one_call_each(t)
            if d is None or abs(t.start - d.start) > self.dispatch_gap_s or (one_each and t.actor_id in d.workers):
                continue
            t.end, t.final = end, True
            d.add(t, one_each)
            self.dispatch_calls += 1
            d.start = min(d.start, t.start)
            self._remember(t)
            added += 1
        return added

    def _remember(self, t: Task) -> None:
        """A closed call into ``done`` (bounded: the oldest leave, with their index entries)."""
        old = self.closed.get(t.key)
        if old is not None and old is not t:
            return
        self.done.append(t)
        self.closed[t.key] = t
        while len(self.done) > self.max_done:
            gone = self.done.popleft()
            if self.closed.get(gone.key) is gone:
                del self.closed[gone.key]
            self.awaiting.pop(gone.key, None)
            self.tries.pop(gone.key, None)

    def known(self, key: tuple[str, int]) -> bool:
        return key in self.running or key in self.closed

    def touch(self, key: tuple[str, int]) -> None:
        """A call opened, closed, got its final end or was recovered: agents mirroring the ledger
        (discovery/taskshare.py) fetch the calls changed since their last look."""
        self.seq += 1
        self.changes.append(key)

    def oldest_change(self) -> int:
        """The seq of the oldest change still kept (``seq + 1`` when none is)."""
        return self.seq - len(self.changes) + 1

    def changed_since(self, since: int) -> list[tuple[str, int]]:
        """The keys changed after seq ``since``, newest first, each once."""
        keys, seen = [], set()
        # one pass from the newest end (indexing a deque near its middle walks it: quadratic over 80,000 changes)
        for key in islice(reversed(self.changes), min(len(self.changes), max(0, self.seq - since))):
            if key not in seen:
                seen.add(key)
                keys.append(key)
        return keys

    # -- finals: Ray's recorded end of calls that left the RUNNING set ---------------------------------
    def apply_final(self, key: tuple[str, int], row: dict | None) -> bool:
        """The finished (or failed) row of an awaiting call, looked up by its task id (None: Ray had none).
        Its ``end_time_ms`` becomes the call's end; after ``FINAL_TRIES`` misses the estimate is kept.
        Returns True when the call became final."""
        t = self.awaiting.get(key)
        if t is None:
            return False
        try:
            end = _ms(row.get("end_time_ms")) if isinstance(row, dict) else None
        except BadRow:
            self.bad_rows += 1
            end = None
        state = row.get("state") if isinstance(row, dict) else ""
        if end is not None and state in ("FINISHED", "FAILED") and end >= t.start:
            t.end, t.end_estimated, t.final, t.failed = end, False, True, t.failed or state == "FAILED"
            self.finals_exact += 1
        else:
            n = self.tries[key] = self.tries.get(key, 0) + 1
            if n < FINAL_TRIES:
                return False
            t.final = True
            self.finals_estimated += 1
        del self.awaiting[key]
        self.tries.pop(key, None)
        self.touch(key)
        return True

    def give_up_old(self, older_than: float) -> int:
        """Closed calls that ended before ``older_than`` and still await their row keep their estimate (a
        lookup budget too small for the calls ending per poll: the newest are looked up first)."""
        old = [k for k, t in self.awaiting.items() if t.end is not None and t.end < older_than]
        for k in old:
            self.awaiting.pop(k).final = True
            self.tries.pop(k, None)
            self.finals_estimated += 1
            self.touch(k)
        return len(old)

    def set_created(self, actor_id: str, end: float | None) -> int:
        """The end of an actor's creation task (its ``__init__``). Ray stamps the first calls queued on an actor
        while it is being created as running from before its creation ended (measured on Ray 2.60: 1-5.5 s
        early); their start becomes the creation's end. Returns the calls moved."""
        self.created[actor_id] = end or 0.0
        if not end:
            return 0
        moved = 0
        for t in list(self.running.values()) + [t for t in reversed(self.done) if t.actor_id == actor_id][:64]:
            if t.actor_id == actor_id and t.start < end and (t.end is None or t.end > end):
                t.start = end
                self.touch(t.key)
                moved += 1
        return moved

    def add_recovered(self, rows: list[dict]) -> int:
        """Finished rows of calls no poll saw running (a finished-task page): each unknown one is a closed,
        final call in its dispatch. Returns how many were added."""
        added = 0
        for r in rows:
            if not isinstance(r, dict) or r.get("type") not in (None, "ACTOR_TASK") \
                    or r.get("state") not in ("FINISHED", "FAILED"):
                continue
            t = self._row_task(r)
            try:
                end = _ms(r.get("end_time_ms")) if t is not None else None
            except BadRow:
                end = None
            if t is None or end is None or end < t.start:
                self.bad_rows += t is not None
                continue
            if self.known(t.key):
                continue
            t.end, t.final, t.recovered, t.failed = end, True, True, r.get("state") == "FAILED"
            t.seen = end
            c = self.created.get(t.actor_id)
            if c and t.start < c < t.end:
                t.start = c
            self._dispatch_for(t)
            self._remember(t)
            self.touch(t.key)
            self.recovered += 1
            added += 1
        return added

    # -- tasks -----------------------------------------------------------------------------------
    def _task(self, r: dict, now: float | None = None) -> Task | None:
        """A row -> a Task; None when it has no task id or start time; BadRow when a field is of the wrong type."""
        tid, start = _id(r.get("task_id"), "task_id"), _ms(r.get("start_time_ms"))
        if not tid or start is None:
            return None
        if now is not None and start > now + CLOCK_SLACK_S:   # a node's clock ahead: the call started by now
            self.clock_ahead += 1
            start = now
        # the strings a call shares with thousands of others (its method, actor, node, job) are kept once, and so
        # is its classification (a frozen Call): 20,000 calls of 512 workers held ~50 MiB before (issue 35's soak)
        name = sys.intern(_text(r.get("name")))
        aid = sys.intern(_id(r.get("actor_id"), "actor_id"))
        actor = self.actors.get(aid)
        call = _classify(name, actor.name if actor else "", actor.class_name if actor else "")
        return Task((tid, _attempt(r.get("attempt_number"))), name, call, aid,
                    sys.intern(_id(r.get("node_id"), "node_id")), _pid(r.get("worker_pid")),
                    sys.intern(_id(r.get("job_id"), "job_id")), start)

    def _row_task(self, r, now: float | None = None) -> Task | None:
        """``_task`` for a row that may be anything: a bad one is counted (``bad_rows``) and gives None."""
        try:
            if not isinstance(r, dict):
                raise BadRow("row")
            t = self._task(r, now)
        except BadRow:
            self.bad_rows += 1
            return None
        if t is None:
            self.bad_rows += 1
        return t

    def _one_call_each(self, t: Task) -> bool:
        """A verl worker-group member (``<prefix><Class>_<pg>:<local>``, not a server): one call per dispatch."""
        a = self.actors.get(t.actor_id)
        return bool(t.call.group) and not t.call.role.endswith("_server") and a is not None \
            and worker_name(a.name) is not None

    def _dispatch_for(self, t: Task) -> None:
        k = (t.call.group or t.actor_id, t.call.method)
        d = self._open_dispatch.get(k)
        one_each = self._one_call_each(t)
        if d is None or t.start - d.start > self.dispatch_gap_s or (one_each and t.actor_id in d.workers):
            d = Dispatch(k[0], t.call.role, t.call.phase, t.call.method, t.start)
            self._open_dispatch.pop(k, None)
            self._open_dispatch[k] = d
            self.dispatches.append(d)
        d.add(t, one_each)
        self.dispatch_calls += 1
        self._trim_dispatches()

    def _trim_dispatches(self) -> None:
        """Bounded in calls, not dispatches: the oldest dispatches leave while the calls they hold are over
        ``max_calls`` (or they are more than ``max_dispatches``); the newest always stays."""
        while len(self.dispatches) > 1 and (self.dispatch_calls > self.max_calls
                                            or len(self.dispatches) > self.max_dispatches):
            old = self.dispatches.popleft()
            self.dispatch_calls -= len(old.tasks)
            k = (old.group, old.method)
            if self._open_dispatch.get(k) is old:
                del self._open_dispatch[k]

    def apply(self, running: list[dict], failed: list[dict] = (), now: float | None = None,
              dropped: int = 0, truncated: bool = False) -> dict:
        """Merge one poll; returns what changed (opened / closed counts, lossy)."""
        now = time.time() if now is None else now
        self.polls += 1
        lossy = truncated or dropped > self.dropped_seen
        if dropped > self.dropped_seen:
            self.drop_increases += 1
            self.dropped_seen = dropped
        if truncated:
            self.truncated_polls += 1
        self.lossy_since = (self.lossy_since or now) if lossy else None
        seen: set[tuple[str, int]] = set()
        opened = closed = 0
        for r in running:
            if not isinstance(r, dict):
                self.bad_rows += 1
                continue
            if r.get("type") == "ACTOR_CREATION_TASK" and r.get("actor_id"):
                aid = r["actor_id"]
                if not isinstance(aid, str) or len(aid) > MAX_ID:
                    self.bad_rows += 1
                elif len(self.creating) < MAX_CREATING or aid in self.creating:
                    self.creating.setdefault(aid, now)
                continue
            if r.get("type") not in (None, "ACTOR_TASK"):
                continue
            t = self._row_task(r, now)
            if t is None:
                continue
            seen.add(t.key)
            if t.key not in self.running:
                if t.key in self.closed:   # closed by a lossy-free poll, running again: Ray's view wins
                    continue
                c = self.created.get(t.actor_id)
                if c and t.start < c:
                    t.start = c
                self.running[t.key] = t
                self._dispatch_for(t)
                self.touch(t.key)
                opened += 1
            self.running[t.key].seen = now
        failed_end = {}
        for r in failed:
            key = task_key(r) if isinstance(r, dict) else None
            if key is None:
                continue
            try:
                failed_end[key] = _ms(r.get("end_time_ms"))
            except BadRow:
                self.bad_rows += 1
        for key in [k for k in self.running if k not in seen]:
            if lossy and key not in failed_end:
                continue  # a cut page or dropped events: not seeing it proves nothing
            t = self.running.pop(key)
            if key in failed_end and failed_end[key]:
                t.failed, t.end, t.final = True, failed_end[key], True
            else:
                t.failed = key in failed_end
                t.end, t.end_estimated = now, True
                self.awaiting[key] = t
                while len(self.awaiting) > MAX_AWAITING:   # the oldest keep their estimate
                    old = next(iter(self.awaiting))
                    self.awaiting.pop(old).final = True
                    self.tries.pop(old, None)
                    self.finals_estimated += 1
            self._remember(t)
            self.touch(key)
            closed += 1
        self.prev_poll, self.last_poll = self.last_poll, now
        return {"opened": opened, "closed": closed, "lossy": lossy}

    # -- views -----------------------------------------------------------------------------------
    def rank(self, t: Task) -> int | None:
        a = self.actors.get(t.actor_id)
        return self.rank_of.get(a.name) if a else None

    def dead_actors(self, job_id: str | None = None) -> list[Actor]:
        return [a for a in self.actors.values() if a.state in DEAD_STATES and (job_id is None or a.job_id == job_id)]

    def jobs(self) -> list[str]:
        js = {t.job_id for t in self.running.values()} | {a.job_id for a in self.actors.values() if a.state == "ALIVE"}
        return sorted(j for j in js if j)


def _node(ledger: TaskLedger, node_id: str) -> str:
    return ledger.nodes.get(node_id) or (node_id[:12] if node_id else "?")


def _mins(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def groups(ledger: TaskLedger, now: float, job_id: str | None = None) -> list[dict]:
    """Every running worker group / fleet: the open dispatch's role, phase, running / done, age and the
    slowest running worker (the ``omniwatch ps --json`` objects)."""
    out = []
    for d in ledger._open_dispatch.values():
        if d.role == "driver":   # the TaskRunner's run call spans the whole run: it holds no step (phases.py)
            continue
        run = [t for t in d.running if job_id is None or t.job_id == job_id]
        if not run:
            continue
        slow = min(run, key=lambda t: t.start)
        done = d.done
        item = {"role": d.role, "phase": d.phase, "method": d.method, "group": d.group,
                "running": len(run), "done": len(done), "since": d.start, "age_s": round(max(0.0, now - d.start), 1),
                "done_within_s": round(max(t.end for t in done) - d.start, 1) if done else None,
                "slowest": {"rank": ledger.rank(slow), "node": _node(ledger, slow.node_id), "pid": slow.pid,
                            "age_s": round(max(0.0, now - slow.start), 1)}}
        if d.role.endswith("_server"):
            item["replica"] = slow.call.replica
        out.append(item)
    out.sort(key=lambda g: -g["age_s"])
    return out


def replicas(ledger: TaskLedger, now: float, job_id: str | None = None) -> list[dict]:
    """Per rollout / reward server replica: requests in flight (``generate`` calls running) and the oldest."""
    per: dict[tuple[str, str], list[Task]] = {}
    for t in ledger.running.values():
        if t.call.role.endswith("_server") and t.call.method == "generate" and (job_id is None or t.job_id == job_id):
            per.setdefault((t.call.role, t.call.replica or t.actor_id[:8]), []).append(t)
    return [{"role": r, "replica": rep, "in_flight": len(ts), "oldest_s": round(max(0.0, now - min(t.start for t in ts)), 1)}
            for (r, rep), ts in sorted(per.items())]


def holder(ledger: TaskLedger, now: float, job_id: str | None = None) -> dict:
    """The one-line answer: {phase, role, since, text} (text without ages that change every poll, so the
    info series the exporter derives from it changes only when the situation does; ``age_s`` separately)."""
    dead = [a for a in ledger.dead_actors(job_id)]
    if dead:
        a = dead[0]
        rank = ledger.rank_of.get(a.name)
        who = f"{a.class_name.rsplit('.', 1)[-1] or 'actor'}" + (f" rank {rank}" if rank is not None else "") + \
              (f" ({a.name})" if a.name else "")
        more = f" and {len(dead) - 1} more" if len(dead) > 1 else ""
        return {"phase": "dead", "role": "other", "age_s": 0.0,
                "text": f"actor {a.state}: {who} on node {_node(ledger, a.node_id)}{more}"}
    reps = [r for r in replicas(ledger, now, job_id) if r["in_flight"]]
    gs = groups(ledger, now, job_id)
    worker_gs = [g for g in gs if not g["role"].endswith("_server")]
    if worker_gs:
        g = worker_gs[0]
        s = g["slowest"]
        total = g["running"] + g["done"]
        who = (f"rank {s['rank']}" if s["rank"] is not None else f"pid {s['pid']}") + f" on node {s['node']}"
        if g["done"]:
            text = (f"{g['phase'] if g['phase'] != 'other' else g['method']}: {g['done']}/{total} ranks done in "
                    f"{_mins(g['done_within_s'] or 0)}, {who} still running")
        else:
            text = f"{g['phase'] if g['phase'] != 'other' else g['method']}: {total} {g['role']} worker(s) running, slowest {who}"
        if reps and g["role"] in ("agent_loop",):
            r = max(reps, key=lambda r: r["oldest_s"])
            text += f"; replica {r['replica']} holds {r['in_flight']} requests"
        return {"phase": g["phase"], "role": g["role"], "age_s": g["age_s"], "text": text}
    if reps:
        r = max(reps, key=lambda r: r["oldest_s"])
        idle = len(reps) == 1
        return {"phase": "generate", "role": r["role"], "age_s": r["oldest_s"],
                "text": f"generation: replica {r['replica']} holds {r['in_flight']} requests"
                        + (", other replicas idle" if idle else f", {len(reps) - 1} other replica(s) busy")}
    return {"phase": "idle", "role": "other", "age_s": 0.0,
            "text": "no Ray task running: the driver is outside any worker call"}
