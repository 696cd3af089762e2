"""One poller per cluster, its calls shared with the node agents (issue 33 item 3).

The exporter's task-event poller (taskwatch.py) is the cluster's only reader of Ray's state API. Each node agent
that samples GPUs keeps a mirror of its ledger -- the actor and node tables, the calls running, the calls closed
(with Ray's recorded ends once final) -- and attributes its own node's GPU seconds to fleets and phases with the
same accountant (gpu/fleet.py); the exporter sums the nodes (gpu/fleetnodes.py).

- ``share(poller, since)``: the exporter's answer to ``GET /api/v1/raytasks/calls?since=N``: the calls changed
  since the ledger's change counter ``N`` (``TaskLedger.touch``), or, when ``N`` is 0 or older than the change
  ring, the running calls and the newest closed ones (``reset``); the whole actor and node tables (bounded);
  the calls still awaiting their finished row and the poll times the accountant's horizon needs.
- ``TaskMirror``: the agent's side. Fetches every ``interval`` seconds, validates every row on its own (a bad
  row is a counted skip, never a broken mirror), and offers what the accountant reads of a poller: ``ledger``
  (a TaskLedger), ``lock``, ``interval``, ``run`` and ``recovery`` -- whose wants (calls the agent's observer saw
  that no poll did) are sent back with ``POST /api/v1/raytasks/recover`` so the one poller fetches their
  finished-task pages.
"""
from __future__ import annotations

import logging
import math
import threading

import httpx

from ..periodic import Periodic
from .phases import ALL_ROLES, PHASES, Call
from .taskevents import Actor, Task, TaskLedger
from .taskfinal import Recovery

log = logging.getLogger(__name__)
VERSION = 1
MAX_CALLS = 20000          # calls in one answer
RESET_CLOSED = 4000        # closed calls in a reset answer (the newest: an agent attributes the recent past)
MAX_ACTORS = 4096
MAX_WANTS = 256            # recovery wants per POST
_ROLES, _PHASES = frozenset(ALL_ROLES), frozenset(PHASES)


def _row(t: Task) -> list:
    c = t.call
    return [t.key[0], t.key[1], t.name, c.role, c.phase, c.method, c.group, c.replica, t.actor_id, t.node_id,
            t.pid, t.job_id, t.start, t.end, t.end_estimated, t.failed, t.final, t.seen, t.recovered]


def share(poller, since: int = 0) -> dict:
    """The ledger's calls changed since ``since`` (call under the poller's lock)."""
    led: TaskLedger = poller.ledger
    reset = since <= 0 or since > led.seq or since < led.oldest_change() - 1
    if reset:
        tasks = list(led.running.values()) + list(led.done)[-RESET_CLOSED:]
    else:
        keys = led.changed_since(since)
        tasks = [t for t in (led.running.get(k) or led.closed.get(k) for k in reversed(keys)) if t is not None]
    tasks = tasks[-MAX_CALLS:]
    snap = poller.snapshot
    return {"v": VERSION, "seq": led.seq, "reset": reset, "job_id": snap.job_id, "interval": poller.interval,
            "polls": led.polls, "last_poll": led.last_poll, "prev_poll": led.prev_poll,
            "run": list(getattr(poller, "run_labels", lambda: ("", ""))() or ("", "")),
            "actors": [[a.actor_id, a.name, a.class_name, a.state, a.node_id, a.pid, a.job_id]
                       for a in list(led.actors.values())[-MAX_ACTORS:]],
            "nodes": {k: dict(v) for k, v in list(led.node_info.items())[:MAX_ACTORS]},
            "calls": [_row(t) for t in tasks],
            "awaiting": [[k[0], k[1]] for k in list(led.awaiting)[:MAX_CALLS]],
            "created": {a: e for a, e in list(led.created.items())[-MAX_ACTORS:]}}


def _str(v, n: int = 256) -> str:
    if not isinstance(v, str) or len(v) > n:
        raise ValueError("not a short string")
    return v


def _num(v, none: bool = False):
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError("not a finite number")
    return float(v)


def _task(x) -> Task:
    (tid, attempt, name, role, phase, method, group, replica, actor, node, pid, job, start, end, est, failed,
     final, seen, recovered) = x
    if role not in _ROLES or phase not in _PHASES or not isinstance(attempt, int):
        raise ValueError("role / phase / attempt out of range")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        raise ValueError("pid")
    t = Task((_str(tid, 128), attempt), _str(name), Call(role, phase, _str(method), _str(group), _str(replica, 64)),
             _str(actor, 128), _str(node, 128), pid, _str(job, 64), _num(start), _num(end, none=True), bool(est),
             bool(failed), bool(final), _num(seen or 0.0), bool(recovered))
    if t.end is not None and t.end < t.start:
        raise ValueError("ends before it starts")
    return t


class TaskMirror(Periodic):
    """An agent's copy of the exporter's ledger, refreshed every ``interval`` s from ``exporter_url`` (its thread:
    periodic.py), with backoff while the exporter does not answer."""
    thread_name, what = "omniwatch-task-mirror", "task mirror fetch"

    def __init__(self, exporter_url: str, token: str | None = None, interval: float = 2.0, timeout: float = 5.0,
                 max_done: int = 20000):
        super().__init__(interval)
        self.url = exporter_url.rstrip("/")
        self.ledger = TaskLedger(max_done=max_done)
        self.lock = threading.Lock()
        self.recovery = Recovery()
        self.run: tuple[str, str] = ("", "")
        self.seq = 0
        self.bad_rows = 0
        self.fetches = 0
        self.failures = 0
        self.up: bool | None = None
        self.why = "not fetched yet"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(timeout=timeout, trust_env=False)
        self._said: str | None = None

    # the poller interface the accountant reads
    def run_labels(self) -> tuple[str, str]:
        return self.run

    def apply(self, doc: dict) -> int:
        """Merge one answer of ``share``; returns the calls applied. Raises ValueError on a wrong shape
        (nothing changed then); a bad row inside a good answer is skipped and counted."""
        if not isinstance(doc, dict) or doc.get("v") != VERSION:
            raise ValueError("not a task-ledger share of this version")
        seq = int(doc["seq"])
        times = [_num(doc.get(k) or 0.0) for k in ("last_poll", "prev_poll")]
        actors, calls = [], []
        for a in doc.get("actors") or []:
            try:
                aid, name, cls, state, node, pid, job = a
                actors.append(Actor(_str(aid, 128), _str(name), _str(cls), _str(state, 32), _str(node or "", 128),
                                    pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                                    _str(job or "", 64)))
            except (ValueError, TypeError):
                self.bad_rows += 1
        for x in doc.get("calls") or []:
            try:
                calls.append(_task(x))
            except (ValueError, TypeError):
                self.bad_rows += 1
        awaiting = set()
        for k in doc.get("awaiting") or []:
            if isinstance(k, list) and len(k) == 2 and isinstance(k[0], str) and isinstance(k[1], int):
                awaiting.add((k[0], k[1]))
        nodes = {}
        for nid, info in (doc.get("nodes") or {}).items():
            if isinstance(nid, str) and isinstance(info, dict):
                nodes[nid[:128]] = {"ip": str(info.get("ip") or "")[:64], "name": str(info.get("name") or "")[:64],
                                    "gpus": info.get("gpus") if isinstance(info.get("gpus"), (int, float)) else 0}
        run = doc.get("run")
        with self.lock:
            led = self.ledger
            if doc.get("reset"):
                led.running.clear()
                led.done.clear()
                led.closed.clear()
            for a in actors:
                led.actors[a.actor_id] = a
            from .phases import ranks
            led.rank_of = ranks([a.name for a in led.actors.values()])
            led.node_info.update(nodes)
            for t in calls:
                if t.end is None:
                    led.running[t.key] = t
                    continue
                led.running.pop(t.key, None)
                old = led.closed.get(t.key)
                if old is None:
                    led._remember(t)
                else:   # a final end or a recovered start: update in place (it keeps its place in ``done``)
                    old.start, old.end, old.end_estimated, old.final, old.failed = \
                        t.start, t.end, t.end_estimated, t.final, t.failed
            led.awaiting = {k: led.closed[k] for k in awaiting if k in led.closed}
            for aid, end in (doc.get("created") or {}).items():
                if isinstance(aid, str) and len(aid) <= 128 and isinstance(end, (int, float)) and \
                        not isinstance(end, bool) and math.isfinite(end) and len(led.created) < 4 * MAX_ACTORS:
                    led.created[aid] = float(end)
            led.polls = int(doc.get("polls") or 0)
            led.last_poll, led.prev_poll = times
            if isinstance(run, list) and len(run) == 2 and all(isinstance(v, str) for v in run):
                self.run = (run[0][:128], run[1][:128])
            if isinstance(doc.get("interval"), (int, float)) and doc["interval"] > 0:
                self.interval = float(doc["interval"])
            self.seq = seq
        return len(calls)

    def fetch_once(self) -> int:
        r = self._client.get(f"{self.url}/api/v1/raytasks/calls", params={"since": str(self.seq)},
                             headers=self._headers)
        if r.status_code != 200:
            raise ValueError(f"HTTP {r.status_code}")
        n = self.apply(r.json())
        self.fetches += 1
        self.send_wants()
        return n

    def send_wants(self) -> None:
        rec = self.recovery
        taken = rec.take(MAX_WANTS)
        wants = [[a, n, s, e] for (a, n), wins in taken for s, e in wins][:MAX_WANTS]
        if not wants and not rec.refresh_actors:
            return
        try:
            r = self._client.post(f"{self.url}/api/v1/raytasks/recover", headers=self._headers,
                                  json={"wants": wants, "refresh_actors": rec.refresh_actors})
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            rec.refresh_actors = False
        else:   # the exporter did not take them: ask again next time
            for k, wins in taken:
                rec.put_back(k, wins)

    def stop(self) -> None:
        super().stop()
        self._client.close()

    def scan_once(self) -> None:
        try:
            self.fetch_once()
            self.failures, self.up, self.why = 0, True, "mirroring the exporter's Ray task ledger"
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            self.failures += 1
            self.up, self.why = False, f"{type(e).__name__}: {str(e)[:160]}"
        if self.why != self._said:
            (log.info if self.up else log.warning)("task mirror of %s: %s", self.url, self.why)
            self._said = self.why

    def next_wait(self, scan_cpu_s: float) -> float:
        from .. import backoff
        return backoff.delay(self.failures, self.interval, 60.0) if self.failures else self.interval


def check_wants(body) -> tuple[list[tuple[str, str, float, float]], bool]:
    """``POST /api/v1/raytasks/recover`` body -> (wants, refresh_actors); ValueError names what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    wants = body.get("wants") or []
    if not isinstance(wants, list) or len(wants) > MAX_WANTS:
        raise ValueError(f"wants must be a list of at most {MAX_WANTS}")
    out = []
    for w in wants:
        if not (isinstance(w, list) and len(w) == 4):
            raise ValueError("each want is [actor_id, task name, start, end]")
        a, n, s, e = w
        out.append((_str(a, 128), _str(n), _num(s), _num(e)))
    return out, bool(body.get("refresh_actors"))
