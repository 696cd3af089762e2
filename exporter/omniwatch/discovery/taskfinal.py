"""Ray's recorded call boundaries, once final: the exact end of every call that left the RUNNING set, and the
calls no poll saw (issue 33 item 1). Called by the poller after each RUNNING poll (taskwatch.py); bounded work.

Why lookups by task id: Ray 2.58-2.60 filter task events only by ``=`` / ``!=`` and the dashboard converts
every row the GCS returns before it applies ``limit`` (``StateAPIManager.list_tasks``: ``get_all_task_info``
carries no limit; sort by task id, then cut), so any query for FINISHED rows costs Ray O(the rows it matches)
-- the run's retained history for a name, an actor or a job (measured: 1-2 ms of the dashboard per matched
row on a loaded 2-core head, 2 KiB per detailed row; docs/who-holds-the-step.md). A ``task_id=`` filter is
answered from the GCS's task index (``GcsTaskManager::HandleGetTaskEvents``: one EQUAL task id -> the index;
two or more -> nothing), one row, 12-21 ms of wall on the same head whatever the history. So:

- **finals**: each closed call awaiting its end (``TaskLedger.awaiting``) is looked up by its task id, the
  newest ``final_budget`` per poll; its ``end_time_ms`` replaces the poll-time estimate
  (``TaskLedger.apply_final``). Not found after ``FINAL_TRIES`` lookups (evicted, dropped), or still waiting
  ``FINAL_WAIT_S`` after it ended (more calls end per poll than the budget looks up: 512 ranks closing one
  dispatch), the estimate stays (``finals_estimated``).
- **recovery**: a call that started and ended between two polls is in no RUNNING answer. A node's call
  observer (gpu/callwatch.py: the worker's process title names the method it runs) sees it and asks for it
  (``want``: actor id, task name, observed window). The finished-task page ``actor_id=A, name=N,
  state=FINISHED`` holds it, with Ray's exact times (``TaskLedger.add_recovered``); at most ``recover_budget``
  pages per poll. Such a page grows with the run (one row per call of that method on that actor still in the
  GCS): a page that comes back cut at ``RECOVER_PAGE`` rows, or that does not hold the observed call after
  ``FINAL_TRIES`` asks, stops paging that (actor, name); the observer's boundaries then stand (counted
  ``recover_observed``).
"""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from .taskevents import FINAL_TRIES, FINAL_WAIT_S, BadRow, TaskLedger, _ms, task_key

RECOVER_PAGE = 200        # rows of one recovery page (an actor's calls of one method still in Ray's GCS)
MAX_WANTED = 1024
MATCH_SLACK_S = 1.0       # an observed window matches a finished row starting within this of it


@dataclass
class Recovery:
    """Calls the node observers saw that no poll did, waiting for their finished-task page (bounded)."""
    wanted: "OrderedDict[tuple[str, str], list]" = field(default_factory=OrderedDict)   # (actor, name) -> [windows]
    tries: dict = field(default_factory=dict)
    given_up: set = field(default_factory=set)          # (actor, name) whose pages are too long: observer's view
    refresh_actors: bool = False   # an observer saw a worker the actor table does not name: re-read it
    pages: int = 0
    cut_pages: int = 0
    observed: int = 0          # observed calls that kept the observer's boundaries
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def want(self, actor_id: str, name: str, start: float, end: float) -> bool:
        """Ask for the finished row of a call seen at [start, end] on ``actor_id`` running ``name``. False when
        that (actor, name) is not paged any more or the queue is full. Thread-safe (the HTTP area and the
        accountants call it while a poll may run)."""
        k = (actor_id, name)
        if not actor_id or not name:
            return False
        with self.lock:
            if k in self.given_up:
                return False
            wins = self.wanted.get(k)
            if wins is None:
                if len(self.wanted) >= MAX_WANTED:
                    return False
                wins = self.wanted[k] = []
            if not any(abs(a - start) < 1e-3 for a, _ in wins) and len(wins) < 64:
                wins.append((start, end))
        return True

    def take(self, n: int) -> list[tuple[tuple[str, str], list]]:
        with self.lock:
            out = [(k, self.wanted.pop(k)) for k in list(self.wanted)[:max(0, n)]]
        return out

    def put_back(self, k: tuple[str, str], windows: list) -> None:
        with self.lock:
            self.wanted.setdefault(k, []).extend(windows)


def settle(api, ledger: TaskLedger, job_filter: list, recovery: Recovery | None,
           final_budget: int = 32, recover_budget: int = 2, lock=None) -> dict:
    """One round of finals and recovery pages (raises RayAPIError when Ray stops answering). Called from the
    poller's thread, the ledger's only writer: Ray is asked outside ``lock``, each answer applied under it (a
    reader of the ledger never waits on Ray)."""
    lock = lock if lock is not None else contextlib.nullcontext()
    looked = exact = 0
    with lock:
        ledger.give_up_old(ledger.last_poll - FINAL_WAIT_S)
        keys = list(ledger.awaiting)[-max(0, final_budget):] if final_budget > 0 else []   # the newest first
    for key in keys:
        page = api.list("tasks", [("task_id", "=", key[0])], detail=True, limit=8)
        looked += 1
        row = next((r for r in page.rows if task_key(r) == key), None)
        with lock:
            exact += ledger.apply_final(key, row) and row is not None
    # the creation task of each actor that has calls: its id is the actor's with a nil prefix
    # (TaskID::ForActorCreationTask), its end bounds the start of the calls queued on the actor meanwhile
    left = max(0, final_budget - looked)
    actors = {t.actor_id for t in list(ledger.running.values())} | {t.actor_id for t in list(ledger.done)[-256:]}
    for aid in [a for a in sorted(actors) if a and a not in ledger.created][:left]:
        page = api.list("tasks", [("task_id", "=", creation_task_id(aid))], detail=True, limit=2)
        looked += 1
        row = page.rows[0] if page.rows else None
        try:
            end = _ms(row.get("end_time_ms")) if isinstance(row, dict) else None
        except BadRow:
            end = None
        with lock:
            ledger.set_created(aid, end)
    pages = added = 0
    if recovery is not None:
        for k, windows in recovery.take(recover_budget):
            actor_id, name = k
            page = api.list("tasks", [("actor_id", "=", actor_id), ("name", "=", name), ("state", "=", "FINISHED")]
                            + job_filter, detail=True, limit=RECOVER_PAGE)
            pages += 1
            recovery.pages += 1
            rows = []
            left = []
            for a, b in windows:
                hit = [r for r in page.rows if _near(r, a, b)]
                rows += hit
                if not hit:
                    left.append((a, b))
            with lock:
                added += ledger.add_recovered(rows)
            if page.truncated:
                recovery.cut_pages += 1
            n = recovery.tries[k] = recovery.tries.get(k, 0) + (1 if left else 0)
            if left and (page.truncated or n >= FINAL_TRIES):
                recovery.given_up.add(k)
                recovery.observed += len(left)
                recovery.tries.pop(k, None)
            elif left:
                recovery.put_back(k, left)
    return {"looked_up": looked, "exact": exact, "pages": pages, "recovered": added}


def creation_task_id(actor_id: str) -> str:
    """Ray's id of an actor's creation task: 8 nil (0xff) bytes + the actor id (src/ray/common/id.cc
    ``TaskID::ForActorCreationTask``)."""
    return "ff" * 8 + actor_id


def _near(row: dict, start: float, end: float) -> bool:
    try:
        s = _ms(row.get("start_time_ms")) or 0.0
        e = _ms(row.get("end_time_ms")) or 0.0
    except (BadRow, AttributeError):
        return False
    return s > 0 and e >= s and abs(s - start) <= MATCH_SLACK_S and abs(e - end) <= MATCH_SLACK_S + 0.5
