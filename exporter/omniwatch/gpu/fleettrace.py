"""Per-fleet GPU time, recorded and replayed (issue 33 item 5): a live run's NVML drains, Ray state-API answers and
worker process-title samples, in the order the accountant (gpu/fleet.py) saw them, replayed through the same
sampler, ledger, poller and accountant code in CI; and the score against the workers' own synchronized segments.

A recording is one JSON document (``FORMAT``):

- ``events``: in the order they happened, each ``[kind, ...]``:
  ``["poll", now, [[kind, filters, limit, detail, page], ...]]`` -- one poll of the task-event source with every
  state-API answer it got (rows reduced to the fields the ledger reads, ``ROW_KEYS``);
  ``["obs", t, {pid: task name or null}, {pid: actor id}]`` -- one process-title sample (gpu/callwatch.py);
  ``["drain", {uuid: [[us, util], ...]}, {uuid: [pids]}, marker]`` -- one sampler poll and the accountant pass
  after it; ``marker`` = ``[polls, observer time]`` the pass saw (``null``: the pass was skipped);
- ``gpus``: ``[[index, uuid, name]]``, ``node`` (the sampler's node label), ``node_id``, ``run``;
- ``truth`` (the workload's own calls and segments) and ``live`` (the live run's figures), written by the
  benchmark that made it (benchmarks/gpu_fleet_validation.py).

Replay applies polls and observer samples up to each pass's marker before feeding its drain, so the ledger,
the observer and the sample ring are in the state the live pass saw. State-API answers are matched to the
replayed poll's requests by (kind, filters); a request with no recorded answer gets an empty page and is
counted (``mismatches``; ``unrecorded`` for a kind the recording has none of).
"""
from __future__ import annotations

import json
import threading
from collections import defaultdict, deque

from ..discovery.rayapi import Page
from .devices import TraceBackend, TraceDevice

FORMAT = 1
ROW_KEYS = ("task_id", "attempt_number", "name", "type", "state", "actor_id", "node_id", "worker_pid", "job_id",
            "start_time_ms", "end_time_ms", "class_name", "pid", "death_cause", "node_ip", "node_name",
            "resources_total", "func_or_class_name")


def _reduce(row: dict) -> dict:
    return {k: row[k] for k in ROW_KEYS if k in row}


class _RecordingAPI:
    """rayapi.StateAPI's ``list``, every answer kept in the recorder's current poll."""

    def __init__(self, api, rec: "Recorder"):
        self._api, self._rec = api, rec

    def __getattr__(self, name):
        return getattr(self._api, name)

    def list(self, kind, filters=(), limit=None, detail=False):
        page = self._api.list(kind, filters, limit=limit, detail=detail)
        self._rec.calls.append([kind, [list(f) for f in filters], limit, detail,
                                {"rows": [_reduce(r) for r in page.rows], "total": page.total,
                                 "after": page.after_truncation, "filtered": page.filtered}])
        return page


class Recorder:
    """Attach to a live poller, sampler, observer and accountant; ``document()`` is the recording."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: list = []
        self.calls: list = []
        self._drains: dict[str, list] = {}
        self._sampler = None

    def attach(self, poller, sampler, accountant, observer=None) -> "Recorder":
        poller.api = _RecordingAPI(poller.api, self)
        orig = poller.poll

        def poll(now=None):
            self.calls = []
            snap = orig(now)
            with self.lock:
                self.events.append(["poll", snap.ts, self.calls])
            return snap
        poller.poll = poll
        sampler.raw_hook = self._raw
        self._sampler = sampler
        accountant.recorder = self
        if observer is not None:
            observer.on_sample = self._obs
        return self

    def _raw(self, st, samples) -> None:
        self._drains.setdefault(st.uuid, []).extend([int(t), int(u)] for t, u in samples)

    def _obs(self, t: float, data: dict) -> None:
        with self.lock:
            self.events.append(["obs", t, {str(p): n for p, n in data["seen"].items()},
                                {str(p): a for p, a in data["actors"].items()}])

    def processed(self, marker) -> None:
        drains, self._drains = self._drains, {}
        pids = {g.uuid: sorted(g.pids) for g in self._sampler.snapshot()} if self._sampler is not None else {}
        with self.lock:
            self.events.append(["drain", drains, pids, list(marker) if marker else None])

    def document(self, sampler, node_id: str = "", run=("", ""), **extra) -> dict:
        gpus = [[g.index, g.uuid, g.name] for g in sampler.snapshot()]
        with self.lock:
            events = list(self.events)
        return dict({"format": FORMAT, "node": sampler.node, "node_id": node_id, "run": list(run), "gpus": gpus,
                     "events": events}, **extra)


class _ReplayAPI:
    """Recorded answers by (kind, filters). A request of a kind the whole recording has none of (a list the
    poller asks for since the recording was made) is answered empty and counted in ``unrecorded``, not as a
    mismatch."""

    def __init__(self, kinds: set[str] = frozenset()):
        self.queue: dict[tuple, deque] = {}
        self.kinds = set(kinds)
        self.mismatches = 0
        self.unrecorded = 0
        self.cost = type("Cost", (), {"calls": 0, "bytes": 0, "seconds": 0.0})()

    def load(self, calls: list) -> None:
        self.queue = defaultdict(deque)
        for kind, filters, limit, detail, page in calls:
            self.queue[(kind, tuple(tuple(f) for f in filters))].append(page)

    def list(self, kind, filters=(), limit=None, detail=False) -> Page:
        self.cost.calls += 1
        q = self.queue.get((kind, tuple(tuple(f) for f in filters)))
        if not q:
            if kind in self.kinds:
                self.mismatches += 1
            else:
                self.unrecorded += 1
            return Page([])
        p = q.popleft()
        return Page(p["rows"], p["total"], p["after"], p["filtered"])

    def close(self) -> None:
        pass


def replay(doc: dict, finals: bool = True, observe: bool = True, trace: bool = False) -> dict:
    """Replay a recording through a fresh sampler, ledger, poller and accountant. ``finals=False`` /
    ``observe=False`` switch off Ray's recorded ends / the call observer (what the accountant did before:
    the poll-time view). Returns ``{"accountant", "poller", "sampler", "mismatches"}``."""
    from ..discovery.taskwatch import TaskPoller
    from .callwatch import CallObserver
    from .fleet import FleetAccountant
    from .sampler import GpuSampler
    if doc.get("format") != FORMAT:
        raise ValueError("not a per-fleet GPU time recording of this format")
    devs = {uuid: TraceDevice(int(i), uuid, name, deque()) for i, uuid, name in doc["gpus"]}
    sampler = GpuSampler(TraceBackend(list(devs.values())), None, node=doc["node"])
    api = _ReplayAPI({c[0] for e in doc["events"] if e[0] == "poll" for c in e[2]})
    poller = TaskPoller("http://127.0.0.1:9", interval=float(doc.get("interval") or 5.0), timeout=1.0)
    poller.api.close()
    poller.api = api
    if not finals:
        poller.final_budget = poller.recover_budget = 0
    observer = CallObserver(lambda: {}) if observe else None
    run = tuple(doc.get("run") or ("", ""))
    acct = FleetAccountant(sampler, poller, lambda: run, None, addresses=set(), node_id=doc.get("node_id") or None,
                           observer=observer)
    if trace:
        acct.trace = []
    polls = deque(e for e in doc["events"] if e[0] == "poll")
    obs = deque(e for e in doc["events"] if e[0] == "obs")
    done_polls = 0
    for ev in doc["events"]:
        if ev[0] != "drain":
            continue
        _, drains, pids, marker = ev
        want_polls = marker[0] if marker else done_polls
        while polls and done_polls < want_polls:
            _, now, calls = polls.popleft()
            api.load(calls)
            poller.poll(now=now)
            if not finals:   # the poll-time view: a call closes at the poll that stops seeing it
                for t in poller.ledger.awaiting.values():
                    t.final = True
                poller.ledger.awaiting.clear()
            done_polls += 1
        if observer is not None and marker:
            while obs and obs[0][1] <= marker[1]:
                _, t, seen, actors = obs.popleft()
                observer.apply(t, {int(p): n for p, n in seen.items()}, {int(p): a for p, a in actors.items()})
        for uuid, dev in devs.items():
            dev.chunks.append([tuple(x) for x in drains.get(uuid, [])])
            dev.visible_pids = frozenset(int(p) for p in (pids or {}).get(uuid, ()))
        if marker is None:   # the live pass was skipped (the poller held its lock): feed the samples only
            listeners, sampler.listeners = sampler.listeners, []
            sampler.poll_once()
            sampler.listeners = listeners
        else:
            sampler.poll_once()
    return {"accountant": acct, "poller": poller, "sampler": sampler, "mismatches": api.mismatches,
            "unrecorded": api.unrecorded}


# -- the score: measured buckets against the workload's own segments ------------------------------------------
def truth_buckets(truth: list[dict], lo: float, hi: float) -> dict:
    """The workload's calls (``{"method", "fleet", "phase", "entry", "exit", "segments": [[kind, s, e]]}``,
    kinds busy / idle, timed after ``torch.cuda.synchronize``) -> seconds per bucket inside [lo, hi]:
    productive (busy in a compute call), idle (idle inside a compute call: its span less its busy segments),
    overhead (every second of an overhead call); and per (fleet, phase)."""
    from .fleet import OVERHEAD_PHASES

    def clip(a, b):
        return max(0.0, min(b, hi) - max(a, lo))
    out = {"productive": 0.0, "overhead": 0.0, "idle": 0.0}
    per: dict[tuple[str, str], float] = defaultdict(float)
    for c in truth:
        span = clip(c["entry"], c["exit"])
        busy = sum(clip(s, e) for k, s, e in c["segments"] if k == "busy")
        per[(c["fleet"], c["phase"])] += span
        if c["phase"] in OVERHEAD_PHASES:
            out["overhead"] += span
        else:
            out["productive"] += busy
            out["idle"] += span - busy
    return {"buckets": out, "per_phase": {f"{f}/{p}": v for (f, p), v in sorted(per.items())}}


def measured_buckets(acct) -> dict:
    """The accountant's seconds: productive, overhead (calls and busy outside calls), idle inside calls (and
    idle outside any call separately), and per (fleet, phase)."""
    out = {"productive": 0.0, "overhead": 0.0, "idle": 0.0, "idle_no_call": 0.0, "busy_no_call": 0.0}
    per: dict[str, float] = defaultdict(float)
    for (_p, _e, _node, fleet, phase, bucket, _how), s in acct.series()[0]:
        if phase == "none":
            out["idle_no_call" if bucket == "idle" else "busy_no_call"] += s
            if bucket == "overhead":
                out["overhead"] += s
            continue
        out[bucket] += s
        per[f"{fleet}/{phase}"] += s
    return {"buckets": out, "per_phase": dict(sorted(per.items()))}


def window(acct) -> tuple[float, float]:
    with acct.lock:
        return max(acct.since.values()), min(acct.until.values())


def call_coverage(truth: list[dict], trace: list, lo: float, hi: float, min_s: float = 0.2) -> list[dict]:
    """Per workload call longer than ``min_s`` inside [lo, hi]: the share of its span the accountant charged
    to its own fleet and phase (from ``FleetAccountant.trace``)."""
    pieces = sorted((a, b, f, p) for _u, a, b, f, p, _busy, _idle in trace)
    starts = [x[0] for x in pieces]
    import bisect
    out = []
    for c in truth:
        a, b = c["entry"], c["exit"]
        if b - a <= min_s or a < lo or b > hi:
            continue
        i = max(0, bisect.bisect_right(starts, a) - 1)
        got = 0.0
        while i < len(pieces) and pieces[i][0] < b:
            pa, pb, f, p = pieces[i]
            if f == c["fleet"] and p == c["phase"]:
                got += max(0.0, min(b, pb) - max(a, pa))
            i += 1
        out.append({"method": c["method"], "phase": c["phase"], "fleet": c["fleet"], "start": a,
                    "seconds": round(b - a, 4), "attributed_s": round(got, 4), "share": round(got / (b - a), 4)})
    return out


def score(truth: list[dict], acct, trace: list | None = None) -> dict:
    lo, hi = window(acct)
    t = truth_buckets(truth, lo, hi)
    m = measured_buckets(acct)
    buckets = {}
    for k in ("productive", "overhead", "idle"):
        tv, mv = t["buckets"][k], m["buckets"][k]
        buckets[k] = {"truth_s": round(tv, 3), "measured_s": round(mv, 3),
                      "error_pct": round(100.0 * (mv - tv) / tv, 2) if tv else None}
    out = {"window": [lo, hi], "buckets": buckets, "truth_per_phase": t["per_phase"],
           "measured_per_phase": m["per_phase"], "busy_no_call_s": round(m["buckets"]["busy_no_call"], 3),
           "idle_no_call_s": round(m["buckets"]["idle_no_call"], 3)}
    if trace is not None:
        cov = call_coverage(truth, trace, lo, hi)
        out["calls"] = len(cov)
        out["calls_min_share"] = min((c["share"] for c in cov), default=None)
        out["calls_below_95pct"] = [c for c in cov if c["share"] < 0.95]
    return out


def load(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
